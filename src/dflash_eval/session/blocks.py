"""The typed blocks of a result besides τ (:mod:`dflash_eval.session.rows` says how a row turns into eval.json's
object and back): the drafter, the drift τ rows, the drift budget, the feature fingerprint. The drift rows and the
drift gate's rows are the checks themselves (:mod:`dflash_eval.metrics.drift_checks`), written and read back by
their own class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_eval.session.rows import Row, _opt

__all__ = ["Refusal", "DrafterBlock", "DriftAcceptRow", "BudgetLevel", "FitPoint", "BudgetFitBlock", "BudgetDirection",
           "SecondaryAxis", "DriftBudgetBlock", "LayerFingerprint", "FingerprintBlock"]


@dataclass
class Refusal(Row):
    """An architecture check that refused the drafter."""

    check: str
    message: str


@dataclass
class DrafterBlock(Row):
    """The drafter evaluated: its path (or label), weight fingerprint and config; the checks that refused it, the
    reference drafter's τ beside it (``--reference-drafter``) and the training step (in-process API) when known."""

    path: str
    fingerprint: str
    config: dict[str, Any]
    refused: list[Refusal] | None = _opt()
    reference: dict[str, Any] | None = _opt()
    step: int | None = _opt()


@dataclass
class DriftAcceptRow(Row):
    """One comparison's chain τ on one prompt from either side's features, against the τ tolerance."""

    comparison: str
    prompt_id: str
    tau_a: float
    tau_b: float
    diff: float
    tol: float
    passed: bool
    a: str
    b: str


@dataclass
class BudgetLevel(Row):
    """One perturbation of the drift budget's ladder and the τ drop it caused (signed: τ(unperturbed) -
    τ(perturbed); ``drop`` per prompt), with the monotone fit at its injected error (None: not fitted)."""

    kind: str
    label: str
    nominal: float | str  # the noise size (a float) or the dtype (a string)
    injected_rel_err: float
    mean_tau: float
    mean_drop: float
    drop_ci95: list[float]
    fitted_drop: float | None
    mean_abs_dtau: float
    max_abs_dtau: float
    within: bool
    drop: dict[str, float]
    axis: str | None = _opt()  # drift (the measured drift direction amplified) | isotropic (noise, rounding)


@dataclass
class FitPoint(Row):
    """One level of the drift budget's monotone fit: its injected error, mean τ drop and the fit there."""

    injected_rel_err: float
    mean_drop: float
    fitted_drop: float


@dataclass
class BudgetFitBlock(Row):
    """The drift budget's fit (:class:`dflash_eval.metrics.drift_fit.BudgetFit`): how, on what, and how often the
    bootstrap resamples reached the tolerance."""

    method: str
    points: list[FitPoint]
    status: str
    n_prompts: int
    ci_level: float
    resamples: int
    crossed_share: float


@dataclass
class BudgetDirection(Row):
    """The measured drift direction the budget's main axis amplifies (:class:`dflash_eval.metrics.drift_budget.
    Direction`): ``other`` minus ``reference`` of comparison ``comparison``, its drift, every candidate's drift."""

    comparison: str
    reference: str
    other: str
    drift: float
    candidates: dict[str, float]


@dataclass
class SecondaryAxis(Row):
    """The isotropic axis's own fit beside the budget (:class:`dflash_eval.metrics.drift_budget.AxisFit`): reported,
    not gated."""

    axis: str
    budget: float
    ci: list[float]
    ci_level: float
    status: str
    lower_bound: bool
    n_measured: int
    fit: BudgetFitBlock


@dataclass
class DriftBudgetBlock(Row):
    """The drafter's drift budget (:class:`dflash_eval.metrics.drift_budget.DriftBudget`) as eval.json holds it:
    the budget, its CI, the fit (``fit``: method, points, status) and the levels it was fitted on."""

    drafter: str
    base: str
    n_prompts: int
    prompt_ids: list[str]
    base_mean_tau: float
    base_tau: dict[str, float]
    tol: float
    safety: float
    seed: int
    ladder: str
    budget: float
    ci: list[float]
    ci_level: float
    status: str
    lower_bound: bool
    gate_limit: float | None
    skipped: list[str]
    min_prompts: int
    n_measured: int
    selected_prompts: int | None
    conclusive: bool
    rule: str
    fit: BudgetFitBlock
    levels: list[BudgetLevel]
    axis: str | None = _opt()  # the main axis the budget was fitted on: drift | isotropic
    axis_text: str | None = _opt()  # what it was read along, in words
    axis_note: str | None = _opt()  # why the main axis is the isotropic one
    direction: BudgetDirection | None = _opt()
    secondary: SecondaryAxis | None = _opt()


@dataclass
class LayerFingerprint(Row):
    """Summary statistics of one target layer's features of the fingerprint text."""

    mean: float
    std: float
    rms: float
    absmax: float
    row_norm_mean: float
    sketch: list[float]


@dataclass
class FingerprintBlock(Row):
    """The target's feature fingerprint on the evaluation backend, dtype and device, with the library versions and
    kernel digests its numerics depend on."""

    target: str
    text: str
    tokens: str
    n_tokens: int
    backend: str
    kernel_fault: str | None
    dtype: str
    device_kind: str
    layers: dict[str, LayerFingerprint]
    versions: dict[str, Any]
    kernel_probe: dict[str, Any]
