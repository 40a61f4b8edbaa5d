"""The suite's confidence interval of a mean over prompts (:func:`dflash_eval.metrics.stats.hall_t_interval`:
Student's t corrected for skewness) and of a paired difference (:func:`dflash_eval.metrics.stats.paired_difference`):
Student's t exactly where there is no skewness, Hall's formula where there is, NaN where there is no interval, and
a measured coverage of at least 94 % at 8, 12 and 37 prompts in simulations calibrated to the bundled runs
(``tests/data/ci_calibration.json``: a greedy run, runs at T = 0.6 and 1.0 with 8 samples per prompt, and the
paired differences of two drafters), where the percentile bootstrap the suite used before falls short; at T = 0.6,
where a few samples run long and no compared interval reaches 94 % at 8 prompts, the interval is pinned to cover
more often than Student's t. Seeded: the same numbers on every run. The full comparison is
``benchmarks/bench_coverage.py``.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from dflash_eval.metrics.stats import (
    PAIRED_T_OVER_PROMPTS,
    T_OVER_PROMPTS,
    hall_t_interval,
    paired_difference,
    summarize,
    t_interval,
)
from dflash_eval.testing import ci_coverage as cc

CALIBRATION = json.loads((Path(__file__).parent / "data" / "ci_calibration.json").read_text())
SIZES = (8, 12, 37)
REPS = 4000  # Monte Carlo standard error of a coverage near 95 %: 0.34 points
T_975_4 = 2.776445  # Student's t, 0.975 quantile, 4 degrees of freedom (tables)


def test_t_interval_is_students_t() -> None:
    lo, hi = t_interval([1.0, 2.0, 3.0, 4.0, 10.0])
    half = T_975_4 * math.sqrt(12.5) / math.sqrt(5)  # sd = sqrt(12.5)
    assert (lo, hi) == pytest.approx((4.0 - half, 4.0 + half), rel=1e-6)
    assert t_interval([2.0, 2.0]) == (2.0, 2.0)


def test_hall_interval_is_t_without_skewness_and_halls_formula_with_it() -> None:
    symmetric = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert hall_t_interval(symmetric) == pytest.approx(t_interval(symmetric))
    x = [1.0, 2.0, 3.0, 4.0, 10.0]
    mean, n = 4.0, 5
    m2, m3 = statistics.fmean((v - mean) ** 2 for v in x), statistics.fmean((v - mean) ** 3 for v in x)
    a = m3 / m2 ** 1.5 / (3 * math.sqrt(n))
    se = math.sqrt(12.5 / n)

    def g_inverse(y: float) -> float:  # g(T) = T + a/2 + a T² + a² T³ / 3 (Hall 1992), solved for T
        u = 1 + 3 * a * (y - a / 2)
        return (math.copysign(abs(u) ** (1 / 3), u) - 1) / a

    lo, hi = hall_t_interval(x)
    assert (lo, hi) == pytest.approx((mean - g_inverse(T_975_4) * se, mean - g_inverse(-T_975_4) * se), rel=1e-6)
    assert hi - mean > mean - lo  # a long right tail: the interval reaches further up
    for no_interval in ([], [3.0], [1.0, math.inf]):
        assert all(math.isnan(v) for v in hall_t_interval(no_interval))
    s = summarize(x)
    assert (s.ci_low, s.ci_high) == (lo, hi) and s.ci_method == T_OVER_PROMPTS and s.median == 3.0
    assert s == summarize(x)
    assert summarize([1.0, 2.0], over="samples").ci_method == "Hall t over samples"


def test_paired_difference_pairs_by_prompt() -> None:
    after = {"a": 2.0, "b": 3.0, "c": 2.5, "d": math.nan, "e": 9.0}
    before = {"a": 1.5, "b": 2.0, "c": 2.5, "d": 1.0, "x": 0.0}
    d = paired_difference(after, before)
    assert d.n == 3 and d.mean == pytest.approx(0.5) and d.ci_method == PAIRED_T_OVER_PROMPTS
    assert (d.ci_low, d.ci_high) == pytest.approx(hall_t_interval([0.5, 1.0, 0.0]))
    one = paired_difference({"a": 1.0}, {"a": 2.0})
    assert one.n == 1 and one.mean == -1.0 and math.isnan(one.ci_high)  # one prompt: no evidence either way


SAMPLES = 8  # the suite's --samples-per-prompt default


def _pearson3_two_level(key: str) -> cc.Model:
    f = cc.within_between(list(CALIBRATION[key].values()))
    return cc.two_level_pearson3(f"{key}, Pearson III", f["mean"], f["sd_between"], f["skew_between"], f["sd_within"],
                                 f["skew_within"], SAMPLES)


def _models() -> list[cc.Model]:
    greedy = list(CALIBRATION["greedy"].values())
    out = [cc.resampled("greedy", greedy), cc.pearson3("greedy, Pearson III", *cc.moments(greedy)),
           cc.two_level("t1.0", CALIBRATION["t1.0"], SAMPLES), _pearson3_two_level("t1.0")]
    diffs = [t - CALIBRATION["greedy_reference"][p] for p, t in CALIBRATION["greedy"].items()
             if p in CALIBRATION["greedy_reference"]]
    out += [cc.resampled("paired", diffs), cc.pearson3("paired, Pearson III", *cc.moments(diffs))]
    return out


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.name)
def test_the_interval_covers_the_true_mean_at_least_94_percent(model: cc.Model) -> None:
    got = {n: cc.coverage(model, cc.hall_over_prompts, n, REPS, seed=n) for n in SIZES}
    low = {n: round(100 * c.covered, 1) for n, c in got.items() if c.covered < 0.94}
    assert not low, f"{model.name}: coverage of the suite's interval below 94 % at n = {low}"


@pytest.mark.parametrize("model", [cc.two_level("t0.6", CALIBRATION["t0.6"], SAMPLES), _pearson3_two_level("t0.6")],
                         ids=lambda m: m.name)
def test_rare_long_samples_are_covered_less_but_better_than_by_t(model: cc.Model) -> None:
    """T = 0.6: a few samples of a prompt run long (τ 2.3-3.3 against ~1.4; within-prompt skewness 2.9), and a
    run of 8 prompts that draws none of them has both a low mean and a low spread. No interval the benchmark
    compares reaches 94 % there at 8 prompts (docs/benchmarks.md: 91-94 %); the skewness correction still covers
    more often than t."""
    hall, t = (cc.coverage(model, ci, 8, REPS, seed=8) for ci in (cc.hall_over_prompts, cc.t_over_prompts))
    assert hall.covered > t.covered and hall.covered > 0.90, (hall.covered, t.covered)


def test_the_percentile_bootstrap_of_before_falls_short() -> None:
    """The check can fail: the interval the suite used before covers less than 94 % at 8 prompts."""
    greedy = list(CALIBRATION["greedy"].values())
    c = cc.coverage(cc.resampled("greedy", greedy), cc.percentile_bootstrap, 8, 1000, seed=8)
    assert c.covered < 0.93
