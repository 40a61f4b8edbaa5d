"""The verdict: τ against its floors and every other gate part, composed into one object. The only place a floor or
another part is judged; the τ tests, the reports, the gate CLI and the training history all ask this module.

The rule: a τ passes its floor when the floor exists, the τ is a number (a prompt with no speculative round has
τ NaN) and τ >= floor. A prompt passes when its chain τ and its τ for every DDTree budget pass; the mean and each
category likewise (their τ is the mean over their prompts; their floors follow the selection, see
:mod:`dflash_eval.metrics.floors`). A missing floor is a failure, never a pass, except where only the mean is gated
(``--tau-floor`` without per-prompt floors): a prompt or category without a floor is then not judged (None).

The functions that fill verdicts work on eval.json's rows (plain dicts), so the same code judges a fresh run, a
merge of xdist workers and a report re-judged against rewritten floors.

The composition (the one place a verdict is assembled, and the one place each of its parts is decided): a
:class:`Verdict` is a list of :class:`Part` (a name, pass / fail / not judged, the reasons of a failure, the notices
that do not fail, an outcome in a word where pass or fail does not say it all), and :func:`compose` makes one of
them. Each part is decided here: the floors (:func:`floors_part`, floors that judge nothing a notice), ``--baseline``
(:func:`baseline_part`: :func:`drop_holds`, :func:`rise_holds`), ``--speedup-floor`` (:func:`speedup_floor_part`),
the drift gate (:func:`drift_outcome` per comparison and layer, :func:`gate_outcome` over them), the verdicts across
training steps (:func:`regressed` and :func:`regression_part`, :func:`gained` and the plateau notice
:func:`plateau_part`), a drafter refused by an architecture check, a result rejected by a plugin, failed tests. Two
verdicts are composed from them: a checkpoint's (:func:`checkpoint_verdict`, then the steps' parts: the gate's
table, gate.json, the training history and its trackers) and a test run's (:func:`run_verdict`, from eval.json's
data: :data:`RUN_PARTS`; stored in eval.json's ``verdict`` and read back by :func:`stored_verdict`: the terminal,
eval.md, eval.html, the junit properties). Every writer shows a verdict's reasons and notices whole, so a new part
(one more function in :data:`RUN_PARTS`, one more :class:`Part` in a checkpoint's verdict) reaches every report
without touching a writer.

Named causes (:func:`diagnoses`), each reported once instead of as many ordinary failures as it causes: a drafter
refused by an architecture check (:func:`refused`: never a pass, and a run without a failed test still fails), and
τ of about 1 on every prompt in a run that misses its floors (:func:`no_acceptance_fails`: the drafter proposes
nothing the target accepts; at most one accepted draft token per completion: :func:`no_acceptance`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from dflash_eval.common.number_text import fmt, is_number
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.near_tie import near_tie_notices
from dflash_eval.metrics.stats import category_table, ddtree_budgets

__all__ = ["passes", "overall", "Threshold", "prompt_threshold", "prompt_thresholds", "mean_thresholds",
           "category_thresholds", "judge_prompts", "judge_mean", "judge_categories", "judge_run", "mean_passed",
           "gate_reasons", "NO_ACCEPTANCE", "NO_ACCEPTANCE_EPS", "NO_ACCEPTANCE_TOKENS", "NO_ACCEPTANCE_MAX_EXCESS",
           "no_acceptance", "no_acceptance_fails", "refused", "diagnoses", "JudgedPrompt",
           "FLOORS", "BASELINE", "SPEEDUP_FLOOR", "REGRESSION", "PLATEAU", "DRIFT_GATE", "REFUSAL", "PLUGINS", "TESTS",
           "NEAR_TIES", "KERNELS",
           "EXIT_STATUS", "REPORTS", "CHECKPOINT", "Part", "Verdict", "compose", "notice",
           "BaselineCheck", "baseline_reasons", "drop_holds", "rise_holds", "baseline_part",
           "VACUOUS_FLOOR", "vacuous_floors", "floors_part", "speedup_floor_reason", "speedup_floor_part",
           "regressed", "gained", "regression_part", "plateau_part", "checkpoint_verdict", "record_verdict",
           "tau_verdict", "PASS", "FAIL", "INCONCLUSIVE", "drift_outcome", "row_outcome", "gate_outcome",
           "RunPart", "RUN_PARTS", "run_verdict", "reports_part", "stored_verdict"]

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


# ------------------------------------------------------------------------------------------------ composition
#: The parts a verdict is composed of, by name (another part is one more name: :class:`Part` takes any).
FLOORS, BASELINE, SPEEDUP_FLOOR, REGRESSION, PLATEAU = "floors", "baseline", "speedup_floor", "regression", "plateau"
DRIFT_GATE, REFUSAL, PLUGINS, TESTS, EXIT_STATUS, REPORTS = ("drift_gate", "refusal", "plugins", "tests", "exit_status",
                                                             "reports")
#: The run's completions that left their golden record or their teacher-forced argmax at a near tie of the target
#: (:mod:`dflash_eval.metrics.near_tie`): a part that only notices.
NEAR_TIES = "near_ties"
#: The target's kernels give other output than the cache's entries were made with (eval.json's
#: ``provenance.kernel_probe.changed``: the kernel probe's or the witness's evidence): a part that only notices, the one
#: cause of whatever the live kernels fail.
KERNELS = "kernels"
#: The one part of a history record written before records kept their verdict's parts: its own verdict (the floors,
#: the baseline and the speed-up floor together).
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Part:
    """One part of a verdict: what was judged (``name``: :data:`FLOORS`, :data:`DRIFT_GATE`, ... or any other),
    whether it passed (None: not judged, or a part that only notices), why it fails (``reasons``), what it says
    without failing (``notices``), and, where pass or fail does not say it all, its ``outcome`` in a word (the drift
    gate's ``inconclusive``)."""

    name: str
    passed: bool | None
    reasons: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    outcome: str | None = None

    @property
    def label(self) -> str:
        """The outcome's word: ``outcome`` when given, else ``pass``, ``fail`` or ``unjudged``."""
        return self.outcome or _label(self.passed)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "outcome": self.label, "reasons": list(self.reasons),
                "notices": list(self.notices)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Part:
        passed = d.get("passed")
        outcome = d.get("outcome")
        return cls(str(d["name"]), passed, tuple(d.get("reasons") or ()), tuple(d.get("notices") or ()),
                   None if outcome == _label(passed) else outcome)


def _label(passed: bool | None) -> str:
    return "unjudged" if passed is None else "pass" if passed else "fail"


@dataclass(frozen=True)
class Verdict:
    """A verdict: its parts, in the order they were judged. It fails when a part fails, passes when a part was
    judged and none fails, and is unjudged (``passed`` None) when no part was judged. Its reasons and notices are its
    parts', in order: a writer shows them whole, whatever the parts are."""

    parts: tuple[Part, ...] = ()

    @property
    def passed(self) -> bool | None:
        judged = [p.passed for p in self.parts if p.passed is not None]
        return None if not judged else all(judged)

    @property
    def reasons(self) -> list[str]:
        """Why it fails: every failing part's reasons."""
        return [r for p in self.parts if p.passed is False for r in p.reasons]

    @property
    def notices(self) -> list[str]:
        """What it says without failing: every part's notices."""
        return [n for p in self.parts for n in p.notices]

    @property
    def label(self) -> str:
        """``pass``, ``fail`` or ``unjudged``."""
        return _label(self.passed)

    def part(self, name: str) -> Part | None:
        """The part called ``name`` (None: not part of this verdict)."""
        return next((p for p in self.parts if p.name == name), None)

    def outcome(self, name: str) -> str | None:
        """The label of the part called ``name`` (None: not part of this verdict)."""
        part = self.part(name)
        return None if part is None else part.label

    def with_parts(self, *parts: Part | None) -> Verdict:
        """This verdict with more parts (:func:`compose`)."""
        return compose(*self.parts, *parts)

    def to_dict(self) -> dict[str, Any]:
        """As eval.json and the history hold it: the outcome, its reasons and notices, and the parts."""
        return {"passed": self.passed, "label": self.label, "reasons": self.reasons, "notices": self.notices,
                "parts": [p.to_dict() for p in self.parts]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        return cls(tuple(Part.from_dict(p) for p in d.get("parts") or ()))


def compose(*parts: Part | None) -> Verdict:
    """The one verdict of its parts (None: a part that does not apply, left out), in their order."""
    return Verdict(tuple(p for p in parts if p is not None))


def notice(name: str, *notices: str) -> Part:
    """A part that only says something: it neither fails nor passes a verdict."""
    return Part(name, None, notices=tuple(notices))


def _reasons_part(name: str, reasons: list[str] | None, notices: tuple[str, ...] = ()) -> Part:
    """A part judged by its reasons (None: not judged): it fails when there is one."""
    return Part(name, None if reasons is None else not reasons, tuple(reasons or ()), notices)


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
    return _baseline_reasons(cmp.rel_change, cmp.drop_tol, cmp.rise_tol, cmp.drop_passed, cmp.rise_passed)


def _baseline_reasons(rel_change: float, drop_tol: float, rise_tol: float, drop_ok: bool, rise_ok: bool) -> list[str]:
    out = []
    if not drop_ok:
        out.append(f"τ dropped against the baseline: {fmt(100 * rel_change, 2, '+f')} % "
                   f"(allowed -{fmt(100 * drop_tol, 6, 'g')} %)")
    if not rise_ok:
        out.append(f"τ rose {fmt(100 * rel_change, 2, '+f')} % against the baseline (allowed "
                   f"+{fmt(100 * rise_tol, 6, 'g')} %): check the drafter for a future-token leak")
    return out


def drop_holds(n: int, rel_change: float, tol: float) -> bool:
    """τ did not drop against the baseline by more than ``tol`` (a relative change; no paired prompt, or NaN: it
    does not hold)."""
    return n > 0 and not math.isnan(rel_change) and rel_change >= -tol


def rise_holds(n: int, rel_change: float, tol: float) -> bool:
    """τ did not rise against the baseline by more than ``tol`` (as :func:`drop_holds`)."""
    return n > 0 and not math.isnan(rel_change) and rel_change <= tol


def baseline_part(cmp: BaselineCheck | None) -> Part | None:
    """The τ against ``--baseline`` (:func:`baseline_reasons`; None without a baseline)."""
    return None if cmp is None else _reasons_part(BASELINE, baseline_reasons(cmp))


#: τ is never below 1 (every verification round accepts at least the target's own token, greedy or sampled): a floor
#: at or below this passes every drafter.
VACUOUS_FLOOR = 1.0


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
    return _reasons_part(FLOORS, gate_reasons(prompts, means, prompt_floors_required=floors.prompt_floors_required),
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
    lo, hi = (chain.get("speedup_ci") or [None, None])[:2]
    loop = ((block.get("models") or {}).get("server") or {}).get("name", "server-style loop")
    return (f"predicted chain speed-up {_x(value)} ({loop}; 95 % CI [{_x(lo)}, {_x(hi)}] from τ's) < --speedup-floor "
            f"{floor:g} on {block.get('device', '?')} ({block.get('dtype', '?')}, context {block.get('context_len')})")


def speedup_floor_part(block: Mapping[str, Any] | None) -> Part | None:
    """The predicted chain speed-up against ``--speedup-floor`` (eval.json's ``speedup`` block; None without a
    block or a floor): :func:`speedup_floor_reason` fails it."""
    if not block or block.get("floor") is None:
        return None
    reason = speedup_floor_reason(block)
    return _reasons_part(SPEEDUP_FLOOR, [reason] if reason else [])


def regressed(upper: float | None) -> bool:
    """The regression rule across training steps: the one-sided upper limit of Δ against the run's recent level is
    below 0 (None: not judged)."""
    return upper is not None and upper < 0


def gained(gain: float, limit: float) -> bool:
    """A checkpoint gained beyond the noise between checkpoints (no plateau): its gain is above the limit."""
    return gain > limit


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


PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


def drift_outcome(scaled: float, low: float, high: float, estimate: float, *, conclusive: bool = False) -> str:
    """The drift gate's rule for one comparison and layer: the drift x the safety factor (``scaled``) passes at or
    below the budget CI's lower end ``low``, fails above its upper end ``high``, and is ``inconclusive`` in between
    (``conclusive``: pass / fail against the point ``estimate`` instead)."""
    if scaled <= low:
        return PASS
    if scaled > high:
        return FAIL
    if conclusive:
        return PASS if scaled <= estimate else FAIL
    return INCONCLUSIVE


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
    return FAIL if FAIL in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else PASS


#: A part of a test run's verdict, from eval.json's data (None: the part does not apply to this run). A new part is
#: one more function in :data:`RUN_PARTS`: every writer shows its reasons and notices.
RunPart = Callable[[dict[str, Any]], Part | None]


def _refusal(data: dict[str, Any]) -> Part | None:
    checks = refused(data)
    return None if not checks else Part(REFUSAL, False, (
        "the drafter was refused by " + ", ".join(c["check"] for c in checks),))


def _plugins(data: dict[str, Any]) -> Part | None:
    rejected = data.get("rejected") or []
    return None if not rejected else Part(PLUGINS, False, tuple(f"rejected by plugin {r['plugin']!r}"
                                                                for r in rejected))


def _baseline(data: dict[str, Any]) -> Part | None:
    b = data.get("baseline")
    if not isinstance(b, dict) or "drop_passed" not in b:
        return None
    rel = b.get("rel_change")
    return _reasons_part(BASELINE, _baseline_reasons(math.nan if rel is None else rel, b.get("drop_tol", math.nan),
                                                     b.get("rise_tol", math.nan), bool(b["drop_passed"]),
                                                     bool(b.get("rise_passed"))))


def _tau(data: dict[str, Any]) -> Part | None:
    tau = tau_verdict(data)
    return None if tau is None else Part(FLOORS, tau, () if tau else ("τ below its floors",))


def _drift_gate(data: dict[str, Any]) -> Part | None:
    gate = gate_outcome(data)
    return None if gate is None else Part(DRIFT_GATE, gate != FAIL, ("drift over budget",) if gate == FAIL else (),
                                          outcome=gate)


def _speedup(data: dict[str, Any]) -> Part | None:
    return speedup_floor_part(data.get("speedup"))


def _kernels(data: dict[str, Any]) -> Part | None:
    changed = ((data.get("provenance") or {}).get("kernel_probe") or {}).get("changed") or []
    if not changed:
        return None
    seen = ", ".join(dict.fromkeys(f"{c.get('label', '?')} ({', '.join(c.get('kinds') or ['?'])})" for c in changed))
    return notice(KERNELS, f"the target's kernels changed since the cache was made: {seen}, named below; nothing "
                           "they made was used as cached (completions, teacher-forced argmax, features, τ, ...): all "
                           "of it was made again with the live kernels, as on an empty cache, and this run's results "
                           "and failures are theirs")


def _near_ties(data: dict[str, Any]) -> Part | None:
    lines = near_tie_notices(data.get("near_ties") or [])
    return notice(NEAR_TIES, *lines) if lines else None


#: The parts of a test run's verdict read from its eval.json data, in the order its reasons are given.
RUN_PARTS: list[RunPart] = [_kernels, _refusal, _plugins, _tau, _baseline, _drift_gate, _speedup, _near_ties]


def run_verdict(data: dict[str, Any], *, failed_tests: int = 0, exitstatus: int = 0) -> Verdict:
    """A test run's verdict from its eval.json data: it passes when τ passes its floors (:func:`tau_verdict`) and its
    ``--baseline``, the drift gate has no failing row (:func:`gate_outcome`), the predicted speed-up passes
    ``--speedup-floor``, the
    drafter was not refused (:func:`refused`), no plugin rejected the result (``rejected``:
    ``pytest_dflash_eval_result_ready``) (:data:`RUN_PARTS`), no test failed (``failed_tests``) and pytest's
    ``exitstatus`` is 0; the reasons say why not."""
    parts = [part(data) for part in RUN_PARTS]
    tests = Part(TESTS, not failed_tests, (f"{failed_tests} test{'s' if failed_tests > 1 else ''} failed",)
                 if failed_tests else ())
    verdict = compose(*parts, tests)
    if exitstatus != 0 and verdict.passed is not False:
        verdict = verdict.with_parts(Part(EXIT_STATUS, False, (f"pytest exit status {exitstatus}",)))
    return verdict


def reports_part() -> Part:
    """The run's reports could not be written (the message naming the file and the cause is printed once, beside
    the verdict): the run fails."""
    return Part(REPORTS, False, ("the reports could not be written (above)",))


def stored_verdict(data: dict[str, Any]) -> Verdict:
    """The verdict eval.json ``data`` holds (``verdict``, composed by :func:`run_verdict` when the run ended); data of
    an earlier version, without one, is judged now from the suite tests' outcomes it holds."""
    if isinstance(data.get("verdict"), dict):
        return Verdict.from_dict(data["verdict"])
    counts = (data.get("tests") or {}).get("counts") or {}
    return run_verdict(data, failed_tests=int(counts.get("failed", 0)) + int(counts.get("error", 0)))
