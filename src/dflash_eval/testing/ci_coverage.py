"""The coverage of a confidence interval of a mean over prompts, measured by simulation: models of per-prompt τ
calibrated to real runs, the intervals the suite compares, and the share of replications whose interval holds the
model's true mean. Used by ``benchmarks/bench_coverage.py`` (every interval side by side) and
``tests/test_ci_coverage.py`` (the suite's own interval, :func:`dflash_eval.metrics.stats.summarize`'s, at the sizes
of real runs). Not part of the installed wheel.

Models (:class:`Model`; each draws ``reps`` runs of ``n`` prompts, a prompt's value the mean of its ``samples``):

- :func:`resampled`: prompts drawn with replacement from real per-prompt values (a greedy run's τ, or the paired
  differences of two drafters' τ); the true mean is theirs. It keeps the real skew and ties.
- :func:`pearson3`: a shifted gamma (Pearson type III) of a given mean, standard deviation and skewness, mirrored
  for a negative skew (normal at zero): a smooth model of the same moments.
- :func:`two_level`: a run at temperature > 0: a prompt drawn from real prompts, its S samples drawn from that
  prompt's own samples around its mean (residuals scaled by ``sqrt(S_i / (S_i - 1))``, so their variance is
  unbiased); the true mean is the mean of the real prompts' means. ``Var(grand mean) = (σ_between² +
  σ_within² / S) / n``.
- :func:`two_level_pearson3`: the same with both stages Pearson III of given standard deviations and skews.

Intervals (each ``(values [reps, n] or samples [reps, n, S], rng) -> (low, high)`` arrays of ``reps``):
:func:`hall_over_prompts` (the suite's: :func:`dflash_eval.metrics.stats.summarize`, at T > 0 with each prompt's
samples, :func:`dflash_eval.metrics.stats.sampled_hall_t_interval`; greedy and paired models
:func:`dflash_eval.metrics.stats.hall_t_interval`, Student's t corrected for skewness, on each replication's prompt
means), :func:`hall_prompt_means` (that Hall t on the prompt means alone, the suite's interval at T > 0 before), the
parts of the sampled interval alone (:func:`hall_skew_from_samples`: the skewness of a prompt mean from the samples;
:func:`hall_box_df`: the kurtosis-matched degrees of freedom), :func:`hall_anova_satterthwaite` (the variance of
a prompt mean from the one-way ANOVA with Satterthwaite's degrees of freedom), :func:`hall_bootstrap_calibrated`
(Hall t whose quantile is the bootstrap's of the transformed statistic), :func:`t_over_prompts` (Student's t),
:func:`percentile_bootstrap` (what the suite used before over prompt means, 2000 resamples), :func:`nested_bootstrap`
(what the suite used before for a sampled run: prompts resampled, then each drawn prompt's samples),
:func:`bca_bootstrap` (``scipy.stats.bootstrap(method="BCa")``) and :func:`studentized_bootstrap`
(bootstrap-t).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dflash_eval.metrics.stats import CI_LEVEL, hall_t_interval, sampled_hall_t_interval, t_interval

__all__ = ["Model", "resampled", "pearson3", "two_level", "two_level_pearson3", "moments", "within_between",
           "Interval", "hall_over_prompts", "hall_prompt_means", "hall_skew_from_samples", "hall_box_df",
           "hall_anova_satterthwaite", "hall_bootstrap_calibrated", "sampled_moments", "hall_arrays", "Array",
           "t_over_prompts", "percentile_bootstrap", "nested_bootstrap",
           "bca_bootstrap", "studentized_bootstrap", "Coverage", "coverage", "INTERVALS"]

Array = NDArray[np.float64]
#: One interval method: (values [reps, n] or samples [reps, n, S], rng) -> (low [reps], high [reps]).
Interval = Callable[[Array, np.random.Generator], tuple[Array, Array]]


@dataclass(frozen=True)
class Model:
    """A model of a run's per-prompt values: :meth:`draw` gives ``[reps, n, samples]`` (a greedy or paired model:
    one sample per prompt), ``true_mean`` the mean the intervals should hold."""

    name: str
    true_mean: float
    samples: int
    draw_fn: Callable[[np.random.Generator, int, int], Array]

    def draw(self, rng: np.random.Generator, reps: int, n: int) -> Array:
        out = self.draw_fn(rng, reps, n)
        assert out.shape == (reps, n, self.samples), (out.shape, reps, n, self.samples)
        return out


def moments(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, standard deviation (n - 1) and sample skewness (adjusted Fisher-Pearson) of ``values``."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    m, sd = float(x.mean()), float(x.std(ddof=1))
    g1 = float(((x - m) ** 3).mean() / x.std(ddof=0) ** 3) if sd > 0 else 0.0
    return m, sd, g1 * math.sqrt(n * (n - 1)) / (n - 2) if n > 2 else g1


def within_between(groups: Sequence[Sequence[float]]) -> dict[str, float]:
    """The two stages of sampled per-prompt τ: ``sd_within`` (root of the mean within-prompt variance), its skew
    (of the pooled residuals around each prompt's mean), ``sd_between`` (of the true prompt means: the variance of
    the prompt means less ``within / S``) and the skew of the prompt means; ``samples`` the mean S."""
    gs = [np.asarray(g, dtype=float) for g in groups if len(g) > 1]
    within = float(np.mean([g.var(ddof=1) for g in gs]))
    s = float(np.mean([len(g) for g in gs]))
    means = [float(g.mean()) for g in gs]
    _, sd_means, skew_means = moments(means)
    resid = np.concatenate([g - g.mean() for g in gs])
    return {"sd_within": math.sqrt(within), "skew_within": moments(resid.tolist())[2], "samples": s,
            "sd_between": math.sqrt(max(0.0, sd_means ** 2 - within / s)), "skew_between": skew_means,
            "mean": float(np.mean(means))}


def resampled(name: str, values: Sequence[float]) -> Model:
    """Prompts drawn with replacement from real per-prompt ``values`` (one sample each)."""
    pop = np.asarray([v for v in values if not math.isnan(v)], dtype=float)

    def draw(rng: np.random.Generator, reps: int, n: int) -> Array:
        return pop[rng.integers(0, len(pop), size=(reps, n))][..., None]

    return Model(name, float(pop.mean()), 1, draw)


def _pearson3(rng: np.random.Generator, shape: tuple[int, ...], sd: float, skew: float) -> Array:
    """Zero-mean Pearson III draws of standard deviation ``sd`` and skewness ``skew``."""
    if abs(skew) < 1e-6 or sd == 0:
        return rng.normal(0.0, sd, size=shape)
    k = 4.0 / skew ** 2
    theta = sd / math.sqrt(k)
    x = (rng.gamma(k, theta, size=shape) - k * theta)
    return x if skew > 0 else -x


def pearson3(name: str, mean: float, sd: float, skew: float) -> Model:
    """A shifted gamma of ``mean``, ``sd`` and ``skew`` (mirrored for a negative skew), one sample per prompt."""
    def draw(rng: np.random.Generator, reps: int, n: int) -> Array:
        return mean + _pearson3(rng, (reps, n, 1), sd, skew)

    return Model(name, mean, 1, draw)


def two_level(name: str, groups: Mapping[str, Sequence[float]], samples: int) -> Model:
    """A sampled run from real per-sample τ (module docstring); ``samples`` per drawn prompt."""
    gs = [np.asarray(g, dtype=float) for g in groups.values() if len(g) > 1]
    means = np.array([g.mean() for g in gs])
    resid = [(g - g.mean()) * math.sqrt(len(g) / (len(g) - 1)) for g in gs]
    width = max(len(r) for r in resid)
    table = np.full((len(gs), width), np.nan)
    for i, r in enumerate(resid):
        table[i, :len(r)] = r
    sizes = np.array([len(r) for r in resid])

    def draw(rng: np.random.Generator, reps: int, n: int) -> Array:
        picks = rng.integers(0, len(gs), size=(reps, n))
        cols = (rng.random((reps, n, samples)) * sizes[picks][..., None]).astype(int)
        return means[picks][..., None] + table[picks[..., None], cols]

    return Model(name, float(means.mean()), samples, draw)


def two_level_pearson3(name: str, mean: float, sd_between: float, skew_between: float, sd_within: float,
                       skew_within: float, samples: int) -> Model:
    """A sampled run with Pearson III prompt effects and Pearson III samples around each prompt's mean."""
    def draw(rng: np.random.Generator, reps: int, n: int) -> Array:
        b = _pearson3(rng, (reps, n, 1), sd_between, skew_between)
        return mean + b + _pearson3(rng, (reps, n, samples), sd_within, skew_within)

    return Model(name, mean, samples, draw)


# ----------------------------------------------------------------------------------------------------------------
# The intervals. Each takes the drawn samples [reps, n, S] (S = 1 for one value per prompt).

_LO, _HI = (1 - CI_LEVEL) / 2, 1 - (1 - CI_LEVEL) / 2
RESAMPLES = 2000


def _each(ci: Callable[[list[float]], tuple[float, float]], x: Array) -> tuple[Array, Array]:
    out = [ci(row.tolist()) for row in x.mean(axis=2)]
    return np.array([c[0] for c in out]), np.array([c[1] for c in out])


def hall_over_prompts(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """The suite's interval: with 3 or more samples per prompt
    :func:`dflash_eval.metrics.stats.sampled_hall_t_interval` of each replication's samples, else
    :func:`dflash_eval.metrics.stats.hall_t_interval` (Student's t corrected for skewness) over its prompt means."""
    if x.shape[2] < 3:
        return _each(hall_t_interval, x)
    out = [sampled_hall_t_interval(row.tolist()) for row in x]
    return np.array([c[0] for c in out]), np.array([c[1] for c in out])


def hall_prompt_means(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """:func:`dflash_eval.metrics.stats.hall_t_interval` over each replication's prompt means alone (the suite's
    interval at T > 0 before it took moments from the samples)."""
    return _each(hall_t_interval, x)


def sampled_moments(x: Array) -> dict[str, Array]:
    """Per replication of ``x`` ``[reps, n, S]`` (S >= 3), the pieces of
    :func:`dflash_eval.metrics.stats.sampled_hall_t_interval`, vectorized: ``mean``, ``k2`` (variance of the prompt
    means), ``k3`` (their k-statistic), ``kappa3`` (with the within-prompt part from the samples), ``df_box`` (the
    kurtosis-matched degrees of freedom, from k4 of the prompt means and of the samples) and ``n``."""
    reps, n, s = x.shape
    m = x.mean(axis=2)
    mean = m.mean(axis=1)
    d = m - mean[:, None]
    m2, m3, m4 = ((d ** k).mean(axis=1) for k in (2, 3, 4))
    k2 = m2 * n / (n - 1)
    k3 = m3 * n * n / ((n - 1) * (n - 2)) if n > 2 else np.zeros(reps)
    r = x - m[..., None]
    w3 = ((r ** 3).sum(axis=2) * s / ((s - 1) * (s - 2))).mean(axis=1)
    g2, g4 = (r ** 2).mean(axis=2), (r ** 4).mean(axis=2)
    w4 = ((s * s * ((s + 1) * g4 - 3 * (s - 1) * g2 ** 2) / ((s - 1) * (s - 2) * (s - 3))).mean(axis=1) if s > 3
          else np.full(reps, -np.inf))
    k4 = (n * n * ((n + 1) * m4 - 3 * (n - 1) * m2 ** 2) / ((n - 1) * (n - 2) * (n - 3)) if n > 3
          else np.full(reps, -np.inf))
    with np.errstate(divide="ignore", invalid="ignore"):
        within3, within4 = w3 / s ** 2, w4 / s ** 3
        kappa3 = np.where((k3 - within3) * within3 < 0, within3, k3)
        excess = np.maximum(0.0, np.maximum(k4, within4) / k2 ** 2)
    excess = np.where(k2 > 0, excess, 0.0)
    return {"mean": mean, "k2": k2, "k3": k3, "kappa3": kappa3, "df_box": 1 / (1 / (n - 1) + excess / (2 * n)),
            "n": np.full(reps, float(n))}


def hall_arrays(mean: Array, k2: Array, kappa3: Array, n: int, df: Array | float) -> tuple[Array, Array]:
    """Hall's interval (:func:`dflash_eval.metrics.stats.hall_t_interval`) from its pieces, vectorized."""
    from scipy.special import stdtrit  # scipy: only where an interval is measured

    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(k2 > 0, kappa3 / k2 ** 1.5, 0.0) / (3 * math.sqrt(n))
        q = stdtrit(df, 0.5 + CI_LEVEL / 2)
        small = np.abs(a) < 1e-12
        safe = np.where(small, 1.0, a)

        def inverse(y: Array) -> Array:
            return np.where(small, y, (np.cbrt(1 + 3 * safe * (y - safe / 2)) - 1) / safe)

        se = np.sqrt(k2 / n)
        return mean - inverse(q) * se, mean - inverse(-q) * se


def hall_skew_from_samples(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """Hall t with n - 1 degrees of freedom and the skewness of a prompt mean from the samples (the sampled
    interval without its kurtosis-matched degrees of freedom); over the prompt means at S < 3."""
    if x.shape[2] < 3:
        return _each(hall_t_interval, x)
    p = sampled_moments(x)
    return hall_arrays(p["mean"], p["k2"], p["kappa3"], x.shape[1], x.shape[1] - 1)


def hall_box_df(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """Hall t with the skewness of the prompt means alone and the kurtosis-matched degrees of freedom from the
    samples (the sampled interval without its skewness from the samples); over the prompt means at S < 3."""
    if x.shape[2] < 3:
        return _each(hall_t_interval, x)
    p = sampled_moments(x)
    return hall_arrays(p["mean"], p["k2"], p["k3"], x.shape[1], p["df_box"])


def hall_anova_satterthwaite(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """Hall t over prompt means with the variance of a prompt mean from the one-way ANOVA, ``σ_between² +
    σ_within² / S``, ``σ_between²`` truncated at 0, and Satterthwaite's degrees of freedom of that sum of mean
    squares (F. E. Satterthwaite, "An approximate distribution of estimates of variance components", Biometrics
    Bulletin 2, 1946): untruncated it is the variance of the prompt means with n - 1; truncated, the within mean
    square alone with n (S - 1). Over the prompt means at S < 2."""
    reps, n, s = x.shape
    if s < 2:
        return _each(hall_t_interval, x)
    m = x.mean(axis=2)
    mean = m.mean(axis=1)
    d = m - mean[:, None]
    m2, m3 = (d ** 2).mean(axis=1), (d ** 3).mean(axis=1)
    k2 = m2 * n / (n - 1)
    within = ((x - m[..., None]) ** 2).sum(axis=(1, 2)) / (n * (s - 1)) / s
    truncated = k2 < within
    v = np.where(truncated, within, k2)
    df = np.where(truncated, n * (s - 1), n - 1).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa3 = np.where(m2 > 0, m3 / m2 ** 1.5, 0.0) * v ** 1.5  # the prompt means' skewness, as Hall t's
    return hall_arrays(mean, v, kappa3, n, df)


def hall_bootstrap_calibrated(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """Hall t over prompt means whose quantile is calibrated by the bootstrap: the 95 % quantile of ``|g*(T*)|``
    over 2000 resamples of the prompt means (T* studentized and g* transformed with each resample's own skewness),
    in place of Student's t (P. Hall, 1992, section 3: bootstrapping the transformed statistic)."""
    m = x.mean(axis=2)
    reps, n = m.shape
    lo, hi = np.empty(reps), np.empty(reps)
    for r in range(reps):
        row = m[r]
        res = row[rng.integers(0, n, size=(RESAMPLES, n))]
        mean_b = res.mean(axis=1)
        d = res - mean_b[:, None]
        m2, m3 = (d ** 2).mean(axis=1), (d ** 3).mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(m2 > 0, m3 / m2 ** 1.5, 0.0) / (3 * math.sqrt(n))
            se = np.sqrt(m2 * n / (n - 1) / n)
            t = np.where(se > 0, (mean_b - row.mean()) / se, 0.0)
        q = float(np.quantile(np.abs(t + a / 2 + a * t ** 2 + a ** 2 * t ** 3 / 3), CI_LEVEL))
        d0 = row - row.mean()
        m2_0, m3_0 = float((d0 ** 2).mean()), float((d0 ** 3).mean())
        a0 = m3_0 / m2_0 ** 1.5 / (3 * math.sqrt(n)) if m2_0 > 0 else 0.0
        se0 = math.sqrt(m2_0 / (n - 1))
        lo[r], hi[r] = row.mean() - _hall_inverse(q, a0) * se0, row.mean() - _hall_inverse(-q, a0) * se0
    return lo, hi


def _hall_inverse(y: float, a: float) -> float:
    """``g⁻¹(y)`` of Hall's ``g(T) = T + a/2 + a T² + a² T³ / 3``."""
    if abs(a) < 1e-12:
        return y
    u = 1 + 3 * a * (y - a / 2)
    return (math.copysign(abs(u) ** (1 / 3), u) - 1) / a


def t_over_prompts(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """Student's t over each replication's prompt means (:func:`dflash_eval.metrics.stats.t_interval`)."""
    return _each(t_interval, x)


def _old_quantiles(means: Array) -> tuple[Array, Array]:
    """The order statistics the suite's percentile bootstrap read: ``sorted[int(0.025 (B-1))]``,
    ``sorted[round(0.975 (B-1))]``."""
    b = means.shape[-1]
    srt = np.sort(means, axis=-1)
    return srt[..., int(_LO * (b - 1))], srt[..., int(round(_HI * (b - 1)))]


def percentile_bootstrap(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """The percentile bootstrap over prompt means (the suite's interval before; 2000 resamples)."""
    m = x.mean(axis=2)
    reps, n = m.shape
    lo, hi = np.empty(reps), np.empty(reps)
    for r in range(reps):
        means = m[r][rng.integers(0, n, size=(RESAMPLES, n))].mean(axis=1)
        lo[r], hi[r] = _old_quantiles(means)
    return lo, hi


def nested_bootstrap(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """Two-stage percentile bootstrap (the suite's interval of a sampled run before): prompts resampled with
    replacement, then each drawn prompt's samples; 2000 resamples."""
    reps, n, s = x.shape
    lo, hi = np.empty(reps), np.empty(reps)
    for r in range(reps):
        picks = rng.integers(0, n, size=(RESAMPLES, n))
        cols = rng.integers(0, s, size=(RESAMPLES, n, s))
        means = x[r][picks[..., None], cols].mean(axis=(1, 2))
        lo[r], hi[r] = _old_quantiles(means)
    return lo, hi


def bca_bootstrap(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """``scipy.stats.bootstrap(method="BCa")`` over prompt means (2000 resamples), replications in chunks."""
    from scipy.stats import bootstrap  # scipy.stats takes ~2 s to import: only when this interval is measured

    m = x.mean(axis=2)
    lo, hi = np.empty(len(m)), np.empty(len(m))
    for start in range(0, len(m), 50):
        chunk = m[start:start + 50]
        res = bootstrap((chunk,), np.mean, axis=-1, vectorized=True, n_resamples=RESAMPLES, method="BCa",
                        confidence_level=CI_LEVEL, random_state=rng)
        lo[start:start + 50], hi[start:start + 50] = res.confidence_interval
    # a replication whose prompt means are all equal has no BCa interval (NaN): the point is its interval
    same = np.ptp(m, axis=1) == 0
    lo[same], hi[same] = m[same, 0], m[same, 0]
    return lo, hi


def studentized_bootstrap(x: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """The bootstrap-t over prompt means: quantiles of ``(mean* - mean) / se*`` (2000 resamples)."""
    m = x.mean(axis=2)
    reps, n = m.shape
    lo, hi = np.empty(reps), np.empty(reps)
    for r in range(reps):
        row = m[r]
        mean, se = row.mean(), row.std(ddof=1) / math.sqrt(n)
        res = row[rng.integers(0, n, size=(RESAMPLES, n))]
        se_b = res.std(axis=1, ddof=1) / math.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(se_b > 0, (res.mean(axis=1) - mean) / se_b, 0.0)
        q_lo, q_hi = np.quantile(t, [_LO, _HI])
        lo[r], hi[r] = mean - q_hi * se, mean - q_lo * se
    return lo, hi


#: Every interval the benchmark compares, by the name it prints.
INTERVALS: dict[str, Interval] = {"percentile (before)": percentile_bootstrap, "nested (before)": nested_bootstrap,
                                  "t": t_over_prompts, "Hall t, prompt means (before)": hall_prompt_means,
                                  "Hall t, skew from samples": hall_skew_from_samples, "Hall t, Box df": hall_box_df,
                                  "Hall t, ANOVA Satterthwaite": hall_anova_satterthwaite,
                                  "Hall t, bootstrap q": hall_bootstrap_calibrated,
                                  "Hall t (now)": hall_over_prompts, "BCa": bca_bootstrap,
                                  "studentized": studentized_bootstrap}


@dataclass(frozen=True)
class Coverage:
    """How often an interval held the true mean over ``reps`` replications, how often it lay wholly below it
    (``below``: its upper end under the true mean, what a false regression reads) and wholly above it, and its
    median width."""

    covered: float
    reps: int
    median_width: float
    below: float = math.nan
    above: float = math.nan

    @property
    def standard_error(self) -> float:
        """The Monte Carlo standard error of :attr:`covered`."""
        return math.sqrt(self.covered * (1 - self.covered) / self.reps)


def coverage(model: Model, interval: Interval, n: int, reps: int, seed: int) -> Coverage:
    """The share of ``reps`` runs of ``n`` prompts drawn from ``model`` whose ``interval`` holds its true mean
    (seeded: the same draws for every interval given the same seed)."""
    x = model.draw(np.random.default_rng(seed), reps, n)
    lo, hi = interval(x, np.random.default_rng(seed + 1))
    held = (lo <= model.true_mean) & (model.true_mean <= hi)
    return Coverage(float(held.mean()), reps, float(np.median(hi - lo)), float((hi < model.true_mean).mean()),
                    float((lo > model.true_mean).mean()))
