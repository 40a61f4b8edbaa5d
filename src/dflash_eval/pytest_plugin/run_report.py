"""The end of a run, between pytest and :mod:`dflash_eval.report.run_end`: each process's result gathered, typed (an
xdist worker hands its own to the controller through ``workeroutput`` as JSON, which the controller reads back once;
the controller's own is kept as it is), the reports written on the controller with the junit properties, and the
terminal's dflash-eval section. The hooks in :mod:`.hooks` call these."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from dflash_eval import report
from dflash_eval.errors import DFlashEvalError, EvalError, PluginError, ResultKeyError
from dflash_eval.metrics.verdict import reports_part, run_fails, run_verdict
from dflash_eval.pytest_plugin.junit import add_junit_properties
from dflash_eval.pytest_plugin.state import (
    FRAGMENTS,
    MESSAGES,
    OUTCOMES,
    REJECTED,
    RESULT,
    SESSION,
    SKIPS,
    START,
    UNREAD,
    get_settings,
    is_controller,
)
from dflash_eval.report.run_end import measured, terminal_section
from dflash_eval.session.run_result import TOP_LEVEL_KEYS, Rejection, RunResult
from dflash_eval.training_loop.plugins import result_ready

if TYPE_CHECKING:  # imports torch: kept out of the plugin's own import
    from dflash_eval.options.settings import EvalSettings

__all__ = ["WORKEROUTPUT_KEY", "REPORT_FAILED", "gather_worker_result", "write_run_reports", "fail_a_refused_run",
           "write_terminal_section"]

WORKEROUTPUT_KEY = "dflash_eval_fragment"
REPORT_FAILED = pytest.StashKey[str]()  # why the reports (or the golden updates) could not be written


class WorkerNode(Protocol):
    """What the plugin reads of an xdist worker's handle on the controller (xdist ships no types): its config and
    the input it starts with (its output, once it is down, is read with ``getattr``)."""

    config: pytest.Config
    workerinput: dict[str, Any]


def gather_worker_result(node: WorkerNode) -> None:
    """xdist controller: keep the result a finished worker sent, read once as its typed result; a result that cannot
    be read is kept as why, naming the worker and the key (the reports then fail on it: :func:`write_run_reports`)."""
    # torch: the process's result module imports it (its builders); this hook runs once per worker, at its end
    from dflash_eval.session.eval_result import EvalResult

    raw = (getattr(node, "workeroutput", {}) or {}).get(WORKEROUTPUT_KEY)
    if not raw:
        return
    worker = node.workerinput.get("workerid", "?")
    try:
        node.config.stash[FRAGMENTS].append(EvalResult.from_dict(json.loads(raw)))
    except ResultKeyError as exc:  # its message: the key's path
        node.config.stash.setdefault(UNREAD, []).append(str(exc.in_file(f"worker {worker}'s result")))
    except Exception as exc:  # noqa: BLE001 - an unreadable result fails the reports, never the controller
        node.config.stash.setdefault(UNREAD, []).append(f"worker {worker}'s result: {type(exc).__name__}: {exc}")


def _own_result(config: pytest.Config) -> bool:
    """This process's result, sent to the controller as JSON (a worker: True, nothing more to do here) or kept as it
    is."""
    sess = config.stash.get(SESSION, None)
    if sess is None:
        return False
    result = sess.result()
    if not is_controller(config):
        config.workeroutput[WORKEROUTPUT_KEY] = json.dumps(result.to_dict())  # type: ignore[attr-defined]  # xdist's
        return True
    if not config.pluginmanager.has_plugin("dsession"):  # an xdist controller only checked the inputs
        config.stash[FRAGMENTS].append(result)
    return False


def write_run_reports(config: pytest.Config, *, failed_tests: int, exitstatus: int) -> None:
    """The controller merges every process's typed result into the run's (:func:`dflash_eval.session.merge.merge`),
    hands its data to the plugins, composes its verdict (``failed_tests``: the run's failed tests and errors;
    ``exitstatus``: pytest's; :func:`dflash_eval.report.write.conclude`) and writes the reports (and the golden
    updates) from it; the result and the lines for the terminal go to the stash, the mean τ and the verdict to the
    junit XML: every one of them, and the exit status, reads that one result. A failure (a worker's result that
    cannot be read among them) is one line for the terminal naming the file or the worker and the cause, never an
    internal error of the test run, and it fails the run (:func:`fail_a_refused_run`) and its verdict: a CI step must
    not pass without its reports."""
    run: RunResult | None = None
    try:
        if _own_result(config) or not is_controller(config):
            return
        unread = config.stash.get(UNREAD, [])
        if unread:
            raise EvalError("; ".join(unread))
        frags = config.stash[FRAGMENTS]
        if not frags or not measured(frags):
            return
        try:
            settings = get_settings(config)
        except DFlashEvalError:
            return
        run = report.merge(frags, outcomes=config.stash[OUTCOMES], skipped=config.stash.get(SKIPS, {}),
                           wall_s=time.time() - config.stash[START])
        run = _result_ready(config, settings, run)
        if run is None:
            return
        concluded = report.conclude(run, settings, failed_tests=failed_tests, exitstatus=exitstatus)
        result = config.stash[RESULT] = concluded.result  # printed even when a file cannot be written
        config.stash[MESSAGES] = concluded.messages + report.finish(result, settings) + [
            f"dflash-eval: {m}" for m in config.stash.get(REJECTED, [])]

        add_junit_properties(config, result)
    except Exception as exc:  # noqa: BLE001 - reporting must never turn a test run into an internal error
        why = f"could not write the reports: {type(exc).__name__}: {exc}"
        config.stash[REPORT_FAILED] = why
        config.stash[MESSAGES] = [f"dflash-eval: {why}; the run fails"]
        if is_controller(config):
            run = config.stash.get(RESULT, run)  # the merged result where the failure came before its verdict
            if run is not None:  # the verdict the terminal prints: the run's, failed by its reports
                verdict = run_verdict(run, failed_tests=failed_tests, exitstatus=exitstatus)
                config.stash[RESULT] = dataclasses.replace(run, verdict=verdict.with_parts(reports_part()))


def _result_ready(config: pytest.Config, settings: EvalSettings, run: RunResult) -> RunResult | None:
    """The ``pytest_dflash_eval_result_ready`` implementations see the run's data (:meth:`RunResult.to_dict`); the
    run with the fields they added (:attr:`RunResult.plugin_fields`) and their rejections (``rejected``). None, with
    the message for the terminal, when a plugin broke the hook's rules: the run fails and no report is written."""
    data = run.to_dict()
    try:
        rejected = result_ready(config.pluginmanager, settings, data)
    except PluginError as exc:
        config.stash[MESSAGES] = [f"dflash-eval: PluginError: {exc}"]
        config.stash[REJECTED] = [str(exc)]
        return None
    added = {k: v for k, v in data.items() if k not in TOP_LEVEL_KEYS}  # a plugin adds no key of the schema
    run = dataclasses.replace(run, plugin_fields=added)
    if rejected:
        run = dataclasses.replace(run, rejected=[Rejection(plugin=name, reason=reason) for name, reason in rejected])
        config.stash[REJECTED] = [f"result rejected by plugin {name!r}: {reason}" for name, reason in rejected]
    return run


def fail_a_refused_run(session: pytest.Session) -> None:
    """pytest's exit status reads the run's verdict as eval.json holds it
    (:func:`dflash_eval.metrics.verdict.run_fails`): its parts that no test asserts make it 1 even when every selected
    test passed (a drafter refused by an architecture check, whose tests were skipped naming the check; a result a
    plugin rejected, ``pytest_dflash_eval_result_ready``; reports that could not be written); so does a run whose
    verdict could not be composed (a plugin that broke the hook's rules, reports that failed before the verdict)."""

    stash = session.config.stash
    broken = bool(stash.get(REJECTED, None)) or REPORT_FAILED in stash
    if run_fails(stash.get(RESULT, None), broken=broken) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def write_terminal_section(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The dflash-eval section: the tables, the messages of the end of the run, the verdict (the one the run's
    eval.json holds) last."""
    result = config.stash.get(RESULT, None)
    if result is None and not (is_controller(config) and MESSAGES in config.stash):
        return
    try:
        settings = get_settings(config)
        report_dir, recorded = settings.report_dir, bool(settings.update_tau_floors)
    except DFlashEvalError:
        report_dir, recorded = None, False
    width = getattr(getattr(terminalreporter, "_tw", None), "fullwidth", 120)
    section = terminal_section(result, config.stash.get(MESSAGES, []), width=width, verbose=config.option.verbose > 0,
                               report_dir=report_dir, recorded=recorded)
    terminalreporter.section("dflash-eval")
    if section.tables:
        terminalreporter.write(section.tables)
    for m in section.messages:
        terminalreporter.write_line(m)
    if section.verdict:  # the verdict last (the named causes in it, once)
        terminalreporter.write_sep("-", "dflash-eval verdict")
        for line in section.verdict:
            terminalreporter.write_line(line)
