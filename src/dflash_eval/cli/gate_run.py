"""``dflash-eval gate`` over a training run: the checkpoints of a folder (``gate DIR``) or globs
(``--drafter-glob``) in step order, each evaluated through one :class:`~dflash_eval.training_loop.evaluator.
Evaluator`, those already in the history skipped, ``--watch`` for new ones, and the history's trend table and plot.

Every gate run, with ``--drafter`` too, appends one record per evaluated checkpoint to ``--history`` (default
``<report-dir>/history.jsonl``) and rewrites ``history.md`` (the trend table) and ``history.png`` (τ over steps)
beside it. A checkpoint worse than the best one before it beyond noise fails the gate (exit 1) like a missed
floor; a plateau (no gain beyond noise over the last ``--plateau-window`` checkpoints) is printed as a notice.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from dflash_eval.errors import ConfigError, DFlashEvalError
from dflash_eval.training_loop.checkpoint_dir import Found, find_checkpoints
from dflash_eval.training_loop.trackers import TensorBoardTracker, WandbTracker
from dflash_eval.training_loop.trend_plot import write_trend_plot
from dflash_eval.training_loop.trend_table import write_trend_table
from dflash_eval.training_loop.watch import WatchLimits, watch

if TYPE_CHECKING:  # they import torch: kept out of --help
    import pluggy

    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.report.gate import GateRow
    from dflash_eval.session.eval_session import EvalSession
    from dflash_eval.training_loop.evaluator import Evaluator, SessionOptions

    class EvaluatorOptions(SessionOptions, total=False):
        """What :func:`make_evaluator` passes on to the Evaluator: its hook manager and its first session's options."""

        hooks: pluggy.PluginManager | None

__all__ = ["add_training_options", "training_checkpoints", "first_checkpoints", "make_evaluator", "judged_row",
           "write_trend", "gate_training_run"]


def add_training_options(g: argparse.ArgumentParser) -> None:
    """The gate's options for a training run (beside the suite options it honours)."""
    g.add_argument("train_dir", nargs="?", metavar="DIR", default=None,
                   help="a training output folder: every checkpoint in it (step_N, checkpoint-N, global_stepN "
                        "folders, .pt/.safetensors files) in step order, skipping those already in the history")
    g.add_argument("--drafter-glob", action="append", default=[], metavar="GLOB",
                   help="checkpoints matching GLOB (quoted; ** allowed), in step order with DIR's; repeatable")
    g.add_argument("--watch", action="store_true",
                   help="after the checkpoints present, evaluate new ones as they appear (each read once its "
                        "files are whole and unchanged for --watch-settle s) until --watch-timeout or Ctrl-C")
    g.add_argument("--watch-timeout", type=float, default=3600.0, metavar="S",
                   help="how long --watch runs in all (seconds; default 3600)")
    g.add_argument("--watch-poll", type=float, default=10.0, metavar="S",
                   help="seconds between two looks for new checkpoints (default 10)")
    g.add_argument("--watch-settle", type=float, default=5.0, metavar="S",
                   help="seconds a new checkpoint's files must stay unchanged before it is read (default 5)")
    g.add_argument("--history", metavar="FILE", default=None,
                   help="the JSONL history appended to (default <report-dir>/history.jsonl)")
    g.add_argument("--plateau-window", type=int, default=4, metavar="K",
                   help="a plateau notice when none of the last K checkpoints gained beyond noise (default 4)")
    g.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="also log τ per step to TensorBoard event files in DIR (needs tensorboard)")
    g.add_argument("--wandb", metavar="DIR", default=None,
                   help="also log τ per step to an offline Weights & Biases run in DIR (needs wandb)")


def training_checkpoints(ns: argparse.Namespace) -> list[Found]:
    """The checkpoints of ``DIR`` and ``--drafter-glob`` in step order (ConfigError when DIR is no folder)."""

    root = Path(ns.train_dir).expanduser() if ns.train_dir else None
    if root is not None and not root.is_dir():
        raise ConfigError(f"gate DIR {root}: not a folder (a training output folder holding checkpoints)")
    return find_checkpoints(root, patterns=list(ns.drafter_glob))


class _First(Exception):
    """Raised by the watch's handler to stop at the first checkpoint."""


def first_checkpoints(ns: argparse.Namespace, say: Callable[[str], None]) -> list[Found]:
    """:func:`training_checkpoints`; with ``--watch`` and none there yet, the first one to appear (waited for within
    ``--watch-timeout``; [] when none came)."""

    found = training_checkpoints(ns)
    if found or not ns.watch:
        return found
    got: list[Found] = []

    def grab(f: Found) -> None:
        got.append(f)
        raise _First

    try:
        watch(Path(ns.train_dir).expanduser() if ns.train_dir else None, grab, patterns=tuple(ns.drafter_glob),
              limits=WatchLimits(poll_s=ns.watch_poll, settle_s=ns.watch_settle, timeout_s=ns.watch_timeout), log=say)
    except _First:
        pass
    return got


def make_evaluator(ns: argparse.Namespace, settings: EvalSettings, *, log: Callable[[str], None],
                   **session: Unpack[EvaluatorOptions]) -> Evaluator:
    """The gate's Evaluator: its history (``--history``), trackers (``--tensorboard``, ``--wandb``: registered on its
    hook manager, ``session``'s ``hooks`` when given), plateau window; ``session``: the Evaluator's ``hooks`` and the
    options of its first EvalSession (progress sink, server link)."""
    from dflash_eval.training_loop.evaluator import Evaluator  # imports torch: kept out of --help

    if ns.plateau_window < 2:
        raise ConfigError(f"--plateau-window must be >= 2, got {ns.plateau_window}")
    trackers: list[TensorBoardTracker | WandbTracker] = []
    if ns.tensorboard:
        trackers.append(TensorBoardTracker(Path(ns.tensorboard)))
    if ns.wandb:
        trackers.append(WandbTracker(Path(ns.wandb), config={"target": str(settings.target_model)}))
    history = Path(ns.history) if ns.history else Path(settings.report_dir) / "history.jsonl"
    return Evaluator(settings, history=history, trackers=trackers, log=log, worker=("master", 0, 1),
                     plateau_window=ns.plateau_window, **session)


def judged_row(evaluator: Evaluator, session: EvalSession, *, step: int | None = None) -> GateRow:
    """Evaluate ``session``'s checkpoint through ``evaluator`` (its history record appended) and make its gate row;
    a regression across steps fails the row, a plateau is a notice beside it."""
    from dflash_eval.report.gate import error_row, gate_row  # imports torch: kept out of --help

    path = session.settings.drafter
    t0 = time.perf_counter()
    try:
        result = evaluator.evaluate(path, step=step)
        assert result.drafter is not None  # evaluate fills it in
        row = gate_row(session.tau_summary(), session.floors, drafter=str(path), fingerprint=result.drafter.fingerprint)
        rec = evaluator.records[-1]
        if rec.regression:
            row.passed, row.reasons = False, [*row.reasons, rec.regression]
        if rec.plateau:
            evaluator.base.inputs.log(f"[dflash-eval] notice: {rec.plateau}")
    except DFlashEvalError as exc:
        row = error_row(str(path), exc)
    row.seconds = round(time.perf_counter() - t0, 3)
    return row


def write_trend(evaluator: Evaluator) -> list[Path]:
    """``history.md`` and ``history.png`` beside the history file, from every record in it."""

    hist = evaluator.history
    assert hist is not None  # make_evaluator gives every gate Evaluator a history
    records = hist.read()
    if not records:
        return []
    paths = [write_trend_table(records, hist.path.with_suffix(".md"))]
    png = write_trend_plot(records, hist.path.with_suffix(".png"))
    return paths + ([png] if png is not None else [])


def _evaluate_found(evaluator: Evaluator, found: Found, say: Callable[[str], None]) -> GateRow:
    from dflash_eval.report.gate import error_row  # imports torch: kept out of --help

    try:
        session = evaluator.session(found.path)
        session.check_inputs()
    except DFlashEvalError as exc:
        return error_row(str(found.path), exc)
    row = judged_row(evaluator, session, step=found.step)
    say(f"[dflash-eval] step {found.step}: {found.path}: {'PASS' if row.passed else 'FAIL'} in {row.seconds:.2f} s")
    return row


def gate_training_run(ns: argparse.Namespace, evaluator: Evaluator, found: list[Found], *,
                      say: Callable[[str], None]) -> list[GateRow]:
    """Evaluate ``found`` (in step order) but those the history holds for these settings, then, with ``--watch``,
    the new ones as they appear; returns their gate rows."""

    history = evaluator.history
    assert history is not None  # make_evaluator gives every gate Evaluator a history
    todo = [f for f in found if not history.has(str(f.path), f.step, evaluator.digest)]
    say(f"[dflash-eval] {len(found)} checkpoint(s) found, {len(found) - len(todo)} already in "
        f"{history.path}")
    rows = [_evaluate_found(evaluator, f, say) for f in todo]
    if ns.watch:
        limits = WatchLimits(poll_s=ns.watch_poll, settle_s=ns.watch_settle, timeout_s=ns.watch_timeout)
        root = Path(ns.train_dir).expanduser() if ns.train_dir else None
        watch(root, lambda f: rows.append(_evaluate_found(evaluator, f, say)), patterns=tuple(ns.drafter_glob),
              seen={f.path for f in found}, limits=limits, log=say)
    return rows
