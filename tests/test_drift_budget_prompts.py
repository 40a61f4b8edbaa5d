"""The drift gate judges the drafter, not the noise of its budget: on a small selection the budget is measured on
``--drift-budget-min-prompts`` prompts of ``--prompts``.

A copy of the bundled drafter with 5 % relative Gaussian noise on every weight keeps its τ (it rises), yet its budget
measured on the 6 selected prompts alone comes out one ladder level lower (one prompt's |Δτ| sets the CI) and failed
``test_drift_within_budget[bf16-vs-fp32-L5]``. Measured on the first 32 prompts, the budget is the full set's and the
gate passes.

The same comparison at more selection sizes: ``benchmarks/bench_budget_prompts.py`` (docs/drift-budget.md).

Run: ``pytest tests/test_drift_budget_prompts.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_noisy_drafter_passes_the_gate_on_six_prompts(suite_checkout, pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from bench_budget_prompts import noisy_drafter

    suite_checkout()
    drafter = noisy_drafter(ROOT / "fixtures" / "drafter", tmp_path / "noisy", 0.05)

    def run(report: str, *args: str) -> tuple[pytest.RunResult, dict]:
        res = pytester.runpytest_subprocess(  # the repository's default prompts (37), the first 6 selected
            "tests_eval", "-k", "within_budget", f"--target-model={ROOT / 'fixtures' / 'target'}",
            f"--drafter={drafter}", f"--prompts=humaneval:16,{ROOT / 'fixtures' / 'prompts.jsonl'}",
            "--num-prompts=6", f"--cache-dir={tmp_path / 'cache'}",
            f"--report-dir={tmp_path / report}", *args, timeout=1200)
        return res, json.loads((tmp_path / report / "eval.json").read_text())

    res, data = run("default")
    assert res.ret == 0, res.stdout.str()
    b = data["drift_budget"]
    assert b["n_prompts"] == 32 and b["selected_prompts"] == 6 and b["conclusive"] is True
    assert len(data["prompts"]) == 6  # τ, drift and the reports stay on the selection
    gates = {(g["comparison"], g["layer"]): g for g in data["drift_gate"]}
    assert gates and all(g["outcome"] == "pass" for g in gates.values()), gates
    res.stdout.fnmatch_lines(["*measured on the 32 first prompts of --prompts (6*"])  # the line wraps

    # The old rule, the budget on the selection alone: the false alarm (the selection's features are cached now)
    res6, data6 = run("selection_only", "--drift-budget-min-prompts=6")
    assert data6["drift_budget"]["n_prompts"] == 6 and data6["drift_budget"]["budget"] < b["budget"]
    assert res6.ret == 1 and any(g["outcome"] == "fail" for g in data6["drift_gate"]), res6.stdout.str()
