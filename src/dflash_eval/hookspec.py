"""Hook specifications of dflash-eval: what a plugin may implement (docs/reference.md, "Hooks").

As pytest-benchmark does with its ``pytest_benchmark_*`` hooks: in pytest the plugin adds them in
``pytest_addhooks``, so any pytest plugin or ``conftest.py`` implements them like pytest's own hooks (a function of
the hook's name). Outside pytest (the :class:`~dflash_eval.training_loop.evaluator.Evaluator`, ``dflash-eval gate``)
a ``pluggy.PluginManager("pytest")`` holds the same specifications and loads the plugins of the ``dflash_eval``
entry-point group (:mod:`dflash_eval.training_loop.plugins`): one implementation serves both.

This module is the package's lowest layer: at run time it imports only pytest and typing. Its parameters are typed
as pytest's own hookspec types them: the classes are imported for type checkers only (``TYPE_CHECKING``), so a
plugin's implementation is checked against them and nothing above this layer is imported with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the parameters' types, for type checkers only (tests/test_layout.py allows these alone)
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.eval_result import EvalResult
    from dflash_eval.sglang.client import ReferenceClient
    from dflash_eval.training_loop.history import CheckpointRecord, History

__all__ = ["pytest_dflash_eval_result_ready", "pytest_dflash_eval_history_record",
           "pytest_dflash_eval_reference_server"]

hookspec = pytest.hookspec


@hookspec
def pytest_dflash_eval_result_ready(settings: EvalSettings, data: dict[str, Any]) -> str | None:
    """A run's eval.json mapping is ready: in pytest on the controller with the merged data, before the reports
    are written; in the :class:`~dflash_eval.training_loop.evaluator.Evaluator` with the evaluation's own mapping
    (the mapping its eval.json fields come from), before its history record is made.

    :param settings: the run's :class:`~dflash_eval.options.settings.EvalSettings`.
    :param data: the mapping; an implementation may add new top-level keys to it. Changing or removing a key that
        was there, or adding one the suite adds after the hook (``rejected``, ``verdict``) or any other key of
        eval.json's schema (one the run left out, e.g. ``speedup``), is refused (a
        :class:`~dflash_eval.errors.PluginError` naming the plugin and the key).
    :return: None to accept the result, or a reason string to reject it: a rejected pytest run fails (exit 1, the
        reason printed and recorded in eval.json's ``rejected``); the Evaluator raises
        :class:`~dflash_eval.errors.ResultRejected` naming the plugin and the reason.
    """


@hookspec
def pytest_dflash_eval_history_record(record: CheckpointRecord, history: History | None, result: EvalResult) -> None:
    """A checkpoint's record was appended to the training history (the Evaluator, hence ``dflash-eval gate`` too).

    :param record: the judged :class:`~dflash_eval.training_loop.history.CheckpointRecord`.
    :param history: the :class:`~dflash_eval.training_loop.history.History` it was appended to, or None when the
        Evaluator keeps its records in memory only (``Evaluator.records``).
    :param result: the :class:`~dflash_eval.session.eval_result.EvalResult` the record was made from.

    The project's TensorBoard and W&B trackers (:mod:`dflash_eval.training_loop.trackers`) implement it.
    """


@hookspec(firstresult=True)
def pytest_dflash_eval_reference_server(settings: EvalSettings) -> ReferenceClient | None:
    """A ready client for the reference completions, instead of the suite launching or connecting to an SGLang
    server (``--sglang-launch`` / ``--sglang-url``); asked only when completions must be fetched.

    :param settings: the run's :class:`~dflash_eval.options.settings.EvalSettings`.
    :return: an object with :class:`~dflash_eval.sglang.client.SGLangClient`'s interface
        (:class:`~dflash_eval.sglang.client.ReferenceClient`: ``generate_greedy``, ``generate_sampled``, ``url``,
        ``model_info``), ready and serving the target; None lets the suite do as
        without the hook. The first non-None answer is used.
    """
