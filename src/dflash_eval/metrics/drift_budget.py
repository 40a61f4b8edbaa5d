"""The drift budget of a drafter: how large a relative error of its target-layer features may be before its τ moves.

Kernel drift matters only when it changes what the drafter proposes. The budget measures that directly, on the
cached features of the selected prompts (only the drafter runs): each perturbation of a ladder is applied to every
prompt's features of the drafter's target layers, chain τ is recomputed offline for every level and compared,
prompt by prompt, with τ on the unperturbed features. Levels are batched into as few simulations as memory
allows (:func:`dflash_eval.metrics.tau.simulate_tau`: every chain in lock-step, drafting only the round starts it
visits).

Perturbations (``--drift-budget-ladder``, default :data:`DEFAULT_LADDER`; :mod:`dflash_eval.metrics.drift_ladder`),
on two axes:

- **the main axis, the measured drift direction amplified**: ``xA`` sets each prompt's features of each layer to
  ``f + A * (g - f)``, ``f`` the perturbed side's (the reference side), ``g`` the same prompt's and layer's features
  of the other side of the run's drift comparison with the largest drift (bf16 against fp32 on a CPU, fla against
  torch on a GPU with fla; :func:`dflash_eval.measurements.budget_ladder.drift_direction`). Real kernel drift is
  structured (correlated across positions, channels and layers) and costs more τ per unit of error than isotropic
  noise, so the budget is read along it. No randomness: these levels do not depend on ``--drift-budget-seed``;
- **the secondary, isotropic axis**: a number ``e``, relative Gaussian noise ``f + e * rms(f) * N(0, 1)`` per prompt
  and layer (seeded per level, prompt and layer from ``--drift-budget-seed``, so a prompt's noise does not depend on
  which others are selected); ``bf16`` / ``fp16`` / ``fp8``: the features rounded through that dtype
  (:func:`dflash_eval.common.dtypes.round_through`; ``fp8`` = float8-e4m3 with a per-tensor scale), where this
  torch has it. A level that leaves the features unchanged (bf16 rounding of bf16 features) costs no simulation.
  These levels are fitted on their own and reported next to the budget; the gate does not use them. Where the run
  has no second feature side (no drift comparison), the drift levels are skipped and the budget is read on this
  axis, which the reports say.

Each level's injected error is measured, not assumed: the mean over prompts and layers of ``||f' - f|| / ||f||``
on the tensors the drafter actually sees (after the cast to its dtype), the metric of
:func:`dflash_eval.metrics.drift.layer_drift`.

**The budget is a number** (:mod:`dflash_eval.metrics.drift_fit`): the harm of a level is the signed τ drop, the mean
over prompts of ``τ(unperturbed) - τ(perturbed)`` (a perturbation that raises τ does no harm); a monotone (isotonic)
fit of the drop against the injected error of the main axis's levels, read log-linearly between the levels, reaches
``--drift-budget-tol`` at the budget. Its 90 % CI comes from a paired bootstrap over prompts (the same resampled
prompts at every level, refitted each time). No crossing within the ladder: the budget is the largest injected error,
a lower bound (``lower_bound``), its CI open above. Each level also reports mean τ, its mean drop with a CI, the
fitted drop and the per-prompt |Δτ|. The fit is done when the cached levels are read, so the tolerance and the safety
factor change nothing that is cached.

**The gate** (``test_drift_within_budget``, :func:`gate_check`): a comparison's measured drift at a layer (the
worst prompt's relative error) times ``--drift-budget-safety`` passes at or below the lower end of the budget's CI,
fails above its upper end, and is inconclusive in between (a skip that names the numbers and what would decide it;
``--drift-budget-conclusive`` decides it on the estimate instead).

Run it through the suite (it is cached per drafter, feature entries, level, seed and code)::

    pytest tests_eval -k within_budget
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from torch import Tensor

from dflash_eval.common.number_text import ci_text, fmt
from dflash_eval.metrics.drift_checks import RULE, Direction, GateCheck
from dflash_eval.metrics.drift_fit import BudgetFit, fit_budget
from dflash_eval.metrics.drift_ladder import (
    DEFAULT_LADDER,
    DRIFT,
    DRIFT_AXIS,
    ISOTROPIC_AXIS,
    Perturbation,
    parse_ladder,
    perturb_layers,
)
from dflash_eval.metrics.stats import Summary, summarize
from dflash_eval.metrics.tau import simulate_tau
from dflash_eval.metrics.tau_chunks import DEFAULT_CHUNK_MEMORY, bytes_per_token, lengths_of, plan_chunks
from dflash_eval.metrics.verdict import FAIL, INCONCLUSIVE, PASS, drift_outcome, fit_within, within_estimate

if TYPE_CHECKING:
    from dflash_eval.drafter.model import DFlashDrafter
    from dflash_eval.target.head import TargetHead

__all__ = ["DEFAULT_LADDER", "Perturbation", "parse_ladder", "perturb_layers", "measure_ladder", "Level",
           "Direction", "AxisFit", "DriftBudget", "gate_check", "impact", "RULE"]

Prompt = tuple[str, dict[int, Tensor], Tensor, int]  # (prompt id, {layer: features [T, H]}, token ids [T], prompt_len)
#: A prompt with its features of the other side by layer (what a ``drift`` level amplifies the difference to).
DirectedPrompt = tuple[str, dict[int, Tensor], Tensor, int, dict[int, Tensor]]


def _other(p: Prompt | DirectedPrompt) -> dict[int, Tensor] | None:
    """The other side's features of a prompt (None for a prompt given without them)."""
    return p[4] if len(p) == 5 else None


def measure_ladder(drafter: DFlashDrafter, head: TargetHead, prompts: Sequence[Prompt] | Sequence[DirectedPrompt],
                   ladder: Sequence[Perturbation], *, base_tau: Sequence[float] | None = None, seed: int = 0,
                   max_blocks: int | None = None, memory: int | None = DEFAULT_CHUNK_MEMORY,
                   progress: Callable[[int], None] | None = None) -> tuple[list[list[float]], list[list[list[float]]]]:
    """Chain τ of every prompt under every perturbation: ``(tau[level][prompt], injected[level][prompt][layer])``.

    The prompts go in chunks of about ``memory`` bytes (:mod:`dflash_eval.metrics.tau_chunks`: a prompt's features
    as read, each level's perturbed copy and its contexts; a :class:`~dflash_eval.metrics.tau_chunks.LazyItems` of
    prompts is read chunk by chunk); within a chunk, the levels go through
    :func:`dflash_eval.metrics.tau.simulate_tau` together (every chain in lock-step, drafting only the starts it
    visits), as many per call as the budget allows. The noise of a prompt is seeded by its id, so the chunks change
    nothing. A ``drift`` level needs each prompt's other-side features (:data:`DirectedPrompt`). A level that leaves a
    chunk's features bit-identical (e.g. bf16 rounding of bf16 features) takes ``base_tau`` instead, when given.
    ``progress``: called with the positions simulated so far, out of ``len(ladder)`` x the sum of
    ``T - 1 - prompt_len``.
    """
    lengths = lengths_of(prompts, lambda p: int(p[2].shape[0]))
    per_token = bytes_per_token(drafter, sides=2 if any(lv.kind == DRIFT for lv in ladder) else 1)
    taus: list[list[float]] = [[float("nan")] * len(prompts) for _ in ladder]
    injected: list[list[list[float]]] = [[[] for _ in prompts] for _ in ladder]
    done = 0
    for order in plan_chunks(lengths, per_token, memory):
        chunk = [prompts[i] for i in order]
        size = len(order) * max(lengths[i] for i in order) * per_token
        step = len(ladder) if memory is None else max(1, memory // max(1, size))
        positions = sum(max(0, int(p[2].shape[0]) - 1 - p[3]) for p in chunk)
        for g0 in range(0, len(ladder), step):
            group = range(g0, min(g0 + step, len(ladder)))
            sims = _measure_group(drafter, head, chunk, [ladder[k] for k in group], base_tau and
                                  [base_tau[i] for i in order], seed, max_blocks,
                                  None if progress is None else _offset(progress, done))
            for k, (ts, errs) in zip(group, sims):
                for n, i in enumerate(order):
                    taus[k][i], injected[k][i] = ts[n], errs[n]
            done += positions * len(group)
            if progress is not None:
                progress(done)
        del chunk
    return taus, injected


def _offset(progress: Callable[[int], None], base: int) -> Callable[[int], None]:
    """``progress`` called with ``base`` added: positions of earlier groups counted."""
    return lambda d: progress(base + d)


def _measure_group(drafter: DFlashDrafter, head: TargetHead, chunk: Sequence[Prompt | DirectedPrompt],
                   levels: Sequence[Perturbation], base_tau: Sequence[float] | None, seed: int, max_blocks: int | None,
                   progress: Callable[[int], None] | None) -> list[tuple[list[float], list[list[float]]]]:
    """(τ of each prompt of ``chunk``, its injected errors) under each of ``levels``, in one simulation."""
    dt = next(drafter.parameters()).dtype
    out: list[tuple[list[float], list[list[float]]]] = []
    items, drafted = [], []
    for k, lv in enumerate(levels):
        level = [perturb_layers(p[1], lv, seed=seed, prompt_id=p[0], dtype=dt, other=_other(p)) for p in chunk]
        out.append((list(base_tau) if base_tau else [], [e for _, e in level]))
        if base_tau is not None and not any(x for _, e in level for x in e):
            continue
        drafted.append(k)
        items += [(f, p[2], p[3]) for (f, _), p in zip(level, chunk)]
    flat = [r.chain.tau for r in simulate_tau(drafter, head, items, (), max_blocks=max_blocks, progress=progress)]
    n = len(chunk)
    for j, k in enumerate(drafted):
        out[k] = (flat[j * n:(j + 1) * n], out[k][1])
    return out


def _finite_mean(values: Sequence[float]) -> float:
    """Mean of the values that are not NaN (a prompt without a round has none); NaN when none is left."""
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else float("nan")


def _sci(x: float) -> str:
    return fmt(x, 2, "e")


@dataclass
class Level:
    """One perturbation's effect: its injected error and τ of every prompt, against the unperturbed τ as the signed
    drop ``τ(unperturbed) - τ(perturbed)`` per prompt (NaN for a prompt without a round)."""

    perturbation: Perturbation
    injected: float
    tau: list[float]
    drop: list[float]
    fitted: float | None = None  # the monotone fit at this level's injected error (None: the level was not fitted)
    injected_by_prompt: list[float] = field(default_factory=list)  # each prompt's mean over layers

    @property
    def axis(self) -> str:
        return self.perturbation.axis

    @property
    def mean_tau(self) -> float:
        return _finite_mean(self.tau)

    @cached_property
    def summary(self) -> Summary:
        """Mean, median and 95 % CI of the per-prompt τ drop (prompts without a round left out)."""
        return summarize([d for d in self.drop if not math.isnan(d)])

    @property
    def mean_drop(self) -> float:
        return self.summary.mean

    @property
    def abs_dtau(self) -> list[float]:
        return [abs(d) for d in self.drop]

    @property
    def mean_abs_dtau(self) -> float:
        return _finite_mean(self.abs_dtau)

    @property
    def max_abs_dtau(self) -> float:
        return max((d for d in self.abs_dtau if not math.isnan(d)), default=float("nan"))

    def within(self, tol: float) -> bool:
        """The fit at this level stays below ``tol`` (a level that was not fitted, e.g. a rounding that changed
        nothing, is within)."""
        return fit_within(self.fitted, tol)


@dataclass(frozen=True)
class AxisFit:
    """The fit of one axis's levels (``levels``: their indices in :attr:`DriftBudget.levels`)."""

    axis: str
    levels: tuple[int, ...]
    fit: BudgetFit

    def text(self) -> str:
        lo, hi = self.fit.ci_low, self.fit.ci_high
        return (f"{'>= ' if self.fit.lower_bound else ''}{_sci(self.fit.budget)} ({self.fit.level:.0%} CI "
                f"{ci_text(lo, hi, 2, 'e')})").replace("%", " %")


def _fit_axis(axis: str, levels: list[Level], ks: Sequence[int], tol: float) -> AxisFit:
    """The monotone fit of the levels ``ks`` of one axis (each level's ``fitted`` set from it)."""
    if not ks:
        raise ValueError(f"the drift budget's {axis} axis has no level to fit")
    fit = fit_budget([levels[k].injected for k in ks], [levels[k].drop for k in ks], tol)
    for j, k in enumerate(ks):
        levels[k].fitted = fit.fitted_at(j)
    return AxisFit(axis, tuple(ks), fit)


def _alphas_text(levels: Sequence[Level]) -> str:
    alphas = sorted(lv.perturbation.size for lv in levels if lv.axis == DRIFT_AXIS)
    if not alphas:
        return ""
    return f"x{alphas[0]:g}" if len(alphas) == 1 else f"x{alphas[0]:g}..x{alphas[-1]:g}"


@dataclass
class DriftBudget:
    """A drafter's drift budget (see module docstring) with everything it was derived from."""

    drafter: str
    base: str  # the side whose features were perturbed, e.g. "torch/float32"
    prompt_ids: list[str]
    base_tau: list[float]
    levels: list[Level]
    tol: float
    safety: float
    seed: int
    ladder: str
    fit: BudgetFit
    skipped: list[str] = field(default_factory=list)
    min_prompts: int = 0  # --drift-budget-min-prompts: a smaller selection was extended to this many
    selected: int | None = None  # prompts of the run's selection (the budget may be measured on more)
    conclusive: bool = False  # --drift-budget-conclusive: a gate inside the CI is decided on the estimate
    axis: str = ISOTROPIC_AXIS  # the main axis, whose fit is the budget: DRIFT_AXIS or ISOTROPIC_AXIS
    direction: Direction | None = None  # the measured drift direction of the drift axis
    axis_note: str = ""  # why the main axis is the isotropic one (no second feature side ...)
    secondary: AxisFit | None = None  # the isotropic axis's own fit, when the drift axis is the main one

    @classmethod
    def build(cls, *, drafter: str, base: str, prompt_ids: Sequence[str], base_tau: Sequence[float],
              ladder: Sequence[Perturbation], taus: Sequence[Sequence[float]],
              injected: Sequence[Sequence[Sequence[float]]], tol: float, safety: float, seed: int, spec: str,
              skipped: Sequence[str] = (), min_prompts: int = 0, selected: int | None = None,
              conclusive: bool = False, direction: Direction | None = None, axis_note: str = "") -> DriftBudget:
        """The budget of measured levels (:func:`measure_ladder`'s output): the drops, the fit, the CI. The main
        axis is the amplified drift direction when the ladder has its levels (``direction`` says which), else the
        isotropic one; with both, the isotropic levels get their own fit (:attr:`secondary`)."""
        levels = []
        for p, ts, inj in zip(ladder, taus, injected):
            errs = [e for per_prompt in inj for e in per_prompt]
            levels.append(Level(p, sum(errs) / len(errs) if errs else float("nan"), list(ts),
                                [b - t for t, b in zip(ts, base_tau)],
                                injected_by_prompt=[sum(e) / len(e) if e else float("nan") for e in inj]))
        drift_k = [k for k, lv in enumerate(levels) if lv.axis == DRIFT_AXIS]
        iso_k = [k for k, lv in enumerate(levels) if lv.axis == ISOTROPIC_AXIS]
        axis = DRIFT_AXIS if drift_k else ISOTROPIC_AXIS
        main = _fit_axis(axis, levels, drift_k or iso_k, tol)
        secondary = _fit_axis(ISOTROPIC_AXIS, levels, iso_k, tol) if drift_k and iso_k else None
        return cls(drafter, base, list(prompt_ids), list(base_tau), levels, tol, safety, seed, spec, main.fit,
                   list(skipped), min_prompts, selected, conclusive, axis, direction if drift_k else None,
                   axis_note, secondary)

    @property
    def axis_text(self) -> str:
        """What the budget was read along: ``along the bf16-vs-fp32 drift of this run (torch/bfloat16 -
        torch/float32), amplified x1..x300``, or the isotropic axis and why."""
        if self.axis == DRIFT_AXIS:
            d = self.direction
            where = f"the {d.comparison} drift of this run ({d.other} - {d.reference})" if d else "the measured drift"
            return f"along {where}, amplified {_alphas_text(self.levels)}"
        return "along isotropic relative noise and dtype rounding" + (f" ({self.axis_note})" if self.axis_note else "")

    @property
    def budget(self) -> float:
        return self.fit.budget

    @property
    def ci(self) -> tuple[float, float]:
        """The budget's bootstrap CI (:data:`CI_LEVEL`); the upper end is +inf when open."""
        return self.fit.ci_low, self.fit.ci_high

    @property
    def lower_bound(self) -> bool:
        return self.fit.lower_bound

    @property
    def n_measured(self) -> int:
        """Prompts whose τ entered the fit (a prompt without a speculative round has none)."""
        return self.fit.n_prompts

    @property
    def base_mean_tau(self) -> float:
        return _finite_mean(self.base_tau)

    @property
    def gate_limit(self) -> float:
        """budget / safety factor: the measured drift at which drift x safety reaches the estimate."""
        return self.budget / self.safety

    def budget_text(self) -> str:
        """``4.20e-01 (90 % CI 3.50e-01–5.10e-01)``; ``>= `` for a lower bound, ``inf`` for an open end."""
        lo, hi = self.ci
        return (f"{'>= ' if self.lower_bound else ''}{_sci(self.budget)} ({self.fit.level:.0%} CI "
                f"{ci_text(lo, hi, 2, 'e')})").replace("%", " %")

    def describe(self) -> str:
        f = self.fit
        why = {"not_reached": f"the fitted τ drop stays below {self.tol:g} up to the largest injected error, so the "
                              "budget is at least that",
               "below_range": f"the fitted τ drop exceeds {self.tol:g} already at the smallest injected error; read "
                              "on the line from no error, no drop",
               "no_prompts": "no prompt had a speculative round, nothing was measured",
               "crossed": f"where the fitted mean τ drop reaches {self.tol:g}"}[f.status]
        extra = (f", {len(self.prompt_ids) - self.selected} of them beyond the {self.selected} selected "
                 f"(--drift-budget-min-prompts {self.min_prompts})"
                 if self.selected is not None and len(self.prompt_ids) > self.selected else "")
        second = (f"; isotropic noise and rounding alone: {self.secondary.text()}, not gated"
                  if self.secondary is not None else "")
        return (f"drift budget {self.budget_text()} {self.axis_text} (drafter {self.drafter[:12]}, {self.base} "
                f"features of {self.n_measured} prompts{extra}; {why}{second})")


def gate_check(comparison: str, layer: int, rel_errs: dict[str, float], budget: DriftBudget) -> GateCheck:
    """The gate for one comparison and layer: the worst prompt's relative error x safety against the budget's CI."""
    worst = max(rel_errs, key=lambda p: rel_errs[p])
    lo, hi = budget.ci
    return GateCheck(comparison, layer, rel_errs[worst], sum(rel_errs.values()) / len(rel_errs), worst,
                     budget.budget, budget.safety, lo, hi, budget.lower_bound, budget.conclusive)


def impact(rel_err: float, budget: DriftBudget, *, bound: bool = False) -> str:
    """``"τ impact: within budget (...)"``, ``"τ impact: over budget (...)"`` or ``"τ impact: near the budget
    (...)"`` (inside its CI) for a feature error ``rel_err`` (``bound``: only a lower bound of the error)."""
    x = rel_err * budget.safety
    lo, hi = budget.ci
    what = "at least " if bound else ""
    rel = f"{what}{_sci(rel_err)} x safety {budget.safety:g} = {_sci(x)}"
    outcome = drift_outcome(x, lo, hi, budget.budget)  # the drift gate's rule, without --drift-budget-conclusive
    if outcome == PASS:
        if bound:
            return (f"τ impact: within budget as far as this check can tell ({rel} <= {budget.budget_text()}'s lower "
                    f"end; a lower bound of the change)")
        return f"τ impact: within budget ({rel} <= the lower end of {budget.budget_text()})"
    if outcome == FAIL:
        return f"τ impact: over budget ({rel} > the upper end of {budget.budget_text()})"
    return f"τ impact: near the budget ({rel} inside {budget.budget_text()}: cannot tell)"


def gate_reason(g: GateCheck, budget: DriftBudget, where: str) -> str:
    """Why the gate ``g`` did not pass, for its test's message (``where``: the comparison and layer): over the
    budget, or inconclusive with the numbers and what would decide it."""
    lo, hi = budget.ci
    drift = (f"{where}: worst prompt {g.worst_prompt!r} rel_err {_sci(g.max_rel_err)} (mean over prompts "
             f"{_sci(g.mean_rel_err)}) x safety factor {g.safety:g} = {_sci(g.scaled)}")
    if g.outcome == FAIL:
        how = (f"> the estimate {_sci(g.budget)}, inside the CI, decided on the estimate (--drift-budget-conclusive)"
               if g.in_ci else f"> the CI's upper end {_sci(hi)}")
        return (f"drift over budget (the drift matters for τ): {drift} {how}; {budget.describe()}; margin "
                f"{g.margin:.2g}x, the gate needs >= {g.safety:g}x")
    if g.outcome == INCONCLUSIVE:
        side = "below" if within_estimate(g.scaled, g.budget) else "above"
        more = (f"measure the budget on more prompts (it was measured on {budget.n_measured}: "
                f"--drift-budget-min-prompts N, or a larger --prompts / --num-prompts), which narrows its CI")
        return (f"drift gate inconclusive: {drift} lies inside the budget's CI {ci_text(lo, hi, 2, 'e')} ({side} its "
                f"estimate {_sci(g.budget)}); {budget.describe()}. To decide: {more}; or pass "
                f"--drift-budget-conclusive to judge against the estimate (this layer would "
                f"{'pass' if within_estimate(g.scaled, g.budget) else 'fail'})")
    return f"drift within budget: {drift} <= the CI's lower end {_sci(lo)}"
