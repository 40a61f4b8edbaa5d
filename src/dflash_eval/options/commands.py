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
from collections.abc import Iterable, Mapping, Sequence

from dflash_eval.options.settings import OPTIONS, add_options

__all__ = ["refused", "misspelled", "environ_for", "add_command_options", "honoured_by"]

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
               others: Iterable[str] = ()) -> list[str]:
    """One line for each ``--flag`` in ``args`` (nothing after ``--``) that is no suite option and not in ``known``
    (the command's own flags) but close to one that ``command`` takes: ``--target-modle: unknown option of
    `dflash-eval run`; did you mean --target-model?``. ``others``: flags of another parser that passes through
    (pytest's, for ``run`` and ``record``): never called a typo."""
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
            line = (f"{flag}: unknown option of `dflash-eval {command}`; did you mean "
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
