"""No thread but the main one imports modules or registers loggers while the suite's tests run.

Why: pytest's log capture enters ``catching_logs`` around every test phase, and its ``__enter__`` iterates
``logging.Logger.manager.loggerDict`` without the logging lock. Any import in another thread that calls
``logging.getLogger(name)`` for a new name (matplotlib and most libraries do, once per module) can change that dict's
size during the iteration: the test's setup, call or teardown then fails with ``RuntimeError: dictionary changed size
during iteration`` raised from ``contextlib.__enter__`` with no frame of the test's own code. The plugin once
imported its report modules (matplotlib) in a background thread while tests ran, which failed about one warm run in
twenty on a loaded 2-core machine. The first test reproduces the race itself, the second checks a real run of the
suite for the precondition.

Run: ``pytest tests/test_no_background_imports.py``
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from _pytest.logging import LogCaptureHandler, catching_logs

ROOT = Path(__file__).resolve().parents[1]

RECORDER = '''
import json, logging, os, threading

_off_main: list[str] = []
_orig = logging.Manager.getLogger


def _recording(self, name):
    if name not in self.loggerDict and threading.current_thread() is not threading.main_thread():
        _off_main.append(f"{threading.current_thread().name}: {name}")
    return _orig(self, name)


logging.Manager.getLogger = _recording


def pytest_sessionfinish(session):
    with open(os.environ["OFF_MAIN_LOG"], "w") as fh:
        json.dump(_off_main, fh)
'''


def test_a_logger_registered_in_another_thread_breaks_pytests_log_capture() -> None:
    """The mechanism, shown directly: while a thread registers new loggers, entering pytest's log capture raises.
    The thread registers loggers until the main thread has seen the error (or 30 s pass: then the test fails, the
    race could not be shown on this pytest)."""
    seen, stop = threading.Event(), threading.Event()

    def register() -> None:
        i = 0
        while not (seen.is_set() or stop.is_set()):
            logging.getLogger(f"dflash-eval-race-test.{i}")
            i += 1

    thread = threading.Thread(target=register, daemon=True)
    thread.start()
    errors: list[str] = []
    try:
        timer = threading.Timer(30.0, stop.set)
        timer.start()
        while not stop.is_set() and not errors:
            try:
                with catching_logs(LogCaptureHandler()):
                    pass
            except RuntimeError as exc:
                errors.append(str(exc))
                seen.set()
        timer.cancel()
    finally:
        seen.set()
        thread.join(timeout=30)
        manager = logging.Logger.manager
        for name in [n for n in manager.loggerDict if n.startswith("dflash-eval-race-test")]:
            del manager.loggerDict[name]
    assert errors and "dictionary changed size during iteration" in errors[0]


@pytest.mark.slow
def test_suite_run_registers_no_logger_off_the_main_thread(suite_checkout, pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A run of the suite's τ tests (cold, so every stage imports what it needs; the reports written at the end)
    registers every new logger from the main thread: nothing imports in the background while pytest's log capture
    iterates the loggers."""
    suite_checkout()
    log = tmp_path / "off_main.json"
    monkeypatch.setenv("OFF_MAIN_LOG", str(log))
    pytester.makeconftest('pytest_plugins = ["dflash_eval.pytest_plugin"]\n' + RECORDER)
    res = pytester.runpytest_subprocess(  # a fresh interpreter: matplotlib and the report modules not yet imported
        "tests_eval/test_tau.py", f"--target-model={ROOT / 'fixtures' / 'target'}",
        f"--drafter={ROOT / 'fixtures' / 'drafter'}", f"--prompts={ROOT / 'fixtures' / 'prompts.jsonl'}",
        "--num-prompts=1", "--max-new-tokens=16", f"--floors-file={tmp_path / 'none.json'}", "--tau-floor=1.0",
        f"--cache-dir={tmp_path / 'cache'}", f"--report-dir={tmp_path / 'reports'}", timeout=600)
    assert res.ret == 0, res.stdout.str()
    assert (tmp_path / "reports" / "eval.png").is_file(), "the run wrote no plot: matplotlib was never imported"
    assert json.loads(log.read_text()) == [], "loggers registered off the main thread while tests ran"
