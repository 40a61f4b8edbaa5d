"""The rows of the measurements registered by plugins (eval.json's ``measurements``: ``{name: {"summary": {...},
"rows": [[label, value], ...]}}``): one small table per measurement, its summary as the caption, for the terminal
and eval.md (:mod:`.render`). Nothing when the run has none."""

from __future__ import annotations

from typing import Any

from dflash_eval.report.format import fmt, is_number
from dflash_eval.report.tables import TextTable

__all__ = ["measurement_tables"]


def _cell(value: object) -> str:
    return fmt(value, 4, "g") if is_number(value) else "-" if value is None else str(value)


def _summary(block: dict[str, Any]) -> str | None:
    summary = block.get("summary") or {}
    return "; ".join(f"{k} {_cell(v)}" for k, v in summary.items()) or None


def measurement_tables(data: dict[str, Any]) -> list[TextTable]:
    """One table per measurement with rows: its label and value columns (extra cells kept), titled by its name."""
    out = []
    for name, block in (data.get("measurements") or {}).items():
        rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in (block or {}).get("rows") or []]
        if not rows:
            continue
        width = max(len(r) for r in rows)
        header = ["label", "value"] + [f"value {i}" for i in range(2, width)] if width >= 2 else ["label"]
        cells = [[_cell(c) for c in r] + [""] * (len(header) - len(r)) for r in rows]
        out.append(TextTable(header, cells, title=f"measurement: {name}", caption=_summary(block),
                             left=frozenset({"label"})))
    return out
