"""eval.json's ``sampled`` block of a run at temperature > 0, on plain numbers (no torch: the report merge uses it):
the mean over prompts of each prompt's mean over its samples, with its 95 % CI and the two stages of its spread.

The CI is the suite's one interval of a mean over prompts at temperature > 0
(:func:`dflash_eval.metrics.stats.sampled_hall_t_interval`: Student's t corrected for skewness, over the prompt
means, with the skewness and kurtosis of a prompt mean taken from the samples too). With n prompts of S samples
each, ``Var(grand mean) = (σ_between² + σ_within² / S) / n``, and the sample variance of the prompt means estimates
exactly that, so the interval over them covers both stages; it is the same interval as the per-category table's
``all`` row of the same run. (A two-stage bootstrap, prompts resampled and then each drawn prompt's samples,
counts the within-prompt variance twice and was up to a quarter wider than needed: ``benchmarks/bench_coverage.py``.)
:func:`spread` gives the two stages, which say whether more samples or more prompts narrow the interval
(:func:`dflash_eval.metrics.sampled_tau.samples_for_width`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_eval.metrics.stats import Summary, summarize
from dflash_eval.metrics.tau_rows import TauRow

__all__ = ["sampled_mean", "spread", "sampled_summary"]


def sampled_mean(per_prompt: Mapping[str, Sequence[float]]) -> Summary:
    """The mean over prompts of each prompt's mean over its samples, with the skew-corrected t 95 % CI over the
    prompt means and their samples (prompts without a sample are left out)."""
    groups = [[float(v) for v in vs] for vs in per_prompt.values() if vs]
    return summarize([statistics.fmean(g) for g in groups], samples=groups)


def spread(per_prompt: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The two stages of the spread: ``sd_within`` (root of the mean variance over a prompt's samples, prompts with
    2 or more) and ``sd_between`` (of the prompts' true means: the variance of the prompt means less
    ``within / S``, at least 0); NaN where there are too few prompts or samples."""
    groups = [[float(v) for v in vs] for vs in per_prompt.values() if len(vs) > 1]
    if not groups:
        return {"sd_between": math.nan, "sd_within": math.nan}
    within = statistics.fmean(statistics.variance(g) for g in groups)
    if len(groups) < 2:
        return {"sd_between": math.nan, "sd_within": math.sqrt(within)}
    s = statistics.fmean(len(g) for g in groups)
    between = statistics.variance([statistics.fmean(g) for g in groups]) - within / s
    return {"sd_between": math.sqrt(max(0.0, between)), "sd_within": math.sqrt(within)}


def _block(per_prompt: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    return {**sampled_mean(per_prompt).to_dict(), **spread(per_prompt)}


def sampled_summary(rows: Mapping[str, TauRow]) -> dict[str, Any] | None:
    """eval.json's ``sampled`` block of a run at temperature > 0 (None for a greedy run): the samples per prompt
    and, for the chain, each DDTree budget and, with ``--online-tau``, the online loop, the mean over prompts of each
    prompt's mean over samples with its skew-corrected t CI over the prompt means (:func:`sampled_mean`) and the two
    stages of the spread (:func:`spread`)."""
    if not rows or any(r.sample_tau is None for r in rows.values()):
        return None
    out: dict[str, Any] = {"prompts": len(rows), "samples": sum(r.samples or 0 for r in rows.values()),
                           "chain": _block({p: r.sample_tau or [] for p, r in rows.items()})}
    budgets = sorted({b for r in rows.values() for b in r.ddtree_sample_tau or {}}, key=int)
    out["ddtree"] = {b: _block({p: r.ddtree_sample_tau[b] for p, r in rows.items()
                                if r.ddtree_sample_tau is not None and b in r.ddtree_sample_tau}) for b in budgets}
    online = {p: r.online.sample_tau for p, r in rows.items()
              if r.online is not None and r.online.sample_tau is not None}
    if online:
        out["online"] = _block(online)
    return out
