"""The dflash-eval hooks (:mod:`dflash_eval.hookspec`) in a pytest run.

pytest's plugin manager collects only ``pytest_``-prefixed names as hook implementations, so an implementation of
``dflash_eval_result_ready`` in a ``conftest.py`` or a pytest plugin is not among ``config.hook``'s even with the
specifications added (:func:`dflash_eval.pytest_plugin.hooks.pytest_addhooks`). :func:`dflash_hooks` gathers them:
a manager of the same specifications (:func:`dflash_eval.training_loop.plugins.plugin_manager`, the one the
Evaluator uses) with, for each plugin pytest holds, its ``dflash_eval_*`` implementations under the plugin's name.
It is made when a hook is called, so that ``conftest.py`` files registered during collection count.
"""

from __future__ import annotations

import types
from typing import Any

import pluggy
import pytest

from dflash_eval import hookspec
from dflash_eval.training_loop.plugins import plugin_manager

__all__ = ["dflash_hooks", "HOOK_NAMES"]

HOOK_NAMES = tuple(hookspec.__all__)


def _implementations(plugin: Any) -> dict[str, Any]:
    """The hook implementations of ``plugin`` (only the hooks' names are read: other attributes may not be)."""
    try:
        names = [n for n in dir(plugin) if n in HOOK_NAMES]
    except Exception:  # noqa: BLE001 - an object pytest holds that cannot list its attributes implements nothing
        return {}
    return {n: f for n in names if getattr(getattr(f := getattr(plugin, n), "__func__", f), "pytest_impl", None)
            is not None}


def dflash_hooks(config: pytest.Config) -> pluggy.PluginManager:
    """The hook manager of this run (module docstring)."""
    pm = plugin_manager(entry_points=False)
    for name, plugin in config.pluginmanager.list_name_plugin():
        impls = _implementations(plugin) if plugin is not None else {}
        if impls:
            pm.register(types.SimpleNamespace(**impls), name)
    return pm
