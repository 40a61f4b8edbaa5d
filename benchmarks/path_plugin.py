"""A pytest plugin for benchmarks: which of the package's modules a run's path from the drafter to the τ table
crosses. Every call made on a call stack through ``read_checkpoint`` (the drafter read), ``simulate_tau`` (the
drafting simulation) or ``tau_rows`` (the τ table) names the package modules on that stack: the callers that lead
there and the callees below. At the process's end the module paths (relative to the package) are written to
``PATH_FILE``, one a line, and a count to stderr.

Run (the bundled fixtures, a cold cache, one process)::

    PATH_FILE=/tmp/path.txt PYTHONPATH=benchmarks .venv/bin/python -m pytest tests_eval -q -p no:cacheprovider \\
        -p path_plugin -p no:xdist -k tau --num-prompts 2 --cache-dir /tmp/path-cache --report-dir /tmp/path-reports

A checkout of older code is counted the same way with its ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from types import FrameType
from typing import Any

#: The functions that mark the path: reading the drafter, simulating τ, the τ table.
MARKS = frozenset({"read_checkpoint", "simulate_tau", "tau_rows"})
PACKAGE = "/dflash_eval/"

_seen: set[str] = set()


def _on_path(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name in MARKS and PACKAGE in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if event != "call" or PACKAGE not in frame.f_code.co_filename or not _on_path(frame):
        return
    f: FrameType | None = frame
    while f is not None:
        if PACKAGE in f.f_code.co_filename:
            _seen.add(f.f_code.co_filename.split(PACKAGE, 1)[1])
        f = f.f_back


def _write() -> None:
    sys.setprofile(None)
    modules = sorted(_seen)
    packages = {m.split("/", 1)[0] for m in modules if "/" in m}
    with open(os.environ["PATH_FILE"], "w", encoding="utf-8") as out:
        out.write("".join(f"{m}\n" for m in modules))
    print(f"path_plugin: {len(modules)} modules in {len(packages)} packages", file=sys.stderr)


if os.environ.get("PATH_FILE"):
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    atexit.register(_write)
