"""Verdicts across training steps, from the per-prompt chain τ of the history's records (paired over the prompts
two records share, as :mod:`dflash_eval.metrics.baseline` pairs a run with its baseline).

- regression (a failure): the checkpoint is worse than the best earlier checkpoint (highest mean chain τ) by more
  than noise: the percentile-bootstrap 95 % CI of the paired mean difference (this - best) lies entirely below 0;
- plateau (a notice): over the last K checkpoints (this one included, in step order) none gained beyond noise over
  the best checkpoint before them: no paired difference whose 95 % CI lies entirely above 0.

Only records of one settings digest are compared (the same target, prompts and τ-relevant options).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from dflash_eval.metrics.stats import Summary, summarize

__all__ = ["paired_diff", "earlier_than", "regression", "plateau", "step_order"]


class _Record(Protocol):
    """What a verdict across steps reads of a history record (read-only)."""

    @property
    def step(self) -> int | None: ...
    @property
    def time(self) -> str: ...
    @property
    def drafter(self) -> str: ...
    @property
    def mean_tau(self) -> float: ...
    @property
    def prompts(self) -> Mapping[str, float]: ...


_R = TypeVar("_R", bound=_Record)


def _name(r: _Record) -> str:
    return f"step {r.step}" if r.step is not None else r.drafter


def paired_diff(a: _Record, b: _Record) -> Summary:
    """Mean, median and bootstrap 95 % CI of the per-prompt chain τ differences a - b (prompts both have)."""
    return summarize([a.prompts[p] - b.prompts[p] for p in a.prompts
                      if p in b.prompts and not math.isnan(a.prompts[p]) and not math.isnan(b.prompts[p])])


def step_order(records: Sequence[_R]) -> list[_R]:
    """Records in step order (records without a step after those with one, in the order they were written)."""
    indexed = list(enumerate(records))
    indexed.sort(key=lambda ir: (ir[1].step is None, ir[1].step if ir[1].step is not None else 0, ir[0]))
    return [r for _, r in indexed]


def earlier_than(record: _Record, records: Sequence[_R]) -> list[_R]:
    """The records before ``record`` in step order (all of them when either has no step)."""
    if record.step is None:
        return list(records)
    return [r for r in records if r.step is None or r.step < record.step]


def _best(records: Sequence[_R]) -> _R | None:
    usable = [r for r in records if not math.isnan(r.mean_tau)]
    return max(usable, key=lambda r: r.mean_tau) if usable else None


def regression(record: _Record, earlier: Sequence[_Record]) -> str | None:
    """The failure message when ``record`` is worse than the best of ``earlier`` beyond noise, else None."""
    best = _best(earlier)
    if best is None:
        return None
    d = paired_diff(record, best)
    if d.n == 0 or not d.ci_high < 0:
        return None
    return (f"worse than the best checkpoint so far ({_name(best)}, mean τ {best.mean_tau:.3f}) beyond noise: "
            f"paired Δ {d.mean:+.3f} (95% CI [{d.ci_low:+.3f}, {d.ci_high:+.3f}]) over {d.n} prompts")


def plateau(record: _Record, earlier: Sequence[_Record], window: int) -> str | None:
    """The notice when none of the last ``window`` checkpoints up to ``record`` gained beyond noise over the best
    checkpoint before them (None with fewer than ``window + 1`` checkpoints)."""
    seq = step_order([*earlier, record])
    if len(seq) <= window:
        return None
    recent, before = seq[-window:], seq[:-window]
    best = _best(before)
    if best is None:
        return None
    gains = [paired_diff(r, best) for r in recent]
    if any(g.n and g.ci_low > 0 for g in gains):
        return None
    top = max(g.mean for g in gains if g.n) if any(g.n for g in gains) else float("nan")
    return (f"plateau: no gain beyond noise over the last {window} checkpoints ({_name(recent[0])} .. "
            f"{_name(recent[-1])}) against {_name(best)} (mean τ {best.mean_tau:.3f}); best paired Δ {top:+.3f}")
