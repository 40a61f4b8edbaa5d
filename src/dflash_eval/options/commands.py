"""Which suite options each ``dflash-eval`` command honours, and one clear refusal of the others.

Every suite option declares the commands that honour it (``commands`` in :mod:`dflash_eval.options.settings`; the option
table of ``docs/reference.md`` shows them): the suite (``run``: ``dflash-eval run``, ``pytest``) honours all,
``gate`` and ``record`` a subset. A command's ``--help`` lists only its options (:func:`add_command_options`); a
suite option it does not honour is refused with exit 2 naming the commands that do (:func:`refused`), never
accepted and ignored. Environment variables ``DFLASH_EVAL_<NAME>`` of options a command does not honour are not
read by it (:func:`environ_for`): they are meant for the commands that do.

Example::

    refused(["--drafter", "a", "--update-tau-floors"], "gate")
    # ['--update-tau-floors: not an option of `dflash-eval gate` (honoured by `dflash-eval run` / pytest)']
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
from collections.abc import Iterable, Mapping, Sequence

from dflash_eval.options.settings import OPTIONS, add_options

__all__ = ["refused", "misspelled", "environ_for", "add_command_options", "honoured_by", "XDIST_FLAGS",
           "xdist_installed", "xdist_missing", "unknown_pytest_args"]

_SHOWN = {"run": "`dflash-eval run` / pytest", "gate": "`dflash-eval gate`", "record": "`dflash-eval record`"}


def honoured_by(commands: Iterable[str]) -> str:
    """``("run", "gate")`` -> "`dflash-eval run` / pytest, `dflash-eval gate`"."""
    return ", ".join(_SHOWN.get(c, c) for c in commands)


def refused(args: Sequence[str], command: str, *, why: Mapping[str, str] | None = None) -> list[str]:
    """One line for each suite option in ``args`` that ``command`` does not honour (``--flag`` or ``--flag=VALUE``;
    nothing after ``--``), naming the commands that do, or ``why[option name]`` where given."""
    flags = {o.flag: o for o in OPTIONS}
    out = []
    for a in args:
        if a == "--":
            break
        spec = flags.get(a.split("=", 1)[0])
        if spec is not None and not spec.applies_to(command):
            reason = (why or {}).get(spec.name) or f"honoured by {honoured_by(spec.commands)}"
            line = f"{spec.flag}: not an option of `dflash-eval {command}` ({reason})"
            if line not in out:
                out.append(line)
    return out


def misspelled(args: Sequence[str], command: str, *, known: Iterable[str] = (),
               others: Iterable[str] = (), where: str | None = None) -> list[str]:
    """One line for each ``--flag`` in ``args`` (nothing after ``--``) that is no suite option and not in ``known``
    (the command's own flags) but close to one that ``command`` takes: ``--target-modle: unknown option of
    `dflash-eval run`; did you mean --target-model?`` (``where``: what the line calls it an option of instead).
    ``others``: flags of another parser that passes through (pytest's, for ``run`` and ``record``): never called a
    typo."""
    suite = {o.flag for o in OPTIONS}
    own = sorted({o.flag for o in OPTIONS if o.applies_to(command)} | set(known))
    passing = set(others) | set(known) | suite
    out = []
    for a in args:
        if a == "--":
            break
        flag = a.split("=", 1)[0]
        if not flag.startswith("--") or flag in passing:
            continue
        # one or two letters off scores >= 0.88 (--promtps / --prompts 0.89); pytest's --trace-config against
        # --drafter-config 0.80: the cut-off keeps options of pytest and its plugins from reading as typos
        close = difflib.get_close_matches(flag, own, n=3, cutoff=0.86)
        if close:
            line = (f"{flag}: unknown option of {where or f'`dflash-eval {command}`'}; did you mean "
                    f"{' or '.join(close)}?")
            if line not in out:
                out.append(line)
    return out


def environ_for(environ: Mapping[str, str], command: str) -> dict[str, str]:
    """``environ`` without the ``DFLASH_EVAL_<NAME>`` variables of options ``command`` does not honour."""
    skip = {o.env for o in OPTIONS if not o.applies_to(command)}
    return {k: v for k, v in environ.items() if k not in skip}


def add_command_options(parser: argparse.ArgumentParser, command: str, *, skip: Iterable[str] = ()) -> None:
    """The suite options ``command`` honours (but ``skip``), as one argparse group of ``parser``."""
    g = parser.add_argument_group(f"suite options `dflash-eval {command}` honours (as in `dflash-eval run`; env "
                                  "DFLASH_EVAL_<NAME> when not given)")
    add_options(g.add_argument, skip=skip, strict_choices=True, command=command)


#: pytest-xdist's options: what ``-n 2`` and its kin need installed.
XDIST_FLAGS = ("-n", "--numprocesses", "--maxprocesses", "--dist", "--tx", "--max-worker-restart")


def _xdist_flag(arg: str) -> str | None:
    """The pytest-xdist option ``arg`` is (``-n``, ``-n2``, ``-nauto``, ``--dist=load``, ...), else None."""
    flag = arg.split("=", 1)[0]
    if flag in XDIST_FLAGS:
        return flag
    return "-n" if arg.startswith("-n") and not arg.startswith("--") and len(arg) > 2 else None


def xdist_installed() -> bool:
    """Whether pytest-xdist can be imported (nothing is imported to tell)."""
    return importlib.util.find_spec("xdist") is not None


def xdist_missing(args: Sequence[str], *, installed: bool | None = None) -> str | None:
    """The one line for pytest-xdist's options in ``args`` (``-n 2``) when pytest-xdist is not installed
    (``installed``: whether it is; None: :func:`xdist_installed`), naming the extra that installs it; None when
    there is none, or it is installed."""
    if installed is None:
        installed = xdist_installed()
    given = list(args)[:list(args).index("--")] if "--" in args else list(args)  # nothing after --
    flags = [f for a in given if (f := _xdist_flag(a))]
    if not flags or installed:
        return None
    return (f"{flags[0]} runs the tests in parallel through pytest-xdist, which is not installed here: install "
            "dflash-eval's xdist extra (pip install '<the dflash-eval wheel or checkout>[xdist]') or pytest-xdist "
            "itself (pip install pytest-xdist)")


def unknown_pytest_args(unknown: Sequence[str], *, xdist_installed: bool | None = None) -> list[str]:
    """What to say of the arguments pytest does not know (``unknown``: after every plugin and conftest registered
    its options): pytest-xdist's options when it is not installed (:func:`xdist_missing`), and a suite option
    misspelled (``--num-promtps``: did you mean ``--num-prompts``?). Empty: leave them to pytest's own message."""
    out = [line] if (line := xdist_missing(unknown, installed=xdist_installed)) else []
    return out + misspelled(unknown, "run", where="the dflash-eval suite")
