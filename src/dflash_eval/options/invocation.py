"""How the running evaluation was started, and the commands a message names for the next step in that same form.

A run's messages name commands the user can paste: a first run without golden records names the command that
records them, ``dflash-eval record`` names the command that gates against what it wrote. Which command is right
depends on how the run was started: under ``dflash-eval run ARGS`` it is ``dflash-eval record ARGS`` (the options
``record`` does not honour left out), under plain pytest (a checkout's ``pytest tests_eval ...``, an installed
``pytest --pyargs dflash_eval.tests_eval ...``) the same pytest command with the recording options added.

``dflash-eval`` commands that run pytest in their own process say so with :func:`started_as_command` around the
run; :func:`started_as` reads it back (None under plain pytest).

Example::

    with started_as_command("run", ["--target-model", "models/x", "--drafter", "ckpt", "-n", "2"]):
        ...  # pytest.main(...): record_command(config) == "dflash-eval record --target-model models/x ..."
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dflash_eval.options.settings import OPTIONS

__all__ = ["started_as_command", "started_as", "args_for", "suite_options", "option_pieces", "shell_join",
           "record_command", "RECORD_FLAGS"]

#: The options of a pytest run that record (``dflash-eval record`` passes them itself).
RECORD_FLAGS = ("--update-tau-floors", "--update-fingerprints", "--snapshot-update")
_STARTED: list[tuple[str, list[str]]] = []  # (command, its arguments) of the dflash-eval commands running pytest


@contextmanager
def started_as_command(command: str, args: Sequence[str]) -> Iterator[None]:
    """While the block runs, this process's pytest run was started as ``dflash-eval COMMAND ARGS``."""
    _STARTED.append((command, list(args)))
    try:
        yield
    finally:
        _STARTED.pop()


def started_as() -> tuple[str, list[str]] | None:
    """(command, arguments) of the ``dflash-eval`` command running pytest in this process, or None."""
    return _STARTED[-1] if _STARTED else None


def _option_flags() -> dict[str, Any]:
    return {o.flag: o for o in OPTIONS}


def option_pieces(args: Sequence[str]) -> Iterator[tuple[Any, list[str]]]:
    """``args`` cut into (suite option or None, its arguments): ``--flag VALUE``, ``--flag=VALUE``, a boolean
    ``--flag``, or one other argument."""
    flags = _option_flags()
    i = 0
    while i < len(args):
        a = args[i]
        spec = flags.get(a.split("=", 1)[0])
        width = 2 if spec is not None and spec.kind != "bool" and "=" not in a and i + 1 < len(args) else 1
        yield spec, list(args[i:i + width])
        i += width


def args_for(args: Sequence[str], command: str, *, drop: Sequence[str] = ()) -> list[str]:
    """``args`` without the suite options ``command`` does not honour and without the arguments in ``drop``
    (exact, or ``drop=...`` forms); everything else (other suite options, pytest's own) as given."""
    out: list[str] = []
    for spec, piece in option_pieces(args):
        if piece[0].split("=", 1)[0] in drop or (spec is not None and not spec.applies_to(command)):
            continue
        out.extend(piece)
    return out


def suite_options(args: Sequence[str], command: str) -> list[str]:
    """Only the suite options of ``args`` that ``command`` honours (with their values), as given."""
    return [a for spec, piece in option_pieces(args) if spec is not None and spec.applies_to(command) for a in piece]


def shell_join(argv: Sequence[str]) -> str:
    """``argv`` as one shell command line (quoted where needed)."""
    return shlex.join([str(a) for a in argv])


def _pytest_program() -> list[str]:
    return ["pytest"] if Path(sys.argv[0]).name == "pytest" else ["python", "-m", "pytest"]


def record_command(pytest_args: Sequence[str], *, add: Sequence[str] = RECORD_FLAGS) -> str:
    """The command that records this run's golden files, in the form the run was started with: ``dflash-eval
    record ARGS`` under a ``dflash-eval`` command, else pytest with ``pytest_args`` (the run's own) and ``add``."""
    cli = started_as()
    if cli is not None:
        return shell_join(["dflash-eval", "record", *args_for(cli[1], "record", drop=("--snapshot-warn-unused",))])
    args = list(pytest_args)
    return shell_join([*_pytest_program(), *args, *[f for f in add if f not in args]])
