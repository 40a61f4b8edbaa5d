"""The suite with ``--reference-drafter fixtures/second_drafter`` (a second small drafter of the bundled target,
built by fixtures/build_second_drafter.py): the reference τ test and the architecture comparison run (they skip
without the option), eval.json carries the reference's τ and the paired difference, and a drafter worse than its
reference beyond noise fails the reference test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"
SECOND = ROOT / "fixtures" / "second_drafter"
pytestmark = pytest.mark.slow

SELECT = "test_drafter_against_reference or test_matches_reference_drafter or test_mean_tau"


def run(pytester, tmp: Path, drafter: Path, reference: Path):  # type: ignore[no-untyped-def]
    res = pytester.runpytest_inprocess(
        "tests_eval", "-q", "-rs", "-k", SELECT, "--target-model", str(TARGET), "--drafter", str(drafter),
        "--reference-drafter", str(reference), "--prompts", str(ROOT / "fixtures" / "prompts.jsonl"),
        "--num-prompts", "4", "--max-new-tokens", "24", "--tau-floor", "1.0", "--cache-dir", str(tmp / "cache"),
        "--report-dir", str(tmp / "reports"))
    outcomes = {r.nodeid.split("::")[-1]: r.outcome for r in res.reprec.getreports("pytest_runtest_logreport")
                if r.when == "call"}
    return res, outcomes, json.loads((tmp / "reports" / "eval.json").read_text())


def test_reference_drafter_tests_run_and_report(pytester, suite_checkout, tmp_path):
    suite_checkout()
    res, outcomes, data = run(pytester, tmp_path, DRAFTER, SECOND)
    assert outcomes == {"test_matches_reference_drafter": "passed", "test_drafter_against_reference": "passed",
                        "test_mean_tau": "passed"}, res.stdout.str()
    ref = data["drafter"]["reference"]
    assert Path(ref["path"]) == SECOND and set(ref["prompts"]) == set(data["prompts"])
    diffs = [data["prompts"][p]["tau"] - t for p, t in ref["prompts"].items()]
    assert ref["paired"]["mean_diff"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-12)
    assert ref["paired"]["mean_diff"] > 0  # the second drafter is trained for fewer steps on less data


def test_a_drafter_worse_than_its_reference_fails(pytester, suite_checkout, tmp_path):
    suite_checkout()
    res, outcomes, data = run(pytester, tmp_path, SECOND, DRAFTER)  # the roles swapped
    assert outcomes["test_drafter_against_reference"] == "failed", res.stdout.str()
    assert "below the reference drafter's" in res.stdout.str()
    assert data["drafter"]["reference"]["paired"]["ci95"][1] < 0
