"""The hook manager of dflash-eval outside pytest, and the calls of :mod:`dflash_eval.hookspec` that need more than
pluggy's plain call.

:func:`plugin_manager` is a ``pluggy.PluginManager("pytest")`` holding the hook specifications, with the plugins
of the ``dflash_eval`` entry-point group loaded: the :class:`~dflash_eval.training_loop.evaluator.Evaluator` and
``dflash-eval gate`` call the hooks through it, and an implementation marked ``@pytest.hookimpl`` works there as in
pytest. :func:`register_tracker` adds a tracker (:mod:`dflash_eval.training_loop.trackers`, or any object with
``log(record, result)``) as an implementation of ``pytest_dflash_eval_history_record``.

:func:`result_ready` calls each ``pytest_dflash_eval_result_ready`` implementation on its own, so that a field it adds,
a key it must not change and a rejection are each attributed to the plugin that made them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import pluggy
import pytest

from dflash_eval import hookspec
from dflash_eval.errors import PluginError
from dflash_eval.session.run_result import TOP_LEVEL_KEYS

if TYPE_CHECKING:  # both import torch: kept out of the plugins' own import
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.eval_result import EvalResult
    from dflash_eval.training_loop.history import CheckpointRecord

__all__ = ["ENTRY_POINT_GROUP", "RESERVED_KEYS", "plugin_manager", "register_tracker", "result_ready"]

ENTRY_POINT_GROUP = "dflash_eval"
HOOK_PREFIX = "pytest_dflash_eval_"
#: eval.json keys the suite adds after the hook (a plugin may not add them either; nor any other key of eval.json's
#: schema, :data:`dflash_eval.session.run_result.TOP_LEVEL_KEYS`: the result is read back typed, those keys as the
#: suite writes them).
RESERVED_KEYS = frozenset({"rejected", "verdict"})


class _Manager(pluggy.PluginManager):
    """Takes a ``pytest_dflash_eval_*`` function as an implementation with or without ``@pytest.hookimpl``, as
    pytest's own manager does for its ``pytest_`` hooks: one plugin module serves both."""

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(HOOK_PREFIX) and callable(getattr(plugin, name, None)):
            return cast("pluggy.HookimplOpts", {})  # pluggy fills in every option left out
        return opts


def plugin_manager(*, entry_points: bool = True, plugins: Iterable[tuple[str, Any]] = ()) -> pluggy.PluginManager:
    """A manager of the hook specifications (project name ``pytest``: ``@pytest.hookimpl`` marks, optional for
    the ``pytest_dflash_eval_*`` names), with the ``dflash_eval`` entry-point group's plugins (``entry_points``) and
    ``plugins`` ((name, plugin) pairs)."""
    pm = _Manager("pytest")
    pm.add_hookspecs(hookspec)
    if entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for name, plugin in plugins:
        pm.register(plugin, name)
    return pm


class _Logger(Protocol):
    """A tracker with ``log(record, result)`` only."""

    def log(self, record: CheckpointRecord, result: EvalResult) -> object: ...


class _LoggingTracker:
    """An object with ``log(record, result)`` only, as an implementation of ``pytest_dflash_eval_history_record``."""

    def __init__(self, tracker: _Logger) -> None:
        self.tracker = tracker

    @pytest.hookimpl
    def pytest_dflash_eval_history_record(self, record: CheckpointRecord, result: EvalResult) -> None:
        self.tracker.log(record, result)


def register_tracker(pm: pluggy.PluginManager, tracker: object) -> None:
    """Register ``tracker`` on ``pm``: itself when it implements ``pytest_dflash_eval_history_record``, else its ``log``
    through an adapter (once: a tracker registered already is left as it is)."""
    if pm.is_registered(tracker) or any(getattr(p, "tracker", None) is tracker for p in pm.get_plugins()):
        return
    if callable(getattr(tracker, "pytest_dflash_eval_history_record", None)):
        pm.register(tracker)
    elif callable(getattr(tracker, "log", None)):
        pm.register(_LoggingTracker(cast("_Logger", tracker)), f"tracker-{type(tracker).__name__}-{id(tracker)}")
    else:
        raise PluginError(f"tracker {tracker!r}: neither a pytest_dflash_eval_history_record implementation nor "
                          "a log(record, result) method")


def result_ready(pm: pluggy.PluginManager, settings: EvalSettings, data: dict[str, Any]) -> list[tuple[str, str]]:
    """Call every ``pytest_dflash_eval_result_ready`` implementation (in pluggy's order), each with a copy of ``data``;
    the keys it added are merged into ``data``. Returns the rejections, (plugin name, reason) each; PluginError
    naming the plugin and the key when one changed or removed a key that was there, added a reserved one, or
    returned something other than None or a string."""
    rejections = []
    for impl in reversed(pm.hook.pytest_dflash_eval_result_ready.get_hookimpls()):
        name = impl.plugin_name
        if impl.hookwrapper or impl.wrapper:
            raise PluginError(f"plugin {name!r}: pytest_dflash_eval_result_ready cannot be a wrapper")
        view = copy.deepcopy(data)
        answer = impl.function(*[{"settings": settings, "data": view}[a] for a in impl.argnames])
        _merge_fields(name, data, view)
        if answer is None:
            continue
        if not isinstance(answer, str) or not answer.strip():
            raise PluginError(f"plugin {name!r}: pytest_dflash_eval_result_ready returned {answer!r}; it returns None "
                              "(accepted) or a non-empty reason string (rejected)")
        rejections.append((name, answer.strip()))
    return rejections


def _merge_fields(plugin: str, data: dict[str, Any], view: Mapping[str, Any]) -> None:
    for key, value in data.items():
        if key not in view:
            raise PluginError(f"plugin {plugin!r} removed the key {key!r} from the result; a plugin may only add "
                              "new top-level keys")
        if view[key] is not value and view[key] != value:  # (deepcopy keeps floats: a NaN is itself)
            raise PluginError(f"plugin {plugin!r} changed the existing key {key!r} of the result; a plugin may "
                              "only add new top-level keys")
    added = [k for k in view if k not in data]
    bad = [k for k in added if not isinstance(k, str) or k in RESERVED_KEYS or k in TOP_LEVEL_KEYS]
    if bad:
        raise PluginError(f"plugin {plugin!r} added the key {bad[0]!r}, which the suite reserves "
                          f"({', '.join(sorted(RESERVED_KEYS))}, and every key of eval.schema.json, which the run "
                          "fills or leaves out itself) or which is not a string")
    data.update({k: view[k] for k in added})
