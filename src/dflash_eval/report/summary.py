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

from dflash_eval.common.number_text import ci_text, ends, fmt
from dflash_eval.metrics.near_tie import near_tie_count
from dflash_eval.metrics.verdict import DRIFT_GATE, FLOORS, Verdict, against
from dflash_eval.report.plot import worst_rows
from dflash_eval.report.speedup_report import verdict_line as speedup_line
from dflash_eval.session.run_result import RunResult

__all__ = ["WORST_NAMED", "REPORT_FILES", "verdict_head", "verdict_lines", "not_checked_lines"]

#: How many prompts the verdict names (those with the least room above their floors).
WORST_NAMED = 3
#: The files of a run's report folder, in the order the verdict lists them.
REPORT_FILES = ("eval.md", "eval.json", "eval.html", "samples.jsonl", "eval.png", "drift_budget.png", "speedup.png")


def _mean_text(result: RunResult) -> str:
    """``mean chain τ (macro) 4.314 >= floor 4.064 over 37 prompts, none below its floor`` (categories that fail
    named)."""
    prompts = result.prompts
    below = [p for p, r in prompts.items() if r.passed is False]
    cats = [c for c, r in (result.categories or {}).items() if r.passed is False and c != "all"]
    mean, floor = (None, None) if result.tau is None else (result.tau.mean_tau, result.tau.mean_floor)
    text = (f"mean chain τ (macro) {against(mean, floor)} over {len(prompts)} "
            "prompts, " + ("none below its floor" if not below else "1 below its floor" if len(below) == 1 else
               f"{len(below)} below their floors"))
    return text + (f"; categories below their floors: {', '.join(sorted(cats))}" if cats else "")


def _detail_line(result: RunResult) -> str | None:
    """The DDTree means against their floors, the pooled τ and the prompts with the least room above their
    floors."""
    parts = []
    tau = result.tau
    if tau is not None:
        parts = [f"mean DDTree-{b} τ (macro) {against(v, tau.mean_ddtree_floor.get(b))}"
                 for b, v in tau.mean_ddtree.items()]
        # the τ SGLang's spec_accept_length and SpecForge report: not the macro one
        pooled = [f"chain {fmt(tau.mean_tau_pooled)}"] + [f"DDTree-{b} {fmt(v)}"
                                                          for b, v in tau.mean_ddtree_pooled.items()]
        parts.append(f"pooled τ (accepted tokens / rounds, as SGLang's spec_accept_length) {', '.join(pooled)}")
    prompts = result.prompts
    named = []
    for pid in worst_rows(prompts, WORST_NAMED) if prompts else []:
        r = prompts[pid]
        floor = "" if r.floor is None else f" / {fmt(r.floor)}"
        named.append(f"{pid} {fmt(r.tau)}{floor}" + (" FAIL" if r.passed is False else ""))
    if named:
        parts.append("lowest prompts (chain τ / floor): " + ", ".join(named))
    return "; ".join(parts) or None


def _gate_line(result: RunResult, outcome: str) -> str:
    """The drift gate's line; ``outcome``: the verdict's drift gate part (the gate ran)."""
    rows = result.drift_gate or []
    b = result.drift_budget
    over = [r for r in rows if r.outcome != "pass"]
    budget = "-" if b is None or b.budget is None else ((">= " if b.lower_bound else "") + fmt(b.budget, 2, "e"))
    lo, hi = ends(None if b is None else b.ci)
    level = 0.9 if b is None else b.ci_level
    ci = f" ({fmt(100 * level, 0)} % CI {ci_text(lo, math.inf if hi is None else hi, 2, 'e')})"
    tight = min(rows, key=lambda r: math.inf if r.margin is None else r.margin)
    undecided = sum(1 for r in over if r.outcome == "inconclusive")
    axis = f" {b.axis_text}" if b is not None and b.axis_text else ""
    detail = (f"{len(rows) - len(over)} of {len(rows)} comparison layers pass (drift x safety "
              f"{fmt(tight.safety, 6, 'g')} below the lower end of the drift budget {budget}{ci}{axis})"
              + (f", {undecided} inconclusive (inside the CI)" if undecided else ""))
    if tight.max_rel_err is not None and tight.margin is not None and tight.margin != math.inf:
        detail += (f"; tightest: {tight.comparison} layer {tight.layer}, drift "
                   f"{fmt(tight.max_rel_err, 2, 'e')}, budget / drift {fmt(tight.margin, 3, 'g')}x")
    return f"drift gate: {outcome.upper()}, {detail}"


def not_checked_lines(result: RunResult) -> list[str]:
    """``not checked: <reason> (N tests)``, one line for every reason a suite test was skipped (eval.json's
    ``not_checked``): what a pass does not vouch for, e.g. ``fla not checked: no CUDA device``, said where the user
    looks even when pytest's short summary (``-ra``) is off. Every reason, however many: each is something the run
    did not check."""
    return [f"not checked: {g.reason} ({g.tests} test{'s' if g.tests != 1 else ''})" for g in result.not_checked or []]


def verdict_head(result: RunResult, *, recorded: bool = False, verdict: Verdict | None = None) -> list[str]:
    """The verdict itself (``verdict``; default: the one the result holds): its first line says it all,
    ``dflash-eval: PASS`` or ``dflash-eval: FAIL (why)``, the mean τ against its floor and the drift gate's outcome;
    then the details (DDTree and pooled τ, the lowest prompts, the drift gate, the predicted speed-up) and the
    verdict's notices. ``recorded``: this run wrote the τ floors it is judged against (--update-tau-floors), which it
    says."""
    verdict = verdict if verdict is not None else result.final_verdict()
    tau, gate = verdict.outcome(FLOORS), verdict.outcome(DRIFT_GATE)
    why = verdict.reasons
    head = "dflash-eval: " + ("PASS" if verdict.passed else "FAIL") + (f" ({'; '.join(why)})" if why else "")
    mean = _mean_text(result) + (" (floors written by this run)" if recorded else "")
    skipped = sum(g.tests for g in result.not_checked or [])
    summary = [mean if result.tau is not None else "τ not measured in this selection",
               "drift gate " + (gate.upper() if gate else "not run")]
    if skipped:
        summary.append(f"{skipped} test{'s' if skipped != 1 else ''} not checked (below)")
    ties = near_tie_count(result.near_ties or [])
    if ties:
        summary.append(f"{ties} of the target, not failures (below)")
    lines = [f"{head} — {'; '.join(summary)}"]
    detail = _detail_line(result) if tau is not None else None
    if detail:
        lines.append(detail)
    if gate is not None and result.drift_gate:
        lines.append(_gate_line(result, gate))
    speed = speedup_line(result.speedup, verdict)  # the predicted speed-up on this device, when the run measured it
    if speed:
        lines.append(speed)
    return lines + [f"notice: {n}" for n in verdict.notices]


def verdict_lines(result: RunResult, *, report_dir: Path | None, recorded: bool = False,
                  verdict: Verdict | None = None) -> list[str]:
    """The verdict block (module docstring): :func:`verdict_head`, then what was not checked, the named causes and the
    reports (``report_dir`` None: no line for them)."""
    lines = verdict_head(result, recorded=recorded, verdict=verdict)
    lines += not_checked_lines(result)
    lines += [f"cause: {d}" for d in result.diagnoses or []]
    if report_dir is not None:
        names = [n for n in REPORT_FILES if (Path(report_dir) / n).is_file()]
        if names:
            lines.append(f"reports: {report_dir}/ ({', '.join(names)}; eval.md holds every table in full)")
    return lines
