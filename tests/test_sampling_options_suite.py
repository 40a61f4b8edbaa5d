"""The sampling options on the suite's command line, each with an outcome of an in-process run (pytester) of the
τ tests on 2 bundled prompts x 2 sampled references x 16 new tokens that depends on it:

- ``--temperature`` > 0 with ``--samples-per-prompt``: every prompt row carries that many per-sample τ and the run a
  ``sampled`` block; ``--sampling-seed``: another seed draws other references (the context records it);
- ``--top-k 1``, ``--top-p`` near 0 and ``--min-p 1``: each keeps only the most likely token, so every prompt's τ
  (and each sample's, where the run samples) is the greedy run's τ, which the plain T = 0.6 run's is not;
- ``--tau-margin-sigmas``: the per-prompt margins of floors recorded at T > 0 scale with it.

Run: ``pytest tests/test_sampling_options_suite.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SAMPLED = ("--temperature", "0.6", "--samples-per-prompt", "2")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, target_modules_imported) -> Path:
    return tmp_path_factory.mktemp("sampling_options") / "cache"


@pytest.fixture
def run(bundled_suite, cache_dir, tmp_path):
    """``run(*args, report=NAME)``: eval.json of ``-k tau`` on 2 bundled prompts, 16 new tokens, with ``args``."""

    def go(*args: str, report: str) -> dict:
        res = bundled_suite("-k", "tau", "--max-new-tokens", "16", "--floors-file",
                            str(tmp_path / f"{report}.floors.json"), "--update-tau-floors", *args, report=report,
                            cache=cache_dir)
        assert res.ret == 0, res.stdout.str()
        return json.loads((tmp_path / report / "eval.json").read_text(encoding="utf-8"))

    go.floors = lambda report: json.loads((tmp_path / f"{report}.floors.json").read_text(encoding="utf-8"))
    return go


def _sample_taus(data: dict) -> dict[str, list[float]]:
    return {pid: row["sample_tau"] for pid, row in data["prompts"].items()}


def test_temperature_samples_and_seed(run):
    greedy = run(report="greedy")
    assert all("sample_tau" not in row for row in greedy["prompts"].values())
    a = run(*SAMPLED, "--sampling-seed", "1", report="seed1")
    b = run(*SAMPLED, "--sampling-seed", "2", report="seed2")
    assert a["sampled"] and all(len(t) == 2 for t in _sample_taus(a).values())
    ctx_a, ctx_b = run.floors("seed1")["context"], run.floors("seed2")["context"]
    assert (ctx_a["temperature"], ctx_a["samples_per_prompt"], ctx_a["sampling_seed"]) == (0.6, 2, 1)
    assert ctx_b["sampling_seed"] == 2
    assert _sample_taus(a) != _sample_taus(b), "another --sampling-seed drew the same references"


@pytest.mark.parametrize("keep_one", [("--top-k", "1"), ("--top-p", "1e-6"), ("--min-p", "1.0")],
                         ids=["top-k", "top-p", "min-p"])
def test_truncation_to_one_token_is_greedy(run, keep_one):
    greedy = {pid: row["tau"] for pid, row in run(report="greedy")["prompts"].items()}
    sampled = {pid: row["tau"] for pid, row in run(*SAMPLED, report="sampled")["prompts"].items()}
    assert sampled != greedy, "T = 0.6 sampled the greedy references: the check below would not see the option"
    truncated = run(*SAMPLED, *keep_one, report=keep_one[0].strip("-"))["prompts"]
    assert {pid: row["tau"] for pid, row in truncated.items()} == greedy
    for pid, row in truncated.items():
        assert row.get("sample_tau", [greedy[pid]] * 2) == [greedy[pid]] * 2, (pid, row)


def test_margin_sigmas_scale_the_sampled_margins(run):
    run(*SAMPLED, "--tau-margin-sigmas", "1", report="sig1")
    run(*SAMPLED, "--tau-margin-sigmas", "2", report="sig2")
    one, two = run.floors("sig1"), run.floors("sig2")
    assert (one["margin_sigmas"], two["margin_sigmas"]) == (1.0, 2.0)
    m1, m2 = one["margins"]["chain"], two["margins"]["chain"]
    assert m1 and set(m1) == set(m2)
    for pid in m1:
        assert m2[pid] == pytest.approx(2 * m1[pid], rel=1e-3, abs=2e-4), pid
