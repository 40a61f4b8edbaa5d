"""A checkpoint's verdict: its τ against its floors, against ``--baseline`` and its predicted speed-up against
``--speedup-floor``; the verdicts across training steps join it later.

The rule (:func:`.rules.passes`) applied to every τ of a run: a prompt passes when its chain τ and its τ for every
DDTree budget pass; the mean and each category likewise (their τ is the mean over their prompts; their floors follow
the selection, see :mod:`dflash_eval.metrics.floors`). A missing floor is a failure, never a pass, except where only
the mean is gated (``--tau-floor`` without per-prompt floors): a prompt or category without a floor is then not
judged (None). The functions that fill the judged fields work on the run's typed rows
(:mod:`dflash_eval.metrics.tau_rows` says what they read and write), so the same code judges a fresh run, a merge of
xdist workers and a run re-judged against rewritten floors
(:meth:`~dflash_eval.session.run_result.RunResult.judged`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from dflash_eval.common.number_text import ci_text, ends, fmt, is_number
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.speedup import Prediction
from dflash_eval.metrics.tau_rows import GatedCategory, GatedPrompt
from dflash_eval.metrics.verdict.core import (
    BASELINE,
    CHECKPOINT,
    FLOORS,
    PLATEAU,
    REGRESSION,
    SPEEDUP_FLOOR,
    Part,
    Verdict,
    compose,
    notice,
    reasons_part,
)
from dflash_eval.metrics.verdict.rules import (
    NO_ACCEPTANCE,
    VACUOUS_FLOOR,
    Threshold,
    no_acceptance,
    overall,
    passes,
)

__all__ = ["prompt_threshold", "prompt_thresholds", "mean_thresholds", "category_thresholds", "judge_prompts",
           "judge_mean", "MeanFloors", "judge_categories", "refused", "mean_passed", "mean_floors_pass", "JudgedPrompt",
           "gate_reasons", "BaselineCheck", "baseline_reasons", "baseline_failures", "baseline_part", "vacuous_floors",
           "floors_part",
           "speedup_floor_reason", "speedup_floor_part", "regression_part", "plateau_part", "checkpoint_verdict",
           "record_verdict", "tau_verdict", "RefusalCheck", "RefusedDrafter", "JudgedMeans", "NamedLoop",
           "SpeedupCheck", "JudgedRow"]

#: A τ as eval.json's rows hold it: a category may lack a budget's τ (None).
_Tau = TypeVar("_Tau", bound=float | None)


def _budget_items(ddtree: Mapping[Any, _Tau]) -> list[tuple[int, _Tau]]:
    return [(int(b), v) for b, v in ddtree.items()]


def prompt_threshold(pid: str, value: float, floors: Floors, budget: int | None = None) -> Threshold:
    """Prompt ``pid``'s chain τ (``budget`` None) or DDTree-``budget`` τ against its per-prompt floor."""
    return Threshold("chain" if budget is None else f"DDTree-{budget}", value, floors.for_prompt(pid, budget),
                     floors.prompt_floors_required)


def prompt_thresholds(pid: str, chain: float, ddtree: Mapping[Any, float], floors: Floors) -> list[Threshold]:
    """Chain τ and each DDTree budget's τ of prompt ``pid`` against their per-prompt floors."""
    return [prompt_threshold(pid, chain, floors)] + [prompt_threshold(pid, v, floors, b)
                                                     for b, v in _budget_items(ddtree)]


def mean_thresholds(chain: float | None, ddtree: Mapping[Any, float | None], floors: Floors) -> list[Threshold]:
    """The macro-averaged τ (chain and each budget) against the mean floors."""
    return [Threshold("chain", chain, floors.for_mean())] + [
        Threshold(f"DDTree-{b}", v, floors.for_mean(b)) for b, v in _budget_items(ddtree)]


def category_thresholds(category: str, chain: float, ddtree: Mapping[Any, float | None],
                        floors: Floors) -> list[Threshold]:
    """A category's mean τ (chain and each budget) against its floors ("all" uses the mean floors)."""
    if category == "all":
        return mean_thresholds(chain, ddtree, floors)
    req = floors.prompt_floors_required
    return [Threshold("chain", chain, floors.for_category(category), req)] + [
        Threshold(f"DDTree-{b}", v, floors.for_category(category, b), req) for b, v in _budget_items(ddtree)]


def judge_prompts(prompts: Mapping[str, GatedPrompt], floors: Floors) -> None:
    """Fill ``floor``, ``ddtree_floor`` and ``passed`` of every prompt row (from its ``tau`` and ``ddtree``)."""
    for pid, r in prompts.items():
        ts = prompt_thresholds(pid, r.tau, r.ddtree, floors)
        r.floor = ts[0].floor
        r.ddtree_floor = {b: t.floor for b, t in zip(r.ddtree, ts[1:])}
        r.passed = overall(ts)


@dataclass(frozen=True)
class MeanFloors:
    """The macro mean's floors, chain and per DDTree budget, and whether the mean passes them (eval.json's
    ``mean_floor``, ``mean_ddtree_floor`` and, without a refusal, ``mean_passed``): :func:`judge_mean`."""

    mean_floor: float | None
    mean_ddtree_floor: dict[str, float | None]
    passed: bool


def judge_mean(mean_tau: float | None, mean_ddtree: Mapping[str, float | None], floors: Floors) -> MeanFloors:
    """The floors and verdict of the macro mean τ, chain (``mean_tau``) and per DDTree budget (``mean_ddtree``)."""
    ts = mean_thresholds(mean_tau, mean_ddtree, floors)
    return MeanFloors(ts[0].floor, {b: t.floor for b, t in zip(mean_ddtree, ts[1:])}, all(t.passed for t in ts))


class RefusalCheck(Protocol):
    """An architecture check that refused the drafter (:class:`~dflash_eval.session.blocks.Refusal`)."""

    @property
    def check(self) -> str: ...
    @property
    def message(self) -> str: ...


class RefusedDrafter(Protocol):
    """What the verdict reads of the drafter evaluated (:class:`~dflash_eval.session.blocks.DrafterBlock`): its path
    and the checks that refused it (None: none)."""

    @property
    def path(self) -> str: ...
    @property
    def refused(self) -> Sequence[RefusalCheck] | None: ...


class JudgedMeans(Protocol):
    """The run's macro mean τ, chain and per DDTree budget, and the floors recorded beside them
    (:class:`~dflash_eval.session.run_result.TauMeans`, :class:`~dflash_eval.session.eval_result.TauSummary`)."""

    @property
    def mean_tau(self) -> float | None: ...
    @property
    def mean_floor(self) -> float | None: ...
    @property
    def mean_ddtree(self) -> Mapping[str, float | None]: ...
    @property
    def mean_ddtree_floor(self) -> Mapping[str, float | None]: ...


def refused(drafter: RefusedDrafter | None) -> list[RefusalCheck]:
    """The architecture checks that refused the drafter (eval.json's ``drafter.refused``; empty: none)."""
    return [] if drafter is None else list(drafter.refused or [])


def mean_passed(refusals: Sequence[RefusalCheck], means: JudgedMeans | None) -> bool:
    """The mean's verdict (eval.json's ``mean_passed``): its floors pass (:func:`mean_floors_pass`; no τ measured:
    nothing passes) and the drafter was not refused by an architecture check (``refusals``, :func:`refused`: a
    refused drafter never passes)."""
    return not refusals and means is not None and mean_floors_pass(means)


def mean_floors_pass(means: JudgedMeans) -> bool:
    """The mean τ against the floors recorded beside it (a budget without a floor fails)."""
    floors = means.mean_ddtree_floor
    return passes(means.mean_tau, means.mean_floor) and all(
        passes(v, floors[b] if b in floors else None) for b, v in means.mean_ddtree.items())


def judge_categories(categories: Mapping[str, GatedCategory], floors: Floors | None, budgets: list[str]) -> None:
    """Fill ``floor``, ``ddtree_floor`` and ``passed`` of every per-category row (``chain`` and ``ddtree`` hold
    summaries with a ``mean``; a category may lack a budget's summary, which then fails) for the DDTree
    ``budgets`` of the run; without floors they are None."""
    for c, row in categories.items():
        if floors is None:
            row.floor, row.ddtree_floor, row.passed = None, {b: None for b in budgets}, None
            continue
        means = {b: row.ddtree[b].mean if b in row.ddtree else None for b in budgets}
        ts = category_thresholds(c, row.chain.mean, means, floors)
        row.floor = ts[0].floor
        row.ddtree_floor = {b: t.floor for b, t in zip(budgets, ts[1:])}
        row.passed = overall(ts)


class JudgedPrompt(Protocol):
    """What a checkpoint's verdict reads of a judged prompt row (:class:`~dflash_eval.session.rows.PromptRow`, the
    typed row eval.json's ``prompts`` hold): its chain τ and rounds, its floors, its verdict (None: not gated)."""

    @property
    def tau(self) -> float: ...
    @property
    def rounds(self) -> int: ...
    @property
    def floor(self) -> float | None: ...
    @property
    def ddtree_floor(self) -> Mapping[str, float | None]: ...
    @property
    def passed(self) -> bool | None: ...


def gate_reasons(prompts: Mapping[str, JudgedPrompt], means: list[Threshold], *,
                 prompt_floors_required: bool = True) -> list[str]:
    """Why a checkpoint fails the gate (empty when it passes): missing prompt floors (only where they are required:
    not under ``--tau-floor`` alone), prompts below their floor, missing or failed mean floors. ``prompts`` are
    judged rows (``passed`` None: not gated)."""
    reasons: list[str] = []
    missing = [pid for pid, v in prompts.items() if prompt_floors_required and v.passed is not None and (
        v.floor is None or None in v.ddtree_floor.values())]
    if missing:
        reasons.append(f"no floor for {len(missing)} prompt(s) (e.g. {missing[0]!r}; pass --tau-floor-prompt)")
    below = [p for p, v in prompts.items() if v.passed is False and p not in missing]
    if below:
        reasons.append(f"{len(below)} prompt(s) below floor")
    for t in means:
        if t.missing:
            reasons.append(f"no mean {t.label} floor")
        elif not t.passed:
            reasons.append(f"mean {t.label} τ {fmt(t.value)} < {fmt(t.floor)}")  # as every table rounds them
    rows = list(prompts.values())
    if reasons and no_acceptance([r.tau for r in rows], [r.rounds for r in rows]):  # the one cause of those reasons
        reasons.insert(0, NO_ACCEPTANCE)
    return reasons



class BaselineCheck(Protocol):
    """What the baseline part reads of a comparison with ``--baseline``
    (:class:`~dflash_eval.metrics.baseline.BaselineComparison`)."""

    @property
    def rel_change(self) -> float: ...
    @property
    def drop_tol(self) -> float: ...
    @property
    def rise_tol(self) -> float: ...
    @property
    def drop_passed(self) -> bool: ...
    @property
    def rise_passed(self) -> bool: ...


def baseline_reasons(cmp: BaselineCheck | None) -> list[str]:
    """Why the τ against ``--baseline`` fails: a drop beyond the drop tolerance, a rise beyond the rise tolerance
    (empty without a baseline or when both hold)."""
    if cmp is None:
        return []
    return baseline_failures(cmp.rel_change, cmp.drop_tol, cmp.rise_tol, cmp.drop_passed, cmp.rise_passed)


def baseline_failures(rel_change: float, drop_tol: float, rise_tol: float, drop_ok: bool, rise_ok: bool) -> list[str]:
    out = []
    if not drop_ok:
        out.append(f"τ dropped against the baseline: {fmt(100 * rel_change, 2, '+f')} % "
                   f"(allowed -{fmt(100 * drop_tol, 6, 'g')} %)")
    if not rise_ok:
        out.append(f"τ rose {fmt(100 * rel_change, 2, '+f')} % against the baseline (allowed "
                   f"+{fmt(100 * rise_tol, 6, 'g')} %): check the drafter for a future-token leak")
    return out



def baseline_part(cmp: BaselineCheck | None) -> Part | None:
    """The τ against ``--baseline`` (:func:`baseline_reasons`; None without a baseline)."""
    return None if cmp is None else reasons_part(BASELINE, baseline_reasons(cmp))



def vacuous_floors(prompts: Mapping[str, JudgedPrompt], means: list[Threshold]) -> str | None:
    """The notice when every floor a verdict judges (the means', every prompt's, chain and DDTree) is at most
    :data:`VACUOUS_FLOOR`: such floors judge nothing; None when one is above it, or there is none."""
    values = [t.floor for t in means] + [v.floor for v in prompts.values()] + [
        f for v in prompts.values() for f in v.ddtree_floor.values()]
    floors = [f for f in values if f is not None]
    if not floors or max(floors) > VACUOUS_FLOOR:
        return None
    return (f"every τ floor judged here is <= {VACUOUS_FLOOR:g} (the highest: {max(floors):g}): τ >= 1 for any "
            "drafter at any temperature (each round accepts at least the target's own token), so these floors pass "
            "every drafter and judge nothing; record floors (dflash-eval record) or pass a --tau-floor above 1")


def floors_part(prompts: Mapping[str, JudgedPrompt], means: list[Threshold], floors: Floors, *,
                floors_required: bool = True) -> Part:
    """A checkpoint's τ (its judged prompt rows, the mean thresholds) against its floors
    (:func:`gate_reasons`). ``floors_required`` False: judged only when there are floors (a floors file,
    ``--tau-floor`` / ``--tau-floor-prompt``), else not judged rather than failed. Floors that judge nothing
    (:func:`vacuous_floors`) are its notice."""
    if not (floors_required or bool(floors.raw) or bool(floors.explicit)):
        return Part(FLOORS, None)
    vacuous = vacuous_floors(prompts, means)
    return reasons_part(FLOORS, gate_reasons(prompts, means, prompt_floors_required=floors.prompt_floors_required),
                         (vacuous,) if vacuous else ())


def _x(v: object) -> str:
    return f"{fmt(v, 2)}x" if is_number(v) else fmt(v)


class NamedLoop(Protocol):
    """What a prediction's loop is called (:class:`~dflash_eval.metrics.speedup.LoopModel`)."""

    @property
    def name(self) -> str: ...


class SpeedupCheck(Protocol):
    """What the speed-up floor reads of the predicted speed-up (:class:`~dflash_eval.metrics.speedup.Speedup`,
    eval.json's ``speedup``): the floor, each strategy's prediction, the loops' names, where it was predicted."""

    @property
    def floor(self) -> float | None: ...
    @property
    def strategies(self) -> Mapping[str, Prediction]: ...
    @property
    def models(self) -> Mapping[str, NamedLoop]: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def context_len(self) -> int: ...


def speedup_floor_reason(block: SpeedupCheck) -> str | None:
    """Why the server-style loop's predicted chain speed-up fails ``--speedup-floor`` (``floor`` and the chain
    strategy's ``speedup``); None when it passes or no floor was given. The floor is judged like a τ floor
    (:func:`passes`: a missing or NaN speed-up fails)."""
    floor = block.floor
    if floor is None:
        return None
    chain = block.strategies["chain"] if "chain" in block.strategies else None
    value = None if chain is None else chain.speedup
    if passes(value, floor):
        return None
    lo, hi = ends(None if chain is None else chain.speedup_ci)
    loop = block.models["server"].name if "server" in block.models else "server-style loop"
    return (f"predicted chain speed-up {_x(value)} ({loop}; 95 % CI {ci_text(lo, hi, 2, unit='x', brackets=True)} "
            f"from τ's) < --speedup-floor {floor:g} on {block.device} ({block.dtype}, context {block.context_len})")


def speedup_floor_part(block: SpeedupCheck | None) -> Part | None:
    """The predicted chain speed-up against ``--speedup-floor`` (None without a prediction or a floor):
    :func:`speedup_floor_reason` fails it."""
    if block is None or block.floor is None:
        return None
    reason = speedup_floor_reason(block)
    return reasons_part(SPEEDUP_FLOOR, [reason] if reason else [])



def regression_part(regression: str | None) -> Part | None:
    """A regression across training steps (its message; None: none) fails the verdict."""
    return None if regression is None else Part(REGRESSION, False, (regression,))


def plateau_part(plateau: str | None) -> Part | None:
    """A plateau across training steps (its message; None: none) is a notice."""
    return None if plateau is None else notice(PLATEAU, plateau)


def checkpoint_verdict(prompts: Mapping[str, JudgedPrompt], means: list[Threshold], floors: Floors,
                       baseline: BaselineCheck | None, *, speedup: SpeedupCheck | None = None,
                       floors_required: bool = True) -> Verdict:
    """A checkpoint's verdict (the gate's, the training history's): its τ against its floors (:func:`floors_part`),
    against ``--baseline`` (:func:`baseline_part`) and its predicted speed-up against ``--speedup-floor``
    (:func:`speedup_floor_part`). The verdicts across training steps join it
    later (:meth:`Verdict.with_parts`: :func:`regression_part`, :func:`plateau_part`)."""
    return compose(floors_part(prompts, means, floors, floors_required=floors_required), baseline_part(baseline),
                   speedup_floor_part(speedup))


def record_verdict(passed: bool | None, reasons: list[str], regression: str | None, plateau: str | None) -> Verdict:
    """The verdict of a history record written before records kept their verdict's parts: its own verdict
    (``passed``, ``reasons``) and the verdicts across steps."""
    return compose(Part(CHECKPOINT, passed, tuple(reasons) if passed is False else ()),
                   regression_part(regression), plateau_part(plateau))


class JudgedRow(Protocol):
    """A judged row's verdict (a category's, :class:`~dflash_eval.session.rows.CategoryRow`; None: not gated)."""

    @property
    def passed(self) -> bool | None: ...


def tau_verdict(measured: bool, mean: bool | None, prompts: Mapping[str, JudgedRow],
                categories: Mapping[str, JudgedRow] | None) -> bool | None:
    """τ of a run against its floors: the mean (``mean``: eval.json's ``mean_passed``) and every gated prompt and
    category pass (None: τ was not ``measured``)."""
    if not measured:
        return None
    return bool(mean) and not any(r.passed is False for r in prompts.values()) \
        and not any(r.passed is False for r in (categories or {}).values())


