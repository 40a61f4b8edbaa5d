"""The in-process API: one :class:`Evaluator` per target and prompt set, ``evaluate(drafter, step=...)`` per checkpoint.

Everything that does not depend on the drafter (prompts and their token ids, the target's head, the reference
completions, the target features) is produced once by the first call, from the cache when it is warm, and kept in
memory: each later call costs drafter work only (no target forward, no cache read of features). ``evaluate``
returns the suite's typed result (:class:`~dflash_eval.session.eval_result.EvalResult`, the fields behind eval.json);
the verdict of the checkpoint, against the floors and across steps, is the :class:`~dflash_eval.training_loop.
history.CheckpointRecord` in :attr:`Evaluator.records` (and, given a history file, appended to it). With a history
file, :meth:`Evaluator.close` (or the ``with`` block's end) writes the trend table ``history.md`` and the plot
``history.png`` beside it, atomically; :meth:`Evaluator.write_trend` writes them at any time.

Example (a training loop)::

    from dflash_eval import Evaluator
    with Evaluator({"target_model": "fixtures/target", "prompts": "fixtures/prompts.jsonl",
                    "report_dir": "runs/x/eval"}, history=True) as ev:
        for step in range(total):
            train_step(drafter)
            if step % 500 == 0:
                result = ev.evaluate(drafter, step=step)   # the live module, on its device, in training mode
                print(step, result.tau.mean_tau, ev.records[-1].verdict)
    # runs/x/eval/history.jsonl, history.md, history.png

``dflash-eval gate`` evaluates every checkpoint through this class. The Evaluator is a client of
:class:`~dflash_eval.session.eval_session.EvalSession` (one per checkpoint, sharing the first one's stages and
reference drafter); the session never calls back into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict, Unpack

import pluggy

from dflash_eval.common.progress import Sink
from dflash_eval.errors import ConfigError, ResultRejected
from dflash_eval.inputs.run_inputs import DRAFTER_OPTIONS, Inputs
from dflash_eval.measurements.round_costs import ROUND_COSTS
from dflash_eval.options.preflight import target_config_problem
from dflash_eval.options.settings import TAU_OPTIONS, EvalSettings
from dflash_eval.references.server_link import ServerLink
from dflash_eval.session.eval_result import EvalResult
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.session.reference_drafter import ReferenceTau
from dflash_eval.training_loop.drafter_input import (
    DrafterConfigSource,
    DrafterInput,
    DrafterSource,
    drafter_input,
    evaluation_mode,
)
from dflash_eval.training_loop.history import CheckpointRecord, History
from dflash_eval.training_loop.plugins import plugin_manager, register_tracker, result_ready
from dflash_eval.training_loop.trend_plot import write_trend_plot
from dflash_eval.training_loop.trend_table import write_trend_table

__all__ = ["Evaluator", "SessionOptions", "settings_digest"]


class SessionOptions(TypedDict, total=False):
    """The options of an Evaluator's first :class:`~dflash_eval.session.eval_session.EvalSession` besides its settings,
    worker and log: its progress sink and its server link."""

    progress: Sink | None | str
    server: ServerLink | None


def settings_digest(session: EvalSession) -> str:
    """A digest of what makes τ of two checkpoints comparable: the options declared ``affects_tau``
    (:data:`~dflash_eval.options.settings.TAU_OPTIONS`) but the drafter's own, the target's content identity and the
    selected prompt ids (records of one digest are compared across steps)."""
    s = session.settings.to_dict()
    kept = {k: v for k, v in s.items() if k in TAU_OPTIONS and k not in DRAFTER_OPTIONS}
    kept["dtype"], kept["device"] = str(session.settings.torch_dtype), session.settings.torch_device.type
    doc = {"settings": kept, "target": session.inputs.target_identity,
           "prompts": [p.id for p in session.inputs.prompts]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Evaluator:
    """τ of drafter checkpoints against one target and prompt set (see module docstring).

    Args:
        settings: :class:`~dflash_eval.EvalSettings`, or a mapping of option names to values
            (``EvalSettings.from_mapping``: relative paths against the current folder).
        history: a :class:`History`, a JSONL path, or True for ``<report_dir>/history.jsonl``; every evaluation
            appends one record to it, and :meth:`close` writes ``history.md`` and ``history.png`` beside it.
            None/False: records are kept in memory only (:attr:`records`), and no file is written.
        trackers: objects with ``log(record, result)`` and ``close()`` (:mod:`dflash_eval.training_loop.trackers`),
            registered on ``hooks`` as implementations of ``pytest_dflash_eval_history_record``.
        hooks: the manager of the dflash-eval hooks (:mod:`dflash_eval.hookspec`); default: a
            :func:`~dflash_eval.training_loop.plugins.plugin_manager` (the ``dflash_eval`` entry-point group's plugins).
        log: where progress lines go (default: nowhere).
        drift_budget: also measure each checkpoint's drift budget (drafter work: one τ simulation per ladder level).
        speedup: also predict each checkpoint's speed-up over plain decoding on this device (eval.json's ``speedup``,
            the record's, the trackers' ``speedup/*``; judged against ``--speedup-floor``): the round costs are timed
            once per target, drafter shape and device and cached (docs/speedup.md).
        plateau_window: K of the plateau notice (no gain beyond noise over the last K checkpoints).
        session_options: passed on to the first :class:`~dflash_eval.session.eval_session.EvalSession` (e.g. its
            progress sink), whose stages every later session shares.
    """

    def __init__(self, settings: EvalSettings | Mapping[str, Any] | None = None, *,
                 history: History | str | Path | bool | None = None, trackers: Sequence[Any] = (),
                 hooks: pluggy.PluginManager | None = None,
                 log: Callable[[str], None] | None = None, worker: tuple[str, int, int] | None = None,
                 drift_budget: bool = False, plateau_window: int = 4, speedup: bool = True,
                 **session_options: Unpack[SessionOptions]) -> None:
        if not isinstance(settings, EvalSettings):
            settings = EvalSettings.from_mapping(dict(settings or {}), base=Path.cwd())
        if plateau_window < 2:
            raise ValueError(f"plateau_window must be >= 2, got {plateau_window}")
        self.settings = settings
        self.base = EvalSession(settings, worker=worker, log=log, **session_options)
        if history is True:
            history = settings.report_dir / "history.jsonl"
        self.history: History | None = history if isinstance(history, History) else \
            History(Path(history)) if history else None
        self.trackers = list(trackers)
        self.hooks = hooks if hooks is not None else plugin_manager()
        for tracker in self.trackers:
            register_tracker(self.hooks, tracker)
        self.data: dict[str, Any] | None = None  # the last evaluation's mapping, with the fields plugins added
        self.drift_budget, self.plateau_window = drift_budget, plateau_window
        self.speedup = speedup
        self.records: list[CheckpointRecord] = []
        self.trend_files: list[Path] = []  # what the last write_trend() wrote
        self._digest: str | None = None
        self._pending: dict[str, EvalSession] = {}
        self._warned: set[str] = set()
        self._closed = False

    @property
    def inputs(self) -> Inputs:
        """The shared drafter-independent stage (:class:`~dflash_eval.inputs.run_inputs.Inputs`)."""
        return self.base.inputs

    @property
    def digest(self) -> str:
        """:func:`settings_digest` of this evaluator's settings."""
        if self._digest is None:
            self._digest = settings_digest(self.base)
        return self._digest

    def check_inputs(self) -> None:
        """The drafter-independent inputs, checked before any work: the target's config.json and tokenizer files,
        the prompts (ConfigError naming the file). A drafter's own files are checked when it is evaluated."""
        problem = target_config_problem(self.settings)
        if problem is not None:
            raise ConfigError(f"unusable inputs:\n  {problem}")
        self.inputs.target_dir.check_json_files()
        self.inputs.check_prompts()  # JSONL errors name the line

    # ------------------------------------------------------------------------------------------------ sessions
    def _input(self, drafter: DrafterSource, config: DrafterConfigSource | None, name: str | None) -> DrafterInput:
        s = self.settings
        on_disk = isinstance(drafter, (str, os.PathLike))  # its config is read with the checkpoint
        return drafter_input(drafter, config=config, name=name, device=s.torch_device, dtype=s.torch_dtype,
                             num_target_layers=None if on_disk else self.inputs.num_layers,
                             vocabulary=None if on_disk else self.inputs.vocabulary)

    def _new_session(self, src: DrafterInput) -> EvalSession:
        settings = replace(self.settings, drafter=src.path) if src.path is not None else self.settings
        return EvalSession(settings, shared=self.base, checkpoint=src.checkpoint, live=src.live)

    def session(self, drafter: DrafterSource | None = None, *, config: DrafterConfigSource | None = None,
                name: str | None = None) -> EvalSession:
        """The :class:`~dflash_eval.session.eval_session.EvalSession` of ``drafter`` (a path; None:
        ``settings.drafter``, this evaluator's own first session) sharing this evaluator's inputs. A path's session is
        kept until :meth:`evaluate` evaluates that path (its checks already run)."""
        if drafter is None:
            return self.base
        src = self._input(drafter, config, name)
        if src.path is not None and str(src.path) in self._pending:
            return self._pending[str(src.path)]
        session = self._new_session(src)
        if src.path is not None:
            self._pending[str(src.path)] = session
        return session

    def reference(self) -> ReferenceTau | None:
        """τ of ``--reference-drafter`` on the shared prompts, measured once (None without it)."""
        return self.base.reference_tau()

    # ------------------------------------------------------------------------------------------------ evaluate
    def evaluate(self, drafter: DrafterSource | None = None, *, step: int | None = None,
                 config: DrafterConfigSource | None = None,
                 name: str | None = None) -> EvalResult:
        """Evaluate one drafter: a checkpoint path (None: ``settings.drafter``), a state dict with ``config``, or
        a live drafter module (see :mod:`~dflash_eval.training_loop.drafter_input`). ``step``: the training step,
        recorded in the history and the result's ``drafter.step``; ``name``: its label in reports.

        Raises the suite's errors: ConfigError / CheckpointError for bad input, DrafterRefused when the drafter
        does not fit the target (naming every failed architecture check)."""
        src = self._input(drafter if drafter is not None else self.settings.drafter, config, name)
        session = self._pending.pop(str(src.path), None) if src.path is not None else None
        session = session or self._new_session(src)
        with evaluation_mode(src.module):
            session.tau_summary()
            self.reference()  # the reference drafter's τ (once), beside the drafter's in drafter.reference
            if self.drift_budget:
                session.drift_budget()
            session.measure_registered()
            if self.speedup:  # the round costs (cached per drafter shape and device); result() predicts from them
                session.evaluation.measure(ROUND_COSTS)
            result = session.result()
        assert result.drafter is not None and result.tau is not None
        result.drafter.path, result.drafter.step = src.label, step
        self.data = result.to_dict()
        rejected = result_ready(self.hooks, self.settings, self.data)
        if rejected:
            raise ResultRejected(*rejected[0])
        # the checkpoint's verdict, composed once: its floors (unjudged, not failed, when there are none), --baseline
        # and --speedup-floor; the record adds the verdicts across steps
        verdict = result.tau.verdict(session.floors, floors_required=False, speedup=result.speedup)
        for notice in verdict.notices:  # e.g. floors that judge nothing: said once per evaluator
            if notice not in self._warned:
                self._warned.add(notice)
                warnings.warn(notice, UserWarning, stacklevel=2)
        record = CheckpointRecord.of(result, step=step, digest=self.digest, verdict=verdict)
        record = self.history.append(record, window=self.plateau_window) if self.history else \
            record.judged([r for r in self.records if r.settings_digest == self.digest], self.plateau_window)
        self.records.append(record)
        self.hooks.hook.pytest_dflash_eval_history_record(record=record, history=self.history or None, result=result)
        return result

    def write_trend(self) -> list[Path]:
        """Write ``history.md`` (the trend table, :func:`~dflash_eval.training_loop.trend_table.write_trend_table`)
        and ``history.png`` (:func:`~dflash_eval.training_loop.trend_plot.write_trend_plot`) beside the history
        file, from every record in it, each atomically (a reader sees the old file or the new one, never a torn
        one); returns their paths (also :attr:`trend_files`). Nothing without a history file or a record."""
        if self.history is None:
            return []
        records = self.history.read()
        if not records:
            return []
        paths = [write_trend_table(records, self.history.path.with_suffix(".md"))]
        png = write_trend_plot(records, self.history.path.with_suffix(".png"))
        self.trend_files = paths + ([png] if png is not None else [])
        return self.trend_files

    def close(self) -> None:
        """Close the trackers (flushes their files), then write the trend files (:meth:`write_trend`). Once: a
        second call does nothing. The trackers are closed even when the trend files cannot be written (a
        :class:`~dflash_eval.errors.StorageError` naming the file)."""
        if self._closed:
            return
        self._closed = True
        try:
            for tracker in self.trackers:
                tracker.close()
        finally:
            self.write_trend()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
