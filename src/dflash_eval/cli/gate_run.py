"""``dflash-eval gate`` over a training run: the checkpoints of a folder (``gate DIR``) or globs
(``--drafter-glob``) in step order, each evaluated through one :class:`~dflash_eval.training_loop.evaluator.
Evaluator`, those already in the history skipped, ``--watch`` for new ones, and the history's trend table and plot.

Every gate run, with ``--drafter`` too, appends one record per evaluated checkpoint to ``--history`` (default
``<report-dir>/history.jsonl``) and rewrites ``history.md`` (the trend table) and ``history.png`` (τ over steps)
beside it (the Evaluator's :meth:`~dflash_eval.training_loop.evaluator.Evaluator.close`). A checkpoint below the
run's recent level beyond the noise between checkpoints fails the gate (exit 1) like a missed floor; a plateau (no
gain beyond noise over the last ``--plateau-window`` checkpoints) is a notice.

``--latest``: the newest checkpoint (the last in step order) alone decides the exit status. The earlier ones the
history does not hold yet are evaluated too (the verdicts across steps judge the newest against them) and their
failures reported as rows that do not gate; failures recorded in the history before are named in a notice; a
newest checkpoint the history holds already is judged from its record, not evaluated again.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from dflash_eval.common.heap import importing
from dflash_eval.errors import ConfigError, DFlashEvalError
from dflash_eval.metrics.verdict import compose, notice
from dflash_eval.report.gate import GatePrompt, GateRow, error_row, gate_row
from dflash_eval.training_loop.checkpoint_dir import Found, find_checkpoints
from dflash_eval.training_loop.history import CheckpointRecord, History
from dflash_eval.training_loop.trackers import TensorBoardTracker, WandbTracker
from dflash_eval.training_loop.watch import WatchLimits, watch

if TYPE_CHECKING:  # they import torch: kept out of --help
    import pluggy

    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.eval_session import EvalSession
    from dflash_eval.training_loop.evaluator import Evaluator, SessionOptions

    class EvaluatorOptions(SessionOptions, total=False):
        """What :func:`make_evaluator` passes on to the Evaluator: its hook manager and its first session's options."""

        hooks: pluggy.PluginManager | None

__all__ = ["add_training_options", "training_checkpoints", "first_checkpoints", "history_path", "check_history",
           "make_evaluator", "judged_row", "record_row", "write_trend", "gate_training_run"]

#: How many earlier failures the ``--latest`` notice names (the rest are counted).
EARLIER_NAMED = 5
#: The gate's own notices, parts of a checkpoint's verdict: judged from its history record; earlier failures under
#: ``--latest``.
RECORDED, LATEST = "recorded", "latest"


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
    g.add_argument("--latest", action="store_true",
                   help="only the newest checkpoint of DIR / --drafter-glob (the last in step order) decides the exit "
                        "status: earlier ones not in the history yet are evaluated (the newest is judged against "
                        "them) and their failures reported without failing the gate; a newest one already in the "
                        "history is judged from its record")
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


def history_path(ns: argparse.Namespace, settings: EvalSettings) -> Path:
    """The history the gate appends to: ``--history``, default ``<report-dir>/history.jsonl``."""
    return Path(ns.history) if ns.history else Path(settings.report_dir) / "history.jsonl"


def check_history(ns: argparse.Namespace, settings: EvalSettings) -> None:
    """Read the gate's history (:func:`history_path`) before any work: a line that is not a history record (a key no
    version wrote, a field it lacks) is a ConfigError naming the file, the line and the key, answered as bad input
    before a checkpoint is evaluated or anything written (``--latest`` judges the newest checkpoint against it;
    every gate run appends to it)."""
    History(history_path(ns, settings)).read()


def make_evaluator(ns: argparse.Namespace, settings: EvalSettings, *, log: Callable[[str], None],
                   **session: Unpack[EvaluatorOptions]) -> Evaluator:
    """The gate's Evaluator: its history (``--history``), trackers (``--tensorboard``, ``--wandb``: registered on its
    hook manager, ``session``'s ``hooks`` when given), plateau window; ``session``: the Evaluator's ``hooks`` and the
    options of its first EvalSession (progress sink, server link)."""
    with importing():  # torch, with the garbage collector paused (dflash_eval.common.heap)
        from dflash_eval.training_loop.evaluator import Evaluator  # imports torch: kept out of --help

    if ns.plateau_window < 2:
        raise ConfigError(f"--plateau-window must be >= 2, got {ns.plateau_window}")
    if getattr(ns, "latest", False) and not (ns.train_dir or ns.drafter_glob):
        raise ConfigError("--latest judges the newest checkpoint of a training run: give a training folder DIR or "
                          "--drafter-glob GLOB (with --drafter every checkpoint named gates)")
    trackers: list[TensorBoardTracker | WandbTracker] = []
    if ns.tensorboard:
        trackers.append(TensorBoardTracker(Path(ns.tensorboard)))
    if ns.wandb:
        trackers.append(WandbTracker(Path(ns.wandb), config={"target": str(settings.target_model)}))
    return Evaluator(settings, history=history_path(ns, settings), trackers=trackers, log=log, worker=("master", 0, 1),
                     plateau_window=ns.plateau_window, **session)


def judged_row(evaluator: Evaluator, session: EvalSession, *, step: int | None = None) -> GateRow:
    """Evaluate ``session``'s checkpoint through ``evaluator`` (its history record appended) and make its gate row;
    a regression across steps fails the row, a plateau is a notice beside it."""
    path = session.settings.drafter
    t0 = time.perf_counter()
    try:
        result = evaluator.evaluate(path, step=step)
        assert result.drafter is not None  # evaluate fills it in
        rec = evaluator.records[-1]  # the checkpoint's verdict, composed once: the gate shows it as recorded
        row = gate_row(session.tau_summary(), rec.judgement, drafter=str(path), fingerprint=result.drafter.fingerprint)
        row.reference, row.speedup = rec.reference, rec.speedup
        if rec.plateau:
            evaluator.base.inputs.log(f"[dflash-eval] notice: {rec.plateau}")
    except DFlashEvalError as exc:
        row = error_row(str(path), exc)
    row.step = step
    row.seconds = round(time.perf_counter() - t0, 3)
    return row


def record_row(record: CheckpointRecord) -> GateRow:
    """The gate row of a checkpoint judged from its history record (not evaluated again): its means, floor and
    verdict as recorded (the floors of the run that recorded it), its regression a reason, its plateau a notice."""
    worst = min(record.prompts.items(), key=lambda kv: kv[1]) if record.prompts else None
    said = notice(RECORDED, f"judged from its history record of {record.time} (already evaluated; not again)")
    verdict = compose(said, *record.judgement.parts)
    return GateRow(drafter=record.drafter, verdict=verdict, step=record.step,
                   fingerprint=record.fingerprint, mean_tau=record.mean_tau, mean_ddtree=dict(record.mean_ddtree),
                   mean_tau_pooled=record.mean_tau_pooled, mean_ddtree_pooled=dict(record.mean_ddtree_pooled),
                   mean_floor=record.mean_floor, worst_prompt=worst[0] if worst else None,
                   worst_tau=worst[1] if worst else None,
                   reference=record.reference, speedup=record.speedup,
                   prompts={p: GatePrompt(t) for p, t in record.prompts.items()})  # a record keeps chain τ only


def write_trend(evaluator: Evaluator) -> list[Path]:
    """Close ``evaluator`` (its trackers; ``history.md`` and ``history.png`` beside the history file, from every
    record in it) and return the trend files it wrote."""

    evaluator.close()
    return list(evaluator.trend_files)


def _evaluate_found(evaluator: Evaluator, found: Found, say: Callable[[str], None]) -> GateRow:
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
    before = history.read() if getattr(ns, "latest", False) else []
    todo = [f for f in found if not history.has(str(f.path), f.step, evaluator.digest)]
    say(f"[dflash-eval] {len(found)} checkpoint(s) found, {len(found) - len(todo)} already in "
        f"{history.path}")
    done = [(f, _evaluate_found(evaluator, f, say)) for f in todo]
    newest = [found[-1]] if found else []
    if ns.watch:
        limits = WatchLimits(poll_s=ns.watch_poll, settle_s=ns.watch_settle, timeout_s=ns.watch_timeout)
        root = Path(ns.train_dir).expanduser() if ns.train_dir else None

        def evaluate_new(f: Found) -> None:
            newest[:] = [f]
            done.append((f, _evaluate_found(evaluator, f, say)))

        watch(root, evaluate_new, patterns=tuple(ns.drafter_glob), seen={f.path for f in found}, limits=limits,
              log=say)
    if getattr(ns, "latest", False) and newest:
        return _latest_rows(done, newest[0], before, evaluator.digest, say)
    return [row for _, row in done]


def _latest_rows(done: list[tuple[Found, GateRow]], newest: Found, before: list[CheckpointRecord], digest: str,
                 say: Callable[[str], None]) -> list[GateRow]:
    """``--latest``: the rows of this run, only the newest checkpoint's gating (its record's row when it was not
    evaluated now), the failures the history held before this run named in a notice on it."""
    rows = [row for _, row in done]
    mine = [row for f, row in done if f == newest]
    for r in rows:
        r.gating = any(r is m for m in mine)
    if not mine:
        rec = next((r for r in reversed(before) if r.drafter == str(newest.path) and r.step == newest.step
                    and r.settings_digest == digest), None)
        if rec is None:  # not in the history and not evaluated: cannot happen unless the history was moved away
            raise ConfigError(f"--latest: the newest checkpoint {newest.path} is neither in the history nor "
                              "evaluated in this run")
        mine = [record_row(rec)]
        rows.append(mine[0])
    failed = [r for r in before if r.settings_digest == digest and r.verdict == "fail"
              and not (r.drafter == str(newest.path) and r.step == newest.step)]
    if failed:
        named = ", ".join(f"step {r.step}" if r.step is not None else Path(r.drafter).name
                          for r in failed[-EARLIER_NAMED:])
        more = f" and {len(failed) - EARLIER_NAMED} more" if len(failed) > EARLIER_NAMED else ""
        note = (f"--latest: {len(failed)} earlier checkpoint(s) of the history failed ({named}{more}; history.md "
                "says why): reported, not gating")
        mine[0].verdict = mine[0].verdict.with_parts(notice(LATEST, note))
        say(f"[dflash-eval] notice: {note}")
    return rows
