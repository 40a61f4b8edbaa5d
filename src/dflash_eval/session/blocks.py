"""The typed blocks of a result besides τ (:mod:`dflash_eval.session.rows` says how a row turns into eval.json's
object and back): the drafter, the drift τ rows, the drift budget, the feature fingerprint, the ``--baseline``
comparison, the mean over samples of a run at temperature > 0. The
drift rows and the drift gate's rows are the checks themselves (:mod:`dflash_eval.metrics.drift_checks`), written
and read back by their own class; so is the budget's measured drift direction
(:class:`dflash_eval.metrics.drift_checks.Direction`). The drift budget's block is made from the measured
:class:`~dflash_eval.metrics.drift_budget.DriftBudget` itself (:meth:`DriftBudgetBlock.of`), never through a
dict. The predicted speed-up's records (its loops' :class:`LoopModel`, re-exported here, the round's costs, the
block itself) are the metrics' own: :mod:`dflash_eval.metrics.speedup`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_eval.metrics.drift_checks import METHOD, RULE, Direction
from dflash_eval.metrics.speedup import LoopModel  # re-exported: its home before the block was made typed
from dflash_eval.session.rows import Row, _opt

if TYPE_CHECKING:  # the measured objects the blocks are made of: drift_budget imports torch, the blocks do not
    from dflash_eval.metrics.drift_budget import AxisFit, DriftBudget, Level
    from dflash_eval.metrics.drift_fit import BudgetFit

__all__ = ["Refusal", "DrafterBlock", "DriftAcceptRow", "BudgetLevel", "FitPoint", "BudgetFitBlock",
           "SecondaryAxis", "DriftBudgetBlock", "LayerFingerprint", "FingerprintBlock", "BaselinePrompt",
           "BaselineBlock", "SampledStat", "SampledBlock", "LoopModel"]


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

    @classmethod
    def of(cls, lv: Level, prompt_ids: Sequence[str], tol: float) -> BudgetLevel:
        """The block of a measured level (``prompt_ids``: the budget's prompts, in the order of its drops)."""
        p, s = lv.perturbation, lv.summary
        return cls(kind=p.kind, label=p.label, nominal=p.dtype if p.kind == "round" else p.size,
                   injected_rel_err=lv.injected, mean_tau=lv.mean_tau, mean_drop=s.mean,
                   drop_ci95=[s.ci_low, s.ci_high], fitted_drop=lv.fitted, mean_abs_dtau=lv.mean_abs_dtau,
                   max_abs_dtau=lv.max_abs_dtau, within=lv.within(tol), drop=dict(zip(prompt_ids, lv.drop)),
                   axis=lv.axis)


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

    @classmethod
    def of(cls, fit: BudgetFit) -> BudgetFitBlock:
        """The block of a fitted budget."""
        return cls(method=METHOD, points=[FitPoint(x, d, f) for x, d, f in zip(fit.errors, fit.drops, fit.fitted)],
                   status=fit.status, n_prompts=fit.n_prompts, ci_level=fit.level, resamples=fit.resamples,
                   crossed_share=fit.crossed_share)



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

    @classmethod
    def of(cls, axis: AxisFit) -> SecondaryAxis:
        """The block of the isotropic axis's own fit."""
        f = axis.fit
        return cls(axis=axis.axis, budget=f.budget, ci=[f.ci_low, f.ci_high], ci_level=f.level, status=f.status,
                   lower_bound=f.lower_bound, n_measured=f.n_prompts, fit=BudgetFitBlock.of(f))


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
    direction: Direction | None = _opt()
    secondary: SecondaryAxis | None = _opt()

    @classmethod
    def of(cls, b: DriftBudget) -> DriftBudgetBlock:
        """The block of a measured drift budget, with the levels it was fitted on and the gate's rule."""
        lo, hi = b.ci
        return cls(drafter=b.drafter, base=b.base, n_prompts=len(b.prompt_ids), prompt_ids=list(b.prompt_ids),
                   base_mean_tau=b.base_mean_tau, base_tau=dict(zip(b.prompt_ids, b.base_tau)), tol=b.tol,
                   safety=b.safety, seed=b.seed, ladder=b.ladder, budget=b.budget, ci=[lo, hi], ci_level=b.fit.level,
                   status=b.fit.status, lower_bound=b.lower_bound, gate_limit=b.gate_limit, skipped=list(b.skipped),
                   min_prompts=b.min_prompts, n_measured=b.n_measured, selected_prompts=b.selected,
                   conclusive=b.conclusive, rule=RULE, fit=BudgetFitBlock.of(b.fit),
                   levels=[BudgetLevel.of(lv, b.prompt_ids, b.tol) for lv in b.levels], axis=b.axis,
                   axis_text=b.axis_text, axis_note=b.axis_note, direction=b.direction,
                   secondary=None if b.secondary is None else SecondaryAxis.of(b.secondary))


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


@dataclass
class BaselinePrompt(Row):
    """One prompt's chain τ in the ``--baseline`` run and in this one, and their difference."""

    baseline: float
    run: float
    delta: float


@dataclass
class BaselineBlock(Row):
    """This run against ``--baseline`` (:meth:`dflash_eval.metrics.baseline.BaselineComparison.to_json`): the paired
    prompts' mean τ of either run, the paired difference with its CI and method, the relative change against the
    tolerances and their verdicts, each paired prompt, and the selected prompts the baseline lacks."""

    path: str
    n: int
    missing: list[str]
    mean_baseline: float
    mean_run: float
    mean_diff: float
    ci95: list[float]
    ci_method: str
    rel_change: float
    drop_tol: float
    rise_tol: float
    drop_passed: bool
    rise_passed: bool
    prompts: dict[str, BaselinePrompt]


@dataclass
class SampledStat(Row):
    """The mean over prompts of each prompt's mean over its samples, its median and 95 % CI with its method, and the
    two stages of the spread (:func:`dflash_eval.metrics.sampled_ci.sampled_summary`; an eval.json written before
    the method and the spread were recorded lacks them)."""

    n: int
    mean: float
    median: float
    ci95: list[float]
    ci_method: str | None = _opt()
    sd_between: float | None = _opt()
    sd_within: float | None = _opt()


@dataclass
class SampledBlock(Row):
    """A run at temperature > 0 (eval.json's ``sampled``): how many prompts and samples, and the chain's, each DDTree
    budget's and (``--online-tau``) the online loop's mean over samples."""

    prompts: int
    samples: int
    chain: SampledStat
    ddtree: dict[str, SampledStat]
    online: SampledStat | None = _opt()
