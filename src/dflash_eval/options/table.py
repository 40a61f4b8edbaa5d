"""The option table of ``docs/reference.md``, generated from the declarations in :mod:`dflash_eval.options.settings`.

Regenerate: ``python -m dflash_eval.options.table --write-docs docs/reference.md``; ``--check-docs`` exits 1 when the
table is stale (a unit test does the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dflash_eval.options.settings import OPTIONS

__all__ = ["render_option_table", "with_option_table", "main", "DOCS_COMMAND", "TABLE_START", "TABLE_END"]

DOCS_COMMAND = "python -m dflash_eval.options.table --write-docs docs/reference.md"
TABLE_START, TABLE_END = "<!-- options-table:start -->", "<!-- options-table:end -->"


def render_option_table() -> str:
    """The markdown table of every option (flag, env, ini, default, the commands that honour it, whether it affects
    τ, meaning) kept in ``docs/reference.md``; ``run`` is the suite (``dflash-eval run``, ``pytest``), ``gate`` and
    ``record`` the ``dflash-eval`` commands (each refuses the options it does not honour); ``affects τ``: yes where
    another value can change a τ measured (what a training history's settings digest keeps, the drafter aside)."""
    rows = ["| option | env | ini | default | commands | affects τ | meaning |", "|---|---|---|---|---|---|---|"]
    for o in OPTIONS:
        flag = o.flag + (" {" + ",".join(o.choices) + "}" if o.choices else "")
        cells = [f"`{flag}`", f"`{o.env}`", f"`{o.ini}`", f"`{o.shown_default}`", ", ".join(o.commands),
                 "yes" if o.affects_tau else "no", o.help]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def with_option_table(doc: str) -> str:
    """``doc`` with the lines between its ``<!-- options-table:start/end -->`` markers replaced by the table."""
    start, end = doc.find(TABLE_START), doc.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"no {TABLE_START} ... {TABLE_END} block")
    return doc[:start + len(TABLE_START)] + "\n" + render_option_table() + doc[end:]


def main(argv: list[str] | None = None) -> int:
    """``python -m dflash_eval.options.table``: print the option table, or rewrite/check it in a markdown file."""
    ap = argparse.ArgumentParser(prog="python -m dflash_eval.options.table", description=main.__doc__)
    act = ap.add_mutually_exclusive_group()
    act.add_argument("--write-docs", metavar="MD", type=Path, help="rewrite the table between the markers of MD")
    act.add_argument("--check-docs", metavar="MD", type=Path, help="exit 1 when the table in MD is stale")
    ns = ap.parse_args(argv)
    path = ns.write_docs or ns.check_docs
    if path is None:
        sys.stdout.write(render_option_table())
        return 0
    text = path.read_text(encoding="utf-8")
    fresh = with_option_table(text)
    if fresh != text and ns.check_docs:
        print(f"{path}: option table is stale; run: {DOCS_COMMAND}", file=sys.stderr)
    elif fresh != text:
        path.write_text(fresh, encoding="utf-8")
    return int(fresh != text and bool(ns.check_docs))


if __name__ == "__main__":
    sys.exit(main())
