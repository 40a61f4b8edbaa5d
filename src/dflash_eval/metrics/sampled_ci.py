"""Confidence intervals of τ at temperature > 0 over prompts and samples, on plain numbers (no torch: the report
merge uses it): :func:`nested_ci`, a two-stage bootstrap (prompts resampled with replacement, then each drawn
prompt's samples), and :func:`sampled_summary`, eval.json's ``sampled`` block built from the prompt rows."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_eval.metrics.stats import Summary

__all__ = ["nested_ci", "sampled_summary"]


def nested_ci(per_prompt: Mapping[str, Sequence[float]], *, resamples: int = 2000, seed: int = 0) -> Summary:
    """Mean over prompts of each prompt's mean over samples, with a two-stage bootstrap 95 % CI (prompts
    resampled with replacement, then each drawn prompt's samples)."""
    groups = [[float(v) for v in vs] for vs in per_prompt.values() if vs]
    if not groups:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan)
    means = [statistics.fmean(g) for g in groups]
    mean = statistics.fmean(means)
    rng = random.Random(seed)
    boot = []
    for _ in range(resamples):
        picks = rng.choices(groups, k=len(groups))
        boot.append(statistics.fmean(statistics.fmean(rng.choices(g, k=len(g))) for g in picks))
    boot.sort()
    return Summary(len(groups), mean, statistics.median(means), boot[int(0.025 * (resamples - 1))],
                   boot[round(0.975 * (resamples - 1))])


def sampled_summary(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """eval.json's ``sampled`` block of a run at temperature > 0 (None for a greedy run): the samples per prompt
    and the mean over prompts of each prompt's mean over samples with its nested CI (:func:`nested_ci`), for the
    chain, each DDTree budget and, with ``--online-tau``, the online loop."""
    if not rows or not all("sample_tau" in r for r in rows.values()):
        return None
    out: dict[str, Any] = {"prompts": len(rows), "samples": sum(r["samples"] for r in rows.values()),
                           "chain": nested_ci({p: r["sample_tau"] for p, r in rows.items()}).to_dict()}
    budgets = sorted({b for r in rows.values() for b in r.get("ddtree_sample_tau", {})}, key=int)
    out["ddtree"] = {b: nested_ci({p: r["ddtree_sample_tau"][b] for p, r in rows.items()
                                   if b in r.get("ddtree_sample_tau", {})}).to_dict() for b in budgets}
    online = {p: r["online"]["sample_tau"] for p, r in rows.items() if "sample_tau" in (r.get("online") or {})}
    if online:
        out["online"] = nested_ci(online).to_dict()
    return out
