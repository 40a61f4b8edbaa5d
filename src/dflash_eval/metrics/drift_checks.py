"""The drift checks as data, one class per concept, each computed and written to eval.json by itself:
:class:`DriftStat` (one comparison's feature drift on one prompt and layer against its tolerances: eval.json's
``drift`` rows) and :class:`GateCheck` (one comparison's worst drift at one layer against the drafter's drift budget
and its CI: eval.json's ``drift_gate`` rows, decided by the drift gate's rule,
:func:`dflash_eval.metrics.verdict.drift_outcome`). No torch: the measurements produce them
(:mod:`dflash_eval.metrics.drift`, :mod:`dflash_eval.metrics.drift_budget`), the results and reports read them back
with :meth:`DriftStat.from_dict` and :meth:`GateCheck.from_dict`. Beside them the drift budget's parts that a result
holds as they are (:mod:`dflash_eval.metrics.drift_budget` measures them): the drift :class:`Direction` its main axis
amplifies, the gate's :data:`RULE` and the fit's :data:`METHOD` in words."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dflash_eval.errors import ResultKeyError
from dflash_eval.metrics.verdict import PASS, drift_holds, drift_outcome, in_ci

__all__ = ["DriftStat", "GateCheck", "Direction", "RULE", "METHOD"]


def _num(v: object, missing: float = math.nan) -> float:
    """A number as eval.json holds it (strict JSON writes NaN and infinities as null)."""
    return missing if v is None else float(v)  # type: ignore[arg-type]  # a JSON number


@dataclass
class DriftStat:
    """One comparison's feature drift on one prompt and layer (relative L2 error, cosine, largest absolute
    difference) against the comparison's tolerances; ``passed``: both hold."""

    comparison: str
    prompt_id: str
    layer: int
    rel_err: float
    cos: float
    max_abs: float
    rel_tol: float
    cos_tol: float

    @property
    def passed(self) -> bool:
        return drift_holds(self.rel_err, self.cos, self.rel_tol, self.cos_tol)

    def to_dict(self) -> dict[str, Any]:
        """eval.json's ``drift`` row: the fields, then ``passed``."""
        return {**asdict(self), "passed": self.passed}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DriftStat:
        """A row of :meth:`to_dict` (``passed`` follows from the numbers); ResultKeyError naming a key it does not
        know or lacks."""
        ResultKeyError.check(d, _DRIFT_KEYS)
        kw = {f.name: d[f.name] for f in fields(cls)}
        for k in ("rel_err", "cos", "max_abs", "rel_tol", "cos_tol"):
            kw[k] = _num(kw[k])
        return cls(**kw)


@dataclass(frozen=True)
class GateCheck:
    """One comparison's measured drift at one target layer (its worst prompt's relative error, the mean over
    prompts) against the drift budget and its CI, times the safety factor."""

    comparison: str
    layer: int
    max_rel_err: float
    mean_rel_err: float
    worst_prompt: str
    budget: float
    safety: float
    budget_low: float  # the CI's lower end
    budget_high: float  # its upper end (+inf: open)
    lower_bound: bool = False
    conclusive: bool = False  # --drift-budget-conclusive: decide on the estimate inside the CI

    @property
    def scaled(self) -> float:
        """The worst prompt's drift x the safety factor: what is compared with the budget."""
        return self.max_rel_err * self.safety

    @property
    def in_ci(self) -> bool:
        """drift x safety lies inside the budget's CI: the measurement cannot tell which side it is on."""
        return in_ci(self.scaled, self.budget_low, self.budget_high)

    @property
    def outcome(self) -> str:
        """``pass`` when drift x safety is at most the CI's lower end, ``fail`` when above its upper end, else
        ``inconclusive`` (with ``conclusive``: pass / fail against the point estimate): the drift gate's rule,
        :func:`dflash_eval.metrics.verdict.drift_outcome`."""
        return drift_outcome(self.scaled, self.budget_low, self.budget_high, self.budget, conclusive=self.conclusive)

    @property
    def passed(self) -> bool:
        return self.outcome == PASS

    @property
    def margin(self) -> float:
        """budget / measured drift: how many times larger the drift could be before it reaches the budget."""
        return self.budget / self.max_rel_err if self.max_rel_err > 0 else float("inf")

    @property
    def decided_on(self) -> str:
        """``estimate`` (inside the CI, decided on the point estimate: ``--drift-budget-conclusive``) or ``ci``."""
        return "estimate" if self.in_ci and self.conclusive else "ci"

    def to_dict(self) -> dict[str, Any]:
        """eval.json's ``drift_gate`` row."""
        return {"comparison": self.comparison, "layer": self.layer, "max_rel_err": self.max_rel_err,
                "mean_rel_err": self.mean_rel_err, "worst_prompt": self.worst_prompt, "budget": self.budget,
                "budget_ci": [self.budget_low, self.budget_high], "safety": self.safety, "margin": self.margin,
                "lower_bound": self.lower_bound, "passed": self.passed, "outcome": self.outcome,
                "decided_on": self.decided_on}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateCheck:
        """A row of :meth:`to_dict`, also as strict JSON wrote it (an open CI's upper end null). Whether it was
        decided on the estimate (``decided_on``) is all of ``conclusive`` that changes its outcome. ResultKeyError
        naming a key it does not know or lacks."""
        ResultKeyError.check(d, _GATE_KEYS)
        lo, hi = (list(d["budget_ci"] or []) + [None, None])[:2]
        return cls(d["comparison"], int(d["layer"]), _num(d["max_rel_err"]), _num(d["mean_rel_err"]),
                   d["worst_prompt"], _num(d["budget"]), _num(d["safety"]), _num(lo), _num(hi, math.inf),
                   bool(d["lower_bound"]), d["decided_on"] == "estimate")


#: The keys of eval.json's ``drift`` and ``drift_gate`` rows (:meth:`DriftStat.to_dict`, :meth:`GateCheck.to_dict`).
_DRIFT_KEYS = (*(f.name for f in fields(DriftStat)), "passed")
_GATE_KEYS = ("comparison", "layer", "max_rel_err", "mean_rel_err", "worst_prompt", "budget", "budget_ci", "safety",
              "margin", "lower_bound", "passed", "outcome", "decided_on")


#: How the budget is fitted, in words (eval.json's ``drift_budget.fit.method``; the fit:
#: :mod:`dflash_eval.metrics.drift_fit`).
METHOD = "isotonic regression of the mean τ drop on the injected error, log-linear between points"

RULE = ("along the run's measured drift direction amplified (reference + α (other side - reference); isotropic "
        "noise where the run has no second feature side): the injected relative feature error at which a monotone "
        "(isotonic) fit of the mean over prompts of τ(unperturbed) - τ(perturbed) against the injected error reaches "
        "tol (log-linear between measured errors; "
        "a rise of τ is no harm), with a paired bootstrap CI over prompts; the gate passes when drift x safety is "
        "below the CI's lower end, fails above its upper end, and is inconclusive in between (decided on the "
        "estimate with --drift-budget-conclusive)")


@dataclass(frozen=True)
class Direction:
    """The measured drift direction the main axis amplifies: the ``other`` side's features minus the ``reference``
    side's (the perturbed ones), of comparison ``comparison``, chosen as the largest ``drift`` (mean relative error
    over prompts and layers) among the run's comparisons (``candidates``: each one's drift)."""

    comparison: str
    reference: str
    other: str
    drift: float
    candidates: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """eval.json's ``drift_budget.direction``."""
        return {"comparison": self.comparison, "reference": self.reference, "other": self.other,
                "drift": self.drift, "candidates": dict(self.candidates)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Direction:
        """A direction of :meth:`to_dict`; ResultKeyError naming a key it does not know or lacks."""
        ResultKeyError.check(d, [f.name for f in fields(cls)])
        return cls(d["comparison"], d["reference"], d["other"], d["drift"], dict(d["candidates"]))
