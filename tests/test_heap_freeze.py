"""When the plugin freezes the garbage collector's heap at the end of a run: only where the process ends with it.

pytest's unraisable-exception plugin walks the whole heap twice at ``pytest_unconfigure``; the plugin freezes the
heap first, but only where nothing runs after: an xdist worker, or the outermost run of a ``pytest`` process. A run
inside another one (pytester), or ``pytest.main`` called from a program that goes on, keeps its heap collectable.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from dflash_eval.common import heap
from dflash_eval.pytest_plugin import state


def _config(worker: bool = False) -> Any:
    """A stand-in for the ``pytest.Config`` the hook receives: only what the rule reads (``workerinput`` on an xdist
    worker)."""
    return types.SimpleNamespace(workerinput={"workerid": "gw0"}) if worker else types.SimpleNamespace()


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records each ``gc.freeze`` the rule makes; a session was held (the plugin registered its exit freeze)."""
    calls: list[bool] = []
    monkeypatch.setattr(state.gc, "freeze", lambda: calls.append(True))
    monkeypatch.setattr(heap, "_FREEZE_AT_EXIT", True)
    monkeypatch.setattr(state, "_CONFIGS", [])
    return calls


def _main_as(monkeypatch: pytest.MonkeyPatch, spec_name: str | None, file: str = "") -> None:
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    main.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", main)


@pytest.mark.parametrize(("spec_name", "file"), [("pytest.__main__", ""), (None, "/usr/bin/pytest"),
                                                  (None, "/venv/bin/py.test")])
def test_the_outermost_run_of_a_pytest_process_freezes(monkeypatch: pytest.MonkeyPatch, frozen: list[bool],
                                                       spec_name: str | None, file: str) -> None:
    _main_as(monkeypatch, spec_name, file)
    config = _config()
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert frozen == [True]


def test_an_xdist_worker_freezes_whatever_started_it(monkeypatch: pytest.MonkeyPatch, frozen: list[bool]) -> None:
    _main_as(monkeypatch, "xdist.remote")
    config = _config(worker=True)
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert frozen == [True]


def test_a_program_that_calls_pytest_main_keeps_its_heap(monkeypatch: pytest.MonkeyPatch,
                                                        frozen: list[bool]) -> None:
    _main_as(monkeypatch, None, "/home/me/train.py")
    config = _config()
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert frozen == []


def test_a_run_inside_another_run_keeps_the_heap_until_the_outer_one_ends(monkeypatch: pytest.MonkeyPatch,
                                                                          frozen: list[bool]) -> None:
    _main_as(monkeypatch, "pytest.__main__")
    outer, inner = _config(), _config()
    state.enter_config(outer)
    state.enter_config(inner)
    state.freeze_heap_if_ending(inner)
    assert frozen == []
    state.freeze_heap_if_ending(outer)
    assert frozen == [True]


def test_a_run_that_held_no_session_does_not_freeze(monkeypatch: pytest.MonkeyPatch, frozen: list[bool]) -> None:
    monkeypatch.setattr(heap, "_FREEZE_AT_EXIT", False)
    _main_as(monkeypatch, "pytest.__main__")
    config = _config()
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert frozen == []
