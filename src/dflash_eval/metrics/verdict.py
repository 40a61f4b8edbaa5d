"""The verdict: τ against its floors. The only place a floor is judged; the τ tests, the reports and the gate CLI
all ask this module.

The rule: a τ passes its floor when the floor exists, the τ is a number (a prompt with no speculative round has
τ NaN) and τ >= floor. A prompt passes when its chain τ and its τ for every DDTree budget pass; the mean and each
category likewise (their τ is the mean over their prompts; their floors follow the selection, see
:mod:`dflash_eval.metrics.floors`). A missing floor is a failure, never a pass, except where only the mean is gated
(``--tau-floor`` without per-prompt floors): a prompt or category without a floor is then not judged (None).

The functions that fill verdicts work on eval.json's rows (plain dicts), so the same code judges a fresh run, a
merge of xdist workers and a report re-judged against rewritten floors.

Named causes (:func:`diagnoses`), each reported once instead of as many ordinary failures as it causes: a drafter
refused by an architecture check (:func:`refused`: never a pass, and a run without a failed test still fails), and
τ of 1.00 on every prompt in a run that misses its floors (:func:`no_acceptance_fails`: the drafter proposes
nothing the target accepts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dflash_eval.metrics.floors import Floors

__all__ = ["passes", "overall", "Threshold", "prompt_threshold", "prompt_thresholds", "mean_thresholds",
           "category_thresholds", "judge_prompts", "judge_mean", "judge_categories", "judge_run", "mean_passed",
           "gate_reasons", "NO_ACCEPTANCE", "NO_ACCEPTANCE_EPS", "no_acceptance", "no_acceptance_fails", "refused",
           "diagnoses"]

#: Chain τ at most this far above 1 counts as 1.00 (what the reports print): at most one accepted draft token in
#: 200 rounds.
NO_ACCEPTANCE_EPS = 0.005
NO_ACCEPTANCE = ("τ is 1.00 on every prompt: the drafter proposes nothing the target accepts; it probably does not "
                 "read this target's features (another target? wrong target_layer_ids? a mask token it was not "
                 "trained with?)")


def no_acceptance(taus: Iterable[float | None]) -> bool:
    """Every prompt's chain τ (prompts without a speculative round left out; at least two prompts) is 1.00: not a
    drafter below its floors but one that does not work with this target at all."""
    vals = [t for t in taus if t is not None and not math.isnan(t)]
    return len(vals) >= 2 and all(t <= 1 + NO_ACCEPTANCE_EPS for t in vals)


def no_acceptance_fails(data: dict[str, Any]) -> bool:
    """τ 1.00 on every prompt of eval.json data (or a τ summary's) that fails its floors: the one cause of those
    failures. A run whose floors accept τ 1 (``--tau-floor 1`` for a random drafter) is not diagnosed."""
    prompts = data.get("prompts", {})
    if not no_acceptance(r.get("tau") for r in prompts.values()):
        return False
    return ("mean_tau" in data and not mean_passed(data)) or any(r.get("passed") is False for r in prompts.values())


def refused(data: dict[str, Any]) -> list[dict[str, str]]:
    """The architecture checks that refused the drafter, from eval.json data (``drafter.refused``; empty: none)."""
    return list((data.get("drafter") or {}).get("refused") or [])


def diagnoses(data: dict[str, Any]) -> list[str]:
    """The named causes of a failing run found in eval.json data, one line each (empty when none)."""
    out = []
    checks = refused(data)
    if checks:
        out.append(f"the drafter {(data.get('drafter') or {}).get('path')} does not fit the target: refused by "
                   f"architecture check{'s' if len(checks) > 1 else ''} "
                   + "; ".join(f"{c['check']}: {c['message']}" for c in checks)
                   + "; every test that needs the drafter was skipped")
    if no_acceptance_fails(data):
        out.append(f"{NO_ACCEPTANCE} ({len(data['prompts'])} prompts)")
    return out


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


def _budget_items(ddtree: Mapping[Any, float]) -> list[tuple[int, float]]:
    return [(int(b), v) for b, v in ddtree.items()]


def prompt_threshold(pid: str, value: float, floors: Floors, budget: int | None = None) -> Threshold:
    """Prompt ``pid``'s chain τ (``budget`` None) or DDTree-``budget`` τ against its per-prompt floor."""
    return Threshold("chain" if budget is None else f"DDTree-{budget}", value, floors.for_prompt(pid, budget),
                     floors.prompt_floors_required)


def prompt_thresholds(pid: str, chain: float, ddtree: Mapping[Any, float], floors: Floors) -> list[Threshold]:
    """Chain τ and each DDTree budget's τ of prompt ``pid`` against their per-prompt floors."""
    return [prompt_threshold(pid, chain, floors)] + [prompt_threshold(pid, v, floors, b)
                                                     for b, v in _budget_items(ddtree)]


def mean_thresholds(chain: float, ddtree: Mapping[Any, float], floors: Floors) -> list[Threshold]:
    """The macro-averaged τ (chain and each budget) against the mean floors."""
    return [Threshold("chain", chain, floors.for_mean())] + [
        Threshold(f"DDTree-{b}", v, floors.for_mean(b)) for b, v in _budget_items(ddtree)]


def category_thresholds(category: str, chain: float, ddtree: Mapping[Any, float],
                        floors: Floors) -> list[Threshold]:
    """A category's mean τ (chain and each budget) against its floors ("all" uses the mean floors)."""
    if category == "all":
        return mean_thresholds(chain, ddtree, floors)
    req = floors.prompt_floors_required
    return [Threshold("chain", chain, floors.for_category(category), req)] + [
        Threshold(f"DDTree-{b}", v, floors.for_category(category, b), req) for b, v in _budget_items(ddtree)]


def judge_prompts(prompts: dict[str, dict[str, Any]], floors: Floors) -> None:
    """Fill ``floor``, ``ddtree_floor`` and ``passed`` of every eval.json prompt row (``tau``, ``ddtree``)."""
    for pid, r in prompts.items():
        ts = prompt_thresholds(pid, r["tau"], r.get("ddtree", {}), floors)
        r["floor"] = ts[0].floor
        r["ddtree_floor"] = {b: t.floor for b, t in zip(r.get("ddtree", {}), ts[1:])}
        r["passed"] = overall(ts)


def judge_mean(data: dict[str, Any], floors: Floors) -> None:
    """Fill ``mean_floor``, ``mean_ddtree_floor`` and ``mean_passed`` of eval.json data (``mean_tau``,
    ``mean_ddtree``)."""
    ts = mean_thresholds(data["mean_tau"], data.get("mean_ddtree", {}), floors)
    data["mean_floor"] = ts[0].floor
    data["mean_ddtree_floor"] = {b: t.floor for b, t in zip(data.get("mean_ddtree", {}), ts[1:])}
    data["mean_passed"] = all(t.passed for t in ts)


def mean_passed(data: dict[str, Any]) -> bool:
    """The mean's verdict from the floors recorded in eval.json data (``mean_floor``, ``mean_ddtree_floor``)."""
    fl = data.get("mean_ddtree_floor", {})
    return passes(data.get("mean_tau"), data.get("mean_floor")) and all(
        passes(v, fl.get(b)) for b, v in data.get("mean_ddtree", {}).items())


def judge_categories(categories: dict[str, dict[str, Any]], floors: Floors | None, budgets: list[str]) -> None:
    """Fill ``floor``, ``ddtree_floor`` and ``passed`` of every per-category row (``chain`` and ``ddtree`` hold
    summaries with a ``mean``; a category may lack a budget's summary, which then fails) for the DDTree
    ``budgets`` of the run; without floors they are None."""
    for c, row in categories.items():
        if floors is None:
            row.update(floor=None, ddtree_floor={b: None for b in budgets}, passed=None)
            continue
        means = {b: row["ddtree"][b]["mean"] if b in row.get("ddtree", {}) else None for b in budgets}
        ts = category_thresholds(c, row["chain"]["mean"], means, floors)
        row["floor"] = ts[0].floor
        row["ddtree_floor"] = {b: t.floor for b, t in zip(budgets, ts[1:])}
        row["passed"] = overall(ts)


def judge_run(data: dict[str, Any], floors: Floors) -> None:
    """Re-judge merged eval.json data against ``floors`` (selected: the run's prompts): every prompt, the mean and
    every category."""
    from dflash_eval.metrics.stats import category_table, ddtree_budgets

    floors = floors.select({p: r.get("category", "prompt") for p, r in data.get("prompts", {}).items()})
    judge_prompts(data.get("prompts", {}), floors)
    if "mean_tau" in data:
        judge_mean(data, floors)
    if data.get("prompts"):
        data["categories"] = category_table(data["prompts"])
        judge_categories(data["categories"], floors, ddtree_budgets(data["prompts"]))


def gate_reasons(prompts: dict[str, dict[str, Any]], means: list[Threshold], *,
                 prompt_floors_required: bool = True) -> list[str]:
    """Why a checkpoint fails the gate (empty when it passes): missing prompt floors (only where they are required:
    not under ``--tau-floor`` alone), prompts below their floor, missing or failed mean floors. ``prompts`` are
    judged eval.json rows (``passed`` None: not gated)."""
    reasons: list[str] = []
    missing = [pid for pid, v in prompts.items() if prompt_floors_required and v["passed"] is not None and (
        v["floor"] is None or None in v["ddtree_floor"].values())]
    if missing:
        reasons.append(f"no floor for {len(missing)} prompt(s) (e.g. {missing[0]!r}; pass --tau-floor-prompt)")
    below = [p for p, v in prompts.items() if v["passed"] is False and p not in missing]
    if below:
        reasons.append(f"{len(below)} prompt(s) below floor")
    for t in means:
        if t.missing:
            reasons.append(f"no mean {t.label} floor")
        elif not t.passed:
            reasons.append(f"mean {t.label} τ {t.value:.3f} < {t.floor}")
    if reasons and no_acceptance(v.get("tau") for v in prompts.values()):  # the one cause of those reasons
        reasons.insert(0, NO_ACCEPTANCE)
    return reasons
