"""A pytest plugin for benchmarks: when each process of a run (the controller and every xdist worker) reaches the
points of a session, so a slow ``-n 2`` run can be taken apart (worker start, collection, tests, reports).

Load it with ``-p timeline_plugin`` (``benchmarks/`` on ``PYTHONPATH``) and ``TIMELINE_FILE=<path>``; each event is
one JSON line ``{"proc", "event", "t"}`` (``unconfigure`` adds ``heavy_modules``: which of torch, transformers,
fla, ... the process imported) with ``t`` in seconds since ``TIMELINE_T0`` (a ``time.time()`` value, the
run's start) and appended with one ``write`` (lines of concurrent processes do not interleave).
:func:`summarize` turns the file into phases per process. Used by ``benchmarks/bench_multigpu.py``.

``STAGE_PROFILE=<stage>[,<stage>...]`` with ``STAGE_PROFILE_DIR=<dir>`` also runs cProfile around every metered
stage of those names (``dflash_eval.common.progress.Meter.timed``, e.g. ``drift_budget``) in every process and writes
``<dir>/<stage>_<process>.txt`` at its end: the functions by own and by cumulative time. Time a process spends
waiting for its GPU shows up as own time of the call that synchronises (``item``, ``tolist``, ``to``, ``cpu``).

``unconfigure`` also adds ``gc``: the garbage collector's collections in the process from the plugin's import to
that point, per generation (``{"0": [count, seconds], ...}``, CPU seconds, counted with :data:`gc.callbacks`).

``STARTUP_PROFILE_DIR=<dir>`` runs cProfile in every process from its ``pytest_configure`` to the end of its
collection (for the controller of an xdist run: to the end of its session start) and writes
``<dir>/startup_<process>.txt``: the functions by cumulative time and which heavy libraries were imported by then.
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

_FIRST = pytest.StashKey[bool]()
_LAST = pytest.StashKey[float]()
_PROFILES: dict[str, cProfile.Profile] = {}
_ACTIVE: set[str] = set()  # the stage being profiled now (one at a time: cProfile does not nest)
_STARTUP: list[cProfile.Profile] = []  # the start-up profile while it runs
HEAVY = ("torch", "transformers", "fla", "triton", "matplotlib", "safetensors", "tokenizers")


_GC: dict[str, list[float]] = {}  # generation -> [collections, CPU seconds] since the plugin's import
_GC_START: list[float] = [0.0]


def _count_collections(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _GC_START[0] = time.process_time()
        return
    entry = _GC.setdefault(str(info["generation"]), [0, 0.0])
    entry[0] += 1
    entry[1] = round(entry[1] + time.process_time() - _GC_START[0], 4)


gc.callbacks.append(_count_collections)


def _heavy_imported() -> list[str]:
    return [m for m in HEAVY if m in sys.modules]


def _proc(config: pytest.Config) -> str:
    return getattr(config, "workerinput", {}).get("workerid", "controller")


def _log(config: pytest.Config, event: str, at: float | None = None, **extra: Any) -> None:
    path = os.environ.get("TIMELINE_FILE")
    if not path:
        return
    proc = _proc(config)
    t = (time.time() if at is None else at) - float(os.environ.get("TIMELINE_T0", "0"))
    line = json.dumps({"proc": proc, "event": event, "t": round(t, 3), **extra}) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def pytest_configure(config: pytest.Config) -> None:
    _log(config, "configure")
    if os.environ.get("STARTUP_PROFILE_DIR"):
        _STARTUP.append(cProfile.Profile())
        _STARTUP[0].enable()
    stages = {x for x in os.environ.get("STAGE_PROFILE", "").split(",") if x}
    if stages and os.environ.get("STAGE_PROFILE_DIR"):
        _profile_stages(stages)


def _profile_stages(stages: set[str]) -> None:
    """Wrap ``Meter.timed`` so the named stages run under one cProfile profile per stage (not nested)."""
    from dflash_eval.common.progress import Meter

    timed = Meter.timed

    @contextmanager
    def profiled(self: Meter, name: str) -> Iterator[None]:
        if name not in stages or _ACTIVE:
            with timed(self, name):
                yield
            return
        prof = _PROFILES.setdefault(name, cProfile.Profile())
        _ACTIVE.add(name)
        with timed(self, name):
            prof.enable()
            try:
                yield
            finally:
                prof.disable()
                _ACTIVE.discard(name)

    Meter.timed = profiled  # type: ignore[method-assign]


def _write_profiles(proc: str) -> None:
    out = Path(os.environ["STAGE_PROFILE_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    for stage, prof in _PROFILES.items():
        buf = io.StringIO()
        for key in ("tottime", "cumulative"):
            buf.write(f"=== {stage} in {proc}, by {key}\n")
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(25)
        (out / f"{stage}_{proc}.txt").write_text(buf.getvalue())


def _end_startup(config: pytest.Config) -> None:
    if not _STARTUP:
        return
    prof = _STARTUP.pop()
    prof.disable()
    buf = io.StringIO()
    buf.write(f"=== start-up of {_proc(config)} (configure to end of collection), by cumulative time\n")
    buf.write(f"heavy libraries imported by then: {_heavy_imported()}\n")
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
    out = Path(os.environ["STARTUP_PROFILE_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"startup_{_proc(config)}.txt").write_text(buf.getvalue())


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _log(session.config, "sessionstart_done")
    if session.config.pluginmanager.has_plugin("dsession"):  # an xdist controller collects nothing itself
        _end_startup(session.config)


def pytest_collection_finish(session: pytest.Session) -> None:
    _log(session.config, "collected")
    _end_startup(session.config)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not item.config.stash.get(_FIRST, False):
        item.config.stash[_FIRST] = True
        _log(item.config, "first_test")


def pytest_runtest_teardown(item: pytest.Item) -> None:
    item.config.stash[_LAST] = time.time()  # written once, at the session's end


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if _LAST in session.config.stash:
        _log(session.config, "last_test_done", session.config.stash[_LAST])
    _log(session.config, "sessionfinish")


def pytest_unconfigure(config: pytest.Config) -> None:
    _log(config, "unconfigure", heavy_modules=_heavy_imported(), gc=dict(_GC))
    if _PROFILES:
        _write_profiles(_proc(config))


def summarize(path: Path) -> dict[str, dict[str, float]]:
    """Per process, the time of each event (its last occurrence), in seconds from the run's start."""
    out: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            e = json.loads(line)
            out.setdefault(e["proc"], {})[e["event"]] = e["t"]
    return out


def stage_windows(spans: dict[str, list[list[Any]]], t0: float) -> dict[str, dict[str, list[float]]]:
    """eval.json ``timings.spans`` as, per worker and stage, ``[first start, last end, seconds spent]`` in seconds
    from ``t0`` (the run's start): which stages of the workers overlapped and who waited."""
    out: dict[str, dict[str, list[float]]] = {}
    for worker, rows in spans.items():
        for stage, start, end in rows:
            w = out.setdefault(worker, {}).setdefault(stage, [start - t0, end - t0, 0.0])
            w[0], w[1], w[2] = min(w[0], start - t0), max(w[1], end - t0), w[2] + end - start
    return {w: {k: [round(x, 2) for x in v] for k, v in sorted(st.items(), key=lambda kv: kv[1][0])}
            for w, st in out.items()}
