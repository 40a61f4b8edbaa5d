"""Reports of an eval run (the results merged across processes beside the result: :mod:`dflash_eval.session.merge`,
re-exported here as :func:`merge`): the rows of its tables (:mod:`.table_rows`) written for
the terminal and as markdown (:mod:`.render`), the verdict printed last (:mod:`.summary`), the plots (:mod:`.plot`:
eval.png; :mod:`.budget_plot`: drift_budget.png), the files plus golden updates at the end of a run (:mod:`.write`,
:mod:`.run_end`) and the gate's combined report (:mod:`.gate`).

One rendering layer serves them all: :func:`fmt` (:mod:`dflash_eval.common.number_text`) is how every number reads
(``-`` for a value that is not there, NaN included), :class:`TextTable` (:mod:`.tables`) the one table type, written
as markdown or as a rich table, and :func:`append_step_summary` (:mod:`.step_summary`) the one writer of
``$GITHUB_STEP_SUMMARY``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Bound now, not lazily (merge is torch-free and light): the merge of the per-process results, which reports read.
from dflash_eval.session.merge import SCHEMA, merge

#: The package's names and the modules that hold them: imported on first use, so importing one report module (the
#: gate's table, the terminal's section) does not import every other (the golden writer, the plots).
_LAZY = {
    "MISSING": "dflash_eval.common.number_text", "fmt": "dflash_eval.common.number_text",
    "measured_drifts": "dflash_eval.report.budget_plot", "write_budget_plot": "dflash_eval.report.budget_plot",
    "write_plot": "dflash_eval.report.plot",
    "TERMINAL_ROWS_SHOWN": "dflash_eval.report.render", "render_markdown": "dflash_eval.report.render",
    "render_terminal": "dflash_eval.report.render",
    "append_step_summary": "dflash_eval.report.step_summary",
    "verdict_lines": "dflash_eval.report.summary",
    "baseline_line": "dflash_eval.report.table_rows", "budget_line": "dflash_eval.report.table_rows",
    "category_rows": "dflash_eval.report.table_rows", "drift_rows": "dflash_eval.report.table_rows",
    "gate_rows": "dflash_eval.report.table_rows", "ladder_rows": "dflash_eval.report.table_rows",
    "tau_rows": "dflash_eval.report.table_rows",
    "TextTable": "dflash_eval.report.tables", "markdown_table": "dflash_eval.report.tables",
    "terminal_text": "dflash_eval.report.tables",
    "conclude": "dflash_eval.report.write", "finish": "dflash_eval.report.write",
    "write_reports": "dflash_eval.report.write",
}

__all__ = ["SCHEMA", "merge", "conclude", "finish", "render_terminal", "render_markdown", "write_plot",
           "write_budget_plot", "measured_drifts", "write_reports", "tau_rows", "category_rows", "drift_rows",
           "ladder_rows", "gate_rows", "baseline_line", "budget_line", "TERMINAL_ROWS_SHOWN", "verdict_lines",
           "fmt", "MISSING", "TextTable", "markdown_table", "terminal_text", "append_step_summary"]

if TYPE_CHECKING:
    # re-exported for type checkers (`X as X`); at run time __getattr__ imports them on first use
    from dflash_eval.common.number_text import MISSING as MISSING
    from dflash_eval.common.number_text import fmt as fmt
    from dflash_eval.report.budget_plot import measured_drifts as measured_drifts
    from dflash_eval.report.budget_plot import write_budget_plot as write_budget_plot
    from dflash_eval.report.plot import write_plot as write_plot
    from dflash_eval.report.render import TERMINAL_ROWS_SHOWN as TERMINAL_ROWS_SHOWN
    from dflash_eval.report.render import render_markdown as render_markdown
    from dflash_eval.report.render import render_terminal as render_terminal
    from dflash_eval.report.step_summary import append_step_summary as append_step_summary
    from dflash_eval.report.summary import verdict_lines as verdict_lines
    from dflash_eval.report.table_rows import baseline_line as baseline_line
    from dflash_eval.report.table_rows import budget_line as budget_line
    from dflash_eval.report.table_rows import category_rows as category_rows
    from dflash_eval.report.table_rows import drift_rows as drift_rows
    from dflash_eval.report.table_rows import gate_rows as gate_rows
    from dflash_eval.report.table_rows import ladder_rows as ladder_rows
    from dflash_eval.report.table_rows import tau_rows as tau_rows
    from dflash_eval.report.tables import TextTable as TextTable
    from dflash_eval.report.tables import markdown_table as markdown_table
    from dflash_eval.report.tables import terminal_text as terminal_text
    from dflash_eval.report.write import conclude as conclude
    from dflash_eval.report.write import finish as finish
    from dflash_eval.report.write import write_reports as write_reports


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dflash_eval.report' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
