"""Progress of long stages: the events (counts, rate, ETA), throttling, the plugin's reporter (one process, and the
xdist controller summing its workers' files), and the lines a run prints through pytest's terminal reporter:
past output capture, silent with ``-q``, and from the controller under ``-n 2``.

Run: ``pytest tests/test_progress.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_eval.common.progress import Meter, Progress, ProgressEvent, throttled
from dflash_eval.pytest_plugin.progress_reporter import ProgressReporter, WorkerFileSink, aggregate, interval

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "dflash_eval.pytest_plugin"


def test_event_line_has_counts_rate_and_eta():
    ev = ProgressEvent("reference completions", 3, 12, 384, 30.0)
    assert ev.eta_s == pytest.approx(90.0) and not ev.finished
    assert str(ev) == ("[dflash-eval] reference completions: 3/12 prompts, 384 tokens, 12.8 tokens/s, 30.0 s, "
                       "ETA 1 min 30 s")
    assert str(ProgressEvent("τ drafting", 0, 10, unit="positions")).endswith("0/10 positions, 0 tokens, 0.0 s, ETA ?")
    done = ProgressEvent("x", 4, 4, 8, 2.0)
    assert done.finished and str(done).endswith(", done") and ProgressEvent.from_json(done.to_json()) == done


def test_progress_reports_start_and_every_step():
    got: list[ProgressEvent] = []
    p = Progress("stage", 3, got.append)
    p.step(10)
    p.wrap(lambda: None, lambda: 5)()
    assert [(e.done, e.tokens) for e in got] == [(0, 0), (1, 10), (2, 15)] and got[-1].total == 3
    Progress("silent", 2, None).step(1)  # no sink: nothing to call


def test_a_stage_counted_in_tokens_reports_where_it_stands_and_extrapolates_tokens():
    got: list[ProgressEvent] = []
    p = Progress("τ drafting", 100, got.append, unit="positions")
    p.reach(30)
    p.reach(30)  # no move: no event
    p.reach(250)  # capped at the total
    assert [(e.done, e.tokens) for e in got] == [(0, 0), (30, 30), (100, 100)] and got[-1].finished
    assert ProgressEvent("τ drafting", 30, 100, 30, 3.0, "positions").eta_s == pytest.approx(7.0)


def test_throttled_keeps_first_last_and_one_per_interval(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("dflash_eval.common.progress.time.monotonic", lambda: clock[0])
    lines: list[str] = []
    sink = throttled(lines.append, 10.0)
    for done, t in [(0, 0), (1, 1), (2, 5), (3, 11), (4, 12), (5, 12.5)]:
        clock[0] = t
        sink(ProgressEvent("s", done, 5))
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == ["0/5", "3/5", "5/5"]


def _reporter(every_s: float = 0.0) -> ProgressReporter:
    config = SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=lambda name: None))
    return ProgressReporter(config, every_s=every_s)  # type: ignore[arg-type]


def test_reporter_sums_workers_and_prints_each_state_once():
    r = _reporter()
    r.update(ProgressEvent("features", 0, 4), "gw0")
    r.update(ProgressEvent("features", 0, 4), "gw1")  # the same state from the other worker: no new line
    r.update(ProgressEvent("features", 1, 4, 100, 2.0), "gw0")
    r.update(ProgressEvent("features", 1, 4, 100, 2.0), "gw0")  # a file read twice
    r.update(ProgressEvent("features", 2, 4, 90, 3.0), "gw1")
    r.update(ProgressEvent("features", 2, 4, 200, 4.0), "gw0")
    assert [line.split(": ")[1] for line in r.lines] == [
        "0/4 prompts, 0 tokens, 0.0 s, ETA ?", "1/4 prompts, 100 tokens, 50.0 tokens/s, 2.0 s, ETA 6.0 s",
        "3/4 prompts, 190 tokens, 63.3 tokens/s, 3.0 s, ETA 1.0 s",
        "4/4 prompts, 290 tokens, 72.5 tokens/s, 4.0 s, done"]
    # every process computing the whole stage for itself (τ under --cache-only) counts once, not twice
    assert aggregate([ProgressEvent("t", 5, 5), ProgressEvent("t", 5, 5)]).done == 5


def test_reporter_interval_and_quiet_settings(monkeypatch):
    r = _reporter(every_s=100.0)
    for done in range(5):
        r.update(ProgressEvent("s", done, 4 if done == 4 else 10))
    assert len(r.lines) == 2  # the first, then nothing for 100 s but the end (a new total: a new production)
    monkeypatch.setenv("DFLASH_EVAL_PROGRESS_EVERY", "7")
    assert interval(True) == 7.0
    monkeypatch.delenv("DFLASH_EVAL_PROGRESS_EVERY")
    assert interval(True) == 2.0 and interval(False) == 30.0


def test_worker_files_are_polled_by_the_controller(tmp_path):
    r = _reporter()
    r._dir = tmp_path  # what worker_dir() hands to xdist workers (without starting the polling thread here)
    a, b = WorkerFileSink(str(tmp_path), "gw0"), WorkerFileSink(str(tmp_path), "gw1")
    a(ProgressEvent("completions", 0, 2))
    b(ProgressEvent("completions", 0, 2))
    r.poll()
    a(ProgressEvent("completions", 1, 2, 64, 1.0))
    b(ProgressEvent("completions", 1, 2, 64, 2.0))
    r.poll()
    r.poll()
    assert json.loads((tmp_path / "gw0.json").read_text())["completions"]["done"] == 1
    assert [line.split(": ")[1].split(",")[0] for line in r.lines] == ["0/2 prompts", "1/2 prompts", "2/2 prompts"]
    r.close()
    assert not tmp_path.exists()


PROGRESS_TEST = '''
from dflash_eval.common.progress import Progress

def test_long_stage(eval_session):
    p = Progress("synthetic stage", 3, eval_session.inputs.progress)
    for _ in range(3):
        p.step(7)
'''


@pytest.fixture
def progress_run(pytester, monkeypatch, tmp_path):
    for k in [k for k in os.environ if k.startswith("DFLASH_EVAL_")]:
        monkeypatch.delenv(k)
    pytester.makepyfile(test_stage=PROGRESS_TEST)
    pytester.makeini("[pytest]\n")
    common = ["-p", PLUGIN, "-p", "no:cacheprovider", f"--target-model={ROOT / 'fixtures' / 'target'}",
              f"--drafter={ROOT / 'fixtures' / 'drafter'}", f"--floors-file={tmp_path / 'none.json'}",
              "--prompts=humaneval:1", f"--report-dir={tmp_path / 'reports'}", f"--cache-dir={tmp_path / 'cache'}"]
    # a subprocess: an in-process run would drop the modules it imported (torch registers some only once)
    return lambda *args: pytester.runpytest_subprocess(*common, *args, timeout=300)


@pytest.mark.slow
def test_progress_lines_pass_pytest_capture_and_are_quiet_with_q(progress_run):
    res = progress_run()
    assert res.ret == 0, res.stdout.str()
    res.stdout.fnmatch_lines(["[[]dflash-eval[]] synthetic stage: 0/3 prompts, 0 tokens, * ETA ?",
                              "[[]dflash-eval[]] synthetic stage: 3/3 prompts, 21 tokens, *, done"])
    quiet = progress_run("-q")
    assert quiet.ret == 0 and "synthetic stage" not in quiet.stdout.str()


@pytest.mark.slow
def test_progress_under_xdist_comes_from_the_controller(progress_run):
    res = progress_run("-n", "2")
    assert res.ret == 0, res.stdout.str()
    res.stdout.fnmatch_lines(["[[]dflash-eval[]] synthetic stage: 3/3 prompts, 21 tokens, *, done"])


def test_meter_records_when_each_stage_ran() -> None:
    """Stages of 10 ms or more leave a (stage, start, end) span in epoch seconds; shorter ones only their sum."""
    import time as _time

    m = Meter()
    before = _time.time()
    with m.timed("features"):
        _time.sleep(0.03)
    with m.timed("tokenize"):
        pass
    with m.timed("features"):
        _time.sleep(0.02)
    assert [s[0] for s in m.spans] == ["features", "features"]
    (_, a0, a1), (_, b0, b1) = m.spans
    assert before - 0.01 <= a0 < a1 <= b0 + 0.002 < b1 + 0.002 <= _time.time() + 0.012  # ms rounding
    assert m.timings["features"] >= 0.05 and "tokenize" in m.timings
