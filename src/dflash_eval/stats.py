"""Summary statistics of per-prompt τ: mean, median and a percentile-bootstrap 95 % confidence interval."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Summary", "summarize", "by_category"]


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "mean": self.mean, "median": self.median, "ci95": [self.ci_low, self.ci_high]}


def summarize(values: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> Summary:
    """Mean, median and percentile-bootstrap 95 % CI of the mean (deterministic for a given seed)."""
    vals = [float(v) for v in values]
    if not vals:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan)
    mean = statistics.fmean(vals)
    if len(vals) == 1:
        return Summary(1, mean, vals[0], mean, mean)
    rng = random.Random(seed)
    n = len(vals)
    means = sorted(statistics.fmean(rng.choices(vals, k=n)) for _ in range(resamples))
    lo = means[int(0.025 * (resamples - 1))]
    hi = means[int(round(0.975 * (resamples - 1)))]
    return Summary(n, mean, statistics.median(vals), lo, hi)


def by_category(values: Mapping[str, float], categories: Mapping[str, str]) -> dict[str, Summary]:
    """Summaries per category plus ``"all"``; ``values`` and ``categories`` are keyed by prompt id."""
    groups: dict[str, list[float]] = {}
    for pid, v in values.items():
        groups.setdefault(categories.get(pid, "prompt"), []).append(v)
    out = {cat: summarize(vs) for cat, vs in sorted(groups.items())}
    out["all"] = summarize(list(values.values()))
    return out
