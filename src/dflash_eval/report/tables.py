"""One table type for every report, written as markdown (eval.md, gate.md, $GITHUB_STEP_SUMMARY) or as a rich table
(the terminal). A table's cells are text made by :mod:`dflash_eval.common.number_text`; both renderings show the same
text: rich only aligns it, and in a ``verdict`` column colours the leading PASS / FAIL / ERROR on a colour terminal.

Build one with :class:`TextTable` (header, rows, and for the terminal a title, a caption and the columns aligned
left), then :func:`markdown_table` or :func:`terminal_text`.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # rich is imported when a table is printed
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

__all__ = ["TextTable", "markdown_table", "rich_table", "terminal_text", "print_tables", "VERDICT_STYLES"]

#: The colour of a ``verdict`` cell's first word on a colour terminal.
VERDICT_STYLES = {"PASS": "green", "FAIL": "red", "ERROR": "red", "INCONCLUSIVE": "yellow"}


@dataclass
class TextTable:
    """A table of text cells. ``left``: the columns aligned left in the terminal (the others, numbers, right);
    ``fold``: columns whose long text folds onto more lines instead of being cut; ``no_wrap``: no cell wraps."""

    header: list[str]
    rows: list[list[str]]
    title: str | None = None
    caption: str | None = None
    left: frozenset[str] = field(default_factory=frozenset)
    fold: frozenset[str] = field(default_factory=frozenset)
    no_wrap: bool = False

    def __post_init__(self) -> None:
        for i, r in enumerate(self.rows):
            if len(r) != len(self.header):
                raise ValueError(f"table {self.title or self.header[0]!r}: row {i} has {len(r)} cells for "
                                 f"{len(self.header)} columns ({r[:3]}...)")

    def __bool__(self) -> bool:
        return bool(self.rows)


def _md_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def markdown_table(table: TextTable) -> str:
    """The table as markdown (no title); a "|" inside a cell (|Δτ|) is escaped so it does not split the cell."""
    return "\n".join([_md_row(table.header), "|" + "|".join("---" for _ in table.header) + "|",
                      *(_md_row(r) for r in table.rows)])


def _cell(text: str, column: str) -> Text:
    """A rich cell: the text as it is (never read as rich markup); a verdict's first word coloured."""
    from rich.text import Text

    cell = Text(text)
    word = text.split(" ", 1)[0].rstrip(":")
    if column == "verdict" and word in VERDICT_STYLES:
        cell.stylize(VERDICT_STYLES[word], 0, len(word))
    return cell


def rich_table(table: TextTable) -> Table:
    """The table as a :class:`rich.table.Table`."""
    from rich.table import Table

    t = Table(title=table.title, caption=table.caption, show_lines=False)
    for h in table.header:
        t.add_column(h, justify="left" if h in table.left else "right", no_wrap=table.no_wrap,
                     overflow="fold" if h in table.fold else "ellipsis")
    for r in table.rows:
        t.add_row(*(_cell(c, h) for c, h in zip(r, table.header)))
    return t


def _print(console: Console, items: Iterable[TextTable | str | None]) -> None:
    for item in items:
        if isinstance(item, TextTable):
            if item:
                console.print(rich_table(item))
        elif item:
            console.print(item, markup=False)


def terminal_text(items: Iterable[TextTable | str | None], *, width: int = 120) -> str:
    """Tables (as rich tables) and lines of text, in order, as plain terminal text ``width`` columns wide (at least
    120, no colour codes); None and empty tables are left out."""
    from rich.console import Console

    buf = io.StringIO()
    _print(Console(file=buf, width=max(120, width), force_terminal=False, color_system=None, highlight=False), items)
    return buf.getvalue()


def print_tables(items: Iterable[TextTable | str | None], stream: TextIO) -> None:
    """Tables and lines as :func:`terminal_text` does, printed to ``stream``: as wide as the terminal, with the
    verdict colours, when it is one, else 160 columns of plain text."""
    from rich.console import Console

    tty = hasattr(stream, "isatty") and stream.isatty()
    _print(Console(file=stream, width=None if tty else 160, highlight=False), items)
