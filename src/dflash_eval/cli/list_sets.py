"""``dflash-eval sets``: list the built-in prompt sets, their public source, where their data must be on this machine
and whether it is there.

The data folder is ``--prompt-data-dir`` when given, else ``DFLASH_EVAL_PROMPT_DATA_DIR``, else the option's default
(``data/prompt_sets``), relative to the current directory (as ``dflash-eval gate`` resolves it; ini files are not
read). ``--check`` also reads every set that is present, as ``--prompts NAME`` would, and prints its prompt count;
``--json`` prints the listing as JSON. No torch import: the listing answers in well under a second.

Exit status: 0 listed (and, with ``--check``, every present set readable); 1 ``--check`` found a set it could not
read; 2 bad arguments.

Example::

    dflash-eval sets --prompt-data-dir /data/prompt_sets --check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from dflash_eval.options.settings import OPTIONS_BY_NAME
from dflash_eval.prompts.catalog import check_entry, render_text, set_entries

__all__ = ["sets_command", "build_sets_parser", "data_dir_of"]


def build_sets_parser() -> argparse.ArgumentParser:
    spec = OPTIONS_BY_NAME["prompt_data_dir"]
    ap = argparse.ArgumentParser(prog="dflash-eval sets", description="List the built-in prompt sets (--prompts NAME): "
                                 "their public source, where their data must be and whether it is present here. "
                                 "Nothing is downloaded. Exit 0: listed; 1: --check found an unreadable set; 2: bad "
                                 "arguments.")
    ap.add_argument(spec.flag, dest="prompt_data_dir", metavar="DIR", default=None,
                    help=f"{spec.help} [env {spec.env}; default: {spec.default}]")
    ap.add_argument("--check", action="store_true", help="also read each present set as the suite would and print its "
                    "number of prompts (Parquet / Arrow data needs pyarrow)")
    ap.add_argument("--json", dest="as_json", action="store_true", help="print the listing as JSON")
    return ap


def data_dir_of(cli_value: str | None, environ: Mapping[str, str]) -> tuple[Path, str]:
    """The data folder (absolute) and where its value came from: the option, the environment or the default."""

    spec = OPTIONS_BY_NAME["prompt_data_dir"]
    if cli_value:
        raw, origin = cli_value, f"from {spec.flag}"
    elif environ.get(spec.env):
        raw, origin = environ[spec.env], f"from {spec.env}"
    else:
        raw, origin = str(spec.default), f"the default; set it with {spec.flag} DIR or {spec.env}"
    p = Path(raw).expanduser()
    return (p if p.is_absolute() else Path.cwd() / p), origin


def sets_command(argv: list[str]) -> int:
    """Run ``dflash-eval sets`` with ``argv`` (the arguments after ``sets``); returns the exit status."""

    try:
        ns = build_sets_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    data_dir, origin = data_dir_of(ns.prompt_data_dir, os.environ)
    entries = set_entries(data_dir)
    if ns.check:
        entries = [check_entry(e, data_dir) for e in entries]
    if ns.as_json:
        print(json.dumps({"data_dir": str(data_dir), "origin": origin, "sets": [e.to_json() for e in entries]},
                         indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(render_text(entries, data_dir, origin))
    return 1 if any(e.error is not None for e in entries) else 0
