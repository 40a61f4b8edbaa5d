"""The gate's report: one :class:`GateRow` per checkpoint, made from its judged τ (:func:`gate_row`, from the typed
:class:`~dflash_eval.session.eval_result.TauSummary`), written as ``<report-dir>/gate.json`` and
``<report-dir>/gate.md`` (also appended to ``$GITHUB_STEP_SUMMARY`` when set) and printed as the gate's terminal table,
all through the one rendering layer (:mod:`dflash_eval.common.number_text`, :mod:`.tables`).

gate.json (strict JSON, NaN written as null)::

    {"schema": 1, "created": ISO time, "wall_s", "passed": bool, "settings": {... every option but --drafter ...},
     "budgets": [N, ...],
     "checkpoints": [{"drafter", "fingerprint", "mean_tau", "mean_ddtree": {N: τ} (macro means), "mean_tau_pooled",
                      "mean_ddtree_pooled": {N: τ} (pooled over every round), "mean_floor", "worst_prompt",
                      "worst_tau", "worst_floor", "passed", "reasons": [...], "baseline", "seconds",
                      "prompts": {id: {"tau", "ddtree", "floor", "passed"}}, "step", "gating",
                      "notices": [...], "reference", "speedup", "verdict": {"passed", "label", "reasons", "notices",
                      "parts": [{"name", "passed", "outcome", "reasons", "notices"}]}} | {"drafter", "passed": false,
                      "error", "seconds", "step", "gating"}]}

A checkpoint's ``passed``, ``reasons`` and ``notices`` are its ``verdict``'s (the one its history record holds,
:mod:`dflash_eval.metrics.verdict`: its floors, ``--baseline``, ``--speedup-floor``, a regression across steps, a
plateau notice, the gate's own notices).

``passed`` at the top: every gating checkpoint passed (:func:`dflash_eval.metrics.verdict.gating_pass`); a
checkpoint with ``gating`` false (an earlier checkpoint under ``gate --latest``) is reported, its failure does not
fail the gate. ``reference`` (with ``--reference-drafter``): the reference drafter's mean τ and the paired
difference against it (``mean_tau``, ``mean_diff``, ``ci95``, ``ci_method``, ``n``, ``path``); ``speedup`` (when
predicted): the chain's predicted speed-up over plain decoding on the gate's device with its CI, tokens/s, each
DDTree budget's, the best budget, the ``--speedup-floor`` and its verdict
(:func:`dflash_eval.metrics.speedup.speedup_digest`; docs/speedup.md).

gate.md: the comparison table (one row per checkpoint: the macro and the pooled τ, named as in eval.md; the paired
Δ against ``--baseline`` and against the reference drafter when given), the notices, and the prompts with the
lowest chain τ (worst first, up to 20) with every checkpoint's τ side by side.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.common.number_text import MISSING, ci_text, ends, fmt, is_number
from dflash_eval.metrics.acceptance_rates import TAU_KINDS_NOTE, pooled_means
from dflash_eval.metrics.verdict import Verdict, gating_pass
from dflash_eval.report.step_summary import append_step_summary
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.report.table_rows import ci_name
from dflash_eval.report.tables import TextTable, markdown_table

if TYPE_CHECKING:
    from dflash_eval.metrics.baseline import BaselineComparison
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.eval_result import TauSummary

__all__ = ["GATE_SCHEMA", "NOT_CHECKED", "WORST_SHOWN", "GatePrompt", "GateRow", "gate_row", "error_row",
           "gate_data", "gate_table", "worst_prompts_table", "render_gate_markdown",
           "write_gate_report"]

GATE_SCHEMA = 1
#: How many prompts gate.md's lowest-τ table shows.
WORST_SHOWN = 20


@dataclass(frozen=True)
class GatePrompt:
    """One prompt of a checkpoint in the gate: its chain τ, each DDTree budget's τ, its floor and verdict (None: not
    judged, or not known: a checkpoint judged from its history record keeps its chain τ only)."""

    tau: float
    ddtree: dict[str, float] = field(default_factory=dict)
    floor: float | None = None
    passed: bool | None = None

    def to_json(self) -> dict[str, object]:
        """The prompt as gate.json's ``checkpoints[].prompts`` entry."""
        return {"tau": self.tau, "ddtree": self.ddtree, "floor": self.floor, "passed": self.passed}


@dataclass
class GateRow:
    """One checkpoint of a gate run: its mean τ per budget against the mean floor, its lowest prompt and its verdict
    (the checkpoint's whole verdict, as its history record holds it: :attr:`passed`, :attr:`reasons`,
    :attr:`notices` are the verdict's); or (``error`` set) the error that stopped its evaluation. ``seconds``: its
    evaluation's time. ``gating`` False: reported, but its verdict does not decide the gate's (an earlier checkpoint
    under ``--latest``); ``reference``: the paired difference against ``--reference-drafter``."""

    drafter: str
    verdict: Verdict = field(default_factory=Verdict)
    step: int | None = None
    gating: bool = True
    fingerprint: str | None = None
    mean_tau: float | None = None
    mean_ddtree: dict[str, float] = field(default_factory=dict)
    mean_tau_pooled: float | None = None
    mean_ddtree_pooled: dict[str, float] = field(default_factory=dict)
    mean_floor: float | None = None
    worst_prompt: str | None = None
    worst_tau: float | None = None
    worst_floor: float | None = None
    baseline: BaselineComparison | None = None
    reference: dict[str, Any] | None = None
    speedup: dict[str, Any] | None = None  # the predicted speed-up (dflash_eval.metrics.speedup.speedup_digest)
    prompts: dict[str, GatePrompt] = field(default_factory=dict)
    error: str | None = None
    seconds: float | None = None

    @property
    def passed(self) -> bool:
        """The checkpoint passes: evaluated, and no part of its verdict failed."""
        return self.error is None and self.verdict.passed is not False

    @property
    def reasons(self) -> list[str]:
        """Why it fails: its verdict's reasons."""
        return self.verdict.reasons

    @property
    def notices(self) -> list[str]:
        """What its verdict says without failing (floors that judge nothing, a plateau, ...)."""
        return self.verdict.notices

    @property
    def name(self) -> str:
        """The checkpoint's folder or file name (how every table of the gate labels it)."""
        return Path(self.drafter).name or self.drafter

    def to_json(self) -> dict[str, Any]:
        """The row as gate.json's ``checkpoints`` entry."""
        if self.error is not None:
            return {"drafter": self.drafter, "passed": self.passed, "error": self.error, "seconds": self.seconds,
                    "step": self.step, "gating": self.gating}
        return {"drafter": self.drafter, "fingerprint": self.fingerprint, "mean_tau": self.mean_tau,
                "mean_ddtree": self.mean_ddtree, "mean_tau_pooled": self.mean_tau_pooled,
                "mean_ddtree_pooled": self.mean_ddtree_pooled, "mean_floor": self.mean_floor,
                "worst_prompt": self.worst_prompt,
                "worst_tau": self.worst_tau, "worst_floor": self.worst_floor, "passed": self.passed,
                "reasons": self.reasons, "baseline": None if self.baseline is None else self.baseline.to_json(),
                "prompts": {p: v.to_json() for p, v in self.prompts.items()},
                "seconds": self.seconds, "step": self.step, "gating": self.gating, "notices": self.notices,
                "reference": self.reference, "speedup": self.speedup, "verdict": self.verdict.to_dict()}


def gate_row(summary: TauSummary, verdict: Verdict, *, drafter: str, fingerprint: str) -> GateRow:
    """A checkpoint's row from its judged τ and its ``verdict`` (the one its history record holds): the means
    against the floors, the prompt with the lowest chain τ."""
    verdicts = summary.prompts
    worst = min(verdicts.items(), key=lambda kv: kv[1].tau) if verdicts else None
    pooled, pooled_dd = pooled_means(verdicts)
    return GateRow(
        drafter=drafter, verdict=verdict, fingerprint=fingerprint, mean_tau=summary.mean_tau,
        mean_ddtree=summary.mean_ddtree, mean_tau_pooled=pooled, mean_ddtree_pooled=pooled_dd,
        mean_floor=summary.mean_floor,
        worst_prompt=worst[0] if worst else None, worst_tau=worst[1].tau if worst else None,
        worst_floor=worst[1].floor if worst else None,
        baseline=summary.baseline,
        prompts={pid: GatePrompt(v.tau, v.ddtree, v.floor, v.passed) for pid, v in verdicts.items()})


def error_row(drafter: str, exc: BaseException) -> GateRow:
    """The row of a checkpoint whose evaluation stopped with ``exc`` (it fails the gate)."""
    return GateRow(drafter=drafter, error=f"{type(exc).__name__}: {exc}")


def _delta_cell(mean_diff: object, ci: object) -> str:
    """A paired difference with its CI: ``+0.120 [+0.050, +0.190]``."""
    return f"{fmt(mean_diff, 3, '+f')} {ci_text(*ends(ci), 3, '+f', brackets=True)}"


def _baseline_cell(b: BaselineComparison | None) -> str:
    if b is None:
        return MISSING
    d = b.diff
    return _delta_cell(d.mean, [d.ci_low, d.ci_high])


def _reference_cells(r: dict[str, Any] | None) -> list[str]:
    """The reference drafter's mean τ and the paired difference against it with its CI (the history record's
    ``reference``)."""
    if not r:
        return [MISSING, MISSING]
    return [fmt(r.get("mean_tau")), _delta_cell(r.get("mean_diff"), r.get("ci95"))]


def _speedup_cell(sp: dict[str, Any] | None) -> str:
    """``2.06x [1.78, 2.35]; DDTree-8 2.13x`` (the chain's predicted speed-up with its CI; the best strategy's)."""
    if not sp:
        return MISSING
    text = f"{fmt(sp.get('chain'), 2)}x {ci_text(*ends(sp.get('chain_ci95')), 2, brackets=True)}"
    best, bb = sp.get("best"), sp.get("best_budget")
    if best and best != "chain" and bb is not None:
        text += f"; DDTree-{bb} {fmt((sp.get('ddtree') or {}).get(str(bb)), 2)}x"
    return text


def _worst_cell(r: GateRow) -> str:
    if r.worst_prompt is None:
        return MISSING
    return f"{r.worst_prompt} ({fmt(r.worst_tau)} / {fmt(r.worst_floor)})"


def _verdict_cell(r: GateRow) -> str:
    text = f"ERROR {r.error}" if r.error is not None else "PASS" if r.passed else "FAIL: " + "; ".join(r.reasons)
    return text if r.gating else f"{text} (earlier checkpoint: reported, not gating)"


def gate_table(rows: list[GateRow], budgets: list[Any], *, terminal: bool = False) -> TextTable:
    """The comparison table, one row per checkpoint (labelled by its name, as every report of the gate labels it):
    macro mean τ, DDTree-N τ (macro), pooled chain τ, mean floor, worst prompt (τ / floor), verdict and seconds.
    ``terminal``: the terminal's form (without the mean floor and the seconds) instead of gate.md's."""
    bs = [str(b) for b in budgets]
    header = ["checkpoint", "mean τ (macro)"] + [f"DDTree-{b} τ (macro)" for b in bs] + [
        "pooled τ", "mean floor", "worst prompt (τ / floor)", "verdict", "s"]
    cells = []
    for r in rows:
        cells.append([r.name, fmt(r.mean_tau)] + [fmt(r.mean_ddtree.get(b)) for b in bs]
                     + [fmt(r.mean_tau_pooled), fmt(r.mean_floor), _worst_cell(r), _verdict_cell(r),
                        fmt(r.seconds)])
    base = [r.baseline for r in rows if r.baseline is not None]
    if base:  # the paired difference against --baseline, its CI named
        header.insert(header.index("mean floor"), f"Δ vs baseline ({ci_name(base[0].diff.ci_method)})")
        for r, row in zip(rows, cells):
            row.insert(header.index("mean floor") - 1, _baseline_cell(r.baseline))
    if any(r.speedup for r in rows):  # the predicted speed-up on the gate's device (docs/speedup.md)
        at = header.index("mean floor")
        header.insert(at, "predicted speed-up, server-style loop (chain [95 % CI]; best)")
        for r, row in zip(rows, cells):
            row.insert(at, _speedup_cell(r.speedup))
    ref = [r.reference for r in rows if r.reference]
    if ref:  # the reference drafter's τ and the paired difference against it, its CI named (as in history.md)
        at = header.index("mean floor")
        header[at:at] = ["reference τ", f"Δ vs reference ({ci_name(ref[0].get('ci_method'))})"]
        for r, row in zip(rows, cells):
            row[at:at] = _reference_cells(r.reference)
    if terminal:
        drop = {header.index("mean floor"), header.index("s")}
        header = [h for i, h in enumerate(header) if i not in drop]
        cells = [[c for i, c in enumerate(row) if i not in drop] for row in cells]
    fold = frozenset({"checkpoint", "worst prompt (τ / floor)", "verdict"})
    return TextTable(header, cells, title="dflash-eval gate" if terminal else None, left=fold, fold=fold)


def worst_prompts_table(rows: list[GateRow], limit: int = WORST_SHOWN) -> TextTable:
    """The ``limit`` prompts with the lowest chain τ over the evaluated checkpoints (worst first): the prompt's
    floor and every checkpoint's τ (`` FAIL`` below its floor)."""
    evaluated = [r for r in rows if r.error is None]
    pids = list(dict.fromkeys(p for r in evaluated for p in r.prompts))

    def low(p: str) -> float:
        vals = [r.prompts[p].tau for r in evaluated if p in r.prompts]
        return min((v for v in vals if is_number(v)), default=float("-inf"))

    def cell(v: GatePrompt | None) -> str:
        return MISSING if v is None else fmt(v.tau) + (" FAIL" if v.passed is False else "")

    cells = [[p, fmt(next((r.prompts[p].floor for r in evaluated if p in r.prompts), None))]
             + [cell(r.prompts.get(p)) for r in evaluated] for p in sorted(pids, key=low)[:limit]]
    title = f"Lowest chain τ ({len(cells)} of {len(pids)} prompts, worst first)"
    return TextTable(["prompt", "floor"] + [r.name for r in evaluated], cells, title=title)


def gate_data(rows: list[GateRow], settings: EvalSettings, *, wall_s: float | None = None) -> dict[str, Any]:
    """gate.json's content from the gate's per-checkpoint rows."""
    opts = {k: v for k, v in settings.to_dict().items() if k != "drafter"}
    return {"schema": GATE_SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "wall_s": None if wall_s is None else round(wall_s, 3), "passed": gating_pass(rows),
            "settings": opts, "budgets": list(settings.ddtree_budget), "checkpoints": [r.to_json() for r in rows]}


#: What a gate run's verdict does not vouch for: it measures τ against the floors (and the history) only.
NOT_CHECKED = ("Not checked by `dflash-eval gate` (it judges τ only): the hidden-state drift and its gate against the "
               "drift budget, the golden feature fingerprint and the reference-completion snapshots; the suite "
               "(`pytest tests_eval`, `dflash-eval run`) checks them.")


def render_gate_markdown(rows: list[GateRow], settings: dict[str, Any], budgets: list[Any]) -> str:
    """gate.md (module docstring); ``settings``: gate.json's (the target and prompts it names)."""
    ok = sum(r.passed for r in rows)
    earlier = [r for r in rows if not r.gating and not r.passed]
    status = f"{ok}/{len(rows)} checkpoint(s) passed" + (
        f" ({len(earlier)} earlier failure(s) reported, not gating: only the newest checkpoint gates)"
        if earlier else "")
    parts = ["## dflash-eval gate", "", f"{status}; target "
             f"`{settings.get('target_model')}`, prompts `{settings.get('prompts')}`", "",
             markdown_table(gate_table(rows, budgets)), "", TAU_KINDS_NOTE, "", NOT_CHECKED]
    notices = [f"- `{r.name}`: {n}" for r in rows for n in r.notices]
    if notices:
        parts += ["", "### Notices", "", *notices]
    worst = worst_prompts_table(rows)
    if worst.header[2:]:
        parts += ["", f"### {worst.title}", "", markdown_table(worst)]
    return "\n".join(parts) + "\n"


def write_gate_report(rows: list[GateRow], settings: EvalSettings, *, wall_s: float | None = None) -> dict[str, Path]:
    """Write gate.json and gate.md under ``settings.report_dir`` (atomically) and append gate.md to the step
    summary; returns their paths."""
    data = gate_data(rows, settings, wall_s=wall_s)
    out = Path(settings.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "gate.json", "md": out / "gate.md"}
    atomic_write_text(paths["json"], dumps_strict(data) + "\n")
    md = render_gate_markdown(rows, data["settings"], data["budgets"])
    atomic_write_text(paths["md"], md)
    append_step_summary(md)
    return paths
