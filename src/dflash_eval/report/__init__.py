"""Reports of an eval run: merged results (:mod:`.merge`), the terminal and markdown tables (:mod:`.render`), the
verdict printed last (:mod:`.summary`), the plots (:mod:`.plot`: eval.png; :mod:`.budget_plot`: drift_budget.png)
and the files plus golden updates at the end of a run (:mod:`.write`)."""

from dflash_eval.report.budget_plot import measured_drifts, write_budget_plot
from dflash_eval.report.merge import SCHEMA, merge
from dflash_eval.report.plot import write_plot
from dflash_eval.report.render import (
                                       TERMINAL_ROWS_SHOWN,
                                       category_rows,
                                       drift_rows,
                                       gate_rows,
                                       ladder_rows,
                                       render_markdown,
                                       render_terminal,
                                       tau_rows,
)
from dflash_eval.report.summary import gate_outcome, tau_verdict, verdict_lines
from dflash_eval.report.write import finish, write_reports

__all__ = ["SCHEMA", "merge", "finish", "render_terminal", "render_markdown", "write_plot", "write_budget_plot",
           "measured_drifts", "write_reports", "tau_rows", "category_rows", "drift_rows", "ladder_rows", "gate_rows",
           "TERMINAL_ROWS_SHOWN", "verdict_lines", "tau_verdict", "gate_outcome"]
