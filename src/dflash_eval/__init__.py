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

    evaluator = Evaluator(settings, history=True)  # target, prompts, completions and features: once
    result = evaluator.evaluate(drafter_module, step=step)   # a path, a state dict + config=, or the live module

Packages, by concern: ``options`` (declared once, parsed, preflight checks), ``prompts`` (sets, files, formatting),
``target`` (the target model, its kernels and features), ``drafter`` (config, model, checkpoints, checks),
``sglang`` (the completion server), ``cache`` (the on-disk cache), ``metrics`` (τ, drift, drift budget, floors,
verdict), ``suite`` (the stages of one run), ``report`` (eval.json, eval.md, plots), ``golden`` (the golden
records), ``pytest_plugin`` and ``cli`` (the two front ends). ``testing`` builds random tiny models for tests and
is not part of the wheel.

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
    "EvalResult": "dflash_eval.results.eval_result",
    "TauSummary": "dflash_eval.results.eval_result",
    "PromptTau": "dflash_eval.evaluation.drafter_evaluation",
    "Evaluator": "dflash_eval.training_loop.evaluator",
    "History": "dflash_eval.training_loop.history",
    "CheckpointRecord": "dflash_eval.training_loop.history",
}

__all__ = ["__version__", *_LAZY, "DFlashEvalError", "ConfigError", "CheckpointError", "ArchitectureMismatch",
           "DrafterRefused", "BackendError", "CacheError", "EvalError"]

if TYPE_CHECKING:
    # re-exported for type checkers (`X as X`); at run time __getattr__ imports them on first use
    from dflash_eval.evaluation.drafter_evaluation import PromptTau as PromptTau
    from dflash_eval.options.settings import EvalSettings as EvalSettings
    from dflash_eval.results.eval_result import EvalResult as EvalResult
    from dflash_eval.results.eval_result import TauSummary as TauSummary
    from dflash_eval.session.eval_session import EvalSession as EvalSession
    from dflash_eval.training_loop.evaluator import Evaluator as Evaluator
    from dflash_eval.training_loop.history import CheckpointRecord as CheckpointRecord
    from dflash_eval.training_loop.history import History as History


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dflash_eval' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
