"""Reports of an eval run: merged results (:mod:`.merge`), the rows of its tables (:mod:`.table_rows`) written for
the terminal and as markdown (:mod:`.render`), the verdict printed last (:mod:`.summary`), the plots (:mod:`.plot`:
eval.png; :mod:`.budget_plot`: drift_budget.png), the files plus golden updates at the end of a run (:mod:`.write`,
:mod:`.run_end`) and the gate's combined report (:mod:`.gate`).

One rendering layer serves them all: :func:`fmt` (:mod:`dflash_eval.common.number_text`) is how every number reads
(``-`` for a value that is not there, NaN included), :class:`TextTable` (:mod:`.tables`) the one table type, written
as markdown or as a rich table, and :func:`append_step_summary` (:mod:`.step_summary`) the one writer of
``$GITHUB_STEP_SUMMARY``.
"""

from dflash_eval.common.number_text import MISSING, fmt
from dflash_eval.report.budget_plot import measured_drifts, write_budget_plot
from dflash_eval.report.merge import SCHEMA, merge
from dflash_eval.report.plot import write_plot
from dflash_eval.report.render import TERMINAL_ROWS_SHOWN, render_markdown, render_terminal
from dflash_eval.report.step_summary import append_step_summary
from dflash_eval.report.summary import verdict_lines
from dflash_eval.report.table_rows import (
           baseline_line,
           budget_line,
           category_rows,
           drift_rows,
           gate_rows,
           ladder_rows,
           tau_rows,
)
from dflash_eval.report.tables import TextTable, markdown_table, terminal_text
from dflash_eval.report.write import finish, write_reports

__all__ = ["SCHEMA", "merge", "finish", "render_terminal", "render_markdown", "write_plot", "write_budget_plot",
           "measured_drifts", "write_reports", "tau_rows", "category_rows", "drift_rows", "ladder_rows", "gate_rows",
           "baseline_line", "budget_line", "TERMINAL_ROWS_SHOWN", "verdict_lines",
           "fmt", "MISSING", "TextTable", "markdown_table", "terminal_text", "append_step_summary"]
