"""``dflash-eval gate DIR`` over a training run's checkpoints: evaluated in step order (steps from their names),
those already in the history skipped on the next run, a new one alone evaluated after it; the history's trend
table and plot written beside it; the reference drafter's τ and the paired difference in the history, the trend
table and the gate table; ``--latest``: the newest checkpoint alone decides the exit status, earlier failures
reported; floors that judge nothing said so; TensorBoard and W&B logging where their libraries are installed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from dflash_eval.cli.main import main
from dflash_eval.training_loop.history import History

ROOT = Path(__file__).resolve().parents[1]
DRAFTER, SECOND = ROOT / "fixtures" / "drafter", ROOT / "fixtures" / "second_drafter"

pytestmark = pytest.mark.slow  # evaluates checkpoints on the bundled target


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate-cache")


def gate(run: Path, cache: Path, reports: Path, *extra: str, floor: str = "1.0") -> int:
    return main(["gate", str(run), "--target-model", str(ROOT / "fixtures" / "target"), "--prompts",
                 str(ROOT / "fixtures" / "prompts.jsonl"), "--num-prompts", "3", "--max-new-tokens", "24",
                 "--tau-floor", floor, "--cache-dir", str(cache), "--report-dir", str(reports), "--quiet", *extra])


def test_gate_dir_in_step_order_skipping_recorded_ones(tmp_path, cache, capsys):
    run = tmp_path / "run"
    for name, src in (("step_300", DRAFTER), ("checkpoint-100", SECOND), ("global_step200", DRAFTER)):
        shutil.copytree(src, run / name)
    (run / "notes.txt").write_text("not a checkpoint")
    reports = tmp_path / "reports"
    assert gate(run, cache, reports) == 0
    hist = History(reports / "history.jsonl")
    assert [(r.step, Path(r.drafter).name) for r in hist.read()] == [
        (100, "checkpoint-100"), (200, "global_step200"), (300, "step_300")]
    assert (reports / "history.md").is_file() and (reports / "history.png").is_file()
    gate_json = json.loads((reports / "gate.json").read_text())
    assert [Path(c["drafter"]).name for c in gate_json["checkpoints"]] == ["checkpoint-100", "global_step200",
                                                                           "step_300"]
    assert [c["step"] for c in gate_json["checkpoints"]] == [100, 200, 300]
    # --tau-floor 1.0 passes any drafter (τ >= 1): the verdict says so rather than passing without a word
    assert all("judge nothing" in c["notices"][0] for c in gate_json["checkpoints"])
    assert "### Notices" in (reports / "gate.md").read_text()
    capsys.readouterr()
    assert gate(run, cache, reports) == 0  # nothing new
    assert "no new checkpoint" in capsys.readouterr().out
    assert len(hist.read()) == 3
    shutil.copytree(DRAFTER, run / "step_400")
    assert gate(run, cache, reports) == 0
    assert [r.step for r in hist.read()] == [100, 200, 300, 400]
    assert [Path(c["drafter"]).name for c in json.loads((reports / "gate.json").read_text())["checkpoints"]] == [
        "step_400"]


def test_a_regression_beyond_noise_fails_the_gate(tmp_path, cache):
    run = tmp_path / "run"
    for step in (1, 2, 3):  # a regression is judged from the fourth checkpoint: σ needs two differences
        shutil.copytree(DRAFTER, run / f"step_{step}")
    shutil.copytree(SECOND, run / "step_4")  # the weaker drafter after the stronger ones
    reports = tmp_path / "reports"
    assert gate(run, cache, reports) == 1
    records = History(reports / "history.jsonl").read()
    assert [r.regression for r in records[:3]] == [None, None, None]
    last = records[-1]
    assert last.step == 4 and last.regression and "(step 1 .. step 3; τ " in last.regression
    assert last.verdict == "fail"
    assert "below the run's recent level beyond the noise between checkpoints" in (reports / "history.md").read_text()


def test_reference_drafter_tau_beside_each_checkpoint(tmp_path, cache):
    run = tmp_path / "run"
    shutil.copytree(DRAFTER, run / "step_5")
    reports = tmp_path / "reports"
    assert gate(run, cache, reports, "--reference-drafter", str(SECOND)) == 0
    rec = History(reports / "history.jsonl").read()[-1]
    ref = rec.reference
    assert ref is not None and Path(ref["path"]) == SECOND and ref["n"] == 3
    # the reference's own τ, evaluated as a drafter on the same prompts, and the paired difference
    alone = tmp_path / "alone"
    shutil.copytree(SECOND, alone / "step_1")
    assert gate(alone, cache, tmp_path / "alone-reports") == 0
    ref_alone = History(tmp_path / "alone-reports" / "history.jsonl").read()[-1]
    assert ref["mean_tau"] == ref_alone.mean_tau
    assert ref["mean_diff"] == pytest.approx(rec.mean_tau - ref_alone.mean_tau, abs=1e-12)
    assert ref["mean_diff"] > 0 and ref["ci95"][0] <= ref["mean_diff"] <= ref["ci95"][1]
    assert "reference τ" in (reports / "history.md").read_text()
    # the gate table: the reference's τ and the paired Δ with its CI, as in history.md
    (row,) = json.loads((reports / "gate.json").read_text())["checkpoints"]
    assert row["reference"] == ref
    md = (reports / "gate.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| checkpoint"))
    assert "| reference τ | Δ vs reference (95 % CI (paired Hall t over prompts)) |" in head
    cells = next(line for line in md.splitlines() if line.startswith("| step_5")).split(" | ")
    col = head.split(" | ").index("reference τ")
    assert cells[col] == f"{ref['mean_tau']:.3f}"
    assert cells[col + 1] == f"{ref['mean_diff']:+.3f} [{ref['ci95'][0]:+.3f}, {ref['ci95'][1]:+.3f}]"
    assert "reference τ" not in (tmp_path / "alone-reports" / "gate.md").read_text()  # only with the option


def test_latest_gates_the_newest_checkpoint_only(tmp_path, cache):
    """The weaker drafter at step 1 misses a floor of 3.0 the bundled one meets: the whole run fails the gate,
    --latest only when its newest checkpoint fails."""
    run = tmp_path / "run"
    shutil.copytree(SECOND, run / "step_1")
    shutil.copytree(DRAFTER, run / "step_2")
    assert gate(run, cache, tmp_path / "all", floor="3.0") == 1  # every checkpoint gates
    reports = tmp_path / "reports"
    assert gate(run, cache, reports, "--latest", floor="3.0") == 0
    data = json.loads((reports / "gate.json").read_text())
    assert data["passed"] is True
    assert [(c["step"], c["passed"], c["gating"]) for c in data["checkpoints"]] == [(1, False, False), (2, True, True)]
    md = (reports / "gate.md").read_text()
    assert "1 earlier failure(s) reported, not gating" in md and "(earlier checkpoint: reported, not gating)" in md
    # nothing new: the newest is judged from its history record; the earlier failure is named, not failing
    assert gate(run, cache, reports, "--latest", floor="3.0") == 0
    (row,) = json.loads((reports / "gate.json").read_text())["checkpoints"]
    assert row["step"] == 2 and row["passed"] and row["gating"]
    assert any("judged from its history record" in n for n in row["notices"])
    assert any("1 earlier checkpoint(s) of the history failed (step 1;" in n for n in row["notices"])
    assert len(History(reports / "history.jsonl").read()) == 2  # not evaluated again
    # a newer checkpoint that misses the floor fails the gate
    shutil.copytree(SECOND, run / "step_3")
    assert gate(run, cache, reports, "--latest", floor="3.0") == 1
    (row,) = json.loads((reports / "gate.json").read_text())["checkpoints"]
    assert row["step"] == 3 and not row["passed"] and row["gating"]
    assert main(["gate", "--drafter", str(DRAFTER), "--latest", "--target-model", str(ROOT / "fixtures" / "target"),
                 "--tau-floor", "3.0", "--cache-dir", str(cache), "--report-dir", str(tmp_path / "d"),
                 "--quiet"]) == 2  # --latest needs a training run


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_event_files(tmp_path, cache):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    shutil.copytree(DRAFTER, run / "step_7")
    assert gate(run, cache, tmp_path / "reports", "--tensorboard", str(tmp_path / "tb")) == 0
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    rec = History(tmp_path / "reports" / "history.jsonl").read()[-1]
    (ev,) = acc.Scalars("tau/mean")
    assert ev.step == 7 and ev.value == pytest.approx(rec.mean_tau, rel=1e-6)
    tags = acc.Tags()["scalars"]
    assert "tau/position/1" in tags and "tau/ddtree-8" in tags
    # the verdict as numbers to alert on, the floor and the CI bounds
    want = {"verdict/pass": 1.0, "verdict/floor_missed": 0.0, "verdict/regression": 0.0, "verdict/plateau": 0.0,
            "tau/floor": 1.0, "tau/mean_ci95_low": rec.mean_tau_ci95[0], "tau/mean_ci95_high": rec.mean_tau_ci95[1]}
    for tag, value in want.items():
        (ev,) = acc.Scalars(tag)
        assert ev.step == 7 and ev.value == pytest.approx(value, rel=1e-6), tag


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_offline_run(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    shutil.copytree(DRAFTER, run / "step_9")
    assert gate(run, cache, tmp_path / "reports", "--wandb", str(tmp_path / "wb")) == 0
    files = list((tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 0
