"""Verdicts a CI gate can trust, end to end on the bundled target, drafter and floors (pytester, in-process):

- subsets of the bundled prompts pass with the bundled drafter, and a degraded drafter fails the mean;
- ``--tau-floor`` is the floor of the mean (one prompt below it does not fail the run);
- ``--baseline``: a degraded drafter fails the drop test, an inflated τ trips the ceiling test;
- floors recorded with other settings, and an invalid target config.json, are one usage error (exit 4) naming the
  file and both values; ``dflash-eval gate`` exits 2 with the same message;
- update modes report the τ tests as skipped ("recorded"), never as passed.

Run: ``pytest tests/test_verdicts_suite.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_eval.cli.main import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"
FLOORS = ROOT / "golden" / "tau_floors.json"
SUBSET = "humaneval:3"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, target_modules_imported):
    d = tmp_path_factory.mktemp("verdicts")
    degraded = d / "degraded_drafter"
    shutil.copytree(DRAFTER, degraded)
    sd = load_file(str(degraded / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    sd = {k: (v + 0.5 * v.std() * torch.randn(v.shape, generator=g) if k.startswith("layers.") and v.dim() == 2
              else v) for k, v in sd.items()}
    save_file(sd, str(degraded / "model.safetensors"))
    return {"root": d, "cache": d / "cache", "degraded": degraded}


@pytest.fixture
def suite(pytester, dirs, suite_checkout):
    suite_checkout()

    def run(*args: str, drafter: Path = DRAFTER, target: Path = TARGET, report: str = "r"):
        res = pytester.runpytest_inprocess(
            "tests_eval", "-q", "-k", "tau", "--target-model", str(target), "--drafter", str(drafter),
            "--prompts", SUBSET, "--cache-dir", str(dirs["cache"]), "--floors-file", str(FLOORS),
            "--golden-dir", str(dirs["root"] / "golden"), "--report-dir", str(dirs["root"] / report), *args)
        return res, dirs["root"] / report / "eval.json"

    return run


def outcomes(res) -> dict[str, str]:
    return {r.nodeid.split("::")[-1]: r.outcome for r in res.reprec.getreports("pytest_runtest_logreport")
            if r.when == "call" or r.outcome != "passed"}


def test_subsets_pass_with_the_bundled_drafter_and_a_degraded_one_fails(suite, dirs):
    res, ej = suite(report="good")
    assert res.ret == 0, res.stdout.str()
    data = json.loads(ej.read_text())
    floors = json.loads(FLOORS.read_text())["chain"]
    want = sum(floors[p] for p in data["prompts"]) / len(data["prompts"])
    assert data["mean_floor"] == pytest.approx(want)  # the mean floor follows the selection

    res, _ = suite(drafter=dirs["degraded"], report="bad")
    oc = outcomes(res)
    assert res.ret == 1 and oc["test_mean_tau"] == "failed", res.stdout.str()
    assert "mean chain τ" in res.stdout.str() and "< floor" in res.stdout.str()


def test_tau_floor_is_the_mean_floor(suite):
    res, ej = suite("--tau-floor", "2.0", "--tau-floor-prompt", "7.5", report="meanonly")
    oc = outcomes(res)
    assert oc["test_mean_tau"] == "passed"  # mean ~4-5 >= 2.0 although every prompt misses 7.5
    assert all(v == "failed" for k, v in oc.items() if k.startswith("test_tau[")), oc


def test_baseline_drop_and_ceiling(suite, dirs):
    res, good = suite(report="base")
    assert res.ret == 0, res.stdout.str()
    res, _ = suite("--baseline", str(good), drafter=dirs["degraded"], report="dropped")
    oc = outcomes(res)
    assert oc["test_baseline_tau_drop"] == "failed" and oc["test_baseline_tau_ceiling"] == "passed", oc
    assert "τ dropped against the baseline" in res.stdout.str()

    low = json.loads(good.read_text())
    for r in low["prompts"].values():
        r["tau"] /= 2  # the same run now looks like a 100 % jump
    inflated = dirs["root"] / "low_baseline.json"
    inflated.write_text(json.dumps(low))
    res, ej = suite("--baseline", str(inflated), report="rose")
    oc = outcomes(res)
    assert oc["test_baseline_tau_ceiling"] == "failed" and oc["test_baseline_tau_drop"] == "passed", oc
    assert "future-token leak" in res.stdout.str()
    data = json.loads(ej.read_text())
    assert data["baseline"]["rel_change"] == pytest.approx(1.0) and data["baseline"]["rise_passed"] is False
    assert all(r["baseline_tau"] == pytest.approx(r["tau"] / 2) for r in data["prompts"].values())
    assert "baseline τ" in res.stdout.str() and "Δτ" in res.stdout.str()


def test_settings_mismatch_is_one_usage_error_and_gate_exit_2(suite, dirs, capsys):
    res, _ = suite("--max-new-tokens", "64", report="mismatch")
    out = res.stdout.str() + res.stderr.str()
    assert res.ret == 4, out
    assert "max_new_tokens (--max-new-tokens): recorded 128, this run 64" in out and str(FLOORS) in out
    assert not res.reprec.getreports("pytest_runtest_logreport"), "tests ran despite a usage error"
    with pytest.warns(UserWarning, match="used anyway: --allow-settings-mismatch"):
        res, _ = suite("--max-new-tokens", "64", "--allow-settings-mismatch", report="allowed")
    assert res.ret in (0, 1) and res.reprec.getreports("pytest_runtest_logreport"), res.stdout.str()

    rc = cli_main(["gate", "--drafter", str(DRAFTER), "--target-model", str(TARGET), "--prompts", SUBSET,
                   "--max-new-tokens", "64", "--floors-file", str(FLOORS), "--cache-dir", str(dirs["cache"]),
                   "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "recorded 128, this run 64" in err


def _target_with_broken_config(bad: Path) -> Path:
    """The bundled target's files linked into ``bad``, except a config.json that is not valid JSON."""
    bad.mkdir(exist_ok=True)
    for f in TARGET.iterdir():
        if f.name != "config.json" and not (bad / f.name).exists():
            (bad / f.name).symlink_to(f)
    (bad / "config.json").write_text('{"num_hidden_layers": 8,,}')
    return bad


def test_invalid_target_config_is_one_message(suite, dirs, capsys):
    bad = _target_with_broken_config(dirs["root"] / "bad_target")
    res, _ = suite(target=bad, report="badcfg")
    out = res.stdout.str() + res.stderr.str()
    assert res.ret == 4 and f"{bad}/config.json: not valid JSON" in out, out
    assert "Traceback" not in out and out.count("not valid JSON") == 1

    rc = cli_main(["gate", "--drafter", str(DRAFTER), "--target-model", str(bad), "--prompts", SUBSET, "--quiet",
                   "--cache-dir", str(dirs["cache"])])
    err = capsys.readouterr().err
    assert rc == 2 and f"{bad}/config.json: not valid JSON" in err


def test_update_modes_are_skipped_as_recorded(suite, dirs):
    floors = dirs["root"] / "floors.json"
    res, _ = suite("--update-tau-floors", "--floors-file", str(floors), report="upd")
    oc = outcomes(res)
    assert res.ret == 0 and floors.is_file()
    tau = {k: v for k, v in oc.items() if "baseline" not in k}
    assert tau and set(tau.values()) == {"skipped"}, oc
    skips = [r for r in res.reprec.getreports("pytest_runtest_logreport") if r.skipped]
    assert all("recorded" in str(r.longrepr) or "--baseline" in str(r.longrepr) for r in skips)


def test_bad_input_under_xdist_is_one_usage_error_before_any_test(suite, dirs):
    """Under -n 2 the controller checks the inputs while its workers start (the check imports torch): still one
    usage error, and no test runs."""
    bad = _target_with_broken_config(dirs["root"] / "bad_target_xdist")
    res, _ = suite("-n", "2", target=bad, report="badcfg_xdist")
    out = res.stdout.str() + res.stderr.str()
    assert res.ret == 4 and f"{bad}/config.json: not valid JSON" in out, out
    assert not res.reprec.getreports("pytest_runtest_logreport"), "tests ran despite a usage error"
