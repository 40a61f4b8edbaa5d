"""``dflash-eval`` console entry point (also ``python -m dflash_eval``).

``dflash-eval run [pytest arguments]`` runs the eval suite (the installed package ``dflash_eval.tests_eval``, or
``tests_eval/`` of a checkout) with pytest in this process: every suite option (``--target-model``, ``--drafter``,
...) and every pytest option (``-k tau``, ``-n 2``, ``--junitxml``) passes through, ``--snapshot-warn-unused`` is
added unless a ``--snapshot-*`` option is given, and the exit status is pytest's (0 pass, 1 failures, 4 bad input).
``dflash-eval run --help`` prints pytest's help with the "dflash-eval" group.

``dflash-eval gate --drafter A --drafter B ...`` evaluates one or more drafter checkpoints against the same target
and prompts in ONE process: the target's embedding/lm_head, tokenizer, prompt ids, reference completions and
features are loaded (or produced) once and shared by every checkpoint's
:class:`~dflash_eval.session.eval_session.EvalSession` (``EvalSession(..., shared=first)``), so each checkpoint after
the first costs only drafter work. It prints a comparison table (checkpoint, mean τ, DDTree-N τ, worst prompt, verdict
against the floors of ``--floors-file`` or ``--tau-floor``) and writes the combined report of all checkpoints to
``--report-dir`` (``gate.json``, ``gate.md``: :mod:`dflash_eval.report.gate`).

Exit status: 0 every checkpoint passes; 1 at least one fails (τ below a floor, τ dropped or rose beyond the
``--baseline`` tolerances, a drafter that does not fit the target; under ``--latest`` only the newest checkpoint of a
training run counts), or a file the gate writes (the cache, its
reports) could not be written: one message naming it and the cause; 2 bad input, reported once before any work (a
path that does not exist, an invalid option value, an unreadable config.json, a floors file or baseline recorded
with other τ-relevant settings, an option the gate does not honour), or no τ floors for the selected prompts and no
explicit threshold: the message names the floors file it looked for and the ``dflash-eval record`` command for the
first checkpoint. Values, paths and prompt files are checked before torch is imported
(:mod:`dflash_eval.options.preflight`).

The suite options the gate honours (``commands`` in :mod:`dflash_eval.options.settings`; ``dflash-eval gate --help``)
are accepted with the same name, and read from ``DFLASH_EVAL_<NAME>`` when not given; relative paths are relative to the
current directory (the bundled-fixture defaults, e.g. ``fixtures/target``, apply only in a checkout of this
repository). Ini files are not read. The others (the recording options, the drift tolerances, ...) are refused.

``dflash-eval record ...`` (:mod:`dflash_eval.cli.record`) records a new model's floors, snapshots and fingerprint;
``dflash-eval sets`` (:mod:`dflash_eval.cli.list_sets`) lists the built-in prompt sets.

Example::

    dflash-eval gate --drafter ckpt/step_4000 --drafter ckpt/step_5000 --target-model /models/Qwen3-8B \\
        --prompts prompts.jsonl --max-new-tokens 512 --tau-floor 3.0
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Iterable
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import pytest

from dflash_eval.cli.gate_run import (
    add_training_options,
    check_history,
    first_checkpoints,
    gate_training_run,
    judged_row,
    make_evaluator,
    write_trend,
)
from dflash_eval.cli.list_sets import sets_command
from dflash_eval.cli.record import record_command
from dflash_eval.cli.suite_run import joined_option_values, run_suite
from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.common.heap import COMMAND_ENTRIES, importing, own_process, started_as
from dflash_eval.common.number_text import fmt
from dflash_eval.common.paths import normal_path
from dflash_eval.common.progress import throttled
from dflash_eval.common.third_party import one_line_warnings, quiet_libraries
from dflash_eval.common.torch_check import require_torch
from dflash_eval.errors import ConfigError, DFlashEvalError, StorageError
from dflash_eval.golden.needed import gate_floors_message, missing_floors
from dflash_eval.metrics.verdict import gating_pass
from dflash_eval.options.commands import add_command_options, environ_for, misspelled, refused
from dflash_eval.options.invocation import option_pieces, shell_join
from dflash_eval.options.preflight import preflight
from dflash_eval.options.settings import resolve
from dflash_eval.references.server_link import ServerLink
from dflash_eval.report.gate import NOT_CHECKED, GateRow, gate_table, write_gate_report
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.report.tables import print_tables
from dflash_eval.session.baseline_file import baseline_problem
from dflash_eval.training_loop.plugins import plugin_manager

if TYPE_CHECKING:
    import pluggy

    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.eval_session import EvalSession
    from dflash_eval.training_loop.checkpoint_dir import Found
    from dflash_eval.training_loop.evaluator import Evaluator

__all__ = ["main", "build_parser", "gate", "run_suite", "joined_option_values"]

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


def _add_suite_options(p: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """The suite options the gate honours (the others are refused: :func:`main`)."""

    add_command_options(p, "gate", skip=skip)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (``dflash-eval COMMAND``); its ``gate`` subparser: :func:`build_parsers`."""
    return build_parsers()[0]


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(the top-level parser, its ``gate`` subparser)."""
    ap = argparse.ArgumentParser(prog="dflash-eval", description="Evaluate DFlash speculative-decoding drafters: "
                                 "`record` a new model's golden records once, then `run` the pytest suite against "
                                 "them, or `gate` several checkpoints in one process.")
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", add_help=False, help="run the eval suite with pytest; every pytest and suite option passes "
                   "through (`dflash-eval run --help`: pytest's help, group dflash-eval)")
    sub.add_parser("record", add_help=False, help="measure a target/drafter/prompt selection once and write the τ "
                   "floors, completion snapshots and fingerprint later runs gate against (`dflash-eval record "
                   "--help`)")
    sub.add_parser("sets", add_help=False, help="list the built-in prompt sets, where their data must be and whether "
                   "it is present here (`dflash-eval sets --help`)")
    g = sub.add_parser("gate", help="evaluate one or more drafter checkpoints in one process and compare them",
                       description="Evaluate each --drafter against the same target and prompts, reusing the "
                                   "target pieces, completions and features across checkpoints; print a comparison "
                                   "table. Exit 0: all pass, 1: any fails, 2: bad input.")
    g.add_argument("--drafter", action="append", default=None, metavar="CKPT",
                   help="a drafter checkpoint (directory or training .pt); repeat for several (or give DIR)")
    g.add_argument("--json", dest="json_out", metavar="FILE", help="also write the comparison as JSON to FILE")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    _add_suite_options(g, skip=("drafter",))

    add_training_options(g)
    return ap, g


def _version() -> str:
    """The installed distribution's version (the package metadata, the same number as ``dflash_eval.__version__``)."""
    return f"dflash-eval {version('dflash-eval')}"


def _settings(ns: argparse.Namespace, drafter: Path, *, check: bool = True) -> EvalSettings:
    """One checkpoint's EvalSettings: CLI > env > default (no ini file; env only of the options the gate honours);
    relative paths against the current directory. ``check=False``: the values parsed, not checked (no torch)."""

    cwd = Path.cwd()
    return resolve(lambda name: drafter if name == "drafter" else getattr(ns, name, None),
                   environ=environ_for(os.environ, "gate"), invocation_dir=cwd, root=cwd, check=check)


def _sglang_client(s: EvalSettings, hooks: pluggy.PluginManager | None = None) -> Any:
    """A ready client for the reference completions: a plugin's (``pytest_dflash_eval_reference_server``), else one of
    the running SGLang server (readiness and identity checked once; nothing is launched)."""
    client = hooks.hook.pytest_dflash_eval_reference_server(settings=s) if hooks is not None else None
    if client is not None:
        return client
    from dflash_eval.sglang import DEFAULT_LAUNCH_URL, SGLangClient  # imports requests: only when a server is needed

    return SGLangClient.connect(s.sglang_url or DEFAULT_LAUNCH_URL,
                                expected_name=s.sglang_model_name or s.target_model.name,
                                ready_timeout_s=s.sglang_timeout, request_timeout_s=s.sglang_request_timeout)


def _drafter_paths(ns: argparse.Namespace, err: TextIO) -> list[Path] | None:
    """The --drafter paths, absolute; None (after one message naming every problem) when one does not exist or an
    option value, path or prompt file is bad (the checks that need no torch)."""

    drafters = [Path(d).expanduser() for d in ns.drafter]
    drafters = [normal_path(d if d.is_absolute() else Path.cwd() / d) for d in drafters]
    problems = [f"--drafter {d}: not found (a drafter directory or a .pt file)" for d in drafters if not d.exists()]
    if problems:
        print("dflash-eval gate: bad input:\n  " + "\n  ".join(problems), file=err)
        return None
    try:  # the checks that need no torch first: bad values, paths, prompt files, --baseline and the history answer
        for d in drafters:  # in about a second
            preflight(_settings(ns, d, check=False), baseline_check=baseline_problem)
        check_history(ns, _settings(ns, drafters[0], check=False))
    except DFlashEvalError as exc:
        print(f"dflash-eval gate: bad input: {exc}", file=err)
        return None
    return drafters


def _training_run(ns: argparse.Namespace, err: TextIO) -> list[Found] | None:
    """``gate DIR`` / ``--drafter-glob``: the run's checkpoints in step order (the first stands in for ``--drafter``
    while the inputs are checked); [] with ``--drafter``; None (after one message) for bad input."""

    run = ns.train_dir is not None or bool(ns.drafter_glob)
    problem = None
    if run and ns.drafter:
        problem = "give --drafter CKPT or a training folder DIR / --drafter-glob GLOB, not both"
    elif not run and not ns.drafter:
        problem = "give --drafter CKPT (repeatable), a training folder DIR or --drafter-glob GLOB"
    found: list[Found] = []
    if problem is None and run:
        try:
            found = first_checkpoints(ns, lambda m: None if ns.quiet else print(m, file=err, flush=True))
        except DFlashEvalError as exc:
            problem = str(exc)
        if problem is None and not found:
            problem = f"no drafter checkpoints in {ns.train_dir or ', '.join(ns.drafter_glob)}"
        ns.drafter = [str(found[0].path)] if found else []
    if problem is not None:
        print(f"dflash-eval gate: bad input: {problem}", file=err)
        return None
    return found


def _report(ns: argparse.Namespace, rows: list[GateRow], settings: EvalSettings, t_all: float) -> int:
    """The comparison table on stdout, the --json file, gate.json and gate.md; the exit status."""
    failed = [r for r in rows if not r.passed]
    gating = [r for r in failed if r.gating]  # gate --latest: an earlier checkpoint's failure is reported only
    print_tables([gate_table(rows, list(settings.ddtree_budget), terminal=True)], sys.stdout)
    earlier = f"; {len(failed) - len(gating)} earlier failure(s) not gating (--latest)" if failed != gating else ""
    print(f"{len(rows) - len(failed)}/{len(rows)} checkpoint(s) passed in {time.perf_counter() - t_all:.1f} s{earlier}")
    for r in rows:
        for notice in r.notices:
            print(f"notice: {r.name}: {notice}")
    print(NOT_CHECKED.replace("`", ""))
    if ns.json_out:
        atomic_write_text(Path(ns.json_out), dumps_strict({"checkpoints": [r.to_json() for r in rows],
                                                           "passed": gating_pass(rows)}) + "\n")
    paths = write_gate_report(rows, settings, wall_s=time.perf_counter() - t_all)
    print("reports: " + ", ".join(str(p) for p in paths.values()))
    return EXIT_OK if gating_pass(rows) else EXIT_FAIL


def gate(ns: argparse.Namespace) -> int:
    err = sys.stderr
    found = _training_run(ns, err)
    if found is None:
        return EXIT_BAD_INPUT
    drafters = _drafter_paths(ns, err)
    if drafters is None:
        return EXIT_BAD_INPUT
    settings: list[EvalSettings] = []

    require_torch()  # before the session module imports it (ConfigError: exit 2 naming how to install it)

    def say(m: str) -> None:
        if not ns.quiet:
            print(m, file=err, flush=True)

    with importing():  # torch, with the garbage collector paused (dflash_eval.common.heap)
        from dflash_eval.common.threads import set_torch_threads  # imports torch: kept out of --help

    progress = None if ns.quiet else throttled(say, 2.0)
    sessions: list[EvalSession] = []
    try:  # every input of every checkpoint checked before any work: bad input is exit 2
        for d in drafters:
            settings.append(_settings(ns, d))
            if not sessions:  # the stages of every checkpoint are the first one's: one link, one thread count
                set_torch_threads(settings[0].torch_threads, 1)
                hooks = plugin_manager()  # the dflash_eval entry points' plugins; make_evaluator adds the trackers
                server = ServerLink(partial(_sglang_client, settings[0], hooks))  # connects when a fetch needs it
                evaluator = make_evaluator(ns, settings[0], log=say, hooks=hooks, progress=progress, server=server)
            sessions.append(evaluator.session(d))  # every checkpoint evaluated through the one Evaluator
            sessions[-1].check_inputs()
    except DFlashEvalError as exc:
        print(f"dflash-eval gate: bad input: {exc}", file=err)
        return EXIT_BAD_INPUT

    missing = missing_floors(sessions[0])
    if missing:  # nothing to gate against: exit 2 naming the floors file and the command that records it
        print(f"dflash-eval gate: {gate_floors_message(missing, _record_command(ns.argv))}", file=err)
        return EXIT_BAD_INPUT


    rows: list[GateRow] = []
    t_all = time.perf_counter()
    if found:  # a training run: its checkpoints in step order, those in the history skipped, --watch
        rows = gate_training_run(ns, evaluator, found, say=say)
    for s, sess in zip(settings, sessions if not found else []):
        row = judged_row(evaluator, sess)
        say(f"[dflash-eval] {s.drafter}: {'PASS' if row.passed else 'FAIL'} in {fmt(row.seconds, 2)} s")
        rows.append(row)
    return _finish(ns, evaluator, rows, settings[0], t_all)


def _finish(ns: argparse.Namespace, evaluator: Evaluator, rows: list[GateRow], settings: EvalSettings,
            t_all: float) -> int:
    """The trackers closed, the history's trend table and plot, then the gate's report (:func:`_report`)."""

    trend = write_trend(evaluator)  # closes the evaluator: its trackers, then the trend files
    if not rows:
        print(f"no new checkpoint to evaluate; history: {', '.join(str(p) for p in trend)}")
        return EXIT_OK
    code = _report(ns, rows, settings, t_all)
    print("history: " + ", ".join(str(p) for p in trend))
    return code


def _record_command(gate_args: list[str]) -> str:
    """The ``dflash-eval record`` command for the gate's target and prompts, from its first ``--drafter`` (whose τ
    sets the bar)."""

    out, seen = [], False
    for spec, piece in option_pieces(gate_args):
        if spec is None or not spec.applies_to("record") or (spec.name == "drafter" and seen):
            continue
        seen = seen or spec.name == "drafter"
        out += piece
    return shell_join(["dflash-eval", "record", *out])


def _refuse(args: list[str]) -> bool:
    """Suite options the gate does not honour: one message naming them (exit 2), never accepted and ignored."""

    why = {name: "the gate only judges; `dflash-eval record` writes floors, snapshots and the fingerprint" for name in
           ("update_tau_floors", "update_fingerprints", "tau_margin", "golden_dir")}
    problems = refused(args, "gate", why=why)
    if problems:
        print("dflash-eval gate: bad input: options it does not take:\n  " + "\n  ".join(problems), file=sys.stderr)
    return bool(problems)


def _typos(args: list[str], command: str, usage: str, *, known: Iterable[str] = ()) -> bool:
    """Options of ``args`` that are no option but close to one of ``command``'s: one message each with a "did you
    mean", then the command's own usage (not pytest's, not the top level's)."""
    problems = misspelled(args, command, known=known)
    for line in problems:
        print(f"dflash-eval {command}: {line}", file=sys.stderr)
    if problems:
        print(usage.rstrip(), file=sys.stderr)
    return bool(problems)


#: The usage line of the commands whose options pass through to pytest.
_PASSING_USAGE = {"run": "usage: dflash-eval run [pytest options] [suite options] (`dflash-eval run --help`: pytest's "
                         "help, suite options in its group dflash-eval)",
                  "record": "usage: dflash-eval record [suite options] [pytest options] (`dflash-eval record --help`)"}


def main(argv: list[str] | None = None) -> int:
    if argv is None and started_as(*COMMAND_ENTRIES):  # the process ends with the command (dflash_eval.common.heap)
        own_process()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["run"], ["record"]) and _typos(argv[1:], argv[0], _PASSING_USAGE[argv[0]]):
        return int(pytest.ExitCode.USAGE_ERROR)
    if argv[:1] == ["run"]:  # everything after `run` belongs to pytest
        return run_suite(argv[1:])
    if argv[:1] == ["record"]:  # its own parser (dflash_eval.cli.record); pytest options pass through
        return record_command(argv[1:])
    if argv[:1] == ["gate"]:
        gate_parser = build_parsers()[1]
        usage = gate_parser.format_usage()
        if _refuse(argv[1:]) or _typos(argv[1:], "gate", usage, known=re.findall(r"--[a-z][a-z0-9-]*", usage)):
            return EXIT_BAD_INPUT
        try:
            unknown = gate_parser.parse_known_args(argv[1:])[1]
        except SystemExit as exc:  # --help (0), or a usage error argparse printed with the gate's usage (2)
            return int(exc.code or 0)
        if unknown:  # argparse would answer with the top level's usage
            gate_parser.print_usage(sys.stderr)
            print(f"dflash-eval gate: error: unrecognized arguments: {' '.join(unknown)}", file=sys.stderr)
            return EXIT_BAD_INPUT
    if argv[:1] == ["sets"]:  # its own parser (dflash_eval.cli.list_sets); no torch import

        return sets_command(argv[1:])
    ap = build_parser()
    try:
        ns = ap.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if ns.command is None:
        ap.print_help()
        return EXIT_BAD_INPUT
    if ns.command == "gate":
        ns.argv = argv[1:]
        quiet_libraries()  # transformers' log warnings and loading bars left out, as pytest's capture does in `run`
        try:
            with one_line_warnings("dflash-eval gate"):
                return gate(ns)
        except ConfigError as exc:
            print(f"dflash-eval gate: bad input: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except OSError as exc:  # the cache or a report could not be written (a StorageError names it and the
            # cause; an OSError of another writer names its file): one message, the gate fails
            print(f"dflash-eval gate: {exc if isinstance(exc, StorageError) else f'{type(exc).__name__}: {exc}'}; "
                  "the gate fails", file=sys.stderr)
            return EXIT_FAIL
    ap.error(f"unknown command {ns.command!r}")
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
