"""Summary statistics of per-prompt τ: mean, median and the one 95 % confidence interval of a mean that the suite
reports and judges by, per category and over all prompts (with each category's pooled per-position acceptance,
:mod:`dflash_eval.metrics.acceptance_rates`); the paired difference of two runs' τ over the prompts both have; and,
for multi-turn conversations, τ per turn and per conversation.

The interval (:func:`hall_t_interval`): Student's t over the units the mean averages (prompts; a prompt's samples
for one prompt's CI), corrected for their skewness by Hall's transformation (P. Hall, "On the removal of skewness
by transformation", J. R. Statist. Soc. B 54, 1992): the studentized mean ``T = (mean - μ) / (s / sqrt(n))`` is
passed through the monotone ``g(T) = T + a/2 + a T² + a² T³ / 3``, ``a = γ / (3 sqrt(n))`` (γ the sample
skewness), which removes the skewness term of T's distribution, and the interval is ``mean - g⁻¹(±t(0.975, n - 1))
· s / sqrt(n)``. For symmetric values (γ = 0, and any 2 values) it is Student's t interval. Per-prompt τ is skewed
(a few prompts, or at T > 0 a few samples, with long accepted runs): a plain t interval then misses the true mean
more often on one side, the side a verdict reads (a regression is an upper end below 0).

For a run at temperature > 0 a prompt's value is the mean over its S samples, and the variance of the mean over n
prompts is ``(σ_between² + σ_within² / S) / n``, which the sample variance of the n prompt means estimates without
bias: one interval over the prompt means covers both stages. A paired difference (:func:`paired_difference`: this
run minus a baseline, a checkpoint minus the best one, a drafter minus the reference drafter) is the interval of
the per-prompt differences. Coverage measured in simulations calibrated to the bundled runs, against Student's t,
the percentile bootstrap the suite used before, BCa and the studentized bootstrap: ``benchmarks/bench_coverage.py``
(docs/benchmarks.md, "Coverage of the confidence intervals"). Every interval carries its method's name
(:attr:`Summary.ci_method`), which the reports print beside it.

Fewer than 2 values give no interval: NaN bounds, which every verdict reads as "no evidence" (a comparison with NaN
is false) and the reports as ``-``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_eval.metrics.acceptance_rates import acceptance_block, acceptance_table, pool

__all__ = ["CI_LEVEL", "T_OVER_PROMPTS", "PAIRED_T_OVER_PROMPTS", "Summary", "t_interval", "hall_t_interval",
           "ci_method_name", "summarize", "paired_difference", "by_category", "category_table", "ddtree_budgets",
           "conversation_table", "turn_table"]

#: The level of every confidence interval the suite reports.
CI_LEVEL = 0.95
#: The method of a mean's interval over prompts (eval.json ``ci_method``; the reports print it beside the numbers).
T_OVER_PROMPTS = "Hall t over prompts"
#: The method of a paired difference's interval over the prompts both runs have.
PAIRED_T_OVER_PROMPTS = "paired Hall t over prompts"


def ci_method_name(over: str, *, paired: bool = False) -> str:
    """The name of the interval over ``over`` (``"Hall t over prompts"``, ``"paired Hall t over prompts"``, ...)."""
    return f"{'paired ' if paired else ''}Hall t over {over}"


def _t_quantile(p: float, df: int) -> float:
    from scipy.special import stdtrit  # scipy takes ~0.7 s to import: kept out of pytest --help and dflash-eval --help

    return float(stdtrit(df, p))


def _moments(values: Sequence[float]) -> tuple[float, float, float] | None:
    """Mean, standard deviation (n - 1) and skewness (``m3 / m2^1.5``) of 2 or more finite values, else None."""
    vals = [float(v) for v in values]
    if len(vals) < 2 or not all(math.isfinite(v) for v in vals):
        return None
    mean = statistics.fmean(vals)
    m2 = math.fsum((v - mean) ** 2 for v in vals) / len(vals)
    m3 = math.fsum((v - mean) ** 3 for v in vals) / len(vals)
    sd = math.sqrt(m2 * len(vals) / (len(vals) - 1))
    return mean, sd, (m3 / m2 ** 1.5 if m2 > 0 else 0.0)


def t_interval(values: Sequence[float], *, level: float = CI_LEVEL) -> tuple[float, float]:
    """Student's t confidence interval of the mean of ``values`` (NaN, NaN with fewer than 2 or with a value that is
    not finite; the mean twice when they are all equal)."""
    m = _moments(values)
    if m is None:
        return math.nan, math.nan
    mean, sd, _ = m
    half = _t_quantile(0.5 + level / 2, len(values) - 1) * sd / math.sqrt(len(values)) if sd > 0 else 0.0
    return mean - half, mean + half


def hall_t_interval(values: Sequence[float], *, level: float = CI_LEVEL) -> tuple[float, float]:
    """The skewness-corrected t confidence interval of the mean of ``values`` (module docstring; NaN, NaN with fewer
    than 2 or with a value that is not finite; the mean twice when they are all equal)."""
    m = _moments(values)
    if m is None:
        return math.nan, math.nan
    mean, sd, gamma = m
    n = len(values)
    if sd == 0:
        return mean, mean
    a = gamma / (3 * math.sqrt(n))

    def inverse(y: float) -> float:  # g⁻¹: g(T) = ((1 + a T)³ - 1) / (3 a) + a / 2
        if abs(a) < 1e-12:
            return y
        u = 1 + 3 * a * (y - a / 2)
        return (math.copysign(abs(u) ** (1 / 3), u) - 1) / a

    q = _t_quantile(0.5 + level / 2, n - 1)
    se = sd / math.sqrt(n)
    return mean - inverse(q) * se, mean - inverse(-q) * se


@dataclass(frozen=True)
class Summary:
    """A mean with its median and its 95 % confidence interval, and the interval's method (:data:`T_OVER_PROMPTS`,
    :data:`PAIRED_T_OVER_PROMPTS`, ``"Hall t over samples"``, ...)."""

    n: int
    mean: float
    median: float
    ci_low: float
    ci_high: float
    ci_method: str = T_OVER_PROMPTS

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "median": self.median, "ci95": [self.ci_low, self.ci_high],
                "ci_method": self.ci_method}


def summarize(values: Sequence[float], *, over: str = "prompts", paired: bool = False) -> Summary:
    """Mean, median and the skewness-corrected t 95 % CI of the mean of ``values`` (:func:`hall_t_interval`), one
    value per ``over`` (prompts, samples, ...); ``paired``: the values are paired differences (the method's name
    says so)."""
    vals = [float(v) for v in values]
    method = ci_method_name(over, paired=paired)
    if not vals:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, method)
    lo, hi = hall_t_interval(vals)
    return Summary(len(vals), statistics.fmean(vals), statistics.median(vals), lo, hi, method)


def paired_difference(after: Mapping[str, float], before: Mapping[str, float]) -> Summary:
    """The mean per-prompt difference ``after - before`` over the prompts both have (NaN on either side left out),
    with its 95 % CI over those prompts (:func:`hall_t_interval` of the differences, :data:`PAIRED_T_OVER_PROMPTS`):
    a regression across checkpoints, a run against its baseline, a drafter against the reference drafter."""
    return summarize([a - before[p] for p, a in after.items()
                      if p in before and not math.isnan(a) and not math.isnan(before[p])], paired=True)


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
    """Per category (and ``"all"``): n, and mean / median / 95 % CI over prompts of chain τ and of each DDTree
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
    """Per turn number of multi-turn conversations: n, mean / median / 95 % CI of chain τ over the
    conversations' k-th turns, and their pooled acceptance (histogram, per-position rates)."""
    by: dict[int, list[Mapping[str, Any]]] = {}
    for r in prompts.values():
        if r.get("conversation"):
            by.setdefault(int(r.get("turn", 0)), []).append(r)
    return {str(k): {"chain": summarize([r["tau"] for r in rs if _num(r.get("tau"))],
                                        over="conversations").to_dict(),
                     "acceptance": acceptance_block(pool(r.get("histogram", []) for r in rs))}
            for k, rs in sorted(by.items())}
