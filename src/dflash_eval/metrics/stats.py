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

At temperature > 0 the interval takes the moments it corrects by from the samples too
(:func:`sampled_hall_t_interval`, method :data:`SAMPLED_T_OVER_PROMPTS`): the third and fourth cumulants of a
prompt mean are ``κ_between + κ_within / S²`` and ``κ_between + κ_within / S³``, and the within-prompt parts
estimated from all n·S samples are far steadier than the same cumulants estimated from n prompt means. The skewness
feeds Hall's correction; the kurtosis sets the degrees of freedom of the standard error (the moment match of
G. E. P. Box, "Non-normality and tests on variances", Biometrika 40, 1953, and G. E. P. Box and S. L. Andersen,
"Permutation theory in the derivation of robust criteria and the study of departures from assumption", J. R.
Statist. Soc. B 17, 1955: a variance of n values with excess kurtosis γ₂ varies as a χ² of ``1 / (1 / (n - 1) +
γ₂ / (2 n))`` degrees of freedom). At T = 0.6 a few samples of a prompt run long, and the prompt-mean interval
covered 91-94 % at 8-37 prompts; this one covers at least 94 % (docs/benchmarks.md).

Fewer than 2 values give no interval: NaN bounds, which every verdict reads as "no evidence" (a comparison with NaN
is false) and the reports as ``-``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dflash_eval.metrics.acceptance_rates import acceptance_block, acceptance_table, pool
from dflash_eval.metrics.tau_rows import TauRow

__all__ = ["CI_LEVEL", "T_OVER_PROMPTS", "PAIRED_T_OVER_PROMPTS", "SAMPLED_T_OVER_PROMPTS", "Summary", "t_interval",
           "hall_t_interval", "sampled_hall_t_interval", "ci_method_name", "summarize", "paired_difference",
           "by_category", "category_table", "ddtree_budgets",
           "conversation_table", "turn_table"]

#: The level of every confidence interval the suite reports.
CI_LEVEL = 0.95
#: The method of a mean's interval over prompts (eval.json ``ci_method``; the reports print it beside the numbers).
T_OVER_PROMPTS = "Hall t over prompts"
#: The method of a paired difference's interval over the prompts both runs have.
PAIRED_T_OVER_PROMPTS = "paired Hall t over prompts"
#: The method of a mean's interval over prompts at temperature > 0, its moments taken from the prompts' samples.
SAMPLED_T_OVER_PROMPTS = "Hall t over prompts and samples"


def ci_method_name(over: str, *, paired: bool = False, samples: bool = False) -> str:
    """The name of the interval over ``over`` (``"Hall t over prompts"``, ``"paired Hall t over prompts"``, ...);
    ``samples``: the interval of :func:`sampled_hall_t_interval` (``"Hall t over prompts and samples"``)."""
    return f"{'paired ' if paired else ''}Hall t over {over}{' and samples' if samples else ''}"


def _t_quantile(p: float, df: float) -> float:
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
    return _hall_bounds(mean, sd / math.sqrt(n), gamma / (3 * math.sqrt(n)), n - 1, level)


def _hall_bounds(mean: float, se: float, a: float, df: float, level: float) -> tuple[float, float]:
    """``mean - g⁻¹(±t(0.5 + level / 2, df)) · se``, ``g(T) = T + a/2 + a T² + a² T³ / 3`` (Hall 1992)."""
    def inverse(y: float) -> float:  # g⁻¹: g(T) = ((1 + a T)³ - 1) / (3 a) + a / 2
        if abs(a) < 1e-12:
            return y
        u = 1 + 3 * a * (y - a / 2)
        return (math.copysign(abs(u) ** (1 / 3), u) - 1) / a

    q = _t_quantile(0.5 + level / 2, df)
    return mean - inverse(q) * se, mean - inverse(-q) * se


def _k3(values: Sequence[float]) -> float:
    """Fisher's k-statistic of the third cumulant (unbiased) of 3 or more values."""
    n = len(values)
    mean = statistics.fmean(values)
    return n * math.fsum((v - mean) ** 3 for v in values) / ((n - 1) * (n - 2))


def _k4(values: Sequence[float]) -> float:
    """Fisher's k-statistic of the fourth cumulant (unbiased) of 4 or more values."""
    n = len(values)
    mean = statistics.fmean(values)
    m2 = math.fsum((v - mean) ** 2 for v in values) / n
    m4 = math.fsum((v - mean) ** 4 for v in values) / n
    return n * n * ((n + 1) * m4 - 3 * (n - 1) * m2 * m2) / ((n - 1) * (n - 2) * (n - 3))


def sampled_hall_t_interval(groups: Sequence[Sequence[float]], *, level: float = CI_LEVEL) -> tuple[float, float]:
    """The 95 % CI of the mean over units (prompts) of each unit's mean over its samples, Hall's skewness-corrected
    t with the moments of a unit's mean taken from the samples as well (module docstring). ``groups``: each
    prompt's per-sample values (its value is their mean).

    With n prompts, prompt means ``m_i`` and S_i samples each: the standard error is ``sd(m) / sqrt(n)`` as for
    :func:`hall_t_interval` (it estimates ``(σ_between² + σ_within² / S) / n`` without bias); the third cumulant
    of a prompt mean is ``k3(m)`` (Fisher's unbiased k-statistic of the prompt means) unless the within-prompt part
    ``κ3_within · mean(1 / S_i²)``, ``κ3_within`` the mean over prompts of their samples' k3, reaches further from
    0 on its own side (the between-prompt part, estimated as the difference, is then taken as 0 rather than let it
    cancel the better-estimated within part); the fourth is the larger of ``k4(m)`` and ``κ4_within · mean(1 /
    S_i³)`` (the samples' k4, likewise), and its excess kurtosis ``γ₂ = κ4 / sd(m)⁴`` (at least 0) sets ``df =
    1 / (1 / (n - 1) + γ₂ / (2 n))`` (Box 1953; k-statistics: R. A. Fisher, "Moments and product moments of
    sampling distributions", Proc. London Math. Soc. 30, 1930). The interval is then :func:`hall_t_interval`'s
    with ``γ = κ3 / sd(m)³`` and ``df``. Without prompts of 3 or more samples it is :func:`hall_t_interval` over
    the prompt means. NaN, NaN with fewer than 2 prompts, a prompt without a sample or a value that is not
    finite."""
    gs = [[float(v) for v in g] for g in groups]
    if len(gs) < 2 or any(not g for g in gs) or not all(math.isfinite(v) for g in gs for v in g):
        return math.nan, math.nan
    means = [statistics.fmean(g) for g in gs]
    if all(len(g) < 3 for g in gs):
        return hall_t_interval(means, level=level)
    n = len(means)
    mean = statistics.fmean(means)
    d = [m - mean for m in means]
    m2, m3, m4 = (math.fsum(v ** k for v in d) / n for k in (2, 3, 4))
    k2 = m2 * n / (n - 1)
    if k2 <= 0:
        return mean, mean
    k3 = m3 * n * n / ((n - 1) * (n - 2)) if n > 2 else 0.0
    within3 = statistics.fmean(_k3(g) for g in gs if len(g) > 2) * statistics.fmean(1 / len(g) ** 2 for g in gs)
    kappa3 = within3 if (k3 - within3) * within3 < 0 else k3
    fourth = [_k4(g) for g in gs if len(g) > 3]
    kappa4 = max(_k4(means) if n > 3 else -math.inf,
                 statistics.fmean(fourth) * statistics.fmean(1 / len(g) ** 3 for g in gs) if fourth else -math.inf)
    excess = max(0.0, kappa4 / k2 ** 2)
    df = 1 / (1 / (n - 1) + excess / (2 * n))
    a = kappa3 / k2 ** 1.5 / (3 * math.sqrt(n))
    return _hall_bounds(mean, math.sqrt(k2 / n), a, df, level)


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


def summarize(values: Sequence[float], *, over: str = "prompts", paired: bool = False,
              samples: Sequence[Sequence[float]] | None = None) -> Summary:
    """Mean, median and the skewness-corrected t 95 % CI of the mean of ``values`` (:func:`hall_t_interval`), one
    value per ``over`` (prompts, samples, ...); ``paired``: the values are paired differences (the method's name
    says so); ``samples``: at temperature > 0, each value's per-sample values (the value is their mean), and the CI
    is :func:`sampled_hall_t_interval` (method ``"Hall t over prompts and samples"``) where a prompt has 3 or more.
    ValueError when ``samples`` does not match ``values`` (another count, or a value that is not its samples'
    mean)."""
    vals = [float(v) for v in values]
    method = ci_method_name(over, paired=paired)
    if not vals:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, method)
    if samples is not None and any(len(g) > 2 for g in samples):
        _check_samples(vals, samples)
        lo, hi = sampled_hall_t_interval(samples)
        method = ci_method_name(over, paired=paired, samples=True)
    else:
        lo, hi = hall_t_interval(vals)
    return Summary(len(vals), statistics.fmean(vals), statistics.median(vals), lo, hi, method)


def _check_samples(values: Sequence[float], samples: Sequence[Sequence[float]]) -> None:
    """ValueError unless ``samples`` holds one group per value, each group's mean the value."""
    if len(samples) != len(values):
        raise ValueError(f"{len(values)} values but {len(samples)} groups of samples: each value needs its samples")
    for i, (v, g) in enumerate(zip(values, samples)):
        m = statistics.fmean(float(x) for x in g) if g else math.nan
        if not math.isclose(v, m, rel_tol=1e-9, abs_tol=1e-9) and not (math.isnan(v) and math.isnan(m)):
            raise ValueError(f"value {i} is {v!r} but its {len(g)} samples' mean is {m!r}: the samples are not "
                             "that value's (another prompt's, or another budget's?)")


def paired_difference(after: Mapping[str, float], before: Mapping[str, float], *,
                      after_samples: Mapping[str, Sequence[float]] | None = None,
                      before_samples: Mapping[str, Sequence[float]] | None = None) -> Summary:
    """The mean per-prompt difference ``after - before`` over the prompts both have (NaN on either side left out),
    with its 95 % CI over those prompts (:func:`hall_t_interval` of the differences, :data:`PAIRED_T_OVER_PROMPTS`):
    a regression across checkpoints, a run against its baseline, a drafter against the reference drafter. At
    temperature > 0, ``after_samples`` / ``before_samples``: each prompt's per-sample τ of either side; where every
    paired prompt has as many on both sides, the sample-by-sample differences (their mean is the prompt's
    difference, paired on the same sampled references or not) give :func:`sampled_hall_t_interval`."""
    keys = [p for p, a in after.items() if p in before and not math.isnan(a) and not math.isnan(before[p])]
    diffs = [after[p] - before[p] for p in keys]
    groups: list[list[float]] | None = None
    if after_samples is not None and before_samples is not None and keys and all(
            p in after_samples and p in before_samples and len(after_samples[p]) == len(before_samples[p])
            for p in keys):
        groups = [[float(a) - float(b) for a, b in zip(after_samples[p], before_samples[p])] for p in keys]
        diffs = [statistics.fmean(g) if g else math.nan for g in groups]
    return summarize(diffs, paired=True, samples=groups)


def by_category(values: Mapping[str, float], categories: Mapping[str, str],
                samples: Mapping[str, Sequence[float]] | None = None) -> dict[str, Summary]:
    """Summaries per category plus ``"all"``; ``values`` and ``categories`` are keyed by prompt id; ``samples``
    (temperature > 0): each prompt's per-sample values, for :func:`summarize`'s interval over prompts and
    samples."""
    groups: dict[str, list[str]] = {}
    for pid in values:
        groups.setdefault(categories.get(pid, "prompt"), []).append(pid)

    def summary(pids: list[str]) -> Summary:
        sam = [samples[p] for p in pids] if samples is not None and all(p in samples for p in pids) else None
        return summarize([values[p] for p in pids], samples=sam)

    out = {cat: summary(pids) for cat, pids in sorted(groups.items())}
    out["all"] = summary(list(values))
    return out


def _num(x: object) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


class _Budgets(Protocol):
    @property
    def ddtree(self) -> Mapping[str, float]: ...


def ddtree_budgets(prompts: Mapping[str, _Budgets]) -> list[str]:
    """The DDTree budgets (eval.json's string keys) found in any prompt row, ascending."""
    return sorted({b for r in prompts.values() for b in r.ddtree}, key=int)


def _row_samples(values: Mapping[str, float], samples: Mapping[str, Sequence[float] | None],
                 where: str) -> dict[str, list[float]]:
    """The per-sample τ at temperature > 0 (``samples``, the rows' field ``where``) of the prompts in ``values``;
    ValueError naming the prompt and field where a row's samples do not average to its τ."""
    out = {}
    for p, v in values.items():
        vals = samples.get(p)
        if not vals:
            continue
        got = statistics.fmean(float(x) for x in vals)
        if not math.isclose(got, float(v), rel_tol=1e-9, abs_tol=1e-9):
            raise ValueError(f"prompt {p!r}: the mean of its {where} is {got!r}, its τ {v!r}: the row's samples and "
                             "τ disagree (an eval.json edited or merged from different runs?)")
        out[p] = [float(x) for x in vals]
    return out


def category_table(prompts: Mapping[str, TauRow]) -> dict[str, dict[str, Any]]:
    """Per category (and ``"all"``): n, and mean / median / 95 % CI over prompts of chain τ and of each DDTree
    budget's τ, from the run's prompt rows (prompts whose τ is NaN are left out), ``acceptance``: per source, the
    pooled rounds' histogram and per-position rates, and the floors and verdict not judged yet (None; every budget's
    floor None), which :func:`dflash_eval.metrics.verdict.judge_categories` fills."""
    cat = {p: r.category for p, r in prompts.items()}
    chain_values = {p: r.tau for p, r in prompts.items() if _num(r.tau)}
    chain = by_category(chain_values, cat, _row_samples(chain_values, {p: r.sample_tau for p, r in prompts.items()},
                                                        "sample_tau"))
    bs = ddtree_budgets(prompts)
    dd = {}
    for b in bs:
        values = {p: r.ddtree[b] for p, r in prompts.items() if _num(r.ddtree.get(b))}
        per_sample = {p: (r.ddtree_sample_tau or {}).get(b) for p, r in prompts.items()}
        dd[b] = by_category(values, cat, _row_samples(values, per_sample, f"ddtree_sample_tau[{b!r}]"))
    acc = acceptance_table(prompts)
    return {c: {"n": summ.n, "chain": summ.to_dict(), "ddtree": {b: dd[b][c].to_dict() for b in bs if c in dd[b]},
                "acceptance": acc.get(c, {}), "floor": None, "ddtree_floor": {b: None for b in bs}, "passed": None}
            for c, summ in chain.items()}


def conversation_table(prompts: Mapping[str, TauRow]) -> dict[str, dict[str, Any]]:
    """Per multi-turn conversation (rows with ``conversation``): its turns' ids and chain τ in turn order, and the
    conversation's τ over all its rounds pooled (``tau``, ``rounds``, ``histogram``, ``position_rates``)."""
    convs: dict[str, list[tuple[int, str, TauRow]]] = {}
    for pid, r in prompts.items():
        if r.conversation:
            convs.setdefault(r.conversation, []).append((int(r.turn or 0), pid, r))
    out = {}
    for cid, turns in convs.items():
        turns.sort(key=lambda t: t[:2])
        block = acceptance_block(pool(r.histogram for _, _, r in turns))
        out[cid] = {"category": turns[0][2].category, "turns": [pid for _, pid, _ in turns],
                    "turn_tau": [r.tau for _, _, r in turns], **block}
    return out


def turn_table(prompts: Mapping[str, TauRow]) -> dict[str, dict[str, Any]]:
    """Per turn number of multi-turn conversations: n, mean / median / 95 % CI of chain τ over the
    conversations' k-th turns, and their pooled acceptance (histogram, per-position rates)."""
    by: dict[int, list[TauRow]] = {}
    for r in prompts.values():
        if r.conversation:
            by.setdefault(int(r.turn or 0), []).append(r)
    return {str(k): {"chain": summarize([r.tau for r in rs if _num(r.tau)], over="conversations").to_dict(),
                     "acceptance": acceptance_block(pool(r.histogram for r in rs))}
            for k, rs in sorted(by.items())}
