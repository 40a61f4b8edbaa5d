"""The markdown trend table of a history: one row per checkpoint in step order (step, drafter, mean chain τ with
its 95 % CI, each DDTree budget's τ, the reference drafter's τ and the paired difference against it, the drift
budget, the verdict and its notices), written as ``history.md`` beside ``history.jsonl``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.training_loop.history import CheckpointRecord
from dflash_eval.training_loop.trend import step_order

__all__ = ["trend_table", "write_trend_table"]


def _f(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ci(ci: Sequence[float] | None) -> str:
    return f"[{_f(ci[0], '.2f')}, {_f(ci[1], '.2f')}]" if ci else "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def trend_table(records: Sequence[CheckpointRecord]) -> str:
    """The table (markdown) of ``records`` in step order; the last column holds the reasons and notices."""
    rows = step_order(records)
    budgets = sorted({b for r in rows for b in r.mean_ddtree}, key=int)
    has_ref = any(r.reference for r in rows)
    head = ["step", "drafter", "mean τ", "95% CI", *[f"DDTree-{b} τ" for b in budgets]]
    head += ["reference τ", "Δ vs reference (95% CI)"] if has_ref else []
    head += ["drift budget", "verdict", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [_f(r.step, "d") if r.step is not None else "-", f"`{Path(r.drafter).name or r.drafter}`",
                 _f(r.mean_tau), _ci(r.mean_tau_ci95), *[_f(r.mean_ddtree.get(b)) for b in budgets]]
        if has_ref:
            ref = r.reference or {}
            cells += [_f(ref.get("mean_tau")),
                      f"{_f(ref.get('mean_diff'), '+.3f')} {_ci(ref.get('ci95'))}" if ref else "-"]
        notes = [*r.reasons, *(x for x in (r.regression, r.plateau) if x)]
        cells += [_f(r.drift_budget, ".3g"), r.verdict.upper(), _cell("; ".join(notes)) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_trend_table(records: Sequence[CheckpointRecord], path: Path) -> Path:
    """``path`` (markdown, atomically): a title, the settings digests covered, the table."""
    digests = sorted({r.settings_digest for r in records})
    text = (f"# τ over training steps\n\n{len(records)} checkpoint(s); settings digest "
            f"{', '.join(f'`{d}`' for d in digests)} (records of one digest are compared).\n\n" + trend_table(records))
    atomic_write_text(path, text)
    return path
