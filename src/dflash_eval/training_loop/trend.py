"""Verdicts across training steps, from the per-prompt chain τ of the history's records: a regression (a failure)
and a plateau (a notice). The rule, why it is so, and its measured error rates: ``docs/training-loop.md``.

Both verdicts look at the run's recent *stretch*: the last :data:`WINDOW` checkpoints before the one judged (before
the last K for a plateau; fewer at the start), compared paired over the prompts both sides have a τ for (Δ: the
mean per-prompt difference). A regression is judged against the stretch's *level*, its per-prompt mean τ, not its
best checkpoint: the best of several noisy checkpoints lies above its true τ (the winner's curse; one lucky
checkpoint would stay the bar for good), the mean of several does not, and it varies less. Not the whole run: its
early rise is no noise of a later plateau.

The noise is not the prompts' alone: two checkpoints of one run that are equally good still differ in τ (their
weights differ), by more than the prompts' standard error once the prompts are many. That noise between
checkpoints, σ (the standard deviation of the paired difference of two equally good checkpoints), is measured
from the stretch itself, from the paired differences of its successive checkpoints: never below the root mean
square of those differences' prompt standard errors (the prompts' share of it), and where the stretch shows no
noise at all (identical checkpoints) the prompt standard error of Δ stands in. Checkpoints already judged
regressions are left out of every stretch (their drop is no noise, and no level).

- **regression**: with w >= 3 checkpoints in the stretch (σ needs two differences), Δ + c · σ < 0, σ the root mean
  square of the w - 1 successive differences (von Neumann's mean square successive difference: a slow trend adds
  little; counted as noise it only makes the test more cautious while τ moves). c (:func:`regression_limit`) is the
  one-sided 99 % quantile of (mean of w - the new one) / σ̂ over simulated runs of w + 1 equally good checkpoints
  (independent normal τ, σ̂ computed as above), so that equally good checkpoints are failed at most once in 100.
- **plateau**: none of the last K checkpoints (this one included, in step order) gained beyond noise over the
  best checkpoint of the stretch before them: max over them of Δ(recent, best before) <= c' · σ, c'
  (:func:`gain_limit`) the one-sided 95 % quantile of (max of K - one earlier checkpoint) / σ̂ for equally good
  checkpoints. Here the bar is the best, not the level: a gain must clear what the run already reached, and the
  level of a rising stretch lags behind it (the notice would come late); the best's own luck is not discounted
  (the best of a rising stretch is its latest checkpoint, no lucky pick), so the notice comes early rather than
  late. σ here is the standard deviation of the
  differences within the stretch before the K and of those among the K, each group about its mean (a steady rise is
  the gain looked for, not noise), never across the boundary (a gain would inflate it).

The limits are Monte Carlo quantiles, seeded (a verdict is the same on every run and machine) and cached per size.
Only records of one settings digest are compared (the same target, prompts and τ-relevant options).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol, TypeVar

from dflash_eval.common.number_text import fmt
from dflash_eval.metrics.verdict import gained, regressed

if TYPE_CHECKING:  # numpy is imported where a limit is simulated, not with the history
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["ALPHA_REGRESSION", "ALPHA_GAIN", "WINDOW", "Paired", "Noise", "paired", "level", "successive",
           "checkpoint_noise", "trend_free_noise", "regression_limit", "gain_limit", "earlier_than",
           "RegressionTest", "regression_test", "regression", "plateau", "step_order"]

#: One-sided level of the regression test: the share of equally good checkpoints failed as regressions.
ALPHA_REGRESSION = 0.01
#: One-sided level of a gain beyond noise (the plateau notice is given when no recent checkpoint has one).
ALPHA_GAIN = 0.05
#: The stretch of the run a checkpoint is judged against: its last this many checkpoints set the level and the noise.
WINDOW = 11
#: Simulated runs per limit, and the seed they are drawn with.
SIMULATIONS = 50_000
SEED = 20_240_917


class _Record(Protocol):
    """What a verdict across steps reads of a history record (read-only)."""

    @property
    def step(self) -> int | None: ...
    @property
    def drafter(self) -> str: ...
    @property
    def prompts(self) -> Mapping[str, float]: ...
    @property
    def regression(self) -> str | None: ...


_R = TypeVar("_R", bound=_Record)


def _name(r: _Record) -> str:
    return f"step {r.step}" if r.step is not None else r.drafter


def _span(records: Sequence[_Record]) -> str:
    return _name(records[0]) if len(records) == 1 else f"{_name(records[0])} .. {_name(records[-1])}"


# ------------------------------------------------------------------------------------------------ differences
@dataclass(frozen=True)
class Paired:
    """A paired difference over the prompts both sides have a τ for: ``n`` prompts, their mean difference and its
    standard error over the prompts (0 for one prompt)."""

    n: int
    mean: float
    se: float


def paired(a: Mapping[str, float], b: Mapping[str, float]) -> Paired:
    """The paired difference a - b of two per-prompt τ mappings; ``n`` 0 and NaN when they share no prompt with a
    τ."""
    d = [a[p] - b[p] for p in a if p in b and not math.isnan(a[p]) and not math.isnan(b[p])]
    n = len(d)
    if not n:
        return Paired(0, math.nan, math.nan)
    mean = math.fsum(d) / n
    var = math.fsum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return Paired(n, mean, math.sqrt(var / n))


def level(records: Sequence[_Record]) -> dict[str, float]:
    """The per-prompt mean τ of ``records`` (each prompt over the records that have a τ for it)."""
    sums: dict[str, list[float]] = {}
    for r in records:
        for p, t in r.prompts.items():
            if not math.isnan(t):
                sums.setdefault(p, []).append(t)
    return {p: math.fsum(v) / len(v) for p, v in sums.items()}


def _mean(taus: Mapping[str, float]) -> float:
    vals = [t for t in taus.values() if not math.isnan(t)]
    return math.fsum(vals) / len(vals) if vals else math.nan


def successive(records: Sequence[_Record]) -> list[Paired]:
    """The paired differences of successive ``records`` (later - earlier, in the order given; pairs that share no
    prompt left out)."""
    return [x for a, b in zip(records, records[1:]) if (x := paired(b.prompts, a.prompts)).n]


@dataclass(frozen=True)
class Noise:
    """The noise between checkpoints from ``n`` successive differences: ``sigma``, what a difference is measured in;
    ``spread``, the differences' root mean square (their pooled standard deviation where ``trend_free``);
    ``prompt_se``, the root mean square of their prompt standard errors (``sigma`` is the larger of the two)."""

    sigma: float
    n: int
    spread: float
    prompt_se: float
    trend_free: bool = False

    def scale(self, d: Paired) -> float:
        """What a difference ``d`` is measured in: σ, or ``d``'s own standard error where the stretch shows no
        noise at all."""
        return self.sigma if self.sigma > 0 else d.se

    def words(self) -> str:
        """How :meth:`scale` was found, for a verdict's text."""
        if self.sigma == 0:
            return f"the prompts' standard error of Δ: the {self.n} successive checkpoint differences are all 0"
        spread = "standard deviation" if self.trend_free else "root mean square"
        if self.spread >= self.prompt_se:
            return f"σ: the {spread} of {self.n} successive checkpoint differences"
        return (f"σ: the prompts' standard error of {self.n} successive checkpoint differences, above their "
                f"{spread} {fmt(self.spread)}")


def checkpoint_noise(diffs: Sequence[Paired]) -> Noise | None:
    """The noise from successive differences (:func:`successive`), their root mean square; None with fewer than
    two."""
    if len(diffs) < 2:
        return None
    rms = math.sqrt(math.fsum(d.mean ** 2 for d in diffs) / len(diffs))
    se = math.sqrt(math.fsum(d.se ** 2 for d in diffs) / len(diffs))
    return Noise(max(rms, se), len(diffs), rms, se)


def trend_free_noise(groups: Sequence[Sequence[Paired]]) -> Noise | None:
    """The noise from groups of successive differences, each about its own mean (a steady rise is no noise), their
    standard deviation pooled; None without a degree of freedom."""
    df = sum(len(g) - 1 for g in groups if g)
    if df < 1:
        return None
    ss = math.fsum((d.mean - math.fsum(x.mean for x in g) / len(g)) ** 2 for g in groups if g for d in g)
    n = sum(len(g) for g in groups)
    sd = math.sqrt(ss / df)
    se = math.sqrt(math.fsum(d.se ** 2 for g in groups for d in g) / n)
    return Noise(max(sd, se), n, sd, se, trend_free=True)


# ------------------------------------------------------------------------------------------------ limits
def _rms(e: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per row, the root mean square of the successive differences of the columns (as :func:`checkpoint_noise`)."""
    import numpy as np  # numpy takes ~60 ms to import: kept out of dflash-eval --help and pytest --help

    d = np.diff(e, axis=1)
    out: NDArray[np.float64] = np.sqrt((d * d).mean(axis=1))
    return out


def _pooled_sd(*groups: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per row, the pooled standard deviation of the successive differences within each group of columns, each
    about its own mean (as :func:`trend_free_noise`)."""
    import numpy as np  # numpy takes ~60 ms to import: kept out of dflash-eval --help and pytest --help

    ds = [np.diff(g, axis=1) for g in groups if g.shape[1] > 1]
    ss = sum(((d - d.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) for d in ds)
    out: NDArray[np.float64] = np.sqrt(ss / sum(d.shape[1] - 1 for d in ds))
    return out


def _quantile(stat: Callable[[NDArray[np.float64]], NDArray[np.float64]], width: int, q: float,
              key: tuple[int, ...]) -> float:
    """The ``q`` quantile of ``stat`` over :data:`SIMULATIONS` rows of ``width`` independent standard normals,
    drawn in chunks of bounded memory from a generator seeded by ``key``."""
    import numpy as np  # numpy takes ~60 ms to import: kept out of dflash-eval --help and pytest --help

    rng = np.random.default_rng([SEED, *key])
    chunk = max(1, 1_000_000 // width)
    vals, left = [], SIMULATIONS
    while left:
        n = min(chunk, left)
        vals.append(stat(rng.standard_normal((n, width))))
        left -= n
    return float(np.quantile(np.concatenate(vals), q))


@lru_cache(maxsize=256)
def regression_limit(w: int, alpha: float = ALPHA_REGRESSION) -> float:
    """c: the one-sided ``1 - alpha`` quantile of (mean of w - the new one) / σ̂ over runs of w + 1 equally good
    checkpoints (independent normal τ), σ̂ the root mean square of the w - 1 successive differences of the w
    (w >= 3)."""
    if w < 3:
        raise ValueError(f"a regression limit needs w >= 3 earlier checkpoints (σ from two differences), got {w}")

    def stat(x: NDArray[np.float64]) -> NDArray[np.float64]:
        e = x[:, :w]
        out: NDArray[np.float64] = (e.mean(axis=1) - x[:, w]) / _rms(e)
        return out

    return _quantile(stat, w + 1, 1 - alpha, (1, w))


@lru_cache(maxsize=256)
def gain_limit(recent: int, before: int, alpha: float = ALPHA_GAIN) -> float:
    """c': the one-sided ``1 - alpha`` quantile of (max of ``recent`` - one of ``before``) / σ̂ over equally good
    checkpoints, σ̂ the pooled standard deviation of the successive differences within the ``before`` and within
    the ``recent``, each group about its mean (at least one degree of freedom in all). The best before is taken as
    one checkpoint, its selection not discounted: a gain is claimed cautiously, a plateau noticed early rather than
    late (the best of a rising stretch is its latest, no lucky pick)."""
    if recent < 1 or before < 1 or max(before - 2, 0) + max(recent - 2, 0) < 1:
        raise ValueError(f"a gain limit needs checkpoints on both sides and a degree of freedom for σ; got "
                         f"{recent} recent, {before} before them")

    def stat(x: NDArray[np.float64]) -> NDArray[np.float64]:
        b, r = x[:, :before], x[:, before:]
        out: NDArray[np.float64] = (r.max(axis=1) - b[:, -1]) / _pooled_sd(b, r)
        return out

    return _quantile(stat, before + recent, 1 - alpha, (2, recent, before))


# ------------------------------------------------------------------------------------------------ order
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


def _kept(records: Sequence[_R]) -> list[_R]:
    """Records in step order, regressions left out."""
    return [r for r in step_order(records) if r.regression is None]


# ------------------------------------------------------------------------------------------------ verdicts
@dataclass(frozen=True)
class RegressionTest:
    """The numbers the regression verdict judges a checkpoint by: its stretch (the earlier checkpoints it is
    compared with), Δ against their level, the noise (None with fewer than two successive differences: not judged)
    and the limit c; :attr:`upper` = Δ + c · σ, a regression when below 0."""

    stretch: Sequence[_Record]
    delta: Paired
    noise: Noise | None
    limit: float | None
    alpha: float

    @property
    def scale(self) -> float | None:
        """What Δ is measured in (:meth:`Noise.scale`); None when not judged."""
        return None if self.noise is None else self.noise.scale(self.delta)

    @property
    def upper(self) -> float | None:
        """The one-sided upper limit of Δ; None when not judged."""
        scale = self.scale
        return None if scale is None or self.limit is None else self.delta.mean + self.limit * scale

    @property
    def regression(self) -> bool:
        """The rule (:func:`dflash_eval.metrics.verdict.regressed`): the upper limit is below 0."""
        return regressed(self.upper)


def regression_test(record: _Record, earlier: Sequence[_Record], *,
                    alpha: float = ALPHA_REGRESSION) -> RegressionTest | None:
    """:class:`RegressionTest` of ``record`` against ``earlier`` (the records before it, :func:`earlier_than`);
    None when no earlier checkpoint (no regression) shares a prompt with it."""
    stretch = [r for r in _kept(earlier) if paired(record.prompts, r.prompts).n][-WINDOW:]
    if not stretch:
        return None
    noise = checkpoint_noise(successive(stretch))
    c = regression_limit(len(stretch), alpha) if noise is not None else None
    return RegressionTest(stretch, paired(record.prompts, level(stretch)), noise, c, alpha)


def regression(record: _Record, earlier: Sequence[_Record], *, alpha: float = ALPHA_REGRESSION) -> str | None:
    """The failure message when ``record`` is below the level of the run's recent stretch beyond noise (see module
    docstring), else None (also with fewer than three earlier checkpoints sharing a prompt with it: σ is measured
    from them)."""
    t = regression_test(record, earlier, alpha=alpha)
    if t is None or not t.regression or t.noise is None or t.limit is None or t.upper is None:
        return None
    d, c, scale, stretch = t.delta, t.limit, t.noise.scale(t.delta), t.stretch
    return (f"below the run's recent level beyond the noise between checkpoints: paired Δ {fmt(d.mean, 3, '+f')} "
            f"over {d.n} prompts against the mean of the last {len(stretch)} checkpoints ({_span(stretch)}; τ "
            f"{fmt(_mean(level(stretch)))}), its {fmt(100 * (1 - alpha), 0)} % upper limit {fmt(t.upper, 3, '+f')} "
            f"< 0 (Δ + {fmt(c, 2)} × {fmt(scale)}, {t.noise.words()}; {fmt(c, 2)}: the limit for one checkpoint "
            f"against the mean of {len(stretch)}, σ measured from them)")


def plateau(record: _Record, earlier: Sequence[_Record], window: int, *,
            alpha: float = ALPHA_GAIN) -> str | None:
    """The notice when none of the last ``window`` checkpoints up to ``record`` gained beyond noise over the best
    checkpoint of the stretch before them (see module docstring); None with fewer than ``window + 1`` checkpoints,
    or when a recent checkpoint gained."""
    seq = step_order([*earlier, record])
    if len(seq) <= window:
        return None
    recent, before = _kept(seq[-window:]), _kept(seq[:-window])[-WINDOW:]
    noise = trend_free_noise([successive(before), successive(recent)])
    if not before or not recent or noise is None:
        return None
    gains = []  # per recent checkpoint: its gain over the best before (the one it gained least over)
    for r in recent:
        ds = [(b, d) for b in before if (d := paired(r.prompts, b.prompts)).n]
        if ds:
            b, d = min(ds, key=lambda bd: bd[1].mean)
            gains.append((r, b, d))
    if not gains:
        return None
    c = gain_limit(len(recent), len(before), alpha)
    r, b, d = max(gains, key=lambda g: g[2].mean - c * noise.scale(g[2]))
    limit = c * noise.scale(d)
    if gained(d.mean, limit):
        return None
    best = "the one before them" if len(before) == 1 else f"the best of the {len(before)} before them"
    return (f"plateau: no gain beyond noise over the last {window} checkpoints ({_span(seq[-window:])}) over "
            f"{best} ({_span(before)}): the largest, {_name(r)} over {_name(b)} (τ {fmt(_mean(b.prompts))}), "
            f"paired Δ {fmt(d.mean, 3, '+f')} <= {fmt(limit, 3, '+f')} ({fmt(c, 2)} × {fmt(noise.scale(d))}, "
            f"{noise.words()}; {fmt(c, 2)}: the one-sided {fmt(100 * (1 - alpha), 0)} % limit for the best of "
            f"{len(recent)} over one checkpoint)")
