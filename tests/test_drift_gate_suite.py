"""The drift gate end to end on the bundled target and drafter (pytester, in-process), with kernel drift injected
through the fault-injection backend (``--kernel-fault``):

- drift under the drafter's budget passes ``test_drift_within_budget``, drift over it fails it, and the failure
  says the drift matters for τ; drift x safety inside the budget's CI is an inconclusive skip until
  ``--drift-budget-conclusive`` decides it; eval.json's ``drift_gate`` rows agree with the verdicts;
- the regression checks (``test_drift_regression``, ``test_fingerprint_regression``) fail on changed numerics with a
  message saying so and giving the τ impact (within budget / over budget), consistent with the gate;
- the budget is measured once and read from the cache by later runs;
- a kernel fault moves the golden fingerprint (the fingerprint check catches a kernel change), and a faulty run
  never records a golden.

Run: ``pytest tests/test_drift_gate_suite.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"
pytestmark = pytest.mark.slow
SELECT = "within_budget or drift_regression"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, target_modules_imported):
    d = tmp_path_factory.mktemp("drift_gate")
    return {"root": d, "cache": d / "cache"}


@pytest.fixture
def suite(pytester, dirs, suite_checkout):
    suite_checkout()

    def run(*args: str, report: str, golden: Path | None = None):
        res = pytester.runpytest_inprocess(
            "tests_eval", "-q", "--target-model", str(TARGET), "--drafter", str(DRAFTER), "--prompts", "humaneval:2",
            "--cache-dir", str(dirs["cache"]), "--golden-dir", str(golden or ROOT / "golden"),
            "--floors-file", str(ROOT / "golden" / "tau_floors.json"), "--report-dir", str(dirs["root"] / report),
            *args)
        return res, json.loads((dirs["root"] / report / "eval.json").read_text())

    def faulty(fault: str, *args: str, report: str):
        # The fault changes τ, so the floors (recorded without it) apply only with --allow-settings-mismatch.
        with pytest.warns(UserWarning, match="--allow-settings-mismatch"):
            return run("-k", SELECT, "--kernel-fault", fault, "--allow-settings-mismatch", *args, report=report)

    return run, faulty


def reports(res, name: str) -> dict[str, object]:
    return {r.nodeid.split("::")[-1]: r for r in res.reprec.getreports("pytest_runtest_logreport")
            if (r.when == "call" or r.outcome != "passed") and r.nodeid.split("::")[-1].startswith(name)}


def test_gate_passes_under_the_budget_and_fails_over_it(suite, dirs):
    _, faulty = suite
    res, data = faulty("noise:1e-3", report="under")
    gate = reports(res, "test_drift_within_budget[")
    assert res.ret == 0 and gate and all(r.outcome == "passed" for r in gate.values()), res.stdout.str()
    assert {g["comparison"] for g in data["drift_gate"]} == {"torch+noise=0.001-vs-torch"}
    b = data["drift_budget"]
    assert b["budget"] > 0 and b["base"] == "torch/float32" and b["n_prompts"] == 2
    assert all(g["passed"] and g["max_rel_err"] * b["safety"] <= b["ci"][0] for g in data["drift_gate"])
    assert (dirs["root"] / "under" / "drift_budget.png").is_file()
    out = res.stdout.str()
    assert "drift gate: measured drift against the drafter's drift budget" in out and "drift budget of drafter" in out

    res, data = faulty("noise:3", report="over")
    gate = reports(res, "test_drift_within_budget[")
    assert res.ret == 1 and gate and all(r.outcome == "failed" for r in gate.values()), res.stdout.str()
    over = data["drift_budget"]  # read along this run's own drift direction (the faulty kernel against the clean)
    assert over["axis"] == "drift" and over["direction"]["comparison"] == "torch+noise=3-vs-torch"
    assert all(g["outcome"] == "fail" and g["max_rel_err"] * over["safety"] > over["ci"][1]
               for g in data["drift_gate"])
    msg = str(next(iter(gate.values())).longrepr)
    assert "drift over budget (the drift matters for τ)" in msg and f"x safety factor {b['safety']:g}" in msg
    regress = reports(res, "test_drift_regression[")
    assert regress and all(r.outcome == "failed" for r in regress.values())
    assert all("numerics regression" in str(r.longrepr) and "τ impact: over budget" in str(r.longrepr)
               for r in regress.values())
    def iso(budget: dict) -> list:
        return [lv for lv in budget["levels"] if lv["axis"] == "isotropic"]
    assert iso(over) == iso(b) and iso(b)  # the same isotropic levels, read from the cache
    produced = [json.loads(x) for x in (dirs["cache"] / "v1" / "produce.log").read_text().splitlines()]
    drift_levels = len(over["levels"]) - len(iso(over))
    # one entry per level, once; the drift levels anew for the other direction
    assert sum(1 for x in produced if x["kind"] == "drift_budget") == len(b["levels"]) + drift_levels


def test_gate_inside_the_budgets_ci_is_inconclusive_until_asked_to_decide(suite):
    """Drift x safety inside the budget's CI skips the gate as inconclusive, naming the numbers and what would decide
    it; --drift-budget-conclusive decides it on the estimate. The safety factor is applied on read, so it places the
    worst layer's drift x safety inside the CI of the budget the first run measured (nothing is measured again)."""
    _, faulty = suite
    _, data = faulty("noise:0.1", report="ci_first")
    b = data["drift_budget"]
    lo, hi = b["ci"]
    worst = max(data["drift_gate"], key=lambda g: g["max_rel_err"])
    target = math.sqrt(lo * hi) if hi is not None else 2 * b["budget"]  # strictly inside the CI
    safety = f"{target / worst['max_rel_err']:.6g}"
    name = f"test_drift_within_budget[{worst['comparison']}-L{worst['layer']}]"
    res, data = faulty("noise:0.1", "--drift-budget-safety", safety, report="ci_inside")
    gate = reports(res, "test_drift_within_budget[")
    assert gate[name].outcome == "skipped", res.stdout.str()
    msg = str(gate[name].longrepr)
    assert "drift gate inconclusive" in msg and "inside the budget's CI" in msg, msg
    assert "--drift-budget-min-prompts" in msg and "--drift-budget-conclusive" in msg, msg
    row = next(g for g in data["drift_gate"] if g["layer"] == worst["layer"])
    assert row["outcome"] == "inconclusive" and row["budget_ci"][0] < row["max_rel_err"] * row["safety"]
    res, data = faulty("noise:0.1", "--drift-budget-safety", safety, "--drift-budget-conclusive", report="ci_decided")
    gate = reports(res, "test_drift_within_budget[")
    row = next(g for g in data["drift_gate"] if g["layer"] == worst["layer"])
    decided = "pass" if row["max_rel_err"] * row["safety"] <= row["budget"] else "fail"
    assert row["outcome"] == decided and row["decided_on"] == "estimate", row
    assert gate[name].outcome == {"pass": "passed", "fail": "failed"}[decided], res.stdout.str()
    assert data["drift_budget"]["levels"] == b["levels"]  # the same measured levels, judged again


def test_regression_failure_says_the_drift_is_within_budget(suite):
    _, faulty = suite
    # numerics changed beyond a tight regression tolerance, but far less than the budget (lenient τ tolerance)
    res, data = faulty("noise:0.01", "--drift-rel-tol", "1e-3", "--drift-budget-tol", "1.0", report="mid")
    gate = reports(res, "test_drift_within_budget[")
    regress = reports(res, "test_drift_regression[")
    assert all(r.outcome == "passed" for r in gate.values()) and gate, res.stdout.str()
    failed = [r for r in regress.values() if r.outcome == "failed"]
    assert failed and all("τ impact: within budget" in str(r.longrepr) for r in failed), res.stdout.str()
    assert all(g["passed"] for g in data["drift_gate"])


def test_fingerprint_regression_names_the_tau_impact(suite, dirs):
    run, _ = suite
    golden = dirs["root"] / "golden_changed"
    shutil.copytree(ROOT / "golden", golden)
    path = golden / "fingerprints" / "cpu-torch-float32.json"
    fp = json.loads(path.read_text())
    for stats in fp["layers"].values():  # a golden from before sketches: judged on its statistics alone
        stats.pop("sketch", None)
    fp["layers"]["0"]["mean"] += 0.5  # not read by the drafter (target layers 1, 3, 5)
    fp["layers"]["3"]["rms"] *= 2.0  # features at least 50 % off: over any budget
    fp["layers"]["5"]["rms"] *= 1.001  # a small change: within the budget as far as the fingerprint tells
    path.write_text(json.dumps(fp))
    res, _ = run("-k", "fingerprint", golden=golden, report="fingerprint")
    fps = reports(res, "test_fingerprint_regression[")
    assert {k for k, r in fps.items() if r.outcome == "failed"} == {f"test_fingerprint_regression[L{i}]"
                                                                   for i in (0, 3, 5)}, res.stdout.str()
    text = {k: str(r.longrepr) for k, r in fps.items()}
    assert all("the numerics changed since the golden was recorded" in text[f"test_fingerprint_regression[L{i}]"]
               for i in (0, 3, 5))
    assert "τ impact: none directly" in text["test_fingerprint_regression[L0]"]
    assert "τ impact: over budget (at least 5.00e-01" in text["test_fingerprint_regression[L3]"]
    assert "τ impact: within budget as far as this check can tell" in text["test_fingerprint_regression[L5]"]



def test_kernel_fault_moves_the_golden_fingerprint(suite, dirs):
    """The fingerprint check catches a kernel change: a faulty delta-rule kernel moves the fingerprint against the
    clean golden, the message names the fault, the layers that moved and the sketch's estimate of the feature change
    with its τ impact; a small fault is within the budget, a large one (noise:1, whose estimate x safety is past the
    budget's CI on the 2 prompts) over it."""
    run, _ = suite
    est = {}
    for fault, report in (("noise:1e-3", "fp_small"), ("noise:1", "fp_large")):
        with pytest.warns(UserWarning, match="--allow-settings-mismatch"):
            res, data = run("-k", "fingerprint", "--kernel-fault", fault, "--allow-settings-mismatch", report=report)
        assert data["fingerprint"]["kernel_fault"] == fault and data["fingerprint"]["backend"] == "torch"
        fps = reports(res, "test_fingerprint_regression[")
        assert fps and all(r.outcome == "failed" for r in fps.values()), res.stdout.str()
        text = str(fps["test_fingerprint_regression[L3]"].longrepr)
        assert f"--kernel-fault {fault}" in text and "cpu-torch-float32.json" in text
        assert "estimated relative change of the features" in text and "layers that moved: [0, 1, 2" in text
        est[fault] = float(text.split("estimated relative change of the features ")[1].split()[0])
        assert ("τ impact: within budget" if fault == "noise:1e-3" else "τ impact: over budget") in text, text
    # the sketch's estimate tracks the injected error (the features' true change is measured by the drift tests)
    assert 1e-4 < est["noise:1e-3"] < 1e-2 < est["noise:1"] < 1.0, est


def test_a_faulty_run_never_records_a_golden(suite, pytester, dirs):
    golden = dirs["root"] / "golden_untouched"
    shutil.copytree(ROOT / "golden", golden)
    before = {p: p.read_bytes() for p in golden.rglob("*.json")}
    res = pytester.runpytest_inprocess("tests_eval", "-q", "-k", "fingerprint", "--target-model", str(TARGET),
                                       "--drafter", str(DRAFTER), "--golden-dir", str(golden), "--kernel-fault",
                                       "noise:0.1", "--update-fingerprints", "--cache-dir", str(dirs["cache"]))
    assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stdout.str()
    assert "golden records are never written from faulty kernels" in res.stderr.str() + res.stdout.str()
    assert {p: p.read_bytes() for p in golden.rglob("*.json")} == before
