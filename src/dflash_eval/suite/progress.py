"""Timings, counters and progress lines of a run (shared by every stage of one process)."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Meter", "Progress", "default_progress_sink"]

Sink = Callable[[str], None]


class Meter:
    """Seconds per stage (``timings``) and event counts (``counts``), reported in eval.json."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] += time.perf_counter() - t0


class Progress:
    """Progress of a long production (prompts done / total, tokens/s): a log line per step, at most every
    ``every_s`` seconds (and always for the last step). ``sink`` None: silent."""

    def __init__(self, what: str, total: int, sink: Sink | None, every_s: float = 2.0) -> None:
        self.what, self.total, self.sink, self.every_s = what, total, sink, every_s
        self.done = self.tokens = 0
        self.t0 = self._last = time.perf_counter()

    def step(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        now = time.perf_counter()
        if self.sink is None or (now - self._last < self.every_s and self.done < self.total):
            return
        self._last = now
        dt = max(now - self.t0, 1e-9)
        self.sink(f"[dflash-eval] {self.what}: {self.done}/{self.total} prompts, {self.tokens} tokens, "
                  f"{self.tokens / dt:.1f} tokens/s, {dt:.1f} s")

    def wrap(self, produce: Callable[[], Any], tokens: Callable[[], int]) -> Callable[[], None]:
        def run() -> None:
            produce()
            self.step(tokens())
        return run


def default_progress_sink(worker_count: int) -> Sink | None:
    """Progress lines go to the real stderr (pytest's capture does not hide them) when it is a terminal and this
    is not an xdist worker; DFLASH_EVAL_PROGRESS=1 / 0 forces them on / off."""
    flag = os.environ.get("DFLASH_EVAL_PROGRESS", "").strip().lower()
    stream = sys.__stderr__
    if flag in ("0", "false", "no", "off") or stream is None:
        return None
    if flag not in ("1", "true", "yes", "on") and (worker_count > 1 or not stream.isatty()):
        return None
    return lambda m: print(m, file=stream, flush=True)
