"""The drift budget as a number: a monotone fit of the mean τ drop against the injected feature error, the error at
which the fit reaches the tolerance, and its bootstrap confidence interval (numpy only; no torch).

:mod:`dflash_eval.metrics.drift_budget` measures τ of every prompt under every perturbation; this module turns those
measurements into the budget:

- **Harm** of a perturbation is the signed τ **drop**, the mean over prompts of ``τ(unperturbed) - τ(perturbed)``:
  a perturbation that raises τ on average does no harm (its drop is negative, and the fit never goes below 0).
- **The fit**: isotonic (non-decreasing) least-squares regression of the mean drop against the injected error
  (pool-adjacent-violators, :func:`isotonic`), clipped at 0, and read between the measured points by linear
  interpolation in ``log(error)`` (:func:`crossing`). No shape is assumed beyond "more error does no less harm";
  interpolating in log error is conservative where the drop grows faster than linearly in log error (as measured:
  docs/drift-budget.md), since the straight line then lies above the curve and reaches the tolerance earlier.
- **The budget**: the injected error at which the fit reaches the tolerance. Below the smallest measured error the
  fit is read on the straight line from (0, 0) (an unperturbed feature does no harm), flagged ``below_range``; when
  the fit stays under the tolerance up to the largest measured error the budget is that error, a lower bound,
  flagged ``not_reached``.
- **Its CI**: a paired percentile bootstrap over prompts: each resample draws prompt indices once and uses them for
  every level (a prompt's τ under the different perturbations is correlated), refits, and finds the crossing; a
  resample that does not reach the tolerance counts as +inf. The CI is the central :data:`CI_LEVEL` interval of the
  crossings; its upper end is +inf (open) when more than its share of resamples does not cross, and its lower end
  never exceeds the largest measured error (nothing beyond it was measured).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dflash_eval.metrics.drift_checks import METHOD

__all__ = ["CI_LEVEL", "RESAMPLES", "METHOD", "BudgetFit", "isotonic", "crossing", "fit_budget"]

#: Two-sided level of the budget's CI: each end is a one-sided 95 % bound, which is what the gate uses them as.
CI_LEVEL = 0.90
#: Bootstrap resamples of the prompts (seed 0: the budget depends on the measured τ only).
RESAMPLES = 2000

CROSSED, BELOW_RANGE, NOT_REACHED, NO_PROMPTS = "crossed", "below_range", "not_reached", "no_prompts"


def isotonic(y: Sequence[float] | np.ndarray) -> np.ndarray:
    """The non-decreasing least-squares fit of ``y`` (equal weights), by pool-adjacent-violators."""
    vals: list[float] = []
    sizes: list[int] = []
    for v in np.asarray(y, dtype=float):
        vals.append(float(v))
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            n = sizes[-2] + sizes[-1]
            vals[-2] = (vals[-2] * sizes[-2] + vals[-1] * sizes[-1]) / n
            sizes[-2] = n
            vals.pop()
            sizes.pop()
    return np.repeat(np.asarray(vals), sizes)


def crossing(errors: Sequence[float] | np.ndarray, fitted: Sequence[float] | np.ndarray,
             tol: float) -> tuple[float, str]:
    """Where a non-decreasing fit (``fitted`` at ascending positive ``errors``) reaches ``tol``: ``(error, status)``
    with status :data:`CROSSED` (log-linear interpolation between the two points around it), :data:`BELOW_RANGE`
    (already at the smallest error: on the line from (0, 0)) or :data:`NOT_REACHED` (the largest error)."""
    x, f = np.asarray(errors, dtype=float), np.asarray(fitted, dtype=float)
    if x.size == 0:
        return 0.0, NOT_REACHED
    over = np.nonzero(f >= tol)[0]
    if over.size == 0:
        return float(x[-1]), NOT_REACHED
    k = int(over[0])
    if k == 0:
        return float(x[0] * tol / f[0]), BELOW_RANGE
    t = (tol - f[k - 1]) / (f[k] - f[k - 1])
    return float(math.exp(math.log(x[k - 1]) + t * (math.log(x[k]) - math.log(x[k - 1])))), CROSSED



@dataclass(frozen=True)
class BudgetFit:
    """The fitted budget (module docstring) with what it was fitted on."""

    errors: tuple[float, ...]  # injected errors of the fitted levels, ascending
    order: tuple[int, ...]  # the level index of each fitted point
    drops: tuple[float, ...]  # mean τ drop over the prompts at each
    fitted: tuple[float, ...]  # the monotone fit, >= 0
    tol: float
    budget: float
    ci_low: float
    ci_high: float  # +inf: open (too many resamples never reached the tolerance)
    status: str  # crossed | below_range | not_reached | no_prompts
    n_prompts: int  # prompts with a finite τ at every level (the others are left out)
    crossed_share: float  # share of resamples whose fit reached the tolerance
    level: float = CI_LEVEL
    resamples: int = RESAMPLES

    @property
    def lower_bound(self) -> bool:
        """The fit never reached the tolerance: the budget is at least the largest measured error."""
        return self.status in (NOT_REACHED, NO_PROMPTS)

    @property
    def below_range(self) -> bool:
        return self.status == BELOW_RANGE

    def fitted_at(self, index: int) -> float | None:
        """The fit at level ``index`` of the ladder (None: a level that was not fitted)."""
        return self.fitted[self.order.index(index)] if index in self.order else None


def fit_budget(errors: Sequence[float], drops: Sequence[Sequence[float]] | np.ndarray, tol: float, *,
               level: float = CI_LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> BudgetFit:
    """The budget of ``drops[level][prompt]`` (signed τ drops, NaN for a prompt without a round) measured at
    injected ``errors[level]``: the monotone fit, its crossing of ``tol`` and the paired bootstrap CI.

    Levels whose injected error is 0 or not finite (a rounding that changed nothing) carry no information and are
    left out; so are prompts that are NaN at any fitted level."""
    d = np.asarray(drops, dtype=float).reshape(len(errors), -1)
    x = np.asarray(errors, dtype=float)
    keep = [i for i in np.argsort(x, kind="stable") if np.isfinite(x[i]) and x[i] > 0]
    xs, dk = x[keep], d[keep]
    cols = np.all(np.isfinite(dk), axis=0) if keep else np.zeros(d.shape[1], dtype=bool)
    dk = dk[:, cols]
    n = int(dk.shape[1])
    if n == 0:  # nothing measured: a budget of at least 0, open above
        return BudgetFit(tuple(map(float, xs)), tuple(map(int, keep)), tuple(math.nan for _ in keep),
                         tuple(0.0 for _ in keep), tol, 0.0, 0.0, math.inf, NO_PROMPTS, 0, 0.0, level, 0)
    means = dk.mean(axis=1)
    fitted = np.maximum(isotonic(means), 0.0)
    budget, status = crossing(xs, fitted, tol)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    boot = dk[:, idx].mean(axis=2).T  # [resample, level]
    found = np.empty(resamples)
    for b in range(resamples):
        c, st = crossing(xs, isotonic(boot[b]), tol)
        found[b] = math.inf if st == NOT_REACHED else c
    lo, hi = _percentiles(found, level)
    top = float(xs[-1])
    if status == NOT_REACHED:
        hi = math.inf
    return BudgetFit(tuple(map(float, xs)), tuple(map(int, keep)), tuple(map(float, means)),
                     tuple(map(float, fitted)), tol, budget, min(lo, top, budget), max(hi, budget), status, n,
                     float(np.isfinite(found).mean()), level, resamples)


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` interval of ``values`` (+inf allowed) by order statistics, no interpolation: the
    ``floor(a n)``-th smallest and the ``ceil((1 - a) n)``-th smallest, ``a = (1 - level) / 2``."""
    v = np.sort(values)
    a = (1.0 - level) / 2.0
    n = v.size
    lo = v[max(0, min(n - 1, int(math.floor(a * n))))]
    hi = v[max(0, min(n - 1, int(math.ceil((1.0 - a) * n)) - 1))]
    return float(lo), float(hi)
