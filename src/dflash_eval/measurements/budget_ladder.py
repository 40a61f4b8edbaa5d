"""The drafter's drift budget (:mod:`dflash_eval.metrics.drift_budget`): the ``drift_budget`` measurement, measured on
the reference side's features and memoised in the cache: one ``drift_budget`` entry per ladder level (τ of every
prompt and the injected errors under that perturbation), keyed by every input (drafter, code, feature entries,
prompts, level; the seed for the noise levels only; the other side's feature entries for the drift levels), so runs
with another ``--drift-budget-seed`` reuse the drift and rounding levels.

The drift levels (``xA``) amplify the measured drift direction of the run's drift comparison with the largest drift
(:func:`drift_direction`: among the comparisons that are not skipped and have the reference side on one side, the
largest mean relative error over the selected prompts and layers; e.g. bf16 against fp32 on a CPU, where the torch
against its recurrent form drifts by rounding only). A run without such a comparison (or whose largest drift is 0)
skips them, and the budget is read on the isotropic levels, which it says.

The levels are measured by several xdist workers side by side (batches of levels, one per worker; one batch of
all levels in a single process), and a changed ladder reuses the levels it keeps; within a batch the prompts go in
chunks of ``--chunk-memory`` (each chunk's features read for it alone), and a chunk's levels through one lock-step
simulation (as many as the chunk memory holds). The tolerance and the safety factor are applied when the budget is
read, so changing them recomputes nothing. Where the selection holds fewer than ``--drift-budget-min-prompts``
prompts the budget is measured on the first that many prompts of ``--prompts`` (:func:`budget_subject`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import cache_key
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.common.progress import Progress
from dflash_eval.common.sizes import parse_memory
from dflash_eval.errors import ConfigError
from dflash_eval.measurements.registry import Measurement, Plan, Subject
from dflash_eval.measurements.tau_greedy import TAU, PromptTau, tau_fields
from dflash_eval.metrics.drift import Side
from dflash_eval.metrics.drift_budget import Direction, DriftBudget, Perturbation, measure_ladder, parse_ladder
from dflash_eval.metrics.drift_ladder import DRIFT
from dflash_eval.metrics.tau_chunks import LazyItems

__all__ = ["DriftBudgetLadder", "DRIFT_BUDGET", "LadderPlan", "budget_subject", "drift_direction"]


def drift_direction(ev: Subject) -> tuple[Direction | None, Side | None, str]:
    """The drift direction the budget's main axis amplifies and its other side, or None, None and why there is none.

    Candidates: the run's drift comparisons that are not skipped and have the reference side (the features the
    budget perturbs) as one of their sides; each one's drift is the mean over ``ev``'s prompts and the drafter's
    target layers of ``||other - reference|| / ||reference||``. The largest wins (the first listed on a tie)."""
    ref = ev.inputs.reference_side
    cands = [(c.name, c.b if c.a == ref else c.a) for c in ev.inputs.comparisons
             if c.skip_reason is None and ref in (c.a, c.b) and c.a != c.b]
    if not cands:
        return None, None, f"no drift comparison of this run has the reference side {ref.label} on one side"
    sizes: list[tuple[str, Side, float]] = []
    for name, other in cands:
        errs = [d.rel_err for per in ev.layer_drifts(other, ref).values() for d in per.values()]
        sizes.append((name, other, sum(errs) / len(errs) if errs else 0.0))
    name, other, drift = max(sizes, key=lambda t: t[2])
    if not drift > 0:
        return None, None, f"the other sides' features equal the reference's ({', '.join(n for n, _, _ in sizes)})"
    return Direction(name, ref.label, other.label, drift, {n: d for n, _, d in sizes}), other, ""


def budget_subject(ev: Subject) -> Subject:
    """Where the budget is measured: ``ev`` when the selection holds at least ``--drift-budget-min-prompts``
    prompts (or ``--prompts`` holds no more), else the same drafter on the first that many prompts of ``--prompts``
    (the selection and the prompts after it; :meth:`Subject.on_prompts`), whose completions and features are
    produced and cached like the selection's. The selection's own τ, drift and reports stay on the selection."""
    s, selected = ev.settings, ev.inputs.prompts
    if len(selected) >= s.drift_budget_min_prompts or s.num_prompts is None:
        return ev
    more = ev.inputs.first_prompts(s.drift_budget_min_prompts)
    if len(more) <= len(selected) or [p.id for p in more[:len(selected)]] != [p.id for p in selected]:
        return ev
    ev.check_drafter()  # a drafter that does not fit the target stops here, before anything is produced
    return ev.on_prompts(more)


@dataclass(frozen=True)
class LadderPlan:
    """What the drift budget's plan keeps for decoding: where it is measured (``subject``: :func:`budget_subject`),
    the ladder asked for and its ``usable`` levels, the base τ of the measured prompts (``ids``), how many prompts
    the selection holds (``selected``), the measured drift direction (None: none) and why there is none
    (``note``)."""

    subject: Subject
    ladder: tuple[Perturbation, ...]
    usable: list[Perturbation]
    base_tau: list[float]
    ids: list[str]
    selected: int
    direction: Direction | None
    note: str


class DriftBudgetLadder(Measurement[LadderPlan, DriftBudget]):
    """The drift budget of the subject's drafter (see module docstring); no parameters. Its value is measured on
    :func:`budget_subject`'s prompts; with more prompts than the selection its base is their chains alone (no
    DDTree)."""

    name: ClassVar[str] = "drift_budget"
    kind: ClassVar[str] = "drift_budget"

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[LadderPlan]:
        selected = len(subject.inputs.prompts)
        ev = budget_subject(subject)
        s, side, prompts = ev.settings, ev.inputs.reference_side, ev.inputs.prompts
        ladder = parse_ladder(s.drift_budget_ladder)
        direction, other, note = (drift_direction(subject) if any(p.kind == DRIFT for p in ladder)
                                  else (None, None, ""))
        usable = [p for p in ladder if p.available and (p.kind != DRIFT or direction is not None)]
        if not usable:
            raise ConfigError(f"--drift-budget-ladder {s.drift_budget_ladder!r}: only amplified-drift levels, and "
                              f"this run has no drift direction to amplify ({note}); add isotropic levels, e.g. "
                              f"0.1,0.5,1")
        extended = len(prompts) > selected
        base: dict[str, PromptTau] = ev.tau_results if side == ev.inputs.eval_side and not extended else \
            ev.measure(TAU, side=side, budgets=())
        base_tau = [base[p.id].chain.tau for p in prompts]
        ids = [p.id for p in prompts]
        common = {**tau_fields(ev, side, ()), "code": CODE_VERSION, "prompt_ids": ids}
        if other is not None:  # the drift levels: the other side's feature entries, no seed
            comps = ev.completions()
            toward = {"comparison": direction.comparison if direction else "", "other": other.label,
                      "features": [[ev.store.key(comps[p.id].sequence, i, other) for i in ev.layer_ids]
                                   for p in prompts]}
        n_p, n_l = len(prompts), len(ev.layer_ids)

        def meta(level: Perturbation) -> dict[str, Any]:
            return {"prompt_ids": ids, "base": side.label, "level": level.label}

        def fields(level: Perturbation) -> dict[str, Any]:
            if level.kind == DRIFT:
                return {**common, "level": level.label, "direction": toward}
            return {**common, "level": level.label, **({"seed": s.drift_budget_seed} if level.seeded else {})}

        reqs = {lv.label: Request(self.kind, fields(lv), derived=True, item=lv.label,
                                  what=f"the drift budget's level {lv.label}", expect=Expected(
                                      tensors={"tau": (torch.float64, (n_p,)),
                                               "injected": (torch.float64, (n_p, n_l))}, meta=meta(lv)))
                for lv in usable}
        by_label = {lv.label: lv for lv in usable}

        def produce(todo: list[Request]) -> list[Produced]:
            levels = [by_label[r.item] for r in todo]
            return [Produced(t, meta(lv)) for lv, t in zip(levels, _measure(ev, side, levels, base_tau, other))]

        # batches of the whole ladder (not of what is missing now): every worker forms the same batches
        n = max(1, min(ev.inputs.worker_count, len(usable)))
        groups = [usable[g * len(usable) // n:(g + 1) * len(usable) // n] for g in range(n)]
        batches = [Batch([reqs[lv.label] for lv in grp], produce,
                         lock="drift_budget-" + cache_key("budget_group",
                                                          {"keys": [reqs[lv.label].key for lv in grp]}))
                   for grp in groups if grp]
        state = LadderPlan(ev, ladder, usable, base_tau, ids, selected, direction, note)
        return Plan(batches, reqs, spread=True, state=state)

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[LadderPlan],
               params: Mapping[str, Any]) -> DriftBudget:
        st = plan.state
        ev, ladder, usable, base_tau, ids, direction, note = (st.subject, st.ladder, st.usable, st.base_tau, st.ids,
                                                              st.direction, st.note)
        s = ev.settings
        got = [entries[lv.label] for lv in usable]
        return DriftBudget.build(
            drafter=ev.checkpoint.fingerprint, base=ev.inputs.reference_side.label, prompt_ids=ids,
            base_tau=base_tau, ladder=usable, taus=[e.tensors["tau"].tolist() for e in got],
            injected=[e.tensors["injected"].tolist() for e in got], tol=s.drift_budget_tol,
            safety=s.drift_budget_safety, seed=s.drift_budget_seed, spec=s.drift_budget_ladder,
            skipped=[f"{p.label}: this torch has no such dtype" for p in ladder if not p.available]
            + [f"{p.label}: {note}" for p in ladder if p.kind == DRIFT and direction is None],
            min_prompts=s.drift_budget_min_prompts, selected=st.selected, conclusive=s.drift_budget_conclusive,
            direction=direction, axis_note=f"no drift direction: {note}" if note else "")



#: The built-in measurement, reached by reference: ``ev.measure(DRIFT_BUDGET)``.
DRIFT_BUDGET = DriftBudgetLadder()

def _measure(ev: Subject, side: Side, levels: list[Perturbation], base_tau: list[float],
             other: Side | None) -> list[dict[str, torch.Tensor]]:
    """τ of every prompt and the injected errors under each of ``levels``, prompt chunk by prompt chunk (the drift
    levels read each prompt's features of the ``other`` side too)."""
    s, prompts = ev.settings, ev.inputs.prompts
    comps, feats = ev.completions(), ev.features(side)
    toward = ev.features(other) if other is not None and any(lv.kind == DRIFT for lv in levels) else None
    ids = [p.id for p in prompts]

    def load(i: int) -> tuple[str, dict[int, torch.Tensor], torch.Tensor, int, dict[int, torch.Tensor]]:
        pid = ids[i]
        return (pid, feats[pid], torch.tensor(comps[pid].sequence, dtype=torch.long), len(comps[pid].prompt_ids),
                toward[pid] if toward is not None else {})

    items = LazyItems([len(comps[pid].sequence) for pid in ids], load)
    total = len(levels) * sum(max(0, len(comps[pid].sequence) - 1 - len(comps[pid].prompt_ids)) for pid in ids)
    prog = Progress(f"drift budget ({len(levels)} levels)", total, ev.inputs.progress, unit="positions")
    with ev.inputs.meter.timed("drift_budget"):
        taus, inj = measure_ladder(ev.drafter, ev.inputs.head, items, levels, base_tau=base_tau,
                                   seed=s.drift_budget_seed, max_blocks=s.max_blocks,
                                   memory=parse_memory(s.chunk_memory), progress=prog.reach)
    prog.reach(total)
    return [{"tau": torch.tensor(t, dtype=torch.float64),
             "injected": torch.tensor(e, dtype=torch.float64).reshape(len(prompts), len(ev.layer_ids))}
            for t, e in zip(taus, inj)]
