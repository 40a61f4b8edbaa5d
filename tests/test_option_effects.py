"""Suite options that no other test passed, each passed here on the command line of an in-process run of the suite
(pytester) on the bundled target and drafter, with an outcome that differs from the run without it:

- ``--drift-cos-tol``: a cosine tolerance above 1 fails every ``test_drift_regression`` (the features' cosine is
  at most 1) with the message naming that tolerance; without it the same tests pass;
- ``--drift-accept-tol``: under a large kernel fault the acceptance lengths with and without the fault differ by
  more than the default 0.5 (``test_functional_drift_accept_len`` fails); a tolerance of 100 passes them;
- ``--prompt-data-dir``: ``--prompts gsm8k:2`` is read from the folder given (a local ``gsm8k.jsonl``), which the
  default folder does not hold;
- ``--reference-backend``: a reference other than the evaluation backend makes the drift comparison
  ``<eval>-vs-<reference>`` alone (the default, the evaluation backend itself, compares the CPU's two torch paths
  and bf16 with fp32);
- ``--max-blocks``: every prompt's τ simulation stops after that many rounds (eval.json ``rounds``);
- ``--generation-batch``: local greedy generation runs one batch per that many prompts (eval.json's ``generation``
  spans);
- ``--drift-budget-safety``: a safety factor so large that no drift fits the budget fails the drift gate, naming it;
  ``--drift-budget-seed``: another seed measures other noise levels (eval.json ``drift_budget``);
- ``--online-tau``: eval.json's prompts carry the real speculative loop's τ (``online``), absent without it;
- ``--rehash``: the memoised target identity is computed again and its memo file rewritten (untouched without it);
- ``--baseline-rise-tol``: the ceiling of the paired τ rise against ``--baseline``.

Run: ``pytest tests/test_option_effects.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "tests" / "data" / "prompt_sets" / "rows"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, target_modules_imported) -> Path:
    return tmp_path_factory.mktemp("option_effects") / "cache"


@pytest.fixture
def run(bundled_suite, cache_dir, tmp_path):
    """``run(*args, report=NAME)``: the suite on 2 bundled prompts with ``args``; (result, call reports by name)."""

    def go(*args: str, report: str, cache: Path | None = None):
        res = bundled_suite(*args, report=report, cache=cache or cache_dir)
        calls = {r.nodeid.split("::")[-1]: r for r in res.reprec.getreports("pytest_runtest_logreport")
                 if r.when == "call" or r.outcome != "passed"}
        go.report = tmp_path / report
        return res, calls

    return go


def named(calls: dict, prefix: str) -> dict:
    """The reports of the tests whose id starts with ``prefix`` that ran (the fla comparison is skipped on a CPU)."""
    return {k: r for k, r in calls.items() if k.startswith(prefix) and r.outcome != "skipped"}


def test_drift_cos_tol_sets_the_regression_tolerance(run):
    res, calls = run("-k", "drift_regression", report="default")
    regress = named(calls, "test_drift_regression[")
    assert regress and all(r.outcome == "passed" for r in regress.values()), res.stdout.str()
    res, calls = run("-k", "drift_regression", "--drift-cos-tol", "1.01", report="cos")
    regress = named(calls, "test_drift_regression[")
    assert regress and all(r.outcome == "failed" for r in regress.values()), res.stdout.str()
    assert all("numerics regression" in str(r.longrepr) and "(tol 1.01)" in str(r.longrepr)
               for r in regress.values())


def test_drift_accept_tol_sets_the_acceptance_tolerance(run):
    fault = ("-k", "functional_drift", "--kernel-fault", "noise:3")
    res, calls = run(*fault, report="accept_default")
    accept = named(calls, "test_functional_drift_accept_len[")
    failed = [r for r in accept.values() if r.outcome == "failed"]
    assert failed and all("> tol 0.5" in str(r.longrepr) for r in failed), res.stdout.str()
    res, calls = run(*fault, "--drift-accept-tol", "100", report="accept_loose")
    accept = named(calls, "test_functional_drift_accept_len[")
    assert accept and all(r.outcome == "passed" for r in accept.values()), res.stdout.str()


def test_prompt_data_dir_is_where_named_sets_are_read(run, tmp_path):
    data = tmp_path / "sets"
    data.mkdir()
    (data / "gsm8k.jsonl").write_text((ROWS / "gsm8k.jsonl").read_text())
    assert not (ROOT / "data" / "prompt_sets" / "gsm8k.jsonl").exists()  # the default folder holds no gsm8k
    res, _ = run("--collect-only", "-k", "reference_completion", "--prompts", "gsm8k:2", "--prompt-data-dir",
                 str(data), report="sets")
    out = res.stdout.str()
    assert res.ret == 0, out
    assert "test_reference_completion[gsm8k-0]" in out and "test_reference_completion[gsm8k-1]" in out, out
    assert "gsm8k-2" not in out, out


def test_reference_backend_sets_the_drift_comparisons(run):
    res, _ = run("--collect-only", "-k", "drift_regression", report="ref_default")
    out = res.stdout.str()
    assert res.ret == 0 and "torch-vs-torch-recurrent-" in out and "bf16-vs-fp32-" in out, out
    res, _ = run("--collect-only", "-k", "drift_regression", "--reference-backend", "torch-recurrent",
                 report="ref_recurrent")
    out = res.stdout.str()
    assert res.ret == 0 and "torch-vs-torch-recurrent-" in out and "bf16-vs-fp32" not in out, out


def read_report(run, res) -> dict:
    path = run.report / "eval.json"
    assert path.is_file(), res.stdout.str() + res.stderr.str()
    return json.loads(path.read_text())


def test_max_blocks_stops_each_simulation(run):
    res, calls = run("-k", "test_mean_tau", "--tau-floor", "1.0", "--max-blocks", "2", "--allow-settings-mismatch",
                     report="blocks")
    prompts = read_report(run, res)["prompts"]
    assert len(prompts) == 2 and all(p["rounds"] == 2 for p in prompts.values()), (res.stdout.str(), prompts)
    assert not any("online" in p for p in prompts.values())  # no --online-tau


def test_online_tau_runs_the_speculative_loop(run):
    res, _ = run("-k", "test_mean_tau", "--tau-floor", "1.0", "--online-tau", report="online")
    prompts = read_report(run, res)["prompts"]
    assert len(prompts) == 2 and all(p["online"]["tau"] >= 1.0 for p in prompts.values()), (res.stdout.str(), prompts)


def test_generation_batch_sets_the_local_batches(run, tmp_path):
    res, _ = run("-k", "test_mean_tau", "--tau-floor", "1.0", "--generation-batch", "1", report="batch1",
                 cache=tmp_path / "cold")
    spans = [s for s in read_report(run, res)["timings"]["spans"]["master"] if s[0] == "generation"]
    assert len(spans) == 2, (res.stdout.str(), spans)  # one batch per prompt; the default 32 takes both in one


def test_drift_budget_safety_and_seed(run):
    """``--drift-budget-safety`` is the gate's factor; ``--drift-budget-seed`` seeds the budget's noise levels (the
    secondary axis), not its amplified drift levels (the main axis, whose fit is the budget)."""
    res, calls = run("-k", "within_budget", "--drift-budget-safety", "1e12", report="safety")
    gate = named(calls, "test_drift_within_budget[")
    assert gate and all(r.outcome == "failed" for r in gate.values()), res.stdout.str()
    assert all("x safety factor 1e+12" in str(r.longrepr) for r in gate.values())
    seed0 = read_report(run, res)["drift_budget"]
    res, _ = run("-k", "within_budget", "--drift-budget-seed", "1", report="seed")
    seed1 = read_report(run, res)["drift_budget"]
    assert seed0["seed"] == 0 and seed1["seed"] == 1, (seed0, seed1)
    noise = [[lv for lv in b["levels"] if lv["kind"] == "noise"] for b in (seed0, seed1)]
    drift = [[lv for lv in b["levels"] if lv["kind"] == "drift"] for b in (seed0, seed1)]
    assert noise[0] and noise[1] != noise[0], "the noise levels measured the same under another seed"
    assert drift[0] and drift[1] == drift[0], "the amplified drift levels depend on the seed"
    assert seed1["budget"] == seed0["budget"], "the budget (the drift axis) moved with the noise seed"


def test_rehash_recomputes_the_target_identity(run, cache_dir):
    run("-k", "teacher_forced", report="identity")
    (memo,) = cache_dir.rglob("target_identity.json")
    before = memo.stat().st_ino
    run("-k", "teacher_forced", report="identity_again")
    assert memo.stat().st_ino == before  # read from the memo
    run("-k", "teacher_forced", "--rehash", report="identity_rehash")
    assert memo.stat().st_ino != before  # computed again and written anew


def test_baseline_rise_tol_sets_the_ceiling(run, tmp_path):
    """Against a baseline whose τ is half this run's, the paired rise (+100 %) exceeds the default 25 % ceiling
    (``test_baseline_tau_ceiling`` fails); ``--baseline-rise-tol 5`` lets it pass."""
    res, _ = run("-k", "test_mean_tau", "--tau-floor", "1.0", report="base_run")
    data = read_report(run, res)
    for row in data["prompts"].values():
        row["tau"] = row["tau"] / 2
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(data))
    args = ("-k", "baseline_tau_ceiling", "--tau-floor", "1.0", "--baseline", str(base))
    res, calls = run(*args, report="ceiling_default")
    ceiling = named(calls, "test_baseline_tau_ceiling")
    assert ceiling and all(r.outcome == "failed" for r in ceiling.values()), res.stdout.str()
    res, calls = run(*args, "--baseline-rise-tol", "5", report="ceiling_loose")
    ceiling = named(calls, "test_baseline_tau_ceiling")
    assert ceiling and all(r.outcome == "passed" for r in ceiling.values()), res.stdout.str()
