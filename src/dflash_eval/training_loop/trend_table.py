"""The markdown trend table of a history: one row per checkpoint in step order (step, drafter, mean chain τ (macro)
with its 95 % CI, each DDTree budget's τ (macro), the pooled chain τ, the reference drafter's τ and the paired
difference against it, the drift budget, the verdict and its notices), written as ``history.md`` beside
``history.jsonl``; the CIs' methods in the headers, the two τ named under the table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.common.number_text import MISSING, ci_text, ends, fmt
from dflash_eval.metrics.acceptance_rates import TAU_KINDS_NOTE
from dflash_eval.report.tables import TextTable, markdown_table
from dflash_eval.training_loop.history import CheckpointRecord
from dflash_eval.training_loop.trend import step_order

__all__ = ["trend_table", "trend_rows", "write_trend_table"]


def _ci(ci: Sequence[float] | None) -> str:
    return ci_text(*ends(ci), 2, brackets=True) if ci else MISSING


def _method(methods: set[str | None], older: str) -> str:
    """One method for a column's header (``older`` for records that did not record it), or ``per record``."""
    named = {m or older for m in methods}
    return named.pop() if len(named) == 1 else "methods differ between records"


def trend_rows(records: Sequence[CheckpointRecord]) -> TextTable:
    """The table of ``records`` in step order (the report's one table type and number formatter); the last column
    holds each checkpoint's verdict's reasons and notices."""
    rows = step_order(records)
    budgets = sorted({b for r in rows for b in r.mean_ddtree}, key=int)
    has_ref = any(r.reference for r in rows)
    ci = _method({r.ci_method for r in rows}, "percentile bootstrap")
    head = ["step", "drafter", "mean τ (macro)", f"95 % CI ({ci})", *[f"DDTree-{b} τ (macro)" for b in budgets],
            "pooled τ"]
    paired = _method({(r.reference or {}).get("ci_method") for r in rows if r.reference}, "percentile bootstrap")
    head += ["reference τ", f"Δ vs reference (95 % CI, {paired})"] if has_ref else []
    head += ["drift budget", "verdict", "notes"]
    cells = []
    for r in rows:
        row = [fmt(r.step, 0) if r.step is not None else MISSING, f"`{Path(r.drafter).name or r.drafter}`",
               fmt(r.mean_tau), _ci(r.mean_tau_ci95), *[fmt(r.mean_ddtree.get(b)) for b in budgets],
               fmt(r.mean_tau_pooled)]
        if has_ref:
            ref = r.reference or {}
            row += [fmt(ref.get("mean_tau")),
                    f"{fmt(ref.get('mean_diff'), 3, '+f')} {_ci(ref.get('ci95'))}" if ref else MISSING]
        verdict = r.judgement  # the checkpoint's whole verdict: its reasons and notices, as its record holds them
        notes = "; ".join([*verdict.reasons, *verdict.notices]).replace("\n", " ")
        row += [fmt(r.drift_budget, 3, "g"), verdict.label.upper(), notes or MISSING]
        cells.append(row)
    return TextTable(head, cells)


def trend_table(records: Sequence[CheckpointRecord]) -> str:
    """The table (markdown) of ``records`` in step order (:func:`trend_rows`)."""
    return markdown_table(trend_rows(records)) + "\n"


def write_trend_table(records: Sequence[CheckpointRecord], path: Path) -> Path:
    """``path`` (markdown, atomically): a title, the settings digests covered, the table."""
    digests = sorted({r.settings_digest for r in records})
    text = (f"# τ over training steps\n\n{len(records)} checkpoint(s); settings digest "
            f"{', '.join(f'`{d}`' for d in digests)} (records of one digest are compared).\n\n" + trend_table(records)
            + f"\n{TAU_KINDS_NOTE}\n")
    atomic_write_text(path, text)
    return path
