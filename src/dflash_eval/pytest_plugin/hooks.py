"""The plugin's pytest hooks; each delegates: options to :mod:`dflash_eval.options.settings`, results to
:mod:`dflash_eval.session.eval_session`, the end of the run (results gathered, reports, the terminal section) to
:mod:`.run_report` and through it :mod:`dflash_eval.report`, progress to :mod:`.progress_reporter`.

Loading the plugin and ``pytest --help`` import no torch; settings are validated (and torch imported) only when a
run includes the suite (:func:`runs_suite`) or a test uses one of its fixtures. Under pytest-xdist each worker
sends its result to the controller through ``workeroutput``; the controller merges them and writes ``reports/`` in
``pytest_sessionfinish`` (before the junit XML is written: the mean τ and the verdict are junit properties).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from dflash_eval import hookspec
from dflash_eval.common.heap import importing
from dflash_eval.common.torch_check import require_torch
from dflash_eval.errors import DFlashEvalError, DrafterRefused
from dflash_eval.options.commands import unknown_pytest_args
from dflash_eval.options.preflight import preflight
from dflash_eval.options.settings import add_options
from dflash_eval.pytest_plugin.fixtures import refused_reason, uses_suite_fixtures
from dflash_eval.pytest_plugin.golden_check import GoldenCheck
from dflash_eval.pytest_plugin.progress_reporter import REPORTER, WORKERINPUT_KEY, ProgressReporter, enabled
from dflash_eval.pytest_plugin.rootdir_check import warn_moved_rootdir
from dflash_eval.pytest_plugin.run_report import (
    fail_a_refused_run,
    gather_worker_result,
    write_run_reports,
    write_terminal_section,
)
from dflash_eval.pytest_plugin.state import (
    FRAGMENTS,
    OUTCOMES,
    SGLANG,
    SKIPS,
    START,
    claim_heap,
    enter_config,
    freeze_heap_if_ending,
    get_session,
    is_controller,
    settings_from_config,
)
from dflash_eval.pytest_plugin.storage_stop import stop_at_storage_failure
from dflash_eval.pytest_plugin.suite_args import runs_suite
from dflash_eval.session.baseline_file import baseline_problem

if TYPE_CHECKING:
    from dflash_eval.pytest_plugin.run_report import WorkerNode

__all__ = ["pytest_addhooks", "pytest_addoption", "pytest_load_initial_conftests", "pytest_configure",
           "pytest_configure_node", "pytest_testnodedown", "pytest_runtest_makereport", "pytest_runtest_call",
           "pytest_sessionstart", "pytest_runtestloop", "pytest_collection", "pytest_collection_modifyitems",
           "pytest_sessionfinish", "pytest_terminal_summary", "MARKERS"]

SUITE_REPORT_ATTR = "dflash_eval_suite"  # set on the reports of tests that use the suite's fixtures
CHECKED = pytest.StashKey[bool]()
DEFERRED_CHECK = pytest.StashKey[bool]()
PREFLIGHT = pytest.StashKey[bool]()
MARKERS = (
    "slow: takes more than a few seconds on a 2-core CPU (deselect with -m 'not slow')",
    "gpu: needs a CUDA device; skipped on CPU-only machines with a reason naming what was not checked",
    "fla: needs the flash-linear-attention kernels (CUDA + fla importable)",
    "sglang: talks to an SGLang server (real or the bundled protocol stand-in)",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """The dflash-eval hook specifications (:mod:`dflash_eval.hookspec`)."""
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dflash-eval", "DFlash drafter evaluation (the dflash-eval suite: `pytest --pyargs "
                            "dflash_eval.tests_eval` or `dflash-eval run`); each option also reads env "
                            "DFLASH_EVAL_<NAME> and ini dflash_<name>; precedence CLI > env > ini > default")
    add_options(group.addoption, add_ini=parser.addini)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> Generator[None, None, None]:
    """Once every plugin and the initial conftests registered their options: arguments no one knows that are
    pytest-xdist's without it installed (``-n 2``), or a misspelled suite option (``--num-promtps``), are one usage
    error saying what to do (the extra to install; did you mean ...), instead of pytest's "unrecognized
    arguments" (:func:`dflash_eval.options.commands.unknown_pytest_args`)."""
    result = yield
    _, unknown = parser.parse_known_and_unknown_args(args)
    problems = unknown_pytest_args(unknown)
    if problems:
        raise pytest.UsageError("dflash-eval: " + "\ndflash-eval: ".join(problems))
    return result


def pytest_configure(config: pytest.Config) -> None:
    enter_config(config)
    if runs_suite(config):
        claim_heap(config)
    for line in MARKERS:  # the suite's modules use them wherever it is installed (--strict-markers)
        config.addinivalue_line("markers", line)
    config.stash[FRAGMENTS] = []
    config.stash[OUTCOMES] = {}
    config.stash[SKIPS] = {}
    config.stash[START] = time.time()
    config.pluginmanager.register(_OutcomeRecorder(config), "dflash-eval-outcomes")
    config.pluginmanager.register(_InterruptHandler(config), "dflash-eval-interrupt")
    config.pluginmanager.register(GoldenCheck(config), "dflash-eval-golden-check")
    if config.option.help:
        return
    if is_controller(config):
        warn_moved_rootdir(config)  # `pytest --target-model ../x` moved reports/ and the cache: say where
    if is_controller(config) and enabled(config):
        config.stash[REPORTER] = ProgressReporter(config)


class _InterruptHandler:
    """Ctrl-C / SIGINT: stop a launched SGLang server before anything else, then make the exit prompt.

    Without it pytest's exit is slow (docs/benchmarks.md, "Interrupting a run with a launched SGLang server"):
    pytest renders the interrupt's whole traceback - about 70 frames of its own and pluggy's, each source file
    parsed into an AST - only to print its last line, then runs four full garbage collections (its unraisable-
    and thread-exception plugins, one triggered by the rendering, interpreter shutdown), each walking the whole
    heap of torch, transformers and the model. So,
    unless ``--full-trace`` asks for the whole traceback, it is cut to the entry pytest reports; and the heap is
    frozen (``gc.freeze``: the process is about to end), leaving those collections only the new objects."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        svc = self.config.stash.get(SGLANG, None)
        if svc is not None:
            try:
                svc.stop()
            except Exception as exc:  # noqa: BLE001 - the interrupt is reported either way
                print(f"dflash-eval: could not stop the SGLang server: {exc}")
        if not self.config.option.fulltrace:
            tb = excinfo.traceback
            last = next((i for i in range(len(tb) - 1, -1, -1) if not tb[i].ishidden(excinfo)), None)
            if last is not None:
                excinfo.traceback = tb[last:]
        gc.freeze()


class _OutcomeRecorder:
    """Records the outcome of every test that uses the suite's fixtures in its own config's stash (eval.json
    "tests"), and the reason of each skip (what the run did not check); an object per config, so pytest runs inside
    one process (pytester) do not share it."""

    def __init__(self, config: pytest.Config) -> None:
        self.outcomes: dict[str, str] = config.stash[OUTCOMES]
        self.skips: dict[str, str] = config.stash[SKIPS]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not getattr(report, SUITE_REPORT_ATTR, False):
            return
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = report.outcome
            if report.skipped:
                self.skips[report.nodeid] = skip_reason(report)
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes[report.nodeid] = "error"


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test gave (pytest keeps it as ``(path, line, "Skipped: reason")``)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    freeze_heap_if_ending(config)  # before pytest's own unconfigure collects the whole heap


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerNode) -> None:
    """xdist controller: hand each worker the folder its progress events go to."""
    reporter = node.config.stash.get(REPORTER, None)
    if reporter is not None:
        node.workerinput[WORKERINPUT_KEY] = reporter.worker_dir()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: WorkerNode, error: object) -> None:
    gather_worker_result(node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Mark the reports of tests that use the suite's fixtures (the mark travels to the xdist controller); a write
    the file system refused stops the run (:mod:`.storage_stop`)."""
    report = yield
    if uses_suite_fixtures(item):
        setattr(report, SUITE_REPORT_ATTR, True)
    stop_at_storage_failure(item, call)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """A test whose body reaches a drafter refused by an architecture check is skipped naming the check (one cause,
    one failure: the check's own test fails; the run's end says so and exits 1 even when that test was not run)."""
    try:
        return (yield)
    except DrafterRefused as exc:
        pytest.skip(refused_reason(exc))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Bad options or inputs are one usage error (exit 4) before collection, when the run includes the suite.

    The checks that need no torch (:mod:`dflash_eval.options.preflight`: option values, paths, prompt files) run first,
    in about a second. An xdist controller makes the rest (they import torch) when its test loop starts instead
    (:func:`pytest_runtestloop`): done here they would delay the workers' start by that long. No test runs before
    them."""
    config = session.config
    if not is_controller(config) or not runs_suite(config) or config.option.collectonly:
        return
    _preflight(config)
    if config.pluginmanager.has_plugin("dsession"):
        config.stash[DEFERRED_CHECK] = True
        return
    _check_inputs(config)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, Any, Any]:
    """xdist controller: the deferred input check, while the workers boot and before any test is scheduled."""
    if session.config.stash.get(DEFERRED_CHECK, False):
        _check_inputs(session.config)
    return (yield)


def _preflight(config: pytest.Config) -> None:
    """The torch-free checks of the options and input files (once): a usage error naming every problem."""
    if config.stash.get(PREFLIGHT, False):
        return
    config.stash[PREFLIGHT] = True

    try:
        preflight(settings_from_config(config, check=False),
                  snapshot_update=bool(getattr(config.option, "update_snapshots", False)),
                  baseline_check=baseline_problem)  # --baseline read through the run's typed result
    except DFlashEvalError as exc:
        raise pytest.UsageError(f"dflash-eval: {exc}") from None


def _check_inputs(config: pytest.Config) -> None:
    config.stash[CHECKED] = True
    _preflight(config)

    try:
        with importing():  # torch and the session's modules, imported here first
            require_torch()
            get_session(config).check_inputs()
    except DFlashEvalError as exc:
        raise pytest.UsageError(f"dflash-eval: {exc}") from None


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, Any, Any]:
    """The suite's test modules import torch and the library (in an xdist worker, first here): with the garbage
    collector paused, the heap frozen after them where the process ends with the run
    (:mod:`dflash_eval.common.heap`)."""
    if not runs_suite(session.config):
        return (yield)
    with importing():
        return (yield)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """A run of other test files (a user's own) that use the suite's fixtures: the same usage error (exit 4) for bad
    options or inputs, checked once (without xdist; under xdist the fixtures fail those tests with the cause)."""
    if CHECKED in config.stash or not is_controller(config) or config.option.collectonly:
        return
    if any(uses_suite_fixtures(it) for it in items):
        _check_inputs(config)


@pytest.hookimpl(tryfirst=True)  # before junitxml writes its file: the run's τ and verdict become its properties
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    reporter = config.stash.get(REPORTER, None)
    if reporter is not None:
        reporter.close()
    svc = config.stash.get(SGLANG, None)
    if svc is not None:  # also after failures and KeyboardInterrupt (the fixture's teardown normally did it)
        try:
            svc.stop()
        except Exception as exc:  # noqa: BLE001 - a server that will not stop must not cost the run its reports
            print(f"dflash-eval: could not stop the SGLang server: {exc}")
    write_run_reports(config, failed_tests=session.testsfailed, exitstatus=exitstatus)
    fail_a_refused_run(session)  # and a run a plugin rejected


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    write_terminal_section(terminalreporter, config)
