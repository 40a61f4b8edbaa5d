"""Summary statistics of per-prompt τ: mean, median and a percentile-bootstrap 95 % confidence interval, per
category and over all prompts (with each category's pooled per-position acceptance,
:mod:`dflash_eval.metrics.acceptance_rates`); and, for multi-turn conversations, τ per turn and per conversation."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_eval.metrics.acceptance_rates import acceptance_block, acceptance_table, pool

__all__ = ["Summary", "summarize", "by_category", "category_table", "ddtree_budgets", "conversation_table",
           "turn_table"]


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, float | int | list[float]]:
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


def _num(x: object) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def ddtree_budgets(prompts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The DDTree budgets (eval.json's string keys) found in any prompt row, ascending."""
    return sorted({b for r in prompts.values() for b in r.get("ddtree", {})}, key=int)


def category_table(prompts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per category (and ``"all"``): n, and mean / median / bootstrap 95 % CI of chain τ and of each DDTree
    budget's τ, from eval.json's ``prompts`` rows (prompts whose τ is NaN are left out), and ``acceptance``: per
    source, the pooled rounds' histogram and per-position rates. Verdicts are added by
    :func:`dflash_eval.metrics.verdict.judge_categories`."""
    cat = {p: r.get("category", "prompt") for p, r in prompts.items()}
    chain = by_category({p: r["tau"] for p, r in prompts.items() if _num(r.get("tau"))}, cat)
    bs = ddtree_budgets(prompts)
    dd = {b: by_category({p: r["ddtree"][b] for p, r in prompts.items() if _num(r.get("ddtree", {}).get(b))}, cat)
          for b in bs}
    acc = acceptance_table(prompts)
    return {c: {"n": summ.n, "chain": summ.to_dict(), "ddtree": {b: dd[b][c].to_dict() for b in bs if c in dd[b]},
                "acceptance": acc.get(c, {})}
            for c, summ in chain.items()}


def conversation_table(prompts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per multi-turn conversation (rows with ``conversation``): its turns' ids and chain τ in turn order, and the
    conversation's τ over all its rounds pooled (``tau``, ``rounds``, ``histogram``, ``position_rates``)."""
    convs: dict[str, list[tuple[int, str, Mapping[str, Any]]]] = {}
    for pid, r in prompts.items():
        if r.get("conversation"):
            convs.setdefault(r["conversation"], []).append((int(r.get("turn", 0)), pid, r))
    out = {}
    for cid, turns in convs.items():
        turns.sort()
        block = acceptance_block(pool(r.get("histogram", []) for _, _, r in turns))
        out[cid] = {"category": turns[0][2].get("category", "prompt"), "turns": [pid for _, pid, _ in turns],
                    "turn_tau": [r.get("tau") for _, _, r in turns], **block}
    return out


def turn_table(prompts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per turn number of multi-turn conversations: n, mean / median / bootstrap 95 % CI of chain τ over the
    conversations' k-th turns, and their pooled acceptance (histogram, per-position rates)."""
    by: dict[int, list[Mapping[str, Any]]] = {}
    for r in prompts.values():
        if r.get("conversation"):
            by.setdefault(int(r.get("turn", 0)), []).append(r)
    return {str(k): {"chain": summarize([r["tau"] for r in rs if _num(r.get("tau"))]).to_dict(),
                     "acceptance": acceptance_block(pool(r.get("histogram", []) for r in rs))}
            for k, rs in sorted(by.items())}
