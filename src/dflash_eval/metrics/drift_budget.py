"""The drift budget of a drafter: how large a relative error of its target-layer features may be before its τ moves.

Kernel drift matters only when it changes what the drafter proposes. The budget measures that directly, on the
cached features of the selected prompts (only the drafter runs): each perturbation of a ladder is applied to every
prompt's features of the drafter's target layers, chain τ is recomputed offline for every level and compared,
prompt by prompt, with τ on the unperturbed features. Levels are batched into as few simulations as memory
allows (:func:`dflash_eval.metrics.tau.simulate_tau`: every chain in lock-step, drafting only the round starts it
visits).

Perturbations (``--drift-budget-ladder``, default :data:`DEFAULT_LADDER`; :mod:`dflash_eval.metrics.drift_ladder`):

- a number ``e``: relative Gaussian noise, ``f + e * rms(f) * N(0, 1)`` per prompt and layer (seeded per level,
  prompt and layer from ``--drift-budget-seed``, so a prompt's noise does not depend on which others are selected);
- ``bf16`` / ``fp16`` / ``fp8``: the features rounded through that dtype
  (:func:`dflash_eval.common.dtypes.round_through`; ``fp8`` = float8-e4m3 with a per-tensor scale), where this torch has
  it. On fp32 features they cover the small end of the ladder (fp16 ~2e-4, bf16 ~2e-3 relative error on the bundled
  target, fp8 ~3e-2); a level that leaves the features unchanged (bf16 rounding of bf16 features) costs no simulation.

Each level's injected error is measured, not assumed: the mean over prompts and layers of ``||f' - f|| / ||f||``
on the tensors the drafter actually sees (after the cast to its dtype), the metric of
:func:`dflash_eval.metrics.drift.layer_drift`.

**The rule.** Sort the levels by injected error. The budget is the largest injected error ``e`` such that every
level with injected error ``<= e`` keeps the mean over prompts of ``|τ(perturbed) - τ(unperturbed)|`` within
``--drift-budget-tol`` with 95 % confidence: the upper end of the mean's percentile-bootstrap 95 % CI
(:func:`dflash_eval.metrics.stats.summarize`: 2000 resamples of the prompts, seed 0) must not exceed the tolerance. A
level over the tolerance ends the search even if a larger one happens to fall back within it. If the smallest
level is already over, the budget is 0; if every level stays within, the budget is the largest injected error,
flagged as a lower bound (``lower_bound``). Judging the CI's upper end rather than the mean itself makes the
budget stable against the noise draw (docs/drift-budget.md: on the bundled drafter seeds 0, 1 and 2 all give 0.1
with it, 0.3 / 0.3 / 0.1 by the mean alone), and more cautious when few prompts are selected (a wider CI). Each
level also reports mean τ, the per-prompt ``|Δτ|``, their mean and maximum.

**The gate** (``test_drift_within_budget``): a comparison's measured drift at a layer (the worst prompt's relative
error) times ``--drift-budget-safety`` must not exceed the budget (:func:`gate_check`).

Run it through the suite (it is cached per drafter, feature entries, ladder, seed and code)::

    pytest tests_eval -k within_budget
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from torch import Tensor

from dflash_eval.metrics.drift_ladder import DEFAULT_LADDER, Perturbation, parse_ladder, perturb_layers
from dflash_eval.metrics.stats import Summary, summarize
from dflash_eval.metrics.tau import simulate_tau
from dflash_eval.metrics.tau_chunks import DEFAULT_CHUNK_MEMORY, bytes_per_token, lengths_of, plan_chunks

if TYPE_CHECKING:
    from dflash_eval.drafter.model import DFlashDrafter
    from dflash_eval.target.head import TargetHead

__all__ = ["DEFAULT_LADDER", "Perturbation", "parse_ladder", "perturb_layers", "measure_ladder", "find_budget",
           "find_harm", "Level", "DriftBudget", "GateCheck", "gate_check", "impact"]

Prompt = tuple[str, dict[int, Tensor], Tensor, int]  # (prompt id, {layer: features [T, H]}, token ids [T], prompt_len)


def measure_ladder(drafter: DFlashDrafter, head: TargetHead, prompts: Sequence[Prompt],
                   ladder: Sequence[Perturbation], *, base_tau: Sequence[float] | None = None, seed: int = 0,
                   max_blocks: int | None = None, memory: int | None = DEFAULT_CHUNK_MEMORY,
                   progress: Callable[[int], None] | None = None) -> tuple[list[list[float]], list[list[list[float]]]]:
    """Chain τ of every prompt under every perturbation: ``(tau[level][prompt], injected[level][prompt][layer])``.

    The prompts go in chunks of about ``memory`` bytes (:mod:`dflash_eval.metrics.tau_chunks`: a prompt's features
    as read, each level's perturbed copy and its contexts; a :class:`~dflash_eval.metrics.tau_chunks.LazyItems` of
    prompts is read chunk by chunk); within a chunk, the levels go through
    :func:`dflash_eval.metrics.tau.simulate_tau` together (every chain in lock-step, drafting only the starts it
    visits), as many per call as the budget allows. The noise of a prompt is seeded by its id, so the chunks change
    nothing. A level that leaves a chunk's features bit-identical (e.g. bf16 rounding of bf16 features) takes
    ``base_tau`` instead, when given. ``progress``: called with the positions simulated so far, out of
    ``len(ladder)`` x the sum of ``T - 1 - prompt_len``.
    """
    lengths = lengths_of(prompts, lambda p: int(p[2].shape[0]))
    per_token = bytes_per_token(drafter)
    taus: list[list[float]] = [[float("nan")] * len(prompts) for _ in ladder]
    injected: list[list[list[float]]] = [[[] for _ in prompts] for _ in ladder]
    done = 0
    for order in plan_chunks(lengths, per_token, memory):
        chunk = [prompts[i] for i in order]
        size = len(order) * max(lengths[i] for i in order) * per_token
        step = len(ladder) if memory is None else max(1, memory // max(1, size))
        positions = sum(max(0, int(toks.shape[0]) - 1 - plen) for _, _, toks, plen in chunk)
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


def _measure_group(drafter: DFlashDrafter, head: TargetHead, chunk: Sequence[Prompt],
                   levels: Sequence[Perturbation], base_tau: Sequence[float] | None, seed: int, max_blocks: int | None,
                   progress: Callable[[int], None] | None) -> list[tuple[list[float], list[list[float]]]]:
    """(τ of each prompt of ``chunk``, its injected errors) under each of ``levels``, in one simulation."""
    dt = next(drafter.parameters()).dtype
    out: list[tuple[list[float], list[list[float]]]] = []
    items, drafted = [], []
    for k, lv in enumerate(levels):
        level = [perturb_layers(feats, lv, seed=seed, prompt_id=pid, dtype=dt) for pid, feats, _, _ in chunk]
        out.append((list(base_tau) if base_tau else [], [e for _, e in level]))
        if base_tau is not None and not any(x for _, e in level for x in e):
            continue
        drafted.append(k)
        items += [(f, toks, plen) for (f, _), (_, _, toks, plen) in zip(level, chunk)]
    flat = [r.chain.tau for r in simulate_tau(drafter, head, items, (), max_blocks=max_blocks, progress=progress)]
    n = len(chunk)
    for j, k in enumerate(drafted):
        out[k] = (flat[j * n:(j + 1) * n], out[k][1])
    return out


def find_harm(points: Sequence[tuple[float, float]], tol: float) -> int | None:
    """Index of the level with the smallest injected error whose mean |Δτ| exceeds ``tol`` (``points``: (injected
    error, mean |Δτ|)): the smallest perturbation that measurably hurt τ on these prompts, or None."""
    over = [i for i, (_, mean) in enumerate(points) if mean > tol]
    return min(over, key=lambda i: points[i][0]) if over else None


def find_budget(points: Sequence[tuple[float, float]], tol: float) -> tuple[float, bool, int | None]:
    """The rule (module docstring) on ``(injected error, |Δτ| statistic)`` points (the statistic: the upper end of
    the CI of the mean |Δτ|): ``(budget, lower_bound, index of the first point over the tolerance in injected-error
    order, or None)``. A NaN statistic counts as over."""
    order = sorted(range(len(points)), key=lambda i: points[i][0])
    budget = 0.0
    for i in order:
        err, dev = points[i]
        if not dev <= tol:
            return budget, False, i
        budget = max(budget, err)
    return budget, True, None


def _finite_mean(values: Sequence[float]) -> float:
    """Mean of the values that are not NaN (a prompt without a round has none); NaN when none is left."""
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else float("nan")


@dataclass
class Level:
    """One perturbation's effect: its injected error and τ of every prompt against the unperturbed τ."""

    perturbation: Perturbation
    injected: float
    tau: list[float]
    abs_dtau: list[float]
    within: bool = False

    @property
    def mean_tau(self) -> float:
        return _finite_mean(self.tau)

    @cached_property
    def summary(self) -> Summary:
        """Mean, median and bootstrap 95 % CI of the per-prompt |Δτ| (prompts without a round left out)."""
        return summarize([d for d in self.abs_dtau if not math.isnan(d)])

    @property
    def mean_abs_dtau(self) -> float:
        return self.summary.mean

    def to_json(self, prompt_ids: Sequence[str]) -> dict[str, Any]:
        s = self.summary
        return {"kind": self.perturbation.kind, "label": self.perturbation.label,
                "nominal": self.perturbation.size if self.perturbation.kind == "noise" else self.perturbation.dtype,
                "injected_rel_err": self.injected, "mean_tau": self.mean_tau, "mean_abs_dtau": s.mean,
                "ci95": [s.ci_low, s.ci_high], "max_abs_dtau": max((d for d in self.abs_dtau if not math.isnan(d)),
                                                                   default=float("nan")),
                "within": self.within, "abs_dtau": dict(zip(prompt_ids, self.abs_dtau))}


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
    budget: float = 0.0
    lower_bound: bool = False
    limiting: str | None = None  # label of the first level over the tolerance
    skipped: list[str] = field(default_factory=list)
    min_prompts: int = 0  # fewer prompts than this: a gate failure is inconclusive unless the drift reaches `harm`
    harm: float | None = None  # injected error of the smallest level whose mean |Δτ| exceeds tol
    harm_label: str | None = None
    selected: int | None = None  # prompts of the run's selection (the budget may be measured on more)

    @classmethod
    def build(cls, *, drafter: str, base: str, prompt_ids: Sequence[str], base_tau: Sequence[float],
              ladder: Sequence[Perturbation], taus: Sequence[Sequence[float]],
              injected: Sequence[Sequence[Sequence[float]]], tol: float, safety: float, seed: int, spec: str,
              skipped: Sequence[str] = (), min_prompts: int = 0, selected: int | None = None) -> DriftBudget:
        """Judge measured levels (:func:`measure_ladder`'s output) by the rule."""
        levels = []
        for p, ts, inj in zip(ladder, taus, injected):
            errs = [e for per_prompt in inj for e in per_prompt]
            levels.append(Level(p, sum(errs) / len(errs) if errs else float("nan"), list(ts),
                                [abs(t - b) for t, b in zip(ts, base_tau)]))
        budget, lower, first = find_budget([(lv.injected, lv.summary.ci_high) for lv in levels], tol)
        for lv in levels:
            lv.within = lv.injected <= budget and lv.summary.ci_high <= tol
        harm = find_harm([(lv.injected, lv.summary.mean) for lv in levels], tol)
        return cls(drafter, base, list(prompt_ids), list(base_tau), levels, tol, safety, seed, spec, budget, lower,
                   None if first is None else levels[first].perturbation.label, list(skipped), min_prompts,
                   None if harm is None else levels[harm].injected,
                   None if harm is None else levels[harm].perturbation.label, selected)

    @property
    def n_measured(self) -> int:
        """Prompts whose |Δτ| entered the CIs (a prompt without a speculative round has none)."""
        return sum(1 for t in self.base_tau if not math.isnan(t))

    @property
    def conclusive(self) -> bool:
        """Whether the budget was measured on enough prompts to fail a gate on (``--drift-budget-min-prompts``)."""
        return self.n_measured >= self.min_prompts

    @property
    def base_mean_tau(self) -> float:
        return _finite_mean(self.base_tau)

    @property
    def gate_limit(self) -> float:
        """The largest measured drift the gate lets through: budget / safety factor."""
        return self.budget / self.safety

    def describe(self) -> str:
        bound = ">= " if self.lower_bound else ""
        why = ("every level of the ladder stayed within it" if self.lower_bound else
               f"next level {self.limiting!r} moved τ by more" if self.limiting else "")
        extra = (f", {len(self.prompt_ids) - self.selected} of them beyond the {self.selected} selected "
                 f"(--drift-budget-min-prompts {self.min_prompts})"
                 if self.selected is not None and len(self.prompt_ids) > self.selected else "")
        return (f"drift budget {bound}{self.budget:.2e} (drafter {self.drafter[:12]}, {self.base} features of "
                f"{len(self.prompt_ids)} prompts{extra}; largest injected relative error whose mean |Δτ| stays <= "
                f"{self.tol:g} with 95 % confidence; "
                f"{why})")

    def to_json(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "base": self.base, "n_prompts": len(self.prompt_ids),
                "prompt_ids": self.prompt_ids, "base_mean_tau": self.base_mean_tau,
                "base_tau": dict(zip(self.prompt_ids, self.base_tau)), "tol": self.tol, "safety": self.safety,
                "seed": self.seed, "ladder": self.ladder, "budget": self.budget, "lower_bound": self.lower_bound,
                "limiting": self.limiting, "gate_limit": self.gate_limit, "skipped": self.skipped,
                "min_prompts": self.min_prompts, "conclusive": self.conclusive, "harm": self.harm,
                "harm_level": self.harm_label, "selected_prompts": self.selected,
                "rule": "largest injected relative feature error e such that every perturbation with injected error "
                        "<= e keeps the upper end of the bootstrap 95 % CI of the mean over prompts of "
                        "|τ(perturbed) - τ(unperturbed)| <= tol",
                "levels": [lv.to_json(self.prompt_ids) for lv in self.levels]}


@dataclass(frozen=True)
class GateCheck:
    """One comparison's measured drift at one target layer against the budget."""

    comparison: str
    layer: int
    max_rel_err: float
    mean_rel_err: float
    worst_prompt: str
    budget: float
    safety: float
    lower_bound: bool = False
    conclusive: bool = True  # the budget was measured on at least --drift-budget-min-prompts prompts
    harm: float | None = None  # the smallest injected error that measurably hurt τ (DriftBudget.harm)

    @property
    def passed(self) -> bool:
        return self.max_rel_err * self.safety <= self.budget

    @property
    def outcome(self) -> str:
        """``pass`` (drift x safety within the budget); ``fail`` when over it and the budget is conclusive, or on any
        budget once drift x safety reaches a level whose mean |Δτ| exceeded the tolerance (the drift is as large as
        a perturbation that measurably hurt τ on these prompts); else ``inconclusive``: the budget, measured on too
        few prompts, is too noisy to fail a drafter on."""
        if self.passed:
            return "pass"
        if self.conclusive or (self.harm is not None and self.max_rel_err * self.safety >= self.harm):
            return "fail"
        return "inconclusive"

    @property
    def margin(self) -> float:
        """budget / measured drift: how many times larger the drift could be before it reaches the budget."""
        return self.budget / self.max_rel_err if self.max_rel_err > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {"comparison": self.comparison, "layer": self.layer, "max_rel_err": self.max_rel_err,
                "mean_rel_err": self.mean_rel_err, "worst_prompt": self.worst_prompt, "budget": self.budget,
                "safety": self.safety, "margin": self.margin, "lower_bound": self.lower_bound, "passed": self.passed,
                "outcome": self.outcome}


def gate_check(comparison: str, layer: int, rel_errs: dict[str, float], budget: DriftBudget) -> GateCheck:
    """The gate for one comparison and layer: the worst prompt's relative error x safety <= budget."""
    worst = max(rel_errs, key=lambda p: rel_errs[p])
    return GateCheck(comparison, layer, rel_errs[worst], sum(rel_errs.values()) / len(rel_errs), worst,
                     budget.budget, budget.safety, budget.lower_bound, budget.conclusive, budget.harm)


def impact(rel_err: float, budget: DriftBudget, *, bound: bool = False) -> str:
    """``"τ impact: within budget (...)"`` or ``"τ impact: over budget (...)"`` for a feature error ``rel_err``
    (``bound``: it is only a lower bound of the error)."""
    ok = rel_err * budget.safety <= budget.budget
    what = "at least " if bound else ""
    rel = f"{what}{rel_err:.2e} x safety {budget.safety:g} {'<=' if ok else '>'} budget {budget.budget:.2e}"
    if ok and bound:
        return f"τ impact: within budget as far as this check can tell ({rel}; a lower bound of the change)"
    return f"τ impact: {'within' if ok else 'over'} budget ({rel})"
