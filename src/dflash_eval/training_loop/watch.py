"""Waiting for a training run's new checkpoints (``dflash-eval gate DIR --watch``).

Every ``poll_s`` seconds the folder (and the globs) are listed (:func:`~dflash_eval.training_loop.checkpoint_dir.
find_checkpoints`); a checkpoint not handled yet is read only once its files have kept the same sizes and times for
``settle_s`` seconds and every weight file is whole (:func:`~dflash_eval.training_loop.checkpoint_dir.is_complete`):
a checkpoint being written is never read. New ones are handled in step order. Every wait is bounded by ``poll_s``
and by what is left of ``timeout_s`` (the whole watch); Ctrl-C stops it cleanly between two files or inside an
evaluation (the history's appends are atomic: nothing is left half-written).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dflash_eval.errors import ConfigError
from dflash_eval.training_loop.checkpoint_dir import Found, find_checkpoints, is_complete, stamp

__all__ = ["WatchLimits", "watch"]


@dataclass(frozen=True)
class WatchLimits:
    """``poll_s``: each wait; ``settle_s``: how long a checkpoint's files must stay unchanged before it is read;
    ``timeout_s``: the whole watch."""

    poll_s: float = 10.0
    settle_s: float = 5.0
    timeout_s: float = 3600.0

    def check(self) -> None:
        for name in ("poll_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--watch: {name} must be > 0 seconds, got {getattr(self, name)}")
        if self.settle_s < 0:
            raise ConfigError(f"--watch: settle_s must be >= 0 seconds, got {self.settle_s}")


@dataclass
class _Pending:
    stamp: tuple[tuple[str, int, int], ...]
    since: float


@dataclass
class _Watcher:
    root: Path | None
    patterns: tuple[str, ...]
    seen: set[Path]
    limits: WatchLimits
    clock: Callable[[], float]
    pending: dict[Path, _Pending] = field(default_factory=dict)

    def ready(self) -> list[Found]:
        """The checkpoints not handled yet whose files are whole and have not changed for ``settle_s``."""
        out = []
        now = self.clock()
        for f in find_checkpoints(self.root, patterns=self.patterns):
            if f.path in self.seen:
                continue
            st, prev = stamp(f.path), self.pending.get(f.path)
            if prev is None or prev.stamp != st:
                self.pending[f.path] = _Pending(st, now)
                if self.limits.settle_s > 0:
                    continue
            elif now - prev.since < self.limits.settle_s:
                continue
            if is_complete(f.path):
                out.append(f)
        return out


def watch(root: Path | None, handle: Callable[[Found], None], *, patterns: tuple[str, ...] = (),
          seen: set[Path] | None = None, limits: WatchLimits = WatchLimits(),
          log: Callable[[str], None] = lambda _m: None, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> str:
    """Call ``handle`` on every new complete checkpoint, in step order, until ``limits.timeout_s`` has passed
    (returns ``"timeout"``) or Ctrl-C (returns ``"interrupted"``). ``seen``: paths already handled (updated)."""
    limits.check()
    w = _Watcher(root, tuple(patterns), seen if seen is not None else set(), limits, clock)
    deadline = clock() + limits.timeout_s
    log(f"[dflash-eval] watching {root or ', '.join(patterns)} for new checkpoints (every {limits.poll_s:g} s, "
        f"files unchanged for {limits.settle_s:g} s, at most {limits.timeout_s:g} s in all; Ctrl-C stops)")
    try:
        while True:
            for found in w.ready():
                w.seen.add(found.path)
                w.pending.pop(found.path, None)
                handle(found)
            left = deadline - clock()
            if left <= 0:
                log(f"[dflash-eval] watch: {limits.timeout_s:g} s passed; stopping")
                return "timeout"
            sleep(min(limits.poll_s, left))
    except KeyboardInterrupt:
        log("[dflash-eval] watch: interrupted (Ctrl-C); stopping")
        return "interrupted"
