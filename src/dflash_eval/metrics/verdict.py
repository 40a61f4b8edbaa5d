"""The verdict: τ against its floors. The only place a floor is judged; the τ tests, the reports and the gate CLI
all ask this module.

The rule: a τ passes its floor when the floor exists, the τ is a number (a prompt with no speculative round has
τ NaN) and τ >= floor. A prompt passes when its chain τ and its τ for every DDTree budget pass; the mean and each
category likewise (their τ is the mean over their prompts; their floors follow the selection, see
:mod:`dflash_eval.metrics.floors`). A missing floor is a failure, never a pass, except where only the mean is gated
(``--tau-floor`` without per-prompt floors): a prompt or category without a floor is then not judged (None).

The functions that fill verdicts work on eval.json's rows (plain dicts), so the same code judges a fresh run, a
merge of xdist workers and a report re-judged against rewritten floors.

The composition (the one place a verdict is assembled from its parts): :class:`Verdict` (pass / fail / unjudged
with the reasons of a failure and the notices), :func:`compose` (the parts' reasons: floors, baseline, regression),
:func:`checkpoint_verdict` (a checkpoint's τ against its floors and ``--baseline``: the gate's table and the
training history), :func:`trend_verdict` (a checkpoint across steps: a regression fails it, a plateau is a notice)
and :func:`run_verdict` (a test run: τ, the drift gate, a refused drafter, failed tests: the terminal's and eval.md's
verdict block).

Named causes (:func:`diagnoses`), each reported once instead of as many ordinary failures as it causes: a drafter
refused by an architecture check (:func:`refused`: never a pass, and a run without a failed test still fails), and
τ of about 1 on every prompt in a run that misses its floors (:func:`no_acceptance_fails`: the drafter proposes
nothing the target accepts; at most one accepted draft token per completion: :func:`no_acceptance`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from dflash_eval.common.number_text import fmt
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.stats import category_table, ddtree_budgets

if TYPE_CHECKING:
    from dflash_eval.metrics.baseline import BaselineComparison

__all__ = ["passes", "overall", "Threshold", "prompt_threshold", "prompt_thresholds", "mean_thresholds",
           "category_thresholds", "judge_prompts", "judge_mean", "judge_categories", "judge_run", "mean_passed",
           "gate_reasons", "NO_ACCEPTANCE", "NO_ACCEPTANCE_EPS", "NO_ACCEPTANCE_TOKENS", "NO_ACCEPTANCE_MAX_EXCESS",
           "no_acceptance", "no_acceptance_fails", "refused",
           "diagnoses", "Verdict", "compose", "baseline_reasons", "VACUOUS_FLOOR", "vacuous_floors",
           "checkpoint_verdict", "trend_verdict",
           "tau_verdict", "row_outcome", "gate_outcome", "run_verdict"]

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


def _rows_accept_nothing(prompts: Mapping[str, Mapping[str, Any]]) -> bool:
    """:func:`no_acceptance` of eval.json's prompt rows (their chain τ and rounds)."""
    rows = list(prompts.values())
    return no_acceptance([r.get("tau") for r in rows], [r.get("rounds") for r in rows])


def no_acceptance_fails(data: dict[str, Any]) -> bool:
    """τ 1.00 on every prompt of eval.json data (or a τ summary's) that fails its floors: the one cause of those
    failures. A run whose floors accept τ 1 (``--tau-floor 1`` for a random drafter) is not diagnosed."""
    prompts = data.get("prompts", {})
    if not _rows_accept_nothing(prompts):
        return False
    return ("mean_tau" in data and not mean_passed(data)) or any(r.get("passed") is False for r in prompts.values())


def _accepted_text(prompts: Mapping[str, Mapping[str, Any]]) -> str:
    """``": N accepted draft tokens in R rounds"`` over the prompts whose τ and rounds are known ("" when none)."""
    known = [(r["tau"], r["rounds"]) for r in prompts.values()
             if isinstance(r.get("rounds"), int) and r.get("tau") is not None and not math.isnan(r["tau"])]
    if not known:
        return ""
    accepted = sum(round((t - 1) * n) for t, n in known)
    return f": {accepted} accepted draft token{'s' if accepted != 1 else ''} in {sum(n for _, n in known)} rounds"


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
        out.append(f"{NO_ACCEPTANCE} ({len(data['prompts'])} prompts{_accepted_text(data['prompts'])})")
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


#: A τ as eval.json's rows hold it: a category may lack a budget's τ (None).
_Tau = TypeVar("_Tau", bound=float | None)


def overall(thresholds: list[Threshold]) -> bool | None:
    """All gated thresholds pass (None when none is gated)."""
    gated = [t for t in thresholds if t.gated]
    return all(t.passed for t in gated) if gated else None


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
    if reasons and _rows_accept_nothing(prompts):  # the one cause of those reasons
        reasons.insert(0, NO_ACCEPTANCE)
    return reasons


# ------------------------------------------------------------------------------------------------ composition
@dataclass(frozen=True)
class Verdict:
    """A verdict: ``passed`` (None: nothing was judged), the reasons of a failure and notices that do not fail."""

    passed: bool | None
    reasons: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``pass``, ``fail`` or ``unjudged``."""
        return "unjudged" if self.passed is None else "pass" if self.passed else "fail"


def compose(floors: list[str] | None = None, *, baseline: list[str] | None = None, regression: str | None = None,
            plateau: str | None = None) -> Verdict:
    """The verdict from its parts' reasons (a part None: not judged): fail when any part has a reason, pass when a
    part was judged without one, unjudged when none was judged. A regression fails; a plateau is a notice."""
    parts = [p for p in (floors, baseline) if p is not None]
    reasons = [r for p in parts for r in p] + ([regression] if regression else [])
    judged = bool(parts) or bool(regression)
    return Verdict(not reasons if judged else None, reasons, [plateau] if plateau else [])


def baseline_reasons(cmp: BaselineComparison | None) -> list[str]:
    """Why the τ against ``--baseline`` fails: a drop beyond the drop tolerance, a rise beyond the rise tolerance
    (empty without a baseline or when both hold)."""
    out = []
    if cmp is not None and not cmp.drop_passed:
        out.append(f"τ dropped against the baseline: {fmt(100 * cmp.rel_change, 2, '+f')} % "
                   f"(allowed -{fmt(100 * cmp.drop_tol, 6, 'g')} %)")
    if cmp is not None and not cmp.rise_passed:
        out.append(f"τ rose {fmt(100 * cmp.rel_change, 2, '+f')} % against the baseline (allowed "
                   f"+{fmt(100 * cmp.rise_tol, 6, 'g')} %): check the drafter for a future-token leak")
    return out


#: τ is never below 1 (every verification round accepts at least the target's own token, greedy or sampled): a floor
#: at or below this passes every drafter.
VACUOUS_FLOOR = 1.0


def vacuous_floors(prompts: dict[str, dict[str, Any]], means: list[Threshold]) -> str | None:
    """The notice when every floor a verdict judges (the means', every prompt's, chain and DDTree) is at most
    :data:`VACUOUS_FLOOR`: such floors judge nothing; None when one is above it, or there is none."""
    values = [t.floor for t in means] + [v.get("floor") for v in prompts.values()] + [
        f for v in prompts.values() for f in (v.get("ddtree_floor") or {}).values()]
    floors = [f for f in values if f is not None]
    if not floors or max(floors) > VACUOUS_FLOOR:
        return None
    return (f"every τ floor judged here is <= {VACUOUS_FLOOR:g} (the highest: {max(floors):g}): τ >= 1 for any "
            "drafter at any temperature (each round accepts at least the target's own token), so these floors pass "
            "every drafter and judge nothing; record floors (dflash-eval record) or pass a --tau-floor above 1")


def checkpoint_verdict(prompts: dict[str, dict[str, Any]], means: list[Threshold], floors: Floors,
                       baseline: BaselineComparison | None, *, floors_required: bool = True) -> Verdict:
    """A checkpoint's τ (judged eval.json ``prompts`` rows, the mean thresholds) against its floors
    (:func:`gate_reasons`) and its baseline comparison (:func:`baseline_reasons`). ``floors_required`` False: the
    floors are judged only when there are any (a floors file, ``--tau-floor`` / ``--tau-floor-prompt``), so a run
    with neither floors nor baseline is unjudged rather than failed. Floors that judge nothing
    (:func:`vacuous_floors`) are a notice of the verdict."""
    judged = floors_required or bool(floors.raw) or bool(floors.explicit)
    fl = gate_reasons(prompts, means, prompt_floors_required=floors.prompt_floors_required) if judged else None
    verdict = compose(fl, baseline=None if baseline is None else baseline_reasons(baseline))
    vacuous = vacuous_floors(prompts, means) if judged else None
    return replace(verdict, notices=[*verdict.notices, vacuous]) if vacuous else verdict


def trend_verdict(verdict: Verdict, regression: str | None, plateau: str | None = None) -> Verdict:
    """A checkpoint's verdict across the steps of a training run: its own, failed by a regression, a plateau
    noted."""
    trend = compose(regression=regression, plateau=plateau)
    passed = False if trend.passed is False else verdict.passed
    return Verdict(passed, verdict.reasons + trend.reasons, verdict.notices + trend.notices)


def tau_verdict(data: dict[str, Any]) -> bool | None:
    """τ of eval.json data against its floors: the mean and every gated prompt and category pass (None: τ was not
    measured)."""
    if "mean_tau" not in data:
        return None
    prompts = data.get("prompts", {})
    cats = data.get("categories") or {}
    return bool(data.get("mean_passed")) and not any(r.get("passed") is False for r in prompts.values()) \
        and not any(r.get("passed") is False for r in cats.values())


def row_outcome(row: dict[str, Any]) -> str:
    """A drift_gate row's outcome: its ``outcome`` field, else (reports from before it) pass / fail by ``passed``."""
    return row.get("outcome") or ("pass" if row.get("passed") else "fail")


def gate_outcome(data: dict[str, Any]) -> str | None:
    """The drift gate over all its rows: "fail" when one fails, else "inconclusive" when one is, else "pass"
    (None: no drift was gated in this run)."""
    rows = data.get("drift_gate") or []
    if not rows:
        return None
    outcomes = [row_outcome(r) for r in rows]
    return "fail" if "fail" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"


def run_verdict(data: dict[str, Any], *, failed_tests: int = 0, exitstatus: int = 0) -> Verdict:
    """A test run's verdict from its eval.json data: it passes when τ passes its floors (:func:`tau_verdict`), the
    drift gate has no failing row (:func:`gate_outcome`), the drafter was not refused (:func:`refused`), no plugin
    rejected the result (``rejected``: ``pytest_dflash_eval_result_ready``), no test failed (``failed_tests``) and
    pytest's ``exitstatus`` is 0; the reasons say why not."""
    tau, gate, refusal = tau_verdict(data), gate_outcome(data), refused(data)
    why = []
    if refusal:
        why.append("the drafter was refused by " + ", ".join(c["check"] for c in refusal))
    why += [f"rejected by plugin {r['plugin']!r}" for r in data.get("rejected") or []]
    if tau is False:
        why.append("τ below its floors")
    if gate == "fail":
        why.append("drift over budget")
    if failed_tests:
        why.append(f"{failed_tests} test{'s' if failed_tests > 1 else ''} failed")
    passed = not why and exitstatus == 0
    if not why and exitstatus != 0:
        why.append(f"pytest exit status {exitstatus}")
    return Verdict(passed, why)
