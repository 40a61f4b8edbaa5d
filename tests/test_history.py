"""The history of a training run's evaluations (dflash_eval.training_loop.history) and the verdicts across steps
(training_loop.trend; the rule's own tests: tests/test_trend.py): appends from two concurrent writer processes all
land, a writer killed inside its append leaves the history as it was and its lock free, regressions beyond noise
fail, a plateau is noticed, and the trend table and plot are written from the records."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.training_loop.history import CheckpointRecord, History
from dflash_eval.training_loop.trend import paired, plateau, regression
from dflash_eval.training_loop.trend_plot import write_trend_plot
from dflash_eval.training_loop.trend_table import trend_table, write_trend_table

WAIT_S = 120  # every wait on another process is bounded


def record(step: int | None, taus: list[float], *, digest: str = "d1", drafter: str | None = None) -> CheckpointRecord:
    mean = sum(taus) / len(taus)
    return CheckpointRecord(step=step, time="2026-01-01T00:00:00+00:00", drafter=drafter or f"ckpt/step_{step}",
                            fingerprint=f"fp{step}", settings_digest=digest, mean_tau=mean,
                            mean_tau_ci95=[mean - 0.1, mean + 0.1], mean_ddtree={"8": mean + 0.3},
                            mean_ddtree_ci95={"8": [mean + 0.2, mean + 0.4]}, mean_floor=1.5,
                            categories={"all": {"n": len(taus), "tau": mean, "ci95": [mean - 0.1, mean + 0.1],
                                                "ddtree": {}},
                                        "code": {"n": 2, "tau": taus[0], "ci95": [0, 0], "ddtree": {}},
                                        "prose": {"n": 2, "tau": taus[-1], "ci95": [0, 0], "ddtree": {}}},
                            prompts={f"p{i}": t for i, t in enumerate(taus)}, passed=True)


BASE = [3.0, 3.4, 2.8, 3.9, 3.1, 3.6, 2.9, 3.3, 3.5, 3.2]


# ------------------------------------------------------------------------------------------------ verdicts
def steady(steps: list[int], level: float = 1.0) -> list[CheckpointRecord]:
    """Checkpoints of one run at one level, each a little above or below it (the noise between checkpoints)."""
    return [record(s, [t + level + (0.02 if k % 2 else -0.02) + 0.01 * ((i * 7 + k) % 3 - 1)
                       for i, t in enumerate(BASE)]) for k, s in enumerate(steps)]


def test_regression_beyond_noise_fails_and_noise_does_not():
    earlier = steady([100, 200, 300, 400, 500])
    worse = record(600, [t + 0.6 for t in BASE])  # every prompt 0.4 lower than the run's level
    msg = regression(worse, earlier)
    assert msg is not None and msg.startswith("below the run's recent level beyond the noise between checkpoints")
    assert "against the mean of the last 5 checkpoints (step 100 .. step 500; τ " in msg
    noisy = record(600, [t + 1.0 + (0.03 if i % 2 else -0.03) for i, t in enumerate(BASE)])  # the level, noisy
    assert regression(noisy, earlier) is None
    assert regression(earlier[0], []) is None
    d = paired(worse.prompts, earlier[0].prompts)
    assert d.n == len(BASE) and d.mean == pytest.approx(-0.4 + 0.02 + 0.01 * 0, abs=0.011) and d.se >= 0


def test_plateau_notice_over_the_last_k_checkpoints():
    rising = [record(s, [t + 0.3 * k for t in BASE]) for k, s in enumerate((100, 200, 300, 400, 500, 600))]
    rising = [r.judged(rising[:k], 3) for k, r in enumerate(rising)]
    assert all(r.plateau is None for r in rising)  # each step gains on the one before
    flat = steady([100, 200, 300, 400, 500, 600])
    note = plateau(flat[-1], flat[:-1], 3)
    assert note is not None and "last 3 checkpoints" in note and "step 400 .. step 600" in note
    assert plateau(flat[2], flat[:2], 3) is None  # fewer than K + 1 checkpoints: no notice yet


def test_judged_record_compares_only_earlier_steps():
    hist = steady([100, 200, 300, 400, 500, 700])
    mid = record(600, [t + 0.6 for t in BASE]).judged(hist, 4)
    assert mid.regression is not None and "(step 100 .. step 500; " in mid.regression  # not step 700
    late = record(800, [t + 0.6 for t in BASE]).judged(hist, 4)
    assert late.regression is not None and "(step 100 .. step 700; " in late.regression
    assert late.verdict == "fail"


# ------------------------------------------------------------------------------------------------ the file
def test_append_read_round_trip_and_has(tmp_path):
    h = History(tmp_path / "history.jsonl")
    assert h.read() == []
    out = [h.append(r) for r in steady([100, 200, 300, 400], level=0.0)]
    h.append(record(500, [t - 1 for t in BASE]))
    got = h.read()
    assert [r.step for r in got] == [100, 200, 300, 400, 500] and got[:4] == out
    assert got[4].regression is not None  # judged against the earlier steps under the lock
    assert h.has("ckpt/step_100", 100, "d1") and not h.has("ckpt/step_100", 100, "other")
    line = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[4])
    assert line["verdict"] == "fail" and line["prompts"]["p0"] == BASE[0] - 1


def test_a_line_that_is_no_record_is_named(tmp_path):
    p = tmp_path / "history.jsonl"
    History(p).append(record(1, BASE))
    p.write_text(p.read_text() + "{not json\n")
    with pytest.raises(ConfigError, match=r"history\.jsonl:2: not a history record"):
        History(p).read()


#: A record as the first history (f4191ea) wrote it: no pooled τ, CI method, speed-up or verdict parts; its own
#: verdict in ``passed`` and ``reasons``, the trend verdicts, and ``verdict`` for readers.
FIRST_LAYOUT = {"step": 100, "time": "2026-01-01T00:00:00+00:00", "drafter": "ckpt/step_100", "fingerprint": "fp",
                "settings_digest": "d1", "mean_tau": 1.4, "mean_tau_ci95": [1.3, 1.5], "mean_ddtree": {"8": 1.6},
                "mean_ddtree_ci95": {"8": [1.5, 1.7]}, "mean_floor": 1.5,
                "categories": {"all": {"n": 2, "tau": 1.4, "ci95": [1.3, 1.5], "ddtree": {}}},
                "prompts": {"p0": 1.3, "p1": 1.5}, "drift_budget": None, "reference": None, "passed": False,
                "reasons": ["mean τ 1.400 < floor 1.500"], "regression": None, "plateau": "no gain over 4 steps",
                "verdict": "fail"}
#: The parts as the history has written them since it first kept them (362ef51): every key of a part.
PARTS = [{"name": "floors", "passed": False, "outcome": "fail", "reasons": ["mean τ 1.400 < floor 1.500"],
          "notices": []},
         {"name": "plateau", "passed": None, "outcome": "unjudged", "reasons": [],
          "notices": ["no gain over 4 steps"]}]


def test_records_of_earlier_versions_are_read(tmp_path):
    """A year of history reads on: a record of the first layout (no parts: judged from its own verdict and the trend
    verdicts) and one with the parts as they were first kept, beside a new record, and a new one is judged against
    them."""
    p = tmp_path / "history.jsonl"
    with_parts = {**FIRST_LAYOUT, "step": 200, "mean_tau_pooled": 1.41, "mean_ddtree_pooled": {"8": 1.6},
                  "ci_method": "Hall t over prompts", "speedup": None, "parts": PARTS}
    p.write_text("".join(json.dumps(r) + "\n" for r in (FIRST_LAYOUT, with_parts)))
    first, second = History(p).read()
    assert first.parts is None and first.verdict == "fail" and first.mean_tau_pooled is None
    assert first.judgement.reasons == ["mean τ 1.400 < floor 1.500"]
    assert first.judgement.notices == ["no gain over 4 steps"]
    assert second.parts is not None and [q.to_dict() for q in second.parts] == PARTS
    assert second.judgement.reasons == ["mean τ 1.400 < floor 1.500"]
    assert second.judgement.notices == ["no gain over 4 steps"]
    History(p).append(record(300, BASE))
    assert [r.step for r in History(p).read()] == [100, 200, 300]


def test_a_part_no_version_wrote_is_named_with_its_line_and_key(tmp_path):
    p = tmp_path / "history.jsonl"
    bad = {**FIRST_LAYOUT, "parts": [PARTS[0], {k: v for k, v in PARTS[1].items() if k != "notices"}]}
    p.write_text(json.dumps(FIRST_LAYOUT) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ConfigError, match=r"history\.jsonl:2: not a history record: missing key 'parts\[1\]\.notices'"
                                          r".*Move it away to start a new history"):
        History(p).read()


def _writer(path: str, name: str, n: int, go: mp.Event) -> None:
    go.wait(WAIT_S)
    h = History(path)
    for i in range(n):
        h.append(record(i, [t + i * 0.01 for t in BASE], drafter=f"{name}/{i}"))


def test_two_concurrent_writer_processes_lose_nothing(tmp_path):
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    path = str(tmp_path / "history.jsonl")
    procs = [ctx.Process(target=_writer, args=(path, name, 15, go)) for name in ("a", "b")]
    for p in procs:
        p.start()
    go.set()  # both start appending at once
    for p in procs:
        p.join(WAIT_S)
        assert p.exitcode == 0
    got = History(path).read()
    assert len(got) == 30
    for name in ("a", "b"):
        assert [r.drafter for r in got if r.drafter.startswith(name)] == [f"{name}/{i}" for i in range(15)]
    assert all(json.loads(line) for line in Path(path).read_text().splitlines())


def _killed_writer(path: str, inside: mp.Event) -> None:
    """Append, but stop for good halfway through writing the new file (the parent kills this process there)."""
    import time

    from dflash_eval.common import atomic
    from dflash_eval.training_loop import history

    def half_write(target: Path, text: str) -> None:
        with atomic.atomic_path(target) as tmp:
            tmp.write_text(text[: len(text) // 2])
            inside.set()
            while True:
                time.sleep(1)

    history.atomic_write_text = half_write
    History(path).append(record(999, BASE, drafter="killed"))


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_writer_leaves_the_history_whole_and_its_lock_free(tmp_path):
    path = tmp_path / "history.jsonl"
    h = History(path, lock_timeout_s=WAIT_S)
    h.append(record(1, BASE))
    before = path.read_bytes()
    ctx = mp.get_context("spawn")
    inside = ctx.Event()
    p = ctx.Process(target=_killed_writer, args=(str(path), inside))
    p.start()
    assert inside.wait(WAIT_S), "the writer never reached its write"
    os.kill(p.pid, signal.SIGKILL)
    p.join(WAIT_S)
    assert p.exitcode == -signal.SIGKILL
    assert path.read_bytes() == before  # the half-written new file never replaced it
    h.append(record(2, BASE))  # the lock died with its holder
    assert [r.step for r in h.read()] == [1, 2]


# ------------------------------------------------------------------------------------------------ outputs
def test_trend_table_and_plot(tmp_path):
    recs = [record(s, [t + 0.2 * k for t in BASE]) for k, s in enumerate((300, 100, 200))]
    recs[0].reference = {"path": "ref", "fingerprint": "x", "mean_tau": 3.0, "mean_ddtree": {}, "mean_diff": 0.4,
                         "ci95": [0.3, 0.5], "n": 10}
    text = trend_table(recs)
    lines = text.splitlines()
    assert lines[0].startswith("| step | drafter | mean τ") and "reference τ" in lines[0]
    assert [ln.split("|")[1].strip() for ln in lines[2:]] == ["100", "200", "300"]  # step order
    assert "+0.400 [0.30, 0.50]" in lines[4]
    md = write_trend_table(recs, tmp_path / "history.md")
    assert "`d1`" in md.read_text()
    png = write_trend_plot(recs, tmp_path / "history.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_trend_plot([], tmp_path / "none.png") is None


# ------------------------------------------------------------------------------------------------ history.png
def _run_with_everything(tmp_path: Path) -> list[CheckpointRecord]:
    """A history written as a run writes it: a rise, a steady stretch, a floor missed, a drop beyond noise, steady
    again, then two evaluations without a step (released checkpoints evaluated beside the run)."""
    h = History(tmp_path / "history.jsonl")
    wobble = [0.0, 0.03, -0.02, 0.01, -0.03, 0.02, -0.01, 0.03, -0.02, 0.0, 0.02, -0.03]
    for k, s in enumerate(range(100, 1300, 100)):
        lvl = min(k, 1) * 0.3 + wobble[k] - (0.6 if s == 1000 else 0.0)
        r = record(s, [t + lvl + 0.01 * ((i * 7 + k) % 3 - 1) for i, t in enumerate(BASE)])
        if s == 300:
            r.passed, r.reasons = False, ["mean chain τ 3.500 < 3.6"]
        h.append(r, window=3)
    for name in ("released/v1", "released/v2"):
        h.append(record(None, [t + 0.3 for t in BASE], drafter=name), window=3)
    return h.read()


def test_the_plots_delta_is_the_regression_verdicts_own(tmp_path):
    from dflash_eval.training_loop.trend_plot import regression_deltas

    records = _run_with_everything(tmp_path)
    deltas = regression_deltas(records)
    assert deltas[0] is None and deltas[1].upper is None and deltas[2].upper is None  # σ needs 3 earlier ones
    assert sum(r.regression is not None for r in records) == 1  # the drop at step 1000
    for r, d in zip(records, deltas):
        assert (d is not None and d.regression) == (r.regression is not None), (r.step, r.drafter, d)
        if r.regression:  # the numbers the verdict's text names
            assert f"paired Δ {d.delta.mean:+.3f} over {d.delta.n} prompts" in r.regression
            assert f"upper limit {d.upper:+.3f} < 0" in r.regression


def test_steps_and_stepless_evaluations_are_drawn_apart(tmp_path):
    from matplotlib.lines import Line2D

    from dflash_eval.training_loop.trend_plot import trend_figure

    records = _run_with_everything(tmp_path)
    fig = trend_figure(records)
    axes = {ax.get_label(): ax for ax in fig.axes}
    assert set(axes) == {"steps tau", "steps delta", "named tau", "named delta"}
    steps = [float(s) for s in range(100, 1300, 100)]
    mean = next(ln for ln in axes["steps tau"].get_lines() if ln.get_label() == "mean chain τ (macro)")
    assert list(mean.get_xdata()) == steps  # no evaluation without a step on the step axis ("one past the last")
    named = next(ln for ln in axes["named tau"].get_lines() if ln.get_label() == "mean chain τ (macro)")
    assert list(named.get_xdata()) == [0.0, 1.0]
    assert [t.get_text() for t in axes["named delta"].get_xticklabels()] == ["v1", "v2"]

    def marks(ax, label):
        return [list(ln.get_xdata()) for ln in ax.get_lines() if isinstance(ln, Line2D) and ln.get_label() == label]

    tau = axes["steps tau"]
    assert marks(tau, "floor missed") == [[300.0]]
    assert marks(tau, "regression across steps") == [[1000.0]]
    plateau = marks(tau, "plateau (a notice)")
    assert plateau and all(x >= 400 for x in plateau[0])
    markers = {ln.get_label(): ln.get_marker() for ln in tau.get_lines()}
    assert len({markers["floor missed"], markers["regression across steps"], markers["plateau (a notice)"]}) == 3
    # the legend sits outside every panel
    fig.draw_without_rendering()  # the layout: where the legend and the panels are
    assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1
    box = fig.legends[0].get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)
    png = write_trend_plot(records, tmp_path / "history.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tracker_scalars_carry_the_verdict(tmp_path):
    import dflash_eval

    records = _run_with_everything(tmp_path)
    names = set(dflash_eval.TRACKER_SCALARS)
    for r in records:
        got = dflash_eval.tracker_scalars(r)
        generic = {k if not k.startswith("tau/ddtree-") else k.replace("-8", "-<N>", 1) for k in got}
        generic = {"tau/category/<name>" if k.startswith("tau/category/") else k for k in generic}
        assert generic <= names, generic - names  # every logged name is documented
        assert got["tau/mean"] == r.mean_tau and got["tau/floor"] == 1.5
        assert (got["tau/mean_ci95_low"], got["tau/mean_ci95_high"]) == tuple(r.mean_tau_ci95)
        assert got["verdict/regression"] == (1.0 if r.regression else 0.0)
        assert got["verdict/plateau"] == (1.0 if r.plateau else 0.0)
        assert got["verdict/floor_missed"] == (0.0 if r.passed else 1.0)
        assert got["verdict/pass"] == (1.0 if r.verdict == "pass" else 0.0)
    unjudged = record(5, BASE)
    unjudged.passed, unjudged.mean_floor = None, None
    got = dflash_eval.tracker_scalars(unjudged)
    assert "verdict/pass" not in got and "verdict/floor_missed" not in got and "tau/floor" not in got
    assert got["verdict/regression"] == 0.0
