"""A checkpoint's verdict: its τ against its floors, against ``--baseline`` and its predicted speed-up against
``--speedup-floor``; the verdicts across training steps join it later.

The rule (:func:`.rules.passes`) applied to every τ of a run: a prompt passes when its chain τ and its τ for every
DDTree budget pass; the mean and each category likewise (their τ is the mean over their prompts; their floors follow
the selection, see :mod:`dflash_eval.metrics.floors`). A missing floor is a failure, never a pass, except where only
the mean is gated (``--tau-floor`` without per-prompt floors): a prompt or category without a floor is then not
judged (None). The functions that fill the judged fields work on eval.json's rows, so the same code judges a fresh
run, a merge of xdist workers and a report re-judged against rewritten floors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from dflash_eval.common.number_text import ci_text, ends, fmt, is_number
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.stats import category_table, ddtree_budgets
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
           "judge_mean", "judge_categories", "judge_run", "refused", "mean_passed", "mean_floors_pass", "JudgedPrompt",
           "gate_reasons", "BaselineCheck", "baseline_reasons", "baseline_failures", "baseline_part", "vacuous_floors",
           "floors_part",
           "speedup_floor_reason", "speedup_floor_part", "regression_part", "plateau_part", "checkpoint_verdict",
           "record_verdict", "tau_verdict"]

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


def mean_thresholds(chain: float, ddtree: Mapping[Any, float | None], floors: Floors) -> list[Threshold]:
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


def refused(data: dict[str, Any]) -> list[dict[str, str]]:
    """The architecture checks that refused the drafter, from eval.json data (``drafter.refused``; empty: none)."""
    return list((data.get("drafter") or {}).get("refused") or [])


def mean_passed(data: dict[str, Any]) -> bool:
    """The mean's verdict (eval.json's ``mean_passed``): its floors pass (:func:`mean_floors_pass`) and the drafter
    was not refused by an architecture check (:func:`refused`: a refused drafter never passes)."""
    return not refused(data) and mean_floors_pass(data)


def mean_floors_pass(data: dict[str, Any]) -> bool:
    """The mean τ against the floors recorded in eval.json data (``mean_floor``, ``mean_ddtree_floor``)."""
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

    floors = floors.select({p: r.get("category", "prompt") for p, r in data.get("prompts", {}).items()})
    judge_prompts(data.get("prompts", {}), floors)
    if "mean_tau" in data:
        judge_mean(data, floors)
    if data.get("prompts"):
        data["categories"] = category_table(data["prompts"])
        judge_categories(data["categories"], floors, ddtree_budgets(data["prompts"]))


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


def speedup_floor_reason(block: Mapping[str, Any]) -> str | None:
    """Why the server-style loop's predicted chain speed-up fails ``--speedup-floor`` (eval.json's ``speedup`` block:
    ``floor`` and ``strategies.chain.speedup``); None when it passes or no floor was given. The floor is judged like a
    τ floor (:func:`passes`: a missing or NaN speed-up fails)."""
    floor = block.get("floor")
    if floor is None:
        return None
    chain = (block.get("strategies") or {}).get("chain") or {}
    value = chain.get("speedup")
    if passes(value, floor):
        return None
    lo, hi = ends(chain.get("speedup_ci"))
    loop = ((block.get("models") or {}).get("server") or {}).get("name", "server-style loop")
    return (f"predicted chain speed-up {_x(value)} ({loop}; 95 % CI {ci_text(lo, hi, 2, unit='x', brackets=True)} "
            f"from τ's) < --speedup-floor {floor:g} on {block.get('device', '?')} ({block.get('dtype', '?')}, context "
            f"{block.get('context_len')})")


def speedup_floor_part(block: Mapping[str, Any] | None) -> Part | None:
    """The predicted chain speed-up against ``--speedup-floor`` (eval.json's ``speedup`` block; None without a
    block or a floor): :func:`speedup_floor_reason` fails it."""
    if not block or block.get("floor") is None:
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
                       baseline: BaselineCheck | None, *, speedup: Mapping[str, Any] | None = None,
                       floors_required: bool = True) -> Verdict:
    """A checkpoint's verdict (the gate's, the training history's): its τ against its floors (:func:`floors_part`),
    against ``--baseline`` (:func:`baseline_part`) and its predicted speed-up against ``--speedup-floor``
    (:func:`speedup_floor_part`, from eval.json's ``speedup`` block). The verdicts across training steps join it
    later (:meth:`Verdict.with_parts`: :func:`regression_part`, :func:`plateau_part`)."""
    return compose(floors_part(prompts, means, floors, floors_required=floors_required), baseline_part(baseline),
                   speedup_floor_part(speedup))


def record_verdict(passed: bool | None, reasons: list[str], regression: str | None, plateau: str | None) -> Verdict:
    """The verdict of a history record written before records kept their verdict's parts: its own verdict
    (``passed``, ``reasons``) and the verdicts across steps."""
    return compose(Part(CHECKPOINT, passed, tuple(reasons) if passed is False else ()),
                   regression_part(regression), plateau_part(plateau))


def tau_verdict(data: dict[str, Any]) -> bool | None:
    """τ of eval.json data against its floors: the mean and every gated prompt and category pass (None: τ was not
    measured)."""
    if "mean_tau" not in data:
        return None
    prompts = data.get("prompts", {})
    cats = data.get("categories") or {}
    return bool(data.get("mean_passed")) and not any(r.get("passed") is False for r in prompts.values()) \
        and not any(r.get("passed") is False for r in cats.values())


