"""Timings, counters and progress events of a run (shared by every stage of one process).

A long production (reference completions, target features, τ drafting) reports a :class:`ProgressEvent` per step
(done / total, tokens, elapsed, ETA) to a *sink*: the pytest plugin's terminal reporter
(:mod:`dflash_eval.pytest_plugin.progress_reporter`), the gate CLI's stderr, or :func:`default_progress_sink`. Sinks are
called on every step; :func:`throttled` keeps one line per interval (and always the first and the last).
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

__all__ = ["Meter", "Compilation", "Progress", "ProgressEvent", "Sink", "default_progress_sink", "throttled"]


class Meter:
    """Seconds per stage (``timings``), event counts (``counts``) and when each stage ran (``spans``: stage, start,
    end in seconds since the epoch, for stages of at least :data:`SPAN_MIN_S`), reported in eval.json; the spans
    line up the stages of xdist workers (who waited for whom). ``compilation``: GPU kernel compilation
    (:mod:`dflash_eval.target.kernel_cache` calls :meth:`note_compile`) by the innermost stage it ran in; its seconds
    are part of that stage's time too."""

    SPAN_MIN_S = 0.01

    def __init__(self) -> None:
        self.timings: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.spans: list[tuple[str, float, float]] = []
        self.compilation = Compilation()
        self._open: list[str] = []

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        t0, wall0 = time.perf_counter(), time.time()
        self._open.append(name)
        try:
            yield
        finally:
            self._open.pop()
            dt = time.perf_counter() - t0
            self.timings[name] += dt
            if dt >= self.SPAN_MIN_S:
                self.spans.append((name, round(wall0, 3), round(wall0 + dt, 3)))

    def note_compile(self, seconds: float, cache_hit: bool) -> None:
        """One kernel compiled (``seconds`` of it) or loaded from the kernel cache (``cache_hit``) while the innermost
        open stage ran."""
        self.compilation.add(self._open[-1] if self._open else Compilation.OUTSIDE, seconds, cache_hit)


@dataclass
class Compilation:
    """GPU kernel compilation of one process: seconds by the stage it ran in (``by_stage``; what ran outside every
    timed stage under :data:`OUTSIDE`), kernels compiled and kernels loaded from the kernel cache."""

    OUTSIDE: ClassVar[str] = "outside stages"

    by_stage: dict[str, float] = field(default_factory=dict)
    compiled: int = 0
    loaded: int = 0

    def add(self, stage: str, seconds: float, cache_hit: bool) -> None:
        if cache_hit:
            self.loaded += 1
            return
        self.compiled += 1
        self.by_stage[stage] = self.by_stage.get(stage, 0.0) + seconds

    @property
    def seconds(self) -> float:
        return sum(self.by_stage.values())

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 4),
                "by_stage": {k: round(v, 4) for k, v in sorted(self.by_stage.items())},
                "kernels_compiled": self.compiled, "kernels_loaded": self.loaded}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Compilation:
        return cls.merged([data])

    @classmethod
    def merged(cls, blocks: list[dict[str, Any]]) -> Compilation:
        """The compilation of several processes (their :meth:`to_dict` blocks), summed."""
        out = cls()
        for b in blocks:
            for k, v in (b.get("by_stage") or {}).items():
                out.by_stage[k] = out.by_stage.get(k, 0.0) + v
            out.compiled += int(b.get("kernels_compiled") or 0)
            out.loaded += int(b.get("kernels_loaded") or 0)
        return out


@dataclass(frozen=True)
class ProgressEvent:
    """Where one long production stands; ``str()`` is its log line (counts, rate, elapsed, ETA)."""

    what: str
    done: int
    total: int
    tokens: int = 0
    elapsed_s: float = 0.0
    unit: str = "prompts"

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before the first step)."""
        if self.done <= 0 or self.elapsed_s <= 0:
            return None
        return max(0.0, self.elapsed_s / self.done * (self.total - self.done))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProgressEvent:
        return cls(**{k: d[k] for k in ("what", "done", "total", "tokens", "elapsed_s", "unit")})

    def __str__(self) -> str:
        rate = f", {self.tokens / self.elapsed_s:.1f} tokens/s" if self.tokens and self.elapsed_s > 0 else ""
        eta = self.eta_s
        tail = "done" if self.finished else ("ETA ?" if eta is None else f"ETA {_duration(eta)}")
        return (f"[dflash-eval] {self.what}: {self.done}/{self.total} {self.unit}, {self.tokens} tokens{rate}, "
                f"{_duration(self.elapsed_s)}, {tail}")


def _duration(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {int(s % 60):02d} s"


Sink = Callable[[ProgressEvent], None]


class Progress:
    """Progress of one long production: an event to ``sink`` when it starts and after every step (``sink`` None:
    silent). ``unit`` names what ``total`` counts (prompts, positions)."""

    def __init__(self, what: str, total: int, sink: Sink | None, unit: str = "prompts") -> None:
        self.what, self.total, self.sink, self.unit = what, total, sink, unit
        self.done = self.tokens = 0
        self.t0 = time.perf_counter()
        self._emit()

    def step(self, tokens: int = 0, n: int = 1) -> None:
        self.done += n
        self.tokens += tokens
        self._emit()

    def reach(self, done: int) -> None:
        """Where a production counted in tokens stands (e.g. the positions a τ simulation has covered): ``done`` of
        ``total``, each a token; an event only when it moved (the ETA then extrapolates tokens, not prompts)."""
        done = min(int(done), self.total)
        if done > self.done:
            self.tokens += done - self.done
            self.done = done
            self._emit()

    def _emit(self) -> None:
        if self.sink is not None:
            self.sink(ProgressEvent(self.what, self.done, self.total, self.tokens,
                                    round(time.perf_counter() - self.t0, 3), self.unit))

    def wrap(self, produce: Callable[[], Any], tokens: Callable[[], int]) -> Callable[[], None]:
        def run() -> None:
            produce()
            self.step(tokens())
        return run


def throttled(write: Callable[[str], None], every_s: float) -> Sink:
    """A sink writing an event's line at most every ``every_s`` seconds per production, and always its first and
    its last event."""
    last: dict[str, float] = {}

    def sink(ev: ProgressEvent) -> None:
        now = time.monotonic()
        if ev.what in last and not ev.finished and now - last[ev.what] < every_s:
            return
        last[ev.what] = now
        write(str(ev))
    return sink


def default_progress_sink(worker_count: int) -> Sink | None:
    """Outside pytest: progress lines (one per 2 s) go to stderr when it is a terminal and this is not an xdist
    worker; DFLASH_EVAL_PROGRESS=1 / 0 forces them on / off. (Under pytest the plugin's reporter replaces this.)"""
    flag = os.environ.get("DFLASH_EVAL_PROGRESS", "").strip().lower()
    stream = sys.__stderr__
    if flag in ("0", "false", "no", "off") or stream is None:
        return None
    if flag not in ("1", "true", "yes", "on") and (worker_count > 1 or not stream.isatty()):
        return None
    return throttled(lambda m: print(m, file=stream, flush=True), 2.0)
