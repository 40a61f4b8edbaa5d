"""``dflash-eval run`` (and the runs ``dflash-eval record`` makes): pytest on the suite's modules, with the suite's
option values joined to their flags (:func:`joined_option_values`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.common.third_party import quiet_libraries
from dflash_eval.options.invocation import started_as_command
from dflash_eval.options.settings import OPTIONS
from dflash_eval.pytest_plugin.suite_args import SUITE_PACKAGE, suite_dir

__all__ = ["run_suite", "joined_option_values"]


def run_suite(args: list[str], *, command: str = "run", plugins: list[Any] | None = None) -> int:
    """``dflash-eval run``: pytest on the suite's modules with ``args``; returns pytest's exit status. ``command``:
    the ``dflash-eval`` command running it (messages name the next command in that form); ``plugins``: plugin
    objects registered for this run."""
    if suite_dir() is not None:
        where = ["--pyargs", SUITE_PACKAGE]
    else:  # a checkout where the package is not installed: the suite's folder next to src/
        repo_suite = Path(__file__).resolve().parents[2] / "tests_eval"
        if not (repo_suite / "test_tau.py").is_file():
            print(f"dflash-eval run: the suite's package {SUITE_PACKAGE} is not installed (pip install dflash-eval)",
                  file=sys.stderr)
            return int(pytest.ExitCode.USAGE_ERROR)
        # the rootdir stays the current folder (else pytest takes the checkout's, found from the suite's path)
        keep = any(a.startswith("--rootdir") for a in args)
        where = [str(repo_suite)] + ([] if keep else [f"--rootdir={Path.cwd()}"])
    extra = [] if any(a.startswith("--snapshot-") for a in args) else ["--snapshot-warn-unused"]
    quiet_libraries()  # as `dflash-eval gate`: transformers' log warnings and loading bars left out
    # This process imported dflash_eval already, so pytest cannot rewrite the plugin's asserts (it has none to).
    quiet = ["-W", "ignore:Module already imported so cannot be rewritten; dflash_eval"
                   ":pytest.PytestAssertRewriteWarning"]
    with started_as_command(command, args):
        return int(pytest.main(["-p", "dflash_eval.pytest_plugin", *quiet, *where, *extra,
                                *joined_option_values(args)], plugins=plugins or []))


def joined_option_values(args: list[str]) -> list[str]:
    """``--target-model DIR`` as ``--target-model=DIR`` for every suite option that takes a value.

    pytest picks its rootdir (and ini file) before plugins register their options, and takes every unknown
    argument that names an existing path for a test path: ``--target-model /models/x`` would move the rootdir (and
    with it the default ``reports/`` and ``.dflash_cache/``) to a common ancestor of the model folders."""
    takes_value = {o.flag for o in OPTIONS if o.kind != "bool"}
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in takes_value and i + 1 < len(args):
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out
