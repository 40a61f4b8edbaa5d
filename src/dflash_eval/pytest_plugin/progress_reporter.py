"""Progress of the suite's long stages (reference completions, target features, τ drafting) through pytest's
terminal reporter.

- One process: the session's stages report :class:`~dflash_eval.common.progress.ProgressEvent` s to
  :class:`ProgressReporter`, which writes a line (past pytest's output capture) for the first event of a stage, its
  last, and in between one per interval: 2 s in a terminal, 30 s otherwise (CI logs).
- pytest-xdist: each worker writes its latest events to ``<dir>/<worker>.json`` (the folder is handed to the
  workers through ``workerinput``); the controller polls the folder once a second and writes one line per stage
  for all workers together (done and tokens summed, so each job counts once).

Off with ``-q`` (or ``-qq``); ``DFLASH_EVAL_PROGRESS=1`` / ``0`` forces it on / off and
``DFLASH_EVAL_PROGRESS_EVERY=SECONDS`` sets the interval.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.common.progress import ProgressEvent, Sink

__all__ = ["ProgressReporter", "progress_sink", "WORKERINPUT_KEY", "REPORTER", "enabled", "interval"]

WORKERINPUT_KEY = "dflash_eval_progress_dir"
REPORTER = pytest.StashKey["ProgressReporter"]()
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def enabled(config: pytest.Config) -> bool:
    """Progress lines unless ``-q`` (DFLASH_EVAL_PROGRESS=1/0 overrides)."""
    flag = os.environ.get("DFLASH_EVAL_PROGRESS", "").strip().lower()
    if flag in _TRUE:
        return True
    if flag in _FALSE:
        return False
    return config.get_verbosity() >= 0


def interval(isatty: bool) -> float:
    """Seconds between two lines of one stage: DFLASH_EVAL_PROGRESS_EVERY, else 2 in a terminal and 30 in logs."""
    raw = os.environ.get("DFLASH_EVAL_PROGRESS_EVERY", "").strip()
    try:
        return max(0.0, float(raw)) if raw else (2.0 if isatty else 30.0)
    except ValueError:
        return 2.0 if isatty else 30.0


def aggregate(events: list[ProgressEvent]) -> ProgressEvent:
    """One stage over several processes: each produced job is counted by the process that produced it (capped at
    the total: a stage that every process computes for itself, e.g. τ under --cache-only, counts once)."""
    total = max(e.total for e in events)
    return ProgressEvent(events[0].what, min(total, sum(e.done for e in events)), total,
                         sum(e.tokens for e in events), max(e.elapsed_s for e in events), events[0].unit)


class ProgressReporter:
    """The controller's progress lines (see module docstring)."""

    def __init__(self, config: pytest.Config, every_s: float | None = None) -> None:
        self.config = config
        self._every_s = every_s
        self._events: dict[tuple[str, str], ProgressEvent] = {}  # (source, stage) -> latest, until the stage is done
        self._seen: dict[tuple[str, str], ProgressEvent] = {}  # (source, stage) -> latest ever
        self._shown: dict[str, tuple[float, tuple[int, int]]] = {}  # stage -> (time, (done, total)) of its last line
        self._finished: set[str] = set()
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.lines: list[str] = []  # every line written (tests read them)

    @property
    def tr(self) -> pytest.TerminalReporter | None:
        """pytest's terminal reporter (registered after this plugin's pytest_configure: looked up when used)."""
        return self.config.pluginmanager.get_plugin("terminalreporter")

    @property
    def every_s(self) -> float:
        if self._every_s is None:
            self._every_s = interval(bool(getattr(self.tr, "isatty", False)))
        return self._every_s

    # ------------------------------------------------------------------------------------------- events
    def update(self, event: ProgressEvent, source: str = "master") -> None:
        """Record ``source``'s latest event of a stage; write the stage's line when it changed and is due."""
        with self._lock:
            if self._seen.get((source, event.what)) == event:
                return  # a worker's file read again
            self._seen[(source, event.what)] = event
            self._events[(source, event.what)] = event
            agg = aggregate([e for (_, w), e in self._events.items() if w == event.what])
            shown = self._shown.get(agg.what)
            if shown is not None and (agg.done, agg.total) == shown[1]:
                return  # nothing new (e.g. the same stage started by another worker)
            if shown is not None and agg.what in self._finished and agg.finished:
                return
            now = time.monotonic()
            if shown is not None and not agg.finished and now - shown[0] < self.every_s:
                return
            self._shown[agg.what] = (now, (agg.done, agg.total))
            if agg.finished:
                self._finished.add(agg.what)
                for key in [k for k in self._events if k[1] == agg.what]:
                    del self._events[key]  # the same stage may run again (another side or drafter)
            else:
                self._finished.discard(agg.what)
        self._write(str(agg))

    def _write(self, line: str) -> None:
        self.lines.append(line)
        tr = self.tr
        if tr is None:
            return
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        if capman is not None and threading.current_thread() is threading.main_thread():
            with capman.global_and_fixture_disabled():
                self._line(tr, line)
        else:  # the polling thread of an xdist controller (which runs no tests: nothing is captured there)
            self._line(tr, line)

    @staticmethod
    def _line(tr: pytest.TerminalReporter, line: str) -> None:
        tw = getattr(tr, "_tw", None)
        if getattr(tw, "width_of_current_line", 0) and tw is not None:  # mid-line of test results (xdist's dots)
            tw.line()
        tr.write_line(line)

    # ------------------------------------------------------------------------------------------- xdist
    def worker_dir(self) -> str:
        """The folder xdist workers write their events to (created on first use; polled from then on)."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="dflash-eval-progress-"))
            self._thread = threading.Thread(target=self._poll_loop, name="dflash-eval-progress", daemon=True)
            self._thread.start()
        return str(self._dir)

    def _poll_loop(self) -> None:
        while not self._stop.wait(min(1.0, max(0.1, self.every_s))):
            self.poll()

    def poll(self) -> None:
        """Read every worker's latest events and report them."""
        if self._dir is None:
            return
        for f in sorted(self._dir.glob("*.json")):
            try:
                events = json.loads(f.read_text())
            except (OSError, ValueError):  # being replaced right now: read it next time
                continue
            for ev in events.values():
                self.update(ProgressEvent.from_json(ev), source=f.stem)

    def close(self) -> None:
        """Stop polling (after one last read) and remove the workers' folder."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self.poll()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class WorkerFileSink:
    """An xdist worker's sink: its latest event per stage in ``<dir>/<worker>.json``, replaced atomically on every
    event (a step is a prompt or a drafter forward: a small file written a few times a second at most)."""

    def __init__(self, folder: str, worker: str) -> None:
        self.path = Path(folder) / f"{worker}.json"
        self.events: dict[str, dict[str, Any]] = {}

    def __call__(self, event: ProgressEvent) -> None:
        self.events[event.what] = event.to_json()
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.events))
            os.replace(tmp, self.path)
        except OSError:  # progress must never fail a run
            pass


def progress_sink(config: pytest.Config) -> Sink | None:
    """The sink for this process's session: the reporter (controller), a file the controller polls (xdist
    worker), or None (progress off)."""
    if not enabled(config):
        return None
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        folder = workerinput.get(WORKERINPUT_KEY)
        return WorkerFileSink(folder, workerinput.get("workerid", "gw")) if folder else None
    reporter = config.stash.get(REPORTER, None)
    return reporter.update if reporter is not None else None
