"""The plugin's per-process state in ``config.stash``: resolved settings (or the error resolving them), the
session, the SGLang service, the results of workers and the test outcomes."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dflash_eval.common.heap import (
    COMMAND_ENTRIES,
    freeze_at_exit,
    freezes_at_exit,
    importing,
    own_process,
    started_as,
)
from dflash_eval.errors import DFlashEvalError
from dflash_eval.options.settings import EvalSettings, resolve, worker_info
from dflash_eval.pytest_plugin.progress_reporter import progress_sink
from dflash_eval.references.server_link import ServerLink

if TYPE_CHECKING:  # the session (and torch) is imported when a test needs it, not when the plugin loads
    from dflash_eval.session.eval_result import EvalResult
    from dflash_eval.session.eval_session import EvalSession
    from dflash_eval.session.run_result import RunResult

__all__ = ["settings_from_config", "get_settings", "get_session", "SESSION", "SETTINGS", "FRAGMENTS", "OUTCOMES",
           "SKIPS", "START", "SGLANG", "RESULT", "MESSAGES", "REJECTED", "UNREAD", "is_controller", "enter_config",
           "claim_heap", "freeze_heap_if_ending"]

SESSION = pytest.StashKey["EvalSession"]()
SETTINGS = pytest.StashKey["EvalSettings | Exception"]()
FRAGMENTS = pytest.StashKey[list["EvalResult"]]()  # each process's result, typed (a worker's read once)
OUTCOMES = pytest.StashKey[dict]()
SKIPS = pytest.StashKey[dict]()  # node id -> the reason a suite test was skipped: what the run did not check
START = pytest.StashKey[float]()
SGLANG = pytest.StashKey[Any]()
RESULT: pytest.StashKey[RunResult] = pytest.StashKey()  # the run's result, its verdict composed: every report reads it
MESSAGES = pytest.StashKey[list]()
REJECTED = pytest.StashKey[list]()  # why the run fails although its tests passed: a plugin rejected its result
UNREAD = pytest.StashKey[list[str]]()  # a worker's result the controller could not read: why, naming the worker


def settings_from_config(config: pytest.Config, *, check: bool = True) -> EvalSettings:
    """Resolve every option (CLI > env > ini > default) into :class:`EvalSettings` (raises ConfigError);
    ``check=False``: values parsed but not validated (no torch import)."""
    root = Path(config.rootpath)
    return resolve(lambda name: config.getoption(name, default=None), environ=os.environ, ini=config.getini,
                   invocation_dir=Path(config.invocation_params.dir), root=root,
                   ini_dir=Path(config.inipath).parent if config.inipath else root, check=check)


def get_settings(config: pytest.Config) -> EvalSettings:
    """The run's settings (CLI > env > ini > default), resolved once; raises the resolution error every time."""
    if SETTINGS not in config.stash:
        try:
            config.stash[SETTINGS] = settings_from_config(config)
        except DFlashEvalError as exc:
            config.stash[SETTINGS] = exc
    s = config.stash[SETTINGS]
    if isinstance(s, Exception):
        raise s
    return s


def get_session(config: pytest.Config) -> EvalSession:
    """The process's EvalSession (created on first use, after torch's thread count is set for this process; its
    progress lines go to the plugin's reporter)."""
    if SESSION not in config.stash:
        settings = get_settings(config)  # bad options raise here, before the session (and torch) is imported
        with importing():
            from dflash_eval.common.threads import set_torch_threads  # imports torch: kept out of --help
            from dflash_eval.session.eval_session import EvalSession  # imports torch: kept out of --help

        name, index, count = worker_info()
        set_torch_threads(settings.torch_threads, count)  # once per process, before any stage computes
        # the sglang fixture attaches its service's client to the link when completions are not cached
        session = EvalSession(settings, worker=(name, index, count), progress=progress_sink(config),
                              server=ServerLink())
        config.stash[SESSION] = session
        freeze_at_exit()  # a process that held a session ends with the torch/transformers heap in memory
    return config.stash[SESSION]


_CONFIGS: list[pytest.Config] = []  # the configs of this process's pytest runs, outermost first


def enter_config(config: pytest.Config) -> None:
    """Note a pytest run of this process (``pytest_configure``): :func:`freeze_heap_if_ending` freezes only the
    outermost one's heap."""
    _CONFIGS.append(config)


def claim_heap(config: pytest.Config) -> None:
    """A process that ends with this run of the suite is declared the heap's owner
    (:func:`dflash_eval.common.heap.own_process`): its heavy imports freeze what they made."""
    if _ends_with(config):
        own_process()


def freeze_heap_if_ending(config: pytest.Config) -> None:
    """At the start of ``pytest_unconfigure``: when the process ends with this run (see :func:`_ends_with`) and held a
    session, freeze the heap now instead of at interpreter exit.

    pytest's unraisable-exception plugin runs a full garbage collection at ``pytest_unconfigure`` and again in its
    cleanup, to report exceptions raised in ``__del__`` of objects freed by those collections: two walks of the whole
    torch/transformers heap, about 0.4 s of a warm run's 7-8 s on two cores. With the heap frozen they walk only
    the objects made after the freeze. What is given up is their report of an exception in the ``__del__`` of an
    object caught in a reference cycle and left until the run's end; exceptions raised while the tests run are
    reported at each test as before."""
    _CONFIGS[:] = [c for c in _CONFIGS if c is not config]
    if freezes_at_exit() and _ends_with(config):
        gc.freeze()


def _ends_with(config: pytest.Config) -> bool:
    """Whether this process ends once ``config``'s run ends: an xdist worker, or the outermost run of a process
    started as ``pytest`` / ``python -m pytest`` / ``dflash-eval`` (never a run inside another one, e.g. pytester's
    in-process runs, nor ``pytest.main`` called from a program that goes on, e.g. a training loop)."""
    if any(c is not config for c in _CONFIGS):  # an enclosing run of this process is still going
        return False
    if not is_controller(config):
        return True
    return started_as("pytest.__main__", "pytest", "py.test", *COMMAND_ENTRIES)


def is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")
