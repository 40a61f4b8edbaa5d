"""The rules: every comparison of a measured number (τ, a drift, a budget, a speed-up, a change against a baseline)
with its floor, budget, tolerance or band, one function each. The parts of a verdict (:mod:`.tau_rules`,
:mod:`.run`), the drift checks, the drift budget, the near ties, the fingerprint and the reports ask these; no
other module compares such a number with its threshold (``tests/test_one_verdict.py`` checks it).

The τ rule: a τ passes its floor when the floor exists, the τ is a number (a prompt with no speculative round has
τ NaN) and τ >= floor (:func:`passes`). A run whose every prompt has τ of about 1 shows a drafter whose drafts the
target never accepts (:func:`no_acceptance`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from dflash_eval.common.number_text import fmt, is_number

__all__ = ["NO_ACCEPTANCE", "NO_ACCEPTANCE_EPS", "NO_ACCEPTANCE_TOKENS", "NO_ACCEPTANCE_MAX_EXCESS", "no_acceptance",
           "passes", "against", "Threshold", "overall", "drop_holds", "rise_holds", "VACUOUS_FLOOR",
           "regressed", "gained", "PASS", "FAIL", "INCONCLUSIVE", "drift_outcome", "within_estimate", "in_ci",
           "drift_holds", "tau_agrees", "is_near_tie", "fit_within", "stat_moved", "sketch_changed", "within_bound"]

#: Chain τ at most this far above 1 counts as 1.00 (what the reports print): at most one accepted draft token in
#: 200 rounds.
NO_ACCEPTANCE_EPS = 0.005
#: A completion with at most this many accepted draft tokens (beyond each round's bonus token: (τ - 1) * rounds)
#: shows no working drafter either, whatever its length: a random drafter on a completion of 127 rounds has τ 1.008
#: from one lucky token.
NO_ACCEPTANCE_TOKENS = 1
#: ... as long as its τ is at most this far above 1: one token in a completion of fewer than 20 rounds is too little
#: to tell.
NO_ACCEPTANCE_MAX_EXCESS = 0.05
NO_ACCEPTANCE = ("τ is about 1 on every prompt (at most one accepted draft token per completion): the drafter "
                 "proposes nothing the target accepts; it probably does not read this target's features (another "
                 "target? wrong target_layer_ids? a mask token it was not trained with? an untrained drafter?)")


def _accepts_nothing(tau: float, rounds: int | None) -> bool:
    """One completion's chain τ over ``rounds`` rounds (None: not known) shows no accepted draft: τ within
    :data:`NO_ACCEPTANCE_EPS` of 1, or at most :data:`NO_ACCEPTANCE_TOKENS` accepted draft tokens with τ within
    :data:`NO_ACCEPTANCE_MAX_EXCESS` of 1."""
    excess = tau - 1
    if excess <= NO_ACCEPTANCE_EPS:
        return True
    return (rounds is not None and rounds > 0 and excess <= NO_ACCEPTANCE_MAX_EXCESS
            and excess * rounds <= NO_ACCEPTANCE_TOKENS + 1e-6)


def no_acceptance(taus: Iterable[float | None], rounds: Iterable[int | None] | None = None) -> bool:
    """Every prompt's chain τ (prompts without a speculative round left out; at least two prompts) shows no accepted
    draft (``rounds``: each prompt's number of rounds, in the same order; without it only τ within
    :data:`NO_ACCEPTANCE_EPS` of 1 counts): not a drafter below its floors but one that does not work with this
    target at all."""
    pairs = list(zip(taus, rounds)) if rounds is not None else [(t, None) for t in taus]
    vals = [(t, r) for t, r in pairs if t is not None and not math.isnan(t)]
    return len(vals) >= 2 and all(_accepts_nothing(t, r) for t, r in vals)


def passes(value: float | None, floor: float | None) -> bool:
    """τ ``value`` passes ``floor`` (see module docstring)."""
    return floor is not None and value is not None and not math.isnan(value) and value >= floor


@dataclass(frozen=True)
class Threshold:
    """One τ against one floor: ``label`` is "chain" or "DDTree-<budget>"; ``required``: a missing floor fails."""

    label: str
    value: float | None
    floor: float | None
    required: bool = True

    @property
    def gated(self) -> bool:
        return self.floor is not None or self.required

    @property
    def passed(self) -> bool:
        return passes(self.value, self.floor)

    @property
    def missing(self) -> bool:
        return self.floor is None


def overall(thresholds: list[Threshold]) -> bool | None:
    """All gated thresholds pass (None when none is gated)."""
    gated = [t for t in thresholds if t.gated]
    return all(t.passed for t in gated) if gated else None


def drop_holds(n: int, rel_change: float, tol: float) -> bool:
    """τ did not drop against the baseline by more than ``tol`` (a relative change; no paired prompt, or NaN: it
    does not hold)."""
    return n > 0 and not math.isnan(rel_change) and rel_change >= -tol


def rise_holds(n: int, rel_change: float, tol: float) -> bool:
    """τ did not rise against the baseline by more than ``tol`` (as :func:`drop_holds`)."""
    return n > 0 and not math.isnan(rel_change) and rel_change <= tol


#: τ is never below 1 (every verification round accepts at least the target's own token, greedy or sampled): a floor
#: at or below this passes every drafter.
VACUOUS_FLOOR = 1.0


def regressed(upper: float | None) -> bool:
    """The regression rule across training steps: the one-sided upper limit of Δ against the run's recent level is
    below 0 (None: not judged)."""
    return upper is not None and upper < 0


def gained(gain: float, limit: float) -> bool:
    """A checkpoint gained beyond the noise between checkpoints (no plateau): its gain is above the limit."""
    return gain > limit


PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


def drift_outcome(scaled: float, low: float, high: float, estimate: float, *, conclusive: bool = False) -> str:
    """The drift gate's rule for one comparison and layer: the drift x the safety factor (``scaled``) passes at or
    below the budget CI's lower end ``low``, fails above its upper end ``high``, and is ``inconclusive`` in between
    (``conclusive``: pass / fail against the point ``estimate`` instead)."""
    if scaled <= low:
        return PASS
    if scaled > high:
        return FAIL
    if conclusive:
        return PASS if within_estimate(scaled, estimate) else FAIL
    return INCONCLUSIVE


def within_estimate(scaled: float, estimate: float) -> bool:
    """Drift x safety (``scaled``) is at or below the budget's point ``estimate``."""
    return scaled <= estimate


def in_ci(scaled: float, low: float, high: float) -> bool:
    """Drift x safety lies inside the budget's CI (``low``, ``high``]: the measurement cannot tell which side it is
    on."""
    return low < scaled <= high


def drift_holds(rel_err: float, cos: float, rel_tol: float, cos_tol: float) -> bool:
    """One prompt and layer's feature drift is within the regression tolerances: relative L2 error at most
    ``rel_tol`` and cosine similarity at least ``cos_tol`` (NaN holds neither)."""
    return rel_err <= rel_tol and cos >= cos_tol


def tau_agrees(a: float, b: float, tol: float) -> bool:
    """Chain τ from either side's features agrees within ``tol`` (NaN never agrees)."""
    return abs(a - b) <= tol


def is_near_tie(margin: float | None, band: float) -> bool:
    """A completion that left its record where the target's two best logits were less than ``band`` apart: a named
    near tie, not a failure (``margin`` None: not measured, not a near tie)."""
    return margin is not None and margin < band


def fit_within(fitted: float | None, tol: float) -> bool:
    """A drift budget level's fitted τ drop stays below ``tol`` (a level that was not fitted is within)."""
    return fitted is None or fitted < tol


def stat_moved(got: float | None, golden: float, tol: float) -> bool:
    """A fingerprint statistic moved from its golden value: missing, or further from it than ``tol`` times the
    golden value's size (times 1 when that is below 1)."""
    return got is None or abs(got - golden) > tol * max(1.0, abs(golden))


def sketch_changed(rel_change: float | None, tol: float) -> bool:
    """The features' relative change estimated from the fingerprint's sketches is beyond ``tol`` (None: no
    estimate, no change)."""
    return rel_change is not None and rel_change > tol


def within_bound(rel_err: float, bound: float) -> bool:
    """A feature difference (relative error) is within the bound the witness allows for the dtype."""
    return rel_err <= bound


def against(value: object, floor: float | None) -> str:
    """``4.314 >= floor 4.064`` (or ``<``; ``4.314 (no floor)`` when there is none): a τ and its floor as the
    reports print them, the sign the rule's (:func:`passes`)."""
    if floor is None:
        return f"{fmt(value)} (no floor)"
    ok = is_number(value) and passes(float(value), floor)
    return f"{fmt(value)} {'>=' if ok else '<'} floor {fmt(floor)}"
