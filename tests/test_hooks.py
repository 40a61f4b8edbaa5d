"""The dflash-eval hooks (:mod:`dflash_eval.hookspec`): a plugin's field in eval.json, a rejecting plugin failing
the run, ``pytest_dflash_eval_history_record`` seeing each record (the trackers through it), and a plugin's reference
server client used for the completions (the SGLang stand-in, ``tests/sglang_standin.py``, NOT SGLang)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.errors import PluginError, ResultRejected
from dflash_eval.training_loop.plugins import plugin_manager, register_tracker, result_ready

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"target_model": str(ROOT / "fixtures" / "target"), "prompts": str(ROOT / "fixtures" / "prompts.jsonl"),
            "num_prompts": 2, "max_new_tokens": 16, "tau_floor": 1.0}

ADDS = '''
import pytest

@pytest.hookimpl
def pytest_dflash_eval_result_ready(settings, data):
    data["my_team"] = {"owner": "drafting", "prompts": len(data["prompts"])}
'''
REJECTS = '''
import pytest

@pytest.hookimpl
def pytest_dflash_eval_result_ready(data):
    return "mean tau below the team's bar" if data["mean_tau"] < 100 else None
'''


def _plugin(pytester: pytest.Pytester, name: str, source: str) -> None:
    pytester.makepyfile(**{name: source})
    pytester.syspathinsert()


def test_a_plugin_adds_a_field_to_eval_json(pytester: pytest.Pytester, bundled_suite: Callable[..., Any],
                                            tmp_path: Path) -> None:
    _plugin(pytester, "adds_plugin", ADDS)
    res = bundled_suite("-p", "adds_plugin", "-k", "tau", "--tau-floor", "1.0", report="r", cache=tmp_path / "cache")
    assert res.ret == 0, res.stdout.str()
    data = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert data["my_team"] == {"owner": "drafting", "prompts": 2}
    assert "rejected" not in data


def test_a_rejecting_plugin_fails_the_run_with_its_reason(pytester: pytest.Pytester,
                                                          bundled_suite: Callable[..., Any], tmp_path: Path) -> None:
    _plugin(pytester, "rejects_plugin", REJECTS)
    res = bundled_suite("-p", "rejects_plugin", "-k", "tau", "--tau-floor", "1.0", report="r", cache=tmp_path / "cache")
    assert res.ret == 1
    res.stdout.fnmatch_lines(
        ["dflash-eval: result rejected by plugin 'rejects_plugin': mean tau below the team's bar*"])
    res.stdout.fnmatch_lines(["dflash-eval: FAIL (rejected by plugin 'rejects_plugin')*"])  # the verdict says so
    assert "dflash-eval: PASS" not in res.stdout.str()
    data = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert data["rejected"] == [{"plugin": "rejects_plugin", "reason": "mean tau below the team's bar"}]


class _Changes:
    @pytest.hookimpl
    def pytest_dflash_eval_result_ready(self, data: dict[str, Any]) -> None:
        data["mean_tau"] = 99.0


class _AddsReserved:
    @pytest.hookimpl
    def pytest_dflash_eval_result_ready(self, data: dict[str, Any]) -> None:
        data["rejected"] = []


class _AddsASchemaKey:
    @pytest.hookimpl
    def pytest_dflash_eval_result_ready(self, data: dict[str, Any]) -> None:
        data["speedup"] = {"mine": 1.0}  # a key of eval.json's schema this run left out


@pytest.mark.parametrize(("plugin", "says"), [(_Changes(), "changed the existing key 'mean_tau'"),
                                              (_AddsReserved(), "added the key 'rejected'"),
                                              (_AddsASchemaKey(), "added the key 'speedup'")])
def test_a_plugin_may_not_overwrite_a_key(plugin: Any, says: str) -> None:
    pm = plugin_manager(entry_points=False, plugins=[("meddler", plugin)])
    data = {"mean_tau": 2.5, "prompts": {}}
    with pytest.raises(PluginError, match=f"plugin 'meddler' {says}"):
        result_ready(pm, None, data)
    assert data == {"mean_tau": 2.5, "prompts": {}}


class _Seen:
    def __init__(self) -> None:
        self.records: list[tuple[Any, Any]] = []

    @pytest.hookimpl
    def pytest_dflash_eval_history_record(self, record: Any, history: Any) -> None:
        self.records.append((record, history))


class _Tracker:
    """A tracker of the trackers' shape (``log`` and ``close``): registered on the manager, called through it."""

    def __init__(self) -> None:
        self.logged: list[tuple[Any, Any]] = []

    def log(self, record: Any, result: Any) -> None:
        self.logged.append((record, result))

    def close(self) -> None:
        pass


class _Field:
    @pytest.hookimpl
    def pytest_dflash_eval_result_ready(self, data: dict[str, Any]) -> None:
        data["checked_by"] = "field-plugin"


class _Refuses:
    @pytest.hookimpl
    def pytest_dflash_eval_result_ready(self) -> str:
        return "not on a Friday"


@pytest.mark.slow
def test_the_evaluator_calls_the_hooks(tmp_path: Path) -> None:
    from dflash_eval import Evaluator

    seen, tracker = _Seen(), _Tracker()
    pm = plugin_manager(entry_points=False, plugins=[("seen", seen), ("field", _Field())])
    ev = Evaluator({**SETTINGS, "cache_dir": str(tmp_path / "cache"), "report_dir": str(tmp_path / "reports")},
                   history=True, trackers=[tracker], hooks=pm)
    drafter = str(ROOT / "fixtures" / "drafter")
    for step in (10, 20):
        result = ev.evaluate(drafter, step=step)
        assert ev.data is not None and ev.data["checked_by"] == "field-plugin"
    assert [r.step for r, _ in seen.records] == [10, 20] and seen.records == [(r, ev.history) for r in ev.records]
    assert [r for r, _ in tracker.logged] == ev.records and tracker.logged[-1][1] is result
    pm.register(_Refuses(), "friday")
    with pytest.raises(ResultRejected, match="plugin 'friday' rejected the result: not on a Friday"):
        ev.evaluate(drafter, step=30)
    assert [r.step for r in ev.history.read()] == [10, 20]  # a rejected result is not recorded


def test_the_trackers_implement_the_history_hook() -> None:
    from dflash_eval.training_loop.trackers import TensorBoardTracker, WandbTracker

    for cls in (TensorBoardTracker, WandbTracker):
        tracker = cls.__new__(cls)  # no library needed to see the hook: only the calls are checked
        tracker.log = lambda record, result, _seen=[]: _seen.append((record, result))  # type: ignore[method-assign]
        pm = plugin_manager(entry_points=False)
        register_tracker(pm, tracker)
        assert pm.is_registered(tracker)
        pm.hook.pytest_dflash_eval_history_record(record="rec", history=None, result="res")
        assert tracker.log.__defaults__[0] == [("rec", "res")]  # type: ignore[attr-defined]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.sglang
def test_a_plugins_reference_server_client_is_used(pytester: pytest.Pytester, bundled_suite: Callable[..., Any],
                                                   tmp_path: Path) -> None:
    """The plugin's client (connected to the stand-in) gives the completions; ``--sglang-url`` names a port where
    nothing listens, so the suite's own connection would have skipped them."""
    from sglang_standin import request_counts

    port, log = _free_port(), tmp_path / "standin.log"
    cmd = [sys.executable, str(ROOT / "tests" / "sglang_standin.py"), "--model-path", str(ROOT / "fixtures" / "target"),
           "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _plugin(pytester, "server_plugin", textwrap.dedent(f'''
            import pytest
            from dflash_eval.sglang import SGLangClient

            @pytest.hookimpl
            def pytest_dflash_eval_reference_server(settings):
                return SGLangClient.connect("http://127.0.0.1:{port}", expected_name="target", ready_timeout_s=120)
            '''))
        res = bundled_suite("-p", "server_plugin", "-k", "tau", "--completions", "sglang",
                            "--sglang-url", f"http://127.0.0.1:{_free_port()}", "--require-sglang", "--tau-floor",
                            "1.0", report="r", cache=tmp_path / "cache")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert res.ret == 0, res.stdout.str() + log.read_text()
    data = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert data["sglang"] == {"url": f"http://127.0.0.1:{port}", "client": "SGLangClient"}, shlex.join(cmd)
    assert request_counts(log.read_text(), status=200)["POST /generate"] >= 1
