"""The run's verdict in a few lines, printed last in the terminal's dflash-eval section (after the tables): PASS or
FAIL and why, the mean τ against its floor, the prompts with the least room above their floors, the drift gate's
outcome, the predicted speed-up on the run's device and where the reports are.

The verdict itself is composed by :func:`dflash_eval.metrics.verdict.run_verdict`: the run passes when τ passes its
floors (:func:`~dflash_eval.metrics.verdict.tau_verdict`: the mean and every gated prompt and category), the drift
gate has no failing row (:func:`~dflash_eval.metrics.verdict.gate_outcome`), the drafter was not refused and no test
failed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dflash_eval.common.number_text import fmt, is_number
from dflash_eval.metrics.near_tie import Divergence
from dflash_eval.metrics.verdict import gate_outcome, row_outcome, run_verdict, tau_verdict
from dflash_eval.report.plot import worst_prompts
from dflash_eval.report.speedup_report import verdict_line as speedup_line

__all__ = ["WORST_NAMED", "REPORT_FILES", "tau_verdict", "gate_outcome", "row_outcome", "verdict_lines",
           "not_checked_lines", "near_tie_lines"]

#: How many prompts the verdict names (those with the least room above their floors).
WORST_NAMED = 3
#: How many reasons of skipped tests the verdict names (eval.md and eval.json hold them all).
NOT_CHECKED_NAMED = 4
#: How many near ties the verdict names (eval.md and eval.json hold them all).
NEAR_TIES_NAMED = 4
#: The files of a run's report folder, in the order the verdict lists them.
REPORT_FILES = ("eval.md", "eval.json", "eval.html", "samples.jsonl", "eval.png", "drift_budget.png", "speedup.png")


def _against(value: object, floor: float | None) -> str:
    """``4.314 >= floor 4.064`` (or ``<``; ``no floor`` when there is none)."""
    if floor is None:
        return f"{fmt(value)} (no floor)"
    ok = is_number(value) and value >= floor
    return f"{fmt(value)} {'>=' if ok else '<'} floor {fmt(floor)}"


def _mean_text(data: dict[str, Any]) -> str:
    """``mean chain τ (macro) 4.314 >= floor 4.064 over 37 prompts, none below its floor`` (categories that fail
    named)."""
    prompts = data.get("prompts", {})
    below = [p for p, r in prompts.items() if r.get("passed") is False]
    cats = [c for c, r in (data.get("categories") or {}).items() if r.get("passed") is False and c != "all"]
    text = (f"mean chain τ (macro) {_against(data.get('mean_tau'), data.get('mean_floor'))} over {len(prompts)} "
            "prompts, " + ("none below its floor" if not below else "1 below its floor" if len(below) == 1 else
               f"{len(below)} below their floors"))
    return text + (f"; categories below their floors: {', '.join(sorted(cats))}" if cats else "")


def _detail_line(data: dict[str, Any]) -> str | None:
    """The DDTree means against their floors, the pooled τ and the prompts with the least room above their
    floors."""
    floors = data.get("mean_ddtree_floor") or {}
    parts = [f"mean DDTree-{b} τ (macro) {_against(v, floors.get(b))}"
             for b, v in (data.get("mean_ddtree") or {}).items()]
    if "mean_tau_pooled" in data:  # the τ SGLang's spec_accept_length and SpecForge report: not the macro one
        pooled = [f"chain {fmt(data['mean_tau_pooled'])}"] + [
            f"DDTree-{b} {fmt(v)}" for b, v in (data.get("mean_ddtree_pooled") or {}).items()]
        parts.append(f"pooled τ (accepted tokens / rounds, as SGLang's spec_accept_length) {', '.join(pooled)}")
    prompts = data.get("prompts", {})
    named = []
    for pid in worst_prompts(prompts, WORST_NAMED) if prompts else []:
        r = prompts[pid]
        floor = "" if r.get("floor") is None else f" / {fmt(r.get('floor'))}"
        named.append(f"{pid} {fmt(r.get('tau'))}{floor}" + (" FAIL" if r.get("passed") is False else ""))
    if named:
        parts.append("lowest prompts (chain τ / floor): " + ", ".join(named))
    return "; ".join(parts) or None


def _gate_line(data: dict[str, Any], outcome: str) -> str:
    """The drift gate's line; ``outcome``: :func:`gate_outcome` of ``data`` (not None: the gate ran)."""
    rows = data["drift_gate"]
    b = data.get("drift_budget") or {}
    over = [r for r in rows if row_outcome(r) != "pass"]
    budget = (">= " if b.get("lower_bound") else "") + fmt(b["budget"], 2, "e") if b.get("budget") is not None else "-"
    lo, hi = b.get("ci") or [None, None]
    ci = f" ({fmt(100 * b.get('ci_level', 0.9), 0)} % CI {fmt(lo, 2, 'e')}–{'inf' if hi is None else fmt(hi, 2, 'e')})"
    tight = min(rows, key=lambda r: math.inf if r.get("margin") is None else r["margin"])
    undecided = sum(1 for r in over if row_outcome(r) == "inconclusive")
    axis = f" {b['axis_text']}" if b.get("axis_text") else ""
    detail = (f"{len(rows) - len(over)} of {len(rows)} comparison layers pass (drift x safety "
              f"{fmt(tight['safety'], 6, 'g')} below the lower end of the drift budget {budget}{ci}{axis})"
              + (f", {undecided} inconclusive (inside the CI)" if undecided else ""))
    if tight.get("max_rel_err") is not None and tight.get("margin") is not None and tight["margin"] != math.inf:
        detail += (f"; tightest: {tight['comparison']} layer {tight['layer']}, drift "
                   f"{fmt(tight['max_rel_err'], 2, 'e')}, budget / drift {fmt(tight['margin'], 3, 'g')}x")
    return f"drift gate: {outcome.upper()}, {detail}"


def not_checked_lines(data: dict[str, Any], *, limit: int | None = NOT_CHECKED_NAMED) -> list[str]:
    """``not checked: <reason> (N tests)``, one line per reason a suite test was skipped (eval.json's
    ``not_checked``; at most ``limit`` of them, then how many more): what a pass does not vouch for, e.g. ``fla not
    checked: no CUDA device``, said where the user looks even when pytest's short summary (``-ra``) is off."""
    groups = data.get("not_checked") or []
    shown = groups if limit is None else groups[:limit]
    lines = [f"not checked: {g['reason']} ({g['tests']} test{'s' if g['tests'] != 1 else ''})" for g in shown]
    if len(groups) > len(shown):
        lines.append(f"not checked: {len(groups) - len(shown)} more reasons of skipped tests (eval.md lists them)")
    return lines


def near_tie_lines(data: dict[str, Any], *, limit: int | None = NEAR_TIES_NAMED) -> list[str]:
    """The near ties of eval.json's ``near_ties`` (not failures; the tokens after each not compared), golden
    completions first: ``near tie: <prompt> ...`` for each completion that left its golden record (at most ``limit``,
    then how many more); the completions that left their own teacher-forced argmax (the decode and the prefill path
    parting at a tie, common in bf16) one by one when few, else on one line naming the prompts."""
    ties = [Divergence.from_dict(d) for d in data.get("near_ties") or []]
    golden = [d for d in ties if d.against != "teacher-forced"]
    forced = [d for d in ties if d.against == "teacher-forced"]
    shown = golden if limit is None else golden[:limit]
    lines = [f"near tie: {d.describe()}" for d in shown]
    if len(golden) > len(shown):
        lines.append(f"near tie: {len(golden) - len(shown)} more golden completions (eval.md lists them)")
    if forced and (limit is None or len(forced) <= 2):
        lines += [f"near tie: {d.describe()}" for d in forced]
    elif forced:
        where = ", ".join(f"{d.prompt_id} token {d.position} (margin {d.margin_text})" for d in forced[:limit])
        more = f" and {len(forced) - limit} more (eval.md lists them)" if limit is not None and len(forced) > limit \
            else ""
        lines.append(f"near tie: {len(forced)} completions leave their teacher-forced argmax (the decode and the "
                     f"prefill path parting where the target's two best tokens tie in {forced[0].dtype}), not "
                     f"failures: {where}{more}")
    return lines


def _near_tie_count(data: dict[str, Any]) -> str | None:
    """``1 golden completion at a near tie, 19 teacher-forced near ties (below)`` (None when there is none)."""
    ties = data.get("near_ties") or []
    golden = sum(1 for d in ties if d.get("against") != "teacher-forced")
    forced = len(ties) - golden
    parts = ([f"{golden} golden completion{'s' if golden != 1 else ''} at a near tie"] if golden else []) + (
        [f"{forced} teacher-forced near tie{'s' if forced != 1 else ''}"] if forced else [])
    return f"{', '.join(parts)} of the target, not failures (below)" if parts else None


def verdict_lines(data: dict[str, Any], *, report_dir: Path | None, failed_tests: int = 0,
                  exitstatus: int = 0, recorded: bool = False) -> list[str]:
    """The verdict block (module docstring). Its first line says it all: ``dflash-eval: PASS`` or ``dflash-eval:
    FAIL (why)``, the mean τ against its floor and the drift gate's outcome; then the details, the named causes and
    the reports. ``failed_tests``: failed tests and errors of the whole run; ``exitstatus``: pytest's (not 0: never
    a pass); ``recorded``: this run wrote the τ floors it is judged against (--update-tau-floors), which it says."""
    tau, gate, verdict = tau_verdict(data), gate_outcome(data), run_verdict(data, failed_tests=failed_tests,
                                                                             exitstatus=exitstatus)
    why = verdict.reasons
    head = "dflash-eval: " + ("PASS" if verdict.passed else "FAIL") + (f" ({'; '.join(why)})" if why else "")
    mean = _mean_text(data) + (" (floors written by this run)" if recorded else "")
    skipped = sum(g["tests"] for g in data.get("not_checked") or [])
    summary = [mean if tau is not None else "τ not measured in this selection",
               "drift gate " + (gate.upper() if gate else "not run")]
    if skipped:
        summary.append(f"{skipped} test{'s' if skipped != 1 else ''} not checked (below)")
    ties = _near_tie_count(data)
    if ties:
        summary.append(ties)
    lines = [f"{head} — {'; '.join(summary)}"]
    detail = _detail_line(data) if tau is not None else None
    if detail:
        lines.append(detail)
    if gate is not None:
        lines.append(_gate_line(data, gate))
    speed = speedup_line(data)  # the predicted speed-up on this device, when the run measured it
    if speed:
        lines.append(speed)
    lines += near_tie_lines(data)
    lines += not_checked_lines(data)
    lines += [f"cause: {d}" for d in data.get("diagnoses", [])]
    if report_dir is not None:
        names = [n for n in REPORT_FILES if (Path(report_dir) / n).is_file()]
        if names:
            lines.append(f"reports: {report_dir}/ ({', '.join(names)}; eval.md holds every table in full)")
    return lines
