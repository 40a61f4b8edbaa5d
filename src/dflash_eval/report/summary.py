"""The run's verdict in a few lines, printed last in the terminal's dflash-eval section (after the tables) and at the
top of eval.md and eval.html: PASS or FAIL and why, the mean τ against its floor, the prompts with the least room
above their floors, the drift gate's outcome, the predicted speed-up on the run's device, the verdict's notices,
every reason a test was skipped and where the reports are.

The verdict itself is the one eval.json holds (``verdict``: :func:`dflash_eval.metrics.verdict.stored_verdict`),
composed once when the run ended by :func:`dflash_eval.metrics.verdict.run_verdict`: the run passes when τ passes its
floors and its ``--baseline``, the drift gate has no failing row, the predicted speed-up passes ``--speedup-floor``,
the drafter was not refused, no plugin rejected the result and no test failed. These lines show it whole (every
reason, every notice); they never judge a part again.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dflash_eval.common.number_text import ci_text, fmt
from dflash_eval.metrics.near_tie import near_tie_count
from dflash_eval.metrics.verdict import DRIFT_GATE, FLOORS, Verdict, against, row_outcome, stored_verdict
from dflash_eval.report.plot import worst_prompts
from dflash_eval.report.speedup_report import verdict_line as speedup_line

__all__ = ["WORST_NAMED", "REPORT_FILES", "verdict_head", "verdict_lines", "not_checked_lines"]

#: How many prompts the verdict names (those with the least room above their floors).
WORST_NAMED = 3
#: The files of a run's report folder, in the order the verdict lists them.
REPORT_FILES = ("eval.md", "eval.json", "eval.html", "samples.jsonl", "eval.png", "drift_budget.png", "speedup.png")


def _mean_text(data: dict[str, Any]) -> str:
    """``mean chain τ (macro) 4.314 >= floor 4.064 over 37 prompts, none below its floor`` (categories that fail
    named)."""
    prompts = data.get("prompts", {})
    below = [p for p, r in prompts.items() if r.get("passed") is False]
    cats = [c for c, r in (data.get("categories") or {}).items() if r.get("passed") is False and c != "all"]
    text = (f"mean chain τ (macro) {against(data.get('mean_tau'), data.get('mean_floor'))} over {len(prompts)} "
            "prompts, " + ("none below its floor" if not below else "1 below its floor" if len(below) == 1 else
               f"{len(below)} below their floors"))
    return text + (f"; categories below their floors: {', '.join(sorted(cats))}" if cats else "")


def _detail_line(data: dict[str, Any]) -> str | None:
    """The DDTree means against their floors, the pooled τ and the prompts with the least room above their
    floors."""
    floors = data.get("mean_ddtree_floor") or {}
    parts = [f"mean DDTree-{b} τ (macro) {against(v, floors.get(b))}"
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
    """The drift gate's line; ``outcome``: the verdict's drift gate part (the gate ran)."""
    rows = data["drift_gate"]
    b = data.get("drift_budget") or {}
    over = [r for r in rows if row_outcome(r) != "pass"]
    budget = (">= " if b.get("lower_bound") else "") + fmt(b["budget"], 2, "e") if b.get("budget") is not None else "-"
    lo, hi = b.get("ci") or [None, None]
    ci = f" ({fmt(100 * b.get('ci_level', 0.9), 0)} % CI {ci_text(lo, math.inf if hi is None else hi, 2, 'e')})"
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


def not_checked_lines(data: dict[str, Any]) -> list[str]:
    """``not checked: <reason> (N tests)``, one line for every reason a suite test was skipped (eval.json's
    ``not_checked``): what a pass does not vouch for, e.g. ``fla not checked: no CUDA device``, said where the user
    looks even when pytest's short summary (``-ra``) is off. Every reason, however many: each is something the run
    did not check."""
    return [f"not checked: {g['reason']} ({g['tests']} test{'s' if g['tests'] != 1 else ''})"
            for g in data.get("not_checked") or []]


def verdict_head(data: dict[str, Any], *, recorded: bool = False, verdict: Verdict | None = None) -> list[str]:
    """The verdict itself (``verdict``; default: the one eval.json ``data`` holds): its first line says it all,
    ``dflash-eval: PASS`` or ``dflash-eval: FAIL (why)``, the mean τ against its floor and the drift gate's outcome;
    then the details (DDTree and pooled τ, the lowest prompts, the drift gate, the predicted speed-up) and the
    verdict's notices. ``recorded``: this run wrote the τ floors it is judged against (--update-tau-floors), which it
    says."""
    verdict = verdict if verdict is not None else stored_verdict(data)
    tau, gate = verdict.outcome(FLOORS), verdict.outcome(DRIFT_GATE)
    why = verdict.reasons
    head = "dflash-eval: " + ("PASS" if verdict.passed else "FAIL") + (f" ({'; '.join(why)})" if why else "")
    mean = _mean_text(data) + (" (floors written by this run)" if recorded else "")
    skipped = sum(g["tests"] for g in data.get("not_checked") or [])
    summary = [mean if "mean_tau" in data else "τ not measured in this selection",
               "drift gate " + (gate.upper() if gate else "not run")]
    if skipped:
        summary.append(f"{skipped} test{'s' if skipped != 1 else ''} not checked (below)")
    ties = near_tie_count(data.get("near_ties") or [])
    if ties:
        summary.append(f"{ties} of the target, not failures (below)")
    lines = [f"{head} — {'; '.join(summary)}"]
    detail = _detail_line(data) if tau is not None else None
    if detail:
        lines.append(detail)
    if gate is not None:
        lines.append(_gate_line(data, gate))
    speed = speedup_line(data, verdict)  # the predicted speed-up on this device, when the run measured it
    if speed:
        lines.append(speed)
    return lines + [f"notice: {n}" for n in verdict.notices]


def verdict_lines(data: dict[str, Any], *, report_dir: Path | None, recorded: bool = False,
                  verdict: Verdict | None = None) -> list[str]:
    """The verdict block (module docstring): :func:`verdict_head`, then what was not checked, the named causes and the
    reports (``report_dir`` None: no line for them)."""
    lines = verdict_head(data, recorded=recorded, verdict=verdict)
    lines += not_checked_lines(data)
    lines += [f"cause: {d}" for d in data.get("diagnoses", [])]
    if report_dir is not None:
        names = [n for n in REPORT_FILES if (Path(report_dir) / n).is_file()]
        if names:
            lines.append(f"reports: {report_dir}/ ({', '.join(names)}; eval.md holds every table in full)")
    return lines
