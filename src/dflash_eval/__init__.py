"""dflash-eval: evaluate DFlash speculative-decoding drafters as pytest tests.

The public face is what this module exports; every other module is private by convention and may move.

    from dflash_eval import EvalSession, EvalSettings

    settings = EvalSettings.from_mapping({"target_model": "fixtures/target", "drafter": "fixtures/drafter",
                                          "prompts": "fixtures/prompts.jsonl"})
    session = EvalSession(settings)
    summary = session.tau_summary()               # computes τ; session.result() then holds it (eval.json's data)
    print(summary.mean_tau, summary.mean_ddtree)

In a training loop, :class:`Evaluator` (docs/training-loop.md) evaluates checkpoints or a live drafter module
against one target and prompt set, keeping a history of τ over steps.

    from dflash_eval import Evaluator              # evaluate while you train (docs/training-loop.md)

    evaluator = Evaluator(settings, history=True,  # target, prompts, completions and features: once
                          trackers=[TensorBoardTracker("runs/x/tb")])   # τ, its CI, floor, verdict as scalars
    result = evaluator.evaluate(drafter_module, step=step)   # a path, a state dict + config=, or the live module
    evaluator.close()                              # history.md (trend_table) and history.png (trend plot)

The trend table and plot of any records: :func:`trend_table`, :func:`write_trend_table`, :func:`write_trend_plot`;
the scalars a tracker logs: :func:`tracker_scalars` (names: :data:`TRACKER_SCALARS`). The drafter being trained:
:class:`DFlashDrafter` built from a :class:`DrafterConfig`, saved with :func:`save_drafter`.

Packages, by concern, from the lowest layer up (tests/test_layout.py holds the order): ``common`` (atomic writes, paths,
number formatting; the process's progress, timings and threads), ``cache`` (the on-disk cache), ``prompts`` (sets,
files, formatting), ``sglang`` (the completion server), ``target`` (the target model, its kernels and features),
``drafter`` (config, model, checkpoints, checks), ``metrics`` (τ, drift, drift budget, floors, the verdict), ``options``
(declared once, parsed, preflight checks), ``inputs`` (what a run needs besides the drafter), ``references`` (reference
completions: local, from a server and checked, cached), ``features`` (the target's hidden states), ``measurements`` (the
registry of measurements and the built-in ones; one drafter evaluated through them), ``session`` (one run composed, and
what it measured as one typed result), ``golden`` (the golden records), ``report`` (eval.json, eval.md, eval.html,
plots, gate.json), ``training_loop`` (the Evaluator, the history, trackers), ``pytest_plugin`` and ``cli`` (the two
front ends). ``testing`` builds random tiny models for tests and is not part of the wheel.

Importing this module imports neither torch nor transformers: the names below load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from dflash_eval.errors import (
    ArchitectureMismatch,
    BackendError,
    CacheError,
    CheckpointError,
    ConfigError,
    DFlashEvalError,
    DrafterRefused,
    EvalError,
)

__version__ = "0.1.0"

_LAZY = {
    "EvalSettings": "dflash_eval.options.settings",
    "EvalSession": "dflash_eval.session.eval_session",
    "EvalResult": "dflash_eval.session.eval_result",
    "TauSummary": "dflash_eval.session.eval_result",
    "PromptTau": "dflash_eval.measurements.drafter_evaluation",
    "Evaluator": "dflash_eval.training_loop.evaluator",
    "History": "dflash_eval.training_loop.history",
    "CheckpointRecord": "dflash_eval.training_loop.history",
    "trend_table": "dflash_eval.training_loop.trend_table",
    "write_trend_table": "dflash_eval.training_loop.trend_table",
    "write_trend_plot": "dflash_eval.training_loop.trend_plot",
    "TensorBoardTracker": "dflash_eval.training_loop.trackers",
    "WandbTracker": "dflash_eval.training_loop.trackers",
    "DFlashDrafter": "dflash_eval.drafter.model",
    "DrafterConfig": "dflash_eval.drafter.config",
    "save_drafter": "dflash_eval.drafter.checkpoint",
    "tracker_scalars": "dflash_eval.training_loop.trackers",
    "TRACKER_SCALARS": "dflash_eval.training_loop.trackers",
}

__all__ = ["__version__", *_LAZY, "DFlashEvalError", "ConfigError", "CheckpointError", "ArchitectureMismatch",
           "DrafterRefused", "BackendError", "CacheError", "EvalError"]

if TYPE_CHECKING:
    # re-exported for type checkers (`X as X`); at run time __getattr__ imports them on first use
    from dflash_eval.drafter.checkpoint import save_drafter as save_drafter
    from dflash_eval.drafter.config import DrafterConfig as DrafterConfig
    from dflash_eval.drafter.model import DFlashDrafter as DFlashDrafter
    from dflash_eval.measurements.drafter_evaluation import PromptTau as PromptTau
    from dflash_eval.options.settings import EvalSettings as EvalSettings
    from dflash_eval.session.eval_result import EvalResult as EvalResult
    from dflash_eval.session.eval_result import TauSummary as TauSummary
    from dflash_eval.session.eval_session import EvalSession as EvalSession
    from dflash_eval.training_loop.evaluator import Evaluator as Evaluator
    from dflash_eval.training_loop.history import CheckpointRecord as CheckpointRecord
    from dflash_eval.training_loop.history import History as History
    from dflash_eval.training_loop.trackers import TRACKER_SCALARS as TRACKER_SCALARS
    from dflash_eval.training_loop.trackers import TensorBoardTracker as TensorBoardTracker
    from dflash_eval.training_loop.trackers import WandbTracker as WandbTracker
    from dflash_eval.training_loop.trackers import tracker_scalars as tracker_scalars
    from dflash_eval.training_loop.trend_plot import write_trend_plot as write_trend_plot
    from dflash_eval.training_loop.trend_table import trend_table as trend_table
    from dflash_eval.training_loop.trend_table import write_trend_table as write_trend_table


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dflash_eval' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
