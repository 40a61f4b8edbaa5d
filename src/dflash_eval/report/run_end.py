"""The report work at the end of a suite run, apart from pytest: whether the processes' results measured anything
to report (:func:`measured`; then :func:`~dflash_eval.session.merge.merge` makes the run's typed result of them,
:func:`~dflash_eval.report.write.conclude` composes its verdict and :func:`~dflash_eval.report.write.finish` writes
it), and the terminal's dflash-eval section (:func:`terminal_section`: the tables, what was written, the verdict
last)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_eval.metrics.verdict import refused
from dflash_eval.report.render import TERMINAL_ROWS_SHOWN, render_terminal
from dflash_eval.report.summary import verdict_lines
from dflash_eval.session.run_result import RunResult

if TYPE_CHECKING:  # the process's result imports torch (its builders); the reports import none
    from dflash_eval.session.eval_result import EvalResult

__all__ = ["measured", "TerminalSection", "terminal_section"]


def measured(fragments: list[EvalResult]) -> bool:
    """Whether any process measured something to report: τ, drift, a fingerprint, a registered measurement, a near
    tie of the target, or a refused drafter."""
    return any(f.tau is not None or f.drift is not None or f.fingerprint is not None or bool(f.measurements)
               or bool(f.near_ties) or (f.drafter is not None and refused(f.drafter)) for f in fragments)


@dataclass
class TerminalSection:
    """The terminal's dflash-eval section: the tables' text, the messages of the end of the run, and the verdict
    lines printed last under their own separator."""

    tables: str
    messages: list[str]
    verdict: list[str]


def terminal_section(result: RunResult | None, messages: list[str], *, width: int, verbose: bool,
                     report_dir: Path | None, recorded: bool) -> TerminalSection:
    """The section for the run's ``result`` (None: only the messages) and the verdict it holds. ``verbose``: every
    row of the long tables; ``report_dir``, ``recorded``: as :func:`dflash_eval.report.summary.verdict_lines` takes
    them."""
    if result is None:
        return TerminalSection("", list(messages), [])
    tables = render_terminal(result, width=width, max_rows=None if verbose else TERMINAL_ROWS_SHOWN)
    verdict = verdict_lines(result, report_dir=report_dir, recorded=recorded)
    return TerminalSection(tables, list(messages), verdict)
