"""The eval suite (tests_eval/) with ``--completions sglang``, end to end, against the SGLang stand-in
(``tests/sglang_standin.py``, NOT SGLang): launch mode, readiness, identity, caching, skip / ``--require-sglang``,
teardown of the launched server's process group (also on SIGTERM and SIGINT).

Each test runs the suite on the bundled fixtures, on the first few prompts of ``fixtures/prompts.jsonl``: in-process
(the ``run_suite`` fixture: pytester, in a checkout of the suite beside this repository's fixtures and golden records)
where the test looks at what the run did, in a subprocess (``python -m pytest tests_eval ...``) where it signals the
run. The stand-in server is always a process of its own, launched by the suite (``--sglang-launch``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from sglang_standin import request_counts

from dflash_eval.session.run_result import RunResult
from dflash_eval.sglang.launch import group_members

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[1]
STANDIN = str(ROOT / "tests" / "sglang_standin.py")
NUM_PROMPTS = 3
SELECT = "tau or reference_completion"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def standin_cmd(port: int, *extra: str) -> str:
    return shlex.join([sys.executable, STANDIN, "--model-path", "fixtures/target", "--port", str(port), *extra])


def suite_args(tmp: Path, *args: str, select: str = SELECT) -> list[str]:
    """The suite's command line after ``pytest``, run where ``fixtures/`` and ``golden/`` are this repository's."""
    return ["tests_eval", "--target-model", "fixtures/target", "--drafter", "fixtures/drafter",
            "--completions", "sglang", "--prompts", "fixtures/prompts.jsonl", "--num-prompts", str(NUM_PROMPTS),
            "--tau-floor", "1.0", "--cache-dir", str(tmp / "cache"), "--report-dir", str(tmp / "reports"), "-k", select,
            "-p", "no:cacheprovider", "--torch-threads", "1", "-p", "no:xdist", *args]


def suite_argv(tmp: Path, *args: str, select: str = SELECT) -> list[str]:
    return [sys.executable, "-m", "pytest", *suite_args(tmp, *args, select=select)]


def suite_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_EVAL_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


@dataclass(frozen=True)
class SuiteRun:
    """What a run of the suite gave: its exit status and its output (``show`` prints it)."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_suite(pytester: pytest.Pytester, suite_checkout: Callable[..., Path]) -> Callable[..., SuiteRun]:
    """``run_suite(tmp, *args)``: the suite of :func:`suite_args` in-process, in a checkout of the suite beside this
    repository's ``fixtures/`` and ``golden/`` (linked: no run here records), with ``--snapshot-warn-unused`` as the
    repository's ini gives it (the golden snapshots of prompts not selected are reported, not failed); the worker's
    torch thread count is restored after each run."""
    root = suite_checkout("--snapshot-warn-unused")
    for name in ("fixtures", "golden"):
        (root / name).symlink_to(ROOT / name, target_is_directory=True)

    def run(tmp: Path, *args: str) -> SuiteRun:
        threads = torch.get_num_threads()
        try:
            res = pytester.runpytest_inprocess(*suite_args(tmp, *args))
        finally:
            torch.set_num_threads(threads)
        return SuiteRun(int(res.ret), res.stdout.str(), res.stderr.str())

    return run


def group_gone(pgid: int) -> bool:
    """No live (non-zombie) process is left in group ``pgid``."""
    return not group_members(pgid)


def standin_pids(port: int) -> list[int]:
    """Live stand-in processes serving ``port`` (by command line)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and any(a.endswith(b"sglang_standin.py") for a in argv) \
                and str(port).encode() in argv:
            out.append(int(entry.name))
    return out


def cached_completions(cache: Path) -> dict[str, tuple[str, list[int]]]:
    """{prompt id: (source, output ids)} of every completion entry in the cache."""
    from safetensors.torch import load_file

    out = {}
    for man in (cache / "v1" / "completion").glob("*/*/manifest.json"):
        m = json.loads(man.read_text())
        meta = m.get("meta", {})
        ids = load_file(str(man.parent / "data.safetensors"))["output_ids"].tolist()
        out[meta["prompt_id"]] = (meta["source"], ids)
    return out


def outcomes(report_dir: Path) -> dict[str, str]:
    return json.loads((report_dir / "eval.json").read_text())["tests"]["outcomes"]


def show(proc: SuiteRun) -> str:
    return f"rc={proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"


@pytest.mark.slow
def test_launched_standin_gives_local_completions_then_warm_cache_needs_no_server(
        tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:
    port = free_port()
    launch = standin_cmd(port, "--warmup-refuse-s", "1", "--warmup-503-s", "1",
                         "--synthetic-spec-accept-length", "3.5", "--skip-tokenizer-init")  # no text: pinned locally
    t0 = time.monotonic()
    proc = run_suite(tmp_path, "--sglang-launch", launch, "--sglang-url", f"http://127.0.0.1:{port}")
    cold_s = time.monotonic() - t0
    assert proc.returncode == 0, show(proc)
    reports = tmp_path / "reports"

    # the server's log is in the report dir, and its process group is gone
    log = reports / "sglang-server.log"
    assert log.is_file(), show(proc)
    log_text = log.read_text()
    assert "NOT SGLang" in log_text and "POST /generate" in log_text
    # readiness and identity were checked once (SGLangService.start), not again before fetching the completions
    answered = request_counts(log_text, status=200)
    assert answered["GET /health_generate"] == 1 and request_counts(log_text)["GET /model_info"] == 1, answered
    data = json.loads((reports / "eval.json").read_text())
    info = data["sglang"]
    assert info["url"] == f"http://127.0.0.1:{port}" and info["launch"] == launch and info["log"] == str(log)
    assert group_gone(info["pid"]), f"process group {info['pid']} of the launched server still alive"
    assert standin_pids(port) == []

    # the completions are the target's own greedy ones: the snapshot tests (golden local generation) passed,
    # and the cached token ids equal the golden snapshots'
    oc = outcomes(reports)
    ref = {k: v for k, v in oc.items() if "test_reference_completion[" in k}
    assert len(ref) == NUM_PROMPTS and set(ref.values()) == {"passed"}, oc
    cached = cached_completions(tmp_path / "cache")
    assert len(cached) == NUM_PROMPTS
    snap_dir = ROOT / "golden" / "snapshots" / "target" / "test_reference_completions"
    for pid, (source, ids) in cached.items():
        assert source == "sglang"
        golden = json.loads((snap_dir / f"test_reference_completion[{pid}].json").read_text())
        assert ids == golden["output_ids"], pid

    # the server's (here SYNTHETIC) spec_accept_length is reported beside the offline τ
    for pid, r in data["prompts"].items():
        assert r["server_accept_length"] == pytest.approx(3.5, abs=1.0), pid
        # and its (SYNTHETIC) histogram: as many rounds as verify steps, rates side by side with the offline ones
        assert sum(r["server_histogram"]) == round(r["completion_tokens"] / r["server_accept_length"]), pid
        assert len(r["server_position_rates"]) == len(r["server_histogram"]) - 1
    md = (reports / "eval.md").read_text()
    assert "server accept len" in md and "| all prompts | server |" in md and "| all prompts | chain |" in md
    assert set(data["categories"]["all"]["acceptance"]) == {"chain", "server"}

    # a warm cache needs no server at all, even under --require-sglang
    dead = free_port()
    t0 = time.monotonic()
    warm = run_suite(tmp_path, "--sglang-url", f"http://127.0.0.1:{dead}", "--sglang-timeout", "1",
                     "--require-sglang", "--report-dir", str(tmp_path / "warm_reports"))
    warm_s = time.monotonic() - t0
    assert warm.returncode == 0, show(warm)
    warm_oc = outcomes(tmp_path / "warm_reports")
    assert {v for k, v in warm_oc.items() if "baseline" not in k} == {"passed"}, warm_oc  # no --baseline: skipped
    assert not (tmp_path / "warm_reports" / "sglang-server.log").exists()
    print(f"cold (launch + fetch) {cold_s:.1f}s, warm {warm_s:.1f}s")


@pytest.mark.slow
def test_cold_cache_without_server_skips_naming_the_url(tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    proc = run_suite(tmp_path, "--sglang-url", url, "--sglang-timeout", "1", "-rs")
    assert proc.returncode == 0, show(proc)
    assert time.monotonic() - t0 < 120
    assert re.search(r"\d+ skipped", proc.stdout) and " passed" not in proc.stdout.splitlines()[-1], show(proc)
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all(url in line and "not cached" in line for line in skips), show(proc)
    assert not list((tmp_path / "cache").glob("v1/completion/*/*/manifest.json"))


@pytest.mark.slow
def test_cold_cache_without_server_fails_under_require_sglang(
        tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = run_suite(tmp_path, "--sglang-url", url, "--sglang-timeout", "1", "--require-sglang")
    assert proc.returncode == 1, show(proc)
    assert "--require-sglang" in proc.stdout and url in proc.stdout, show(proc)
    assert "skipped" not in proc.stdout.splitlines()[-1] and "error" in proc.stdout.splitlines()[-1], show(proc)


@pytest.mark.slow
def test_wrong_model_fails_before_any_completion(tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:
    port = free_port()
    proc = run_suite(tmp_path, "--sglang-launch", standin_cmd(port, "--mode", "wrong-model-info"),
                     "--sglang-url", f"http://127.0.0.1:{port}")
    assert proc.returncode == 1, show(proc)
    assert "serves the wrong model" in proc.stdout and "Some-Other-Model-7B" in proc.stdout, show(proc)
    assert "POST /generate" not in (tmp_path / "reports" / "sglang-server.log").read_text()
    assert not list((tmp_path / "cache").glob("v1/completion/*/*/manifest.json"))
    assert standin_pids(port) == []


@pytest.mark.slow
def test_sglang_model_name_is_the_name_the_server_must_serve(
        tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:
    """``--sglang-model-name`` replaces the target folder's name as what ``/model_info`` must match: the stand-in
    serving ``fixtures/target`` (accepted without the option) is refused for another name before any completion."""
    port = free_port()
    proc = run_suite(tmp_path, "--sglang-launch", standin_cmd(port), "--sglang-url", f"http://127.0.0.1:{port}",
                     "--sglang-model-name", "Qwen3-8B")
    assert proc.returncode == 1, show(proc)
    assert "serves the wrong model: expected 'Qwen3-8B'" in proc.stdout, show(proc)
    assert "POST /generate" not in (tmp_path / "reports" / "sglang-server.log").read_text()
    assert not list((tmp_path / "cache").glob("v1/completion/*/*/manifest.json"))
    assert standin_pids(port) == []


@pytest.mark.slow
def test_a_server_wrong_on_a_later_prompt_fails_naming_it_and_caches_nothing(
        tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:
    """The server answers the first prompt right and the second wrong (a replica behind a router serving other
    weights): every completion of the fetch is checked against the local target, the run fails naming the wrong
    prompt, and nothing of the fetch is cached (a later run must not find it as ``source: sglang``)."""
    port = free_port()
    ids = [json.loads(line)["id"] for line in (ROOT / "fixtures" / "prompts.jsonl").read_text().splitlines()[:3]]
    proc = run_suite(tmp_path, "--sglang-launch", standin_cmd(port, "--wrong-answer-at", "1"),
                     "--sglang-url", f"http://127.0.0.1:{port}")
    assert proc.returncode == 1, show(proc)
    log = (tmp_path / "reports" / "sglang-server.log").read_text()
    assert "answering prompt 1 with a wrong completion" in log and request_counts(log)["POST /generate"] == 1, log
    m = re.search(r"does not serve the target .*?: its greedy completion of prompt '([^']+)' disagrees with the local "
                  r"target's teacher-forced argmax at \d+ of \d+ tokens \(first at completion token (\d+): server "
                  r"(\d+) .*?, local (\d+) ", proc.stdout)
    assert m, show(proc)
    assert m[1] == ids[1] and int(m[3]) != int(m[4]), m[0]
    assert "2 of the 3 completions of this fetch agree" in proc.stdout and "No completion cached" in proc.stdout
    assert ids[0] not in re.findall(r"completion of prompt '([^']+)' disagrees", proc.stdout)
    # the cache directory holds no completion entry at all: not the wrong one, nor (by design) the right ones
    cached = cached_completions(tmp_path / "cache")
    assert ids[1] not in cached and cached == {}, cached
    assert not list((tmp_path / "cache").glob("v1/completion/*/*/data.safetensors"))
    assert standin_pids(port) == []


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "says"), [("malformed-json", "the body is not valid JSON"),
                                            ("generate-500", "HTTP 500")])
def test_a_failed_fetch_fails_naming_the_url_and_caches_nothing(
        tmp_path: Path, mode: str, says: str, run_suite: Callable[..., SuiteRun]) -> None:
    """The suite's own fetch (the references stage through the SGLang client and the cache): a server whose
    ``POST /generate`` answer is cut off or an HTTP error fails the run naming the URL and what was wrong, and the
    cache holds no completion entry (a later run must not find a partial answer as ``source: sglang``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = run_suite(tmp_path, "--sglang-launch", standin_cmd(port, "--mode", mode), "--sglang-url", url)
    assert proc.returncode == 1, show(proc)
    assert f"POST {url}/generate" in proc.stdout and says in proc.stdout, show(proc)
    log = (tmp_path / "reports" / "sglang-server.log").read_text()
    assert request_counts(log)["POST /generate"] >= 1, log
    assert cached_completions(tmp_path / "cache") == {}
    assert not list((tmp_path / "cache").glob("v1/completion/*/*/data.safetensors"))
    assert standin_pids(port) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_interrupted_run_stops_the_launched_server(tmp_path: Path, sig: signal.Signals) -> None:
    """The launched server's whole group is gone promptly after the signal, and pytest exits non-zero.

    Waits are on events (the server's log line, the group being gone, the process exiting), each bounded
    generously: starting pytest alone is slow on a loaded machine. The server is stopped before pytest's own
    interrupt handling; pytest then exits promptly (the plugin cuts the traceback rendering and the heap walks;
    timings: ``benchmarks/bench_interrupt.py``)."""
    port = free_port()
    argv = suite_argv(tmp_path, "--sglang-launch", standin_cmd(port, "--mode", "never-ready"),
                      "--sglang-url", f"http://127.0.0.1:{port}", "--sglang-timeout", "600")
    log = tmp_path / "reports" / "sglang-server.log"
    out_file = tmp_path / "pytest-output.txt"  # a file, not a pipe nobody reads while waiting: no blocked writes
    with out_file.open("w") as sink:
        # SIGINT's default disposition in the child: a runner that ignores SIGINT (SIG_IGN survives exec) would
        # leave Python without its KeyboardInterrupt handler, and the signal would test nothing
        proc = subprocess.Popen(argv, cwd=ROOT, env=suite_env(), stdout=sink, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (log.is_file() and "listening on" in log.read_text()):
            assert proc.poll() is None, out_file.read_text()
            time.sleep(0.2)
        assert log.is_file() and "listening on" in log.read_text(), f"server not launched within 300 s: {log}"
        m = re.search(r"pid=(\d+)", log.read_text())
        assert m, log.read_text()
        server_pid = int(m.group(1))
        assert not group_gone(server_pid)
        proc.send_signal(sig)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not group_gone(server_pid):
            time.sleep(0.1)
        assert group_gone(server_pid), (f"launched server group {server_pid} survived {sig.name} to pytest by 60 s"
                                        f"\n--- pytest so far ---\n{out_file.read_text()[-3000:]}"
                                        f"\n--- server log ---\n{log.read_text()[-2000:]}")
        proc.wait(timeout=300)
        out = out_file.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out[-3000:]
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in out and "it was stopped" in out, out[-3000:]
    assert standin_pids(port) == []


# ------------------------------------------------------------------------------------------------ settings (no server)


def test_sglang_settings_validation(tmp_path: Path) -> None:
    from dflash_eval.errors import DFlashEvalError
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.sglang import DEFAULT_LAUNCH_URL, SGLangService

    s = EvalSettings.from_mapping({"completions": "sglang", "sglang_launch": "serve --port 30000"}, base=tmp_path)
    svc = SGLangService(s)
    assert svc.url == DEFAULT_LAUNCH_URL and svc.expected_name == "target"
    assert svc.log_path == s.report_dir / "sglang-server.log" and s.sglang_timeout == 600 and not s.require_sglang
    s = EvalSettings.from_mapping({"completions": "sglang", "sglang_url": "http://h:1/", "sglang_model_name": "Q",
                                   "sglang_timeout": "5", "require_sglang": "1"}, base=tmp_path)
    svc = SGLangService(s)
    assert (svc.url, svc.expected_name, svc.timeout_s, svc.log_path, s.require_sglang) == ("http://h:1", "Q", 5.0,
                                                                                          None, True)
    for bad, needle in [({"completions": "sglang"}, "--sglang-url"),
                        ({"sglang_launch": "serve"}, "--sglang-launch needs --completions sglang"),
                        ({"completions": "sglang", "sglang_url": "http://h:1", "sglang_timeout": "0"},
                         "--sglang-timeout"),
                        ({"completions": "sglang", "sglang_url": "http://h:1", "sglang_request_timeout": "-1"},
                         "--sglang-request-timeout")]:
        with pytest.raises(DFlashEvalError, match=re.escape(needle)):
            EvalSettings.from_mapping(bad, base=tmp_path)


def test_tau_table_has_a_server_accept_column_only_when_reported() -> None:
    from result_rows import fragment, prompt_row

    from dflash_eval import report

    prompts = {"a": prompt_row(tau=2.0, floor=1.0, rounds=3, passed=True),
               "b": prompt_row(tau=3.0, floor=1.0, rounds=2, passed=True)}

    def run() -> RunResult:
        return report.merge([fragment(prompts=prompts, mean_tau=2.5, mean_floor=1.0, mean_ddtree={},
                                      mean_ddtree_floor={})])

    header, rows = report.tau_rows(run())
    assert "server accept len" not in header
    prompts["a"]["server_accept_length"] = 3.25
    header, rows = report.tau_rows(run())
    i = header.index("server accept len")
    assert [r[i] for r in rows] == ["3.250", "-", "3.250"]
    assert all(len(r) == len(header) for r in rows)
