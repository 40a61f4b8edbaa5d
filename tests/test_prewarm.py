"""The report imports begun in a background thread at the session's start are joined at its end, so the interpreter
never shuts down while that thread is inside an import.

Run: ``pytest tests/test_prewarm.py``
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from dflash_eval.pytest_plugin import hooks


def test_session_end_waits_for_the_report_imports(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow_imports() -> None:  # stands for an import of matplotlib still running when the session ends
        started.set()
        release.wait(30)
        finished.append(True)

    monkeypatch.setattr(hooks, "_import_report_modules", slow_imports)
    config = pytester.parseconfig()
    hooks._prewarm_reports(config)
    assert started.wait(30), "the prewarm thread did not start"
    timer = threading.Timer(0.3, release.set)
    timer.start()
    try:
        hooks.pytest_sessionfinish(SimpleNamespace(config=config), 0)  # type: ignore[arg-type]
    finally:
        release.set()
        timer.cancel()
    assert finished == [True], "pytest_sessionfinish returned while the report imports were still running"
    assert not config.stash[hooks.PREWARM].is_alive()
