"""The garbage collector and the process's heap (:mod:`dflash_eval.common.heap`): paused inside a block of heavy
imports, restored after it (also after an error), the heap frozen after a block that imported modules only in a
process declared to end with the suite's run; which pytest runs declare it; and when the plugin freezes the heap at the
end of a run.

pytest's unraisable-exception plugin walks the whole heap twice at ``pytest_unconfigure``; the plugin freezes the heap
first, but only where nothing runs after: an xdist worker, or the outermost run of a ``pytest`` process. A run inside
another one (pytester), or ``pytest.main`` called from a program that goes on, keeps its heap collectable."""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from dflash_eval.common import heap
from dflash_eval.pytest_plugin import state


@pytest.fixture
def freezes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Each ``gc.freeze`` the module makes (recorded, not made: the test process's heap stays collectable); the
    process not owned to start with; the collector enabled as the test started."""
    calls: list[bool] = []
    monkeypatch.setattr(heap.gc, "freeze", lambda: calls.append(True))
    monkeypatch.setattr(heap, "_OWNED", False)
    monkeypatch.setattr(heap, "_FREEZE_AT_EXIT", True)  # registered already: the test process's exit stays as it was
    monkeypatch.setattr(state, "_CONFIGS", [])  # no run of this process encloses the ones a test enters
    was = gc.isenabled()
    gc.enable()
    yield calls
    if not was:
        gc.disable()


def _import_a_module(monkeypatch: pytest.MonkeyPatch, name: str = "dflash_eval_heap_test_module") -> None:
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))


def test_the_collector_is_paused_inside_and_restored_after(freezes: list[bool]) -> None:
    with heap.importing():
        assert not gc.isenabled()
        with heap.importing():
            assert not gc.isenabled()
        assert not gc.isenabled(), "a nested block restored the collector before the outer block ended"
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled(freezes: list[bool]) -> None:
    gc.disable()
    with heap.importing():
        pass
    assert not gc.isenabled()


def test_an_error_in_the_block_restores_the_collector(freezes: list[bool]) -> None:
    with pytest.raises(ImportError), heap.importing():
        raise ImportError("no such module")
    assert gc.isenabled()


def test_an_owned_process_freezes_after_a_block_that_imported(monkeypatch: pytest.MonkeyPatch,
                                                              freezes: list[bool]) -> None:
    heap.own_process()
    assert heap.owned()
    with heap.importing():
        pass
    assert freezes == [], "nothing was imported: the heap may hold garbage the collector has yet to find"
    with heap.importing():
        _import_a_module(monkeypatch)
    assert freezes == [True]


def test_a_process_not_owned_never_freezes(monkeypatch: pytest.MonkeyPatch, freezes: list[bool]) -> None:
    with heap.importing():
        _import_a_module(monkeypatch)
    assert freezes == []


def _config() -> Any:
    """A stand-in for the ``pytest.Config`` the plugin's hooks receive: only what the rules read."""
    return types.SimpleNamespace()


def _worker_config() -> Any:
    """An xdist worker's (``workerinput`` set)."""
    return types.SimpleNamespace(workerinput={"workerid": "gw0"})


def _main_as(monkeypatch: pytest.MonkeyPatch, spec_name: str | None, file: str = "") -> None:
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    main.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", main)


@pytest.mark.parametrize(("spec_name", "file"), [("pytest.__main__", ""), (None, "/venv/bin/pytest"),
                                                  ("dflash_eval.__main__", ""), (None, "/venv/bin/dflash-eval")])
def test_the_suite_run_of_a_pytest_or_dflash_eval_process_owns_the_heap(
        monkeypatch: pytest.MonkeyPatch, freezes: list[bool], spec_name: str | None, file: str) -> None:
    _main_as(monkeypatch, spec_name, file)
    config = _config()
    state.enter_config(config)
    state.claim_heap(config)
    assert heap.owned()


def test_a_program_that_runs_the_suite_and_goes_on_keeps_its_heap(monkeypatch: pytest.MonkeyPatch,
                                                                  freezes: list[bool]) -> None:
    _main_as(monkeypatch, None, "/home/me/train.py")
    config = _config()
    state.enter_config(config)
    state.claim_heap(config)
    assert not heap.owned()


def test_a_run_inside_another_run_does_not_own_the_heap(monkeypatch: pytest.MonkeyPatch, freezes: list[bool]) -> None:
    _main_as(monkeypatch, "pytest.__main__")
    outer, inner = _config(), _config()
    state.enter_config(outer)
    state.enter_config(inner)
    state.claim_heap(inner)
    assert not heap.owned()


def test_the_dflash_eval_command_owns_its_process(monkeypatch: pytest.MonkeyPatch, freezes: list[bool],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from dflash_eval.cli.main import main

    _main_as(monkeypatch, None, "/venv/bin/dflash-eval")
    monkeypatch.setattr(sys, "argv", ["dflash-eval", "sets"])
    assert main() == 0
    assert heap.owned()


def test_the_command_called_from_a_program_does_not_own_it(monkeypatch: pytest.MonkeyPatch, freezes: list[bool],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from dflash_eval.cli.main import main

    _main_as(monkeypatch, None, "/home/me/train.py")
    assert main(["sets"]) == 0
    assert not heap.owned()


@pytest.mark.parametrize(("spec_name", "file"), [("pytest.__main__", ""), (None, "/usr/bin/pytest"),
                                                  (None, "/venv/bin/py.test")])
def test_the_outermost_run_of_a_pytest_process_freezes(monkeypatch: pytest.MonkeyPatch, freezes: list[bool],
                                                       spec_name: str | None, file: str) -> None:
    _main_as(monkeypatch, spec_name, file)
    config = _config()
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert freezes == [True]


def test_an_xdist_worker_freezes_whatever_started_it(monkeypatch: pytest.MonkeyPatch, freezes: list[bool]) -> None:
    _main_as(monkeypatch, "xdist.remote")
    config = _worker_config()
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert freezes == [True]


def test_a_program_that_calls_pytest_main_keeps_its_heap(monkeypatch: pytest.MonkeyPatch,
                                                        freezes: list[bool]) -> None:
    _main_as(monkeypatch, None, "/home/me/train.py")
    config = _config()
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert freezes == []


def test_a_run_inside_another_run_keeps_the_heap_until_the_outer_one_ends(monkeypatch: pytest.MonkeyPatch,
                                                                          freezes: list[bool]) -> None:
    _main_as(monkeypatch, "pytest.__main__")
    outer, inner = _config(), _config()
    state.enter_config(outer)
    state.enter_config(inner)
    state.freeze_heap_if_ending(inner)
    assert freezes == []
    state.freeze_heap_if_ending(outer)
    assert freezes == [True]


def test_a_run_that_held_no_session_does_not_freeze(monkeypatch: pytest.MonkeyPatch, freezes: list[bool]) -> None:
    monkeypatch.setattr(heap, "_FREEZE_AT_EXIT", False)
    _main_as(monkeypatch, "pytest.__main__")
    config = _config()
    state.enter_config(config)
    state.freeze_heap_if_ending(config)
    assert freezes == []
