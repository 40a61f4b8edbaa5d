"""Tests of :mod:`dflash_eval.sglang` against the SGLang stand-in (``tests/sglang_standin.py``, NOT SGLang).

Each failure mode of a server must end in an :class:`SGLangError` that names the URL and what was seen, within
the timeout given, never a hang. Every network wait here is bounded by a few seconds. The stand-in runs as a
subprocess on a free port of 127.0.0.1, backed by a tiny random Qwen3 built in a temporary folder (no hub).
Finer validation cases use a canned in-process HTTP server that answers whatever the test wants.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from sglang_standin import request_counts

import dflash_eval
from dflash_eval.sglang import (
    Completion,
    LaunchedServer,
    SGLangClient,
    SGLangError,
    SGLangService,
    SGLangUnavailable,
    check_identity,
    generate_greedy,
    normalize_url,
    process_alive,
    server_info,
    wait_until_ready,
)

pytestmark = pytest.mark.sglang

STANDIN = Path(__file__).with_name("sglang_standin.py")
PYTHON = sys.executable
MODEL_NAME = "tiny-qwen3"
VOCAB = 300
EOS_ID = VOCAB - 1
DIE_EXIT_CODE = 3  # tests/sglang_standin.py DIE_EXIT_CODE


# ---------------------------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 causal LM with a word-level tokenizer ("w0".."w299"), saved locally."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("sglang_models") / MODEL_NAME
    torch.manual_seed(1234)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        eos_token_id=EOS_ID,
        pad_token_id=0,
    )
    transformers.Qwen3ForCausalLM(config).save_pretrained(out)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", pad_token="w0", eos_token=f"w{EOS_ID}"
    ).save_pretrained(out)
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StandIn:
    process: subprocess.Popen
    url: str
    port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)


def standin_argv(
    model_dir: Path, port: int, mode: str, refuse_s: float = 0.0, w503_s: float = 0.0, *extra: str
) -> list[str]:
    return [
        PYTHON, str(STANDIN), "--model-path", str(model_dir), "--port", str(port), "--mode", mode,
        "--warmup-refuse-s", str(refuse_s), "--warmup-503-s", str(w503_s), *extra,
    ]  # fmt: skip


def start_standin(
    model_dir: Path, log_dir: Path, mode: str, *, refuse_s: float = 0.0, w503_s: float = 0.0, extra: tuple = ()
) -> StandIn:
    port = free_port()
    log_path = log_dir / f"standin-{mode}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            standin_argv(model_dir, port, mode, refuse_s, w503_s, *extra),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return StandIn(proc, f"http://127.0.0.1:{port}", port, log_path)


def wait_bound(s: StandIn, timeout_s: float = 60.0) -> None:
    """Wait until the stand-in answers GET /model_info (port bound), failing early if it died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if s.process.poll() is not None:
            pytest.fail(f"stand-in exited with {s.process.returncode}:\n{s.log()}")
        try:
            if requests.get(s.url + "/model_info", timeout=2).status_code == 200:
                return
        except requests.exceptions.ConnectionError:
            pass
        time.sleep(0.05)
    pytest.fail(f"stand-in did not bind within {timeout_s}s:\n{s.log()}")


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Callable[..., StandIn]]:
    """Factory starting stand-ins; all are killed at module teardown."""
    log_dir = tmp_path_factory.mktemp("sglang_logs")
    started: list[StandIn] = []

    def start(mode: str, **kw: Any) -> StandIn:
        s = start_standin(tiny_model_dir, log_dir, mode, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def ready(s: StandIn, timeout_s: float = 60.0) -> float:
    """Wait (polling often) until the stand-in is ready."""
    return wait_until_ready(
        s.url, timeout_s=timeout_s, poll_interval_s=0.05, max_interval_s=0.25, process=s.process, log_path=s.log_path
    )


@dataclass
class HappyServer:
    standin: StandIn
    refused_before_bind: bool
    health_during_warmup: int
    model_info_during_warmup: int
    waited_s: float


@pytest.fixture(scope="module")
def happy(standins: Callable[..., StandIn]) -> HappyServer:
    """A happy stand-in, walked through its warm-up phases: refused -> 503 (model_info 200) -> ready."""
    s = standins("happy", refuse_s=1.0, w503_s=2.0)
    try:
        requests.get(s.url + "/health_generate", timeout=2)
        refused = False
    except requests.exceptions.ConnectionError:
        refused = True
    wait_bound(s)
    health = requests.get(s.url + "/health_generate", timeout=2).status_code
    model_info = requests.get(s.url + "/model_info", timeout=2).status_code
    waited = ready(s)
    return HappyServer(s, refused, health, model_info, waited)


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir: Path) -> Callable[[list[int], int], list[int]]:
    """Greedy output ids of the model's own ``generate`` (generated ids only)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True, dtype=torch.float32).eval()

    def ref(ids: list[int], max_new_tokens: int) -> list[int]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the stand-in runs on one thread; keep reductions identical
        try:
            x = torch.tensor([ids])
            with torch.no_grad():
                out = model.generate(
                    input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False
                )
        finally:
            torch.set_num_threads(threads)
        return out[0, len(ids) :].tolist()

    return ref


PROMPTS = [[1, 2, 3], [17], [5, 6, 7, 8, 9, 10, 11], [250, 3, 3, 3], [42, 43]]


# ---------------------------------------------------------------------------------------------------------------
# canned in-process server for fine-grained validation cases

Responder = Callable[[str, Any], tuple]  # (path, request json) -> (status, body bytes[, trickle seconds per byte])


@dataclass
class Canned:
    url: str
    received: list[tuple[str, Any]] = field(default_factory=list)  # POSTs: (path, request json)
    gets: list[str] = field(default_factory=list)  # paths of GETs, in order


@pytest.fixture
def canned() -> Iterator[Callable[[Responder], Canned]]:
    servers: list[ThreadingHTTPServer] = []

    def make(responder: Responder) -> Canned:
        state = Canned(url="")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes, trickle_s: float = 0.0) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if trickle_s <= 0:
                        self.wfile.write(body)
                        return
                    for b in body:
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        time.sleep(trickle_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:
                state.gets.append(self.path)
                self._answer(*responder(self.path, None))

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = json.loads(raw)
                state.received.append((self.path, req))
                self._answer(*responder(self.path, req))

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        # shutdown() at teardown returns once serve_forever sees it: at its next poll (0.5 s by default)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(httpd)
        state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        return state

    yield make
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def item(ids: list[int], finish: dict | None = None, **meta: Any) -> dict:
    finish = finish or {"type": "length", "length": len(ids)}
    return {"text": "", "output_ids": ids, "meta_info": {"id": "x", "finish_reason": finish, **meta}}


def echo_batch(path: str, req: Any) -> tuple[int, bytes]:
    """A well-behaved /generate: every prompt's completion is its first id repeated max_new_tokens times."""
    n = req["sampling_params"]["max_new_tokens"]
    return 200, json.dumps([item([p[0]] * n) for p in req["input_ids"]]).encode()


# ---------------------------------------------------------------------------------------------------------------
# URL handling


def test_url_trailing_slash_and_scheme_checks() -> None:
    assert normalize_url("http://127.0.0.1:30000/") == "http://127.0.0.1:30000"
    assert normalize_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000"
    assert normalize_url("https://gpu-box:30000//") == "https://gpu-box:30000"
    for bad in ("127.0.0.1:30000", "localhost:30000", "gpu-box", "", "ftp://host:1"):
        with pytest.raises(SGLangError, match="scheme|non-empty"):
            normalize_url(bad)
    for bad in ("http://127.0.0.1:99999", "http://127.0.0.1:port", "http://127.0.0.1:0"):
        with pytest.raises(SGLangError, match="invalid port"):
            normalize_url(bad)
    with pytest.raises(SGLangError, match="http://127.0.0.1:30000"):
        wait_until_ready("127.0.0.1:30000", timeout_s=1)
    with pytest.raises(SGLangError, match="scheme"):
        generate_greedy("localhost:30000", [[1]], max_new_tokens=1)


# ---------------------------------------------------------------------------------------------------------------
# happy path (stand-in with the tiny model)


@pytest.mark.slow  # the happy stand-in's warm-up and model load (docs/benchmarks.md, "The fast test lane")
def test_warmup_phases_then_ready(happy: HappyServer) -> None:
    assert happy.refused_before_bind, "the port must refuse connections while the model loads"
    assert happy.health_during_warmup == 503
    assert happy.model_info_during_warmup == 200, "/model_info answers during warm-up (not a readiness signal)"
    assert happy.waited_s > 0.5  # the 2 s of 503 were waited out
    assert requests.get(happy.standin.url + "/health_generate", timeout=2).status_code == 200
    # A second wait on a ready server returns at once.
    assert wait_until_ready(happy.standin.url + "/", timeout_s=5) < 1.0


def test_wait_until_ready_polls_through_refused_and_503(
    standins: Callable[..., StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    s = standins("generate-500", refuse_s=0.6, w503_s=0.8)  # no model load: starts fast
    caplog.set_level(logging.DEBUG, logger="dflash_eval.sglang")
    waited = wait_until_ready(s.url, timeout_s=20, poll_interval_s=0.05, max_interval_s=0.2, process=s.process)
    assert 0.6 < waited < 20
    seen = caplog.text
    assert "connection refused" in seen and "HTTP 503" in seen and "ready after" in seen


@pytest.mark.slow  # the happy stand-in's warm-up and model load (docs/benchmarks.md, "The fast test lane")
def test_completions_equal_model_generate(happy: HappyServer, reference_model: Callable, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    n = 12
    got = generate_greedy(happy.standin.url, PROMPTS, max_new_tokens=n, timeout_s=30, batch_size=2)
    assert len(got) == len(PROMPTS)
    for prompt, c in zip(PROMPTS, got, strict=True):
        assert isinstance(c, Completion)
        expected = reference_model(prompt, n)
        assert c.output_ids == expected, f"prompt {prompt}"
        if len(expected) == n:
            assert c.finish_reason == {"type": "length", "length": n}
        else:
            assert c.finish_reason == {"type": "stop", "matched": EOS_ID}
        assert c.text == tokenizer.decode(c.output_ids, skip_special_tokens=True)
        assert c.spec_accept_length is None and c.spec_verify_ct is None
    # Batching must not change results or order.
    assert generate_greedy(happy.standin.url + "/", PROMPTS, max_new_tokens=n, timeout_s=30, batch_size=32) == got


@pytest.mark.slow  # the happy stand-in's warm-up and model load (docs/benchmarks.md, "The fast test lane")
def test_stop_token_ids(happy: HappyServer, reference_model: Callable) -> None:
    prompt = PROMPTS[0]
    full = reference_model(prompt, 10)
    stop = full[3]
    k = full.index(stop)
    (c,) = generate_greedy(happy.standin.url, [prompt], max_new_tokens=10, timeout_s=30, stop_token_ids=[stop])
    assert c.output_ids == full[: k + 1]
    assert c.finish_reason == ({"type": "stop", "matched": stop} if k + 1 < 10 else {"type": "length", "length": 10})


@pytest.mark.slow  # the happy stand-in's warm-up and model load (docs/benchmarks.md, "The fast test lane")
def test_identity_and_server_info(happy: HappyServer, tiny_model_dir: Path) -> None:
    info = check_identity(happy.standin.url, expected_name=MODEL_NAME, timeout_s=5)
    assert info["model_path"] == str(tiny_model_dir)
    assert check_identity(happy.standin.url + "/", expected_name=str(tiny_model_dir))["model_type"] == "qwen3"
    with pytest.raises(SGLangError) as err:
        check_identity(happy.standin.url, expected_name="Qwen3.5-27B", timeout_s=5)
    assert "Qwen3.5-27B" in str(err.value) and MODEL_NAME in str(err.value) and happy.standin.url in str(err.value)
    assert server_info(happy.standin.url, timeout_s=5)["version"] == "dflash-eval-standin"


@pytest.mark.parametrize(
    ("model_path", "served", "expected", "ok"),
    [
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/0123abcd/", None, "Qwen3-8B", True),
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/0123abcd", None, "Qwen/Qwen3-8B", True),
        ("/models/0123abcd", "Qwen3-8B", "Qwen3-8B", True),  # served_model_name from /server_info
        ("Qwen/Qwen3-8B", None, "Qwen3-8B", True),
        ("/models/Qwen3-8B", "other", "Qwen3-4B", False),
    ],
)
def test_identity_names(canned: Callable, model_path: str, served: str | None, expected: str, ok: bool) -> None:
    def respond(path: str, req: Any) -> tuple[int, bytes]:
        if path == "/model_info":
            return 200, json.dumps({"model_path": model_path, "is_generation": True}).encode()
        if path == "/server_info":
            return 200, json.dumps({"served_model_name": served or model_path, "version": "x"}).encode()
        return 404, b"{}"

    server = canned(respond)
    if ok:
        assert check_identity(server.url, expected_name=expected, timeout_s=5)["model_path"] == model_path
    else:
        with pytest.raises(SGLangError, match=f"expected '{expected}'.*model_path='{model_path}'.*'{served}'"):
            check_identity(server.url, expected_name=expected, timeout_s=5)


# ---------------------------------------------------------------------------------------------------------------
# failure modes of a server


def test_never_ready_times_out_naming_url_and_503(standins: Callable[..., StandIn]) -> None:
    s = standins("never-ready")
    wait_bound(s)
    t0 = time.monotonic()
    with pytest.raises(SGLangError) as err:
        wait_until_ready(s.url, timeout_s=2.0, poll_interval_s=0.1, process=s.process, log_path=s.log_path)
    elapsed = time.monotonic() - t0
    assert 1.9 < elapsed < 4.0
    msg = str(err.value)
    assert s.url in msg and "not ready after 2." in msg and "HTTP 503" in msg
    assert "never-ready" in msg  # the log tail


def test_nothing_listening_times_out_with_connection_refused() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(SGLangError, match="connection refused") as err:
        wait_until_ready(url, timeout_s=1.0, poll_interval_s=0.1)
    assert time.monotonic() - t0 < 3.0
    assert url in str(err.value)


def test_die_during_warmup_fails_at_once_with_exit_code_and_log(standins: Callable[..., StandIn]) -> None:
    s = standins("die-during-warmup", w503_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(SGLangError) as err:
        wait_until_ready(s.url, timeout_s=60.0, process=s.process, log_path=s.log_path)
    assert time.monotonic() - t0 < 10.0, "must not wait for the 60 s timeout"
    msg = str(err.value)
    assert f"exited with code {DIE_EXIT_CODE}" in msg and s.url in msg
    assert "simulated crash during warm-up" in msg  # log tail


def test_generate_500_names_status_and_body(standins: Callable[..., StandIn]) -> None:
    s = standins("generate-500")
    ready(s)
    with pytest.raises(SGLangError) as err:
        generate_greedy(s.url, PROMPTS, max_new_tokens=4, timeout_s=5)
    msg = str(err.value)
    assert "HTTP 500" in msg and "failure injection" in msg and f"{s.url}/generate" in msg


def test_malformed_json_is_an_error(standins: Callable[..., StandIn]) -> None:
    s = standins("malformed-json")
    ready(s)
    with pytest.raises(SGLangError, match="not valid JSON") as err:
        generate_greedy(s.url, PROMPTS, max_new_tokens=4, timeout_s=5)
    assert f"{s.url}/generate" in str(err.value)


def test_slow_generate_times_out_without_hanging(standins: Callable[..., StandIn]) -> None:
    s = standins("slow", extra=("--slow-s", "60"))
    ready(s)
    t0 = time.monotonic()
    with pytest.raises(SGLangError, match="timed out|timeout") as err:
        generate_greedy(s.url, PROMPTS[:1], max_new_tokens=4, timeout_s=1.0)
    assert time.monotonic() - t0 < 3.0
    assert f"{s.url}/generate" in str(err.value)


def test_wrong_model_info_fails_identity(standins: Callable[..., StandIn]) -> None:
    s = standins("wrong-model-info")
    ready(s)
    with pytest.raises(SGLangError) as err:
        check_identity(s.url, expected_name=MODEL_NAME, timeout_s=5)
    msg = str(err.value)
    assert MODEL_NAME in msg and "Some-Other-Model-7B" in msg and s.url in msg


# ---------------------------------------------------------------------------------------------------------------
# validation of /generate answers (canned server)


MALFORMED_ITEMS = [  # (body of a /generate answer for the prompts [[1], [2]], max_new_tokens=2; needle)
    ([item([1, 1])], "list has 1 items for a batch of 2"),
    ({"error": "boom"}, "expected a JSON list"),
    ([{"text": "", "meta_info": {"finish_reason": {"type": "length"}}}] * 2, "'output_ids' is missing"),
    ([item(["a", "b"]), item([1])], "'output_ids' is not a list of ints"),
    ([item([1, 2]), item([1.5])], "'output_ids' is not a list of ints"),
    ([item([1, 2]), {"output_ids": [3]}], "'meta_info' is missing"),
    ([item([1, 2]), {"output_ids": [3], "meta_info": {}}], "'meta_info.finish_reason'"),
    ([item([1, 2]), item([], {"type": "stop", "matched": 2})], "empty output_ids"),
    ([item([1, 2]), item([4], {"type": "abort", "message": "oom"})], "aborted"),
    ([item([1, 2]), item([1, 2, 3])], "more than max_new_tokens=2"),
    ([item([1, 2]), {**item([1, 2]), "text": 7}], "'text'"),
    ([item([1, 2]), item([1, 2], spec_accept_length="x")], "spec_accept_length"),
    ([item([1, 2]), item([1, 2], spec_accept_histogram=[1, -2])], "spec_accept_histogram"),
]


@pytest.mark.parametrize(("body", "needle"), MALFORMED_ITEMS)
def test_malformed_items_name_the_field(canned: Callable, body: Any, needle: str) -> None:
    server = canned(lambda path, req: (200, json.dumps(body).encode()))
    with pytest.raises(SGLangError) as err:
        generate_greedy(server.url, [[1], [2]], max_new_tokens=2, timeout_s=5)
    assert needle in str(err.value)
    assert f"{server.url}/generate" in str(err.value)


def test_http_4xx_quotes_body(canned: Callable) -> None:
    server = canned(lambda path, req: (400, b'{"error": {"message": "input_ids too long"}}'))
    with pytest.raises(SGLangError, match="HTTP 400.*input_ids too long"):
        generate_greedy(server.url, [[1]], max_new_tokens=2, timeout_s=5)


def test_request_shape_batching_and_spec_fields(canned: Callable) -> None:
    def respond(path: str, req: Any) -> tuple[int, bytes]:
        n = req["sampling_params"]["max_new_tokens"]
        items = [item([p[0]] * n, spec_accept_length=2.5, spec_verify_ct=2, spec_accept_histogram=[0, 1, 1])
                 for p in req["input_ids"]]
        return 200, json.dumps(items).encode()

    server = canned(respond)
    prompts = [[i, i + 1] for i in range(5)]
    got = generate_greedy(server.url, prompts, max_new_tokens=5, timeout_s=5, batch_size=2, stop_token_ids=[9])
    assert [c.output_ids for c in got] == [[i] * 5 for i in range(5)]
    assert all(c.spec_accept_length == 2.5 and c.spec_verify_ct == 2 for c in got)
    assert all(c.spec_accept_histogram == [0, 1, 1] for c in got)  # rounds that accepted 0, 1, 2 drafts
    assert [len(req["input_ids"]) for _, req in server.received] == [2, 2, 1]
    path, req = server.received[0]
    assert path == "/generate"
    assert req["sampling_params"]["temperature"] == 0
    assert req["sampling_params"]["max_new_tokens"] == 5
    assert req["sampling_params"]["stop_token_ids"] == [9]
    assert generate_greedy(server.url, [], max_new_tokens=3) == []


def test_connection_broke_names_broken_connections_not_timeouts_or_answers() -> None:
    """Only a connection that failed or broke makes the client wait for a launched server's exit."""
    from dflash_eval.sglang.transport import connection_broke

    def raised_from(cause: BaseException) -> SGLangError:
        try:
            raise SGLangError("POST /generate failed") from cause
        except SGLangError as exc:
            return exc

    broken = [requests.exceptions.ConnectionError("RemoteDisconnected"), requests.exceptions.ChunkedEncodingError()]
    other = [requests.exceptions.ReadTimeout(), requests.exceptions.ConnectTimeout(), TimeoutError(), ValueError()]
    assert [connection_broke(raised_from(e)) for e in broken + other] == [True] * 2 + [False] * 4
    assert not connection_broke(SGLangError("HTTP 500"))


def test_zero_verify_rounds_mean_no_speculation(canned: Callable) -> None:
    """SGLang's tokenizer manager sends ``spec_accept_length: 0`` with ``spec_verify_ct: 0`` for an answer that ran no
    speculative round (no speculative algorithm): that is no accept length at all, not an accept length of 0."""
    metas = [{"spec_accept_length": 0, "spec_verify_ct": 0, "spec_accept_rate": 0.0},
             {"spec_accept_length": 0.0, "spec_verify_ct": 0.0, "spec_accept_histogram": [0, 0]},
             {"spec_accept_length": 2.0, "spec_verify_ct": 3, "spec_accept_histogram": [1, 1, 1]}]

    def respond(path: str, req: Any) -> tuple[int, bytes]:
        return 200, json.dumps([item([p[0]] * 6, **m) for p, m in zip(req["input_ids"], metas)]).encode()

    server = canned(respond)
    got = generate_greedy(server.url, [[1], [2], [3]], max_new_tokens=6, timeout_s=5)
    assert [(c.spec_accept_length, c.spec_verify_ct, c.spec_accept_histogram) for c in got] == [
        (None, None, None), (None, None, None), (2.0, 3, [1, 1, 1])]


def test_trickling_body_is_bounded_by_total_timeout(canned: Callable) -> None:
    body = json.dumps([item([1, 2])]).encode() * 20
    server = canned(lambda path, req: (200, body, 0.05))  # one byte every 50 ms: never a read timeout
    t0 = time.monotonic()
    with pytest.raises(SGLangError, match="timeout 1s"):
        generate_greedy(server.url, [[1]], max_new_tokens=2, timeout_s=1.0)
    assert time.monotonic() - t0 < 3.0
    # The reading thread was woken up (socket shut down) rather than left trickling.
    deadline = time.monotonic() + 3.0
    while any(t.name.startswith("sglang-post") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name.startswith("sglang-post") for t in threading.enumerate())


def test_input_validation(canned: Callable) -> None:
    server = canned(echo_batch)
    with pytest.raises(SGLangError, match="max_new_tokens"):
        generate_greedy(server.url, [[1]], max_new_tokens=0)
    with pytest.raises(SGLangError, match=r"batch_input_ids\[1\] is empty"):
        generate_greedy(server.url, [[1], []], max_new_tokens=1)
    with pytest.raises(SGLangError, match="expected int"):
        generate_greedy(server.url, [[1, "x"]], max_new_tokens=1)
    assert server.received == []


# ---------------------------------------------------------------------------------------------------------------
# SGLangService and SGLangClient: readiness and identity checked once, then a ready client is handed over


def service_settings(url: str, tmp_path: Path, **overrides: Any) -> SimpleNamespace:
    """The settings fields SGLangService reads (external server at ``url``, the target named MODEL_NAME)."""
    fields = {"sglang_url": url, "sglang_launch": None, "sglang_timeout": 30.0, "sglang_request_timeout": 30.0,
              "sglang_model_name": None, "target_model": Path("/models") / MODEL_NAME, "report_dir": tmp_path}
    return SimpleNamespace(**{**fields, **overrides})


def ready_and_serving(model_path: str) -> Responder:
    """A canned server that is ready, serves ``model_path`` and answers /generate like :func:`echo_batch`."""

    def respond(path: str, req: Any) -> tuple[int, bytes]:
        if path == "/health_generate":
            return 200, b""
        if path == "/model_info":
            return 200, json.dumps({"model_path": model_path, "is_generation": True}).encode()
        if path == "/generate":
            return echo_batch(path, req)
        return 404, b"{}"

    return respond


@pytest.mark.slow  # the happy stand-in's warm-up and model load (docs/benchmarks.md, "The fast test lane")
def test_service_start_checks_readiness_and_identity_once_then_hands_over_a_client(
    happy: HappyServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    s = happy.standin
    before = request_counts(s.log())
    svc = SGLangService(service_settings(s.url + "/", tmp_path))
    client = svc.start()
    started = request_counts(s.log())
    assert isinstance(client, SGLangClient) and svc.client is client
    assert client.url == s.url and client.request_timeout_s == 30.0
    assert client.model_info["model_path"] == str(tiny_model_dir) == svc.info()["model_path"]
    assert started - before == {"GET /health_generate": 1, "GET /model_info": 1}

    got = client.generate_greedy(PROMPTS, max_new_tokens=6)
    assert got == generate_greedy(s.url, PROMPTS, max_new_tokens=6, timeout_s=30)
    assert all(isinstance(c, Completion) for c in got)
    assert client.info()["version"] == "dflash-eval-standin"
    # fetching completions asked neither for readiness nor for identity again
    assert request_counts(s.log()) - started == {"POST /generate": 2, "GET /server_info": 1}
    svc.stop()  # an external server is left running
    assert requests.get(s.url + "/health_generate", timeout=5).status_code == 200


def test_service_waits_through_warmup_once(canned: Callable, tmp_path: Path) -> None:
    polls = {"n": 0}
    serving = ready_and_serving(f"/models/{MODEL_NAME}")

    def respond(path: str, req: Any) -> tuple[int, bytes]:
        if path == "/health_generate":
            polls["n"] += 1
            return (503, b"") if polls["n"] < 3 else (200, b"")
        return serving(path, req)

    server = canned(respond)
    client = SGLangService(service_settings(server.url, tmp_path, sglang_request_timeout=7.5)).start()
    assert server.gets == ["/health_generate"] * 3 + ["/model_info"]
    assert client.request_timeout_s == 7.5
    assert [c.output_ids for c in client.generate_greedy([[4], [5]], max_new_tokens=3)] == [[4, 4, 4], [5, 5, 5]]
    assert server.gets == ["/health_generate"] * 3 + ["/model_info"]
    assert [path for path, _ in server.received] == ["/generate"]


def test_service_without_server_is_unavailable_and_wrong_model_is_an_error(canned: Callable, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    svc = SGLangService(service_settings(url, tmp_path, sglang_timeout=1.0))
    with pytest.raises(SGLangUnavailable, match="no SGLang server ready at") as err:
        svc.start()
    assert url in str(err.value) and "--sglang-timeout 1s" in str(err.value) and svc.client is None

    wrong = canned(ready_and_serving("/models/Some-Other-Model-7B"))
    svc = SGLangService(service_settings(wrong.url, tmp_path))
    with pytest.raises(SGLangError, match="serves the wrong model") as err:
        svc.start()
    assert not isinstance(err.value, SGLangUnavailable) and svc.client is None
    assert wrong.received == []


def test_client_connect_checks_readiness_and_identity(canned: Callable) -> None:
    server = canned(ready_and_serving(f"/models/{MODEL_NAME}"))
    client = SGLangClient.connect(server.url + "/", expected_name=MODEL_NAME, ready_timeout_s=30, request_timeout_s=9)
    assert (client.url, client.request_timeout_s) == (server.url, 9.0)
    assert client.model_info["model_path"] == f"/models/{MODEL_NAME}"
    assert server.gets == ["/health_generate", "/model_info"]
    with pytest.raises(SGLangError, match="expected 'Qwen3-8B'"):
        SGLangClient.connect(server.url, expected_name="Qwen3-8B", ready_timeout_s=30)
    with pytest.raises(SGLangError, match="request_timeout_s must be > 0"):
        SGLangClient(server.url, model_info={"model_path": "/m"}, request_timeout_s=0)


@pytest.mark.parametrize(("body", "needle"), MALFORMED_ITEMS)
def test_client_validates_answers_like_generate_greedy(canned: Callable, body: Any, needle: str) -> None:
    server = canned(lambda path, req: (200, json.dumps(body).encode()))
    client = SGLangClient(server.url, model_info={"model_path": f"/models/{MODEL_NAME}"}, request_timeout_s=5)
    with pytest.raises(SGLangError) as err:
        client.generate_greedy([[1], [2]], max_new_tokens=2)
    assert needle in str(err.value)
    assert f"{server.url}/generate" in str(err.value)
    assert server.gets == []  # a ready client asks for completions only


def test_client_requests_are_bounded_by_its_request_timeout(canned: Callable) -> None:
    body = json.dumps([item([1, 2])]).encode() * 20
    server = canned(lambda path, req: (200, body, 0.05))  # one byte every 50 ms: never a read timeout
    client = SGLangClient(server.url, model_info={"model_path": "/m"}, request_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(SGLangError, match="timeout 1s"):
        client.generate_greedy([[1]], max_new_tokens=2)
    assert time.monotonic() - t0 < 10.0  # the whole trickle would take over a minute


# ---------------------------------------------------------------------------------------------------------------
# LaunchedServer: process-group teardown


def wrapped_command(
    model_dir: Path, port: int, mode: str, pidfile: Path, *, ignore_term: bool = False, w503_s: float = 0.0
) -> str:
    """A shell that starts a background child (its pid in ``pidfile``) and then execs the stand-in."""
    inner = " ".join(shlex.quote(a) for a in standin_argv(model_dir, port, mode, 0.0, w503_s))
    trap = "trap '' TERM; " if ignore_term else ""
    script = f"{trap}sleep 300 & echo $! > {shlex.quote(str(pidfile))}; exec {inner}"
    return f"sh -c {shlex.quote(script)}"


def wait_pidfile(pidfile: Path, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{pidfile} not written")


def assert_gone(*pids: int, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if process_alive(p)], f"still alive: {[p for p in pids if process_alive(p)]}"


def test_launched_server_kills_whole_group(tiny_model_dir: Path, tmp_path: Path) -> None:
    port, pidfile = free_port(), tmp_path / "child.pid"
    cmd = wrapped_command(tiny_model_dir, port, "generate-500", pidfile)
    server = LaunchedServer(
        cmd, url=f"http://127.0.0.1:{port}/", log_path=tmp_path / "logs" / "server.log", ready_timeout_s=30
    )
    with server as s:
        leader, child = s.pid, wait_pidfile(pidfile)
        assert process_alive(leader) and process_alive(child)
        assert server_info(s.url, timeout_s=5)["version"] == "dflash-eval-standin"
        assert s.ready_after_s is not None
    assert_gone(leader, child)
    assert server.stop() == server.process.returncode  # idempotent
    assert "dflash-eval launching" in server.log_tail()


def test_launched_server_teardown_when_body_raises(tiny_model_dir: Path, tmp_path: Path) -> None:
    port, pidfile = free_port(), tmp_path / "child.pid"
    cmd = wrapped_command(tiny_model_dir, port, "generate-500", pidfile)
    with pytest.raises(ZeroDivisionError):
        with LaunchedServer(cmd, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log", ready_timeout_s=30) as s:
            leader, child = s.pid, wait_pidfile(pidfile)
            1 / 0  # noqa: B018
    assert_gone(leader, child)


def test_launched_server_sigkills_a_group_ignoring_sigterm(tiny_model_dir: Path, tmp_path: Path) -> None:
    port, pidfile = free_port(), tmp_path / "child.pid"
    cmd = wrapped_command(tiny_model_dir, port, "generate-500", pidfile, ignore_term=True)
    server = LaunchedServer(
        cmd, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log", ready_timeout_s=30, term_timeout_s=1.0
    )
    with server as s:
        leader, child = s.pid, wait_pidfile(pidfile)
        t0 = time.monotonic()
    assert 0.9 < time.monotonic() - t0 < 8.0  # waited term_timeout_s, then SIGKILL
    assert_gone(leader, child, within_s=0.5)
    assert server.process.returncode == -signal.SIGKILL


def test_launched_server_dies_during_warmup(tiny_model_dir: Path, tmp_path: Path) -> None:
    port, pidfile = free_port(), tmp_path / "child.pid"
    cmd = wrapped_command(tiny_model_dir, port, "die-during-warmup", pidfile, w503_s=0.3)
    server = LaunchedServer(cmd, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log", ready_timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(SGLangError, match=f"exited with code {DIE_EXIT_CODE}") as err:
        with server:
            pytest.fail("body must not run")
    assert time.monotonic() - t0 < 10.0
    assert "simulated crash during warm-up" in str(err.value)
    assert_gone(server.pid, wait_pidfile(pidfile))  # the orphaned child of the group too


def test_launched_server_not_ready_in_time_is_torn_down(tiny_model_dir: Path, tmp_path: Path) -> None:
    port, pidfile = free_port(), tmp_path / "child.pid"
    cmd = wrapped_command(tiny_model_dir, port, "never-ready", pidfile)
    server = LaunchedServer(cmd, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log", ready_timeout_s=1.5)
    with pytest.raises(SGLangError, match="not ready after 1"):
        server.start()
    assert_gone(server.pid, wait_pidfile(pidfile))


def test_launch_missing_executable(tmp_path: Path) -> None:
    with pytest.raises(SGLangError, match="could not launch"):
        LaunchedServer(
            "/nonexistent/sglang-binary --port 1", url="http://127.0.0.1:1", log_path=tmp_path / "x.log"
        ).start()


def test_launched_server_atexit_teardown(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A run that exits without stopping its server still tears the group down (atexit)."""
    port, pidfile = free_port(), tmp_path / "child.pid"
    cmd = wrapped_command(tiny_model_dir, port, "generate-500", pidfile)
    script = textwrap.dedent(
        f"""
        import sys
        from dflash_eval.sglang import LaunchedServer
        s = LaunchedServer({cmd!r}, url="http://127.0.0.1:{port}", log_path={str(tmp_path / "s.log")!r},
                           ready_timeout_s=30)
        s.start()
        print(s.pid, flush=True)
        sys.exit(0)  # no stop(): atexit must do it
        """
    )
    src = str(Path(dflash_eval.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    leader = int(done.stdout.split()[0])
    assert_gone(leader, wait_pidfile(pidfile))


# ---------------------------------------------------------------------------------------------------------------
# older releases, ports taken by stale servers, launched servers that exit early


def legacy_info(model_path: str) -> Responder:
    """A canned server of an older SGLang release: only /get_model_info and /get_server_info (404 on the new
    names)."""

    def respond(path: str, req: Any) -> tuple[int, bytes]:
        if path == "/get_model_info":
            return 200, json.dumps({"model_path": model_path, "is_generation": True}).encode()
        if path == "/get_server_info":
            return 200, json.dumps({"served_model_name": "served-name", "version": "0.3.0"}).encode()
        if path == "/health_generate":
            return 200, b""
        return 404, b'{"detail": "Not Found"}'

    return respond


def test_identity_and_server_info_fall_back_to_the_get_names_on_404(canned: Callable, tmp_path: Path) -> None:
    server = canned(legacy_info(f"/models/{MODEL_NAME}"))
    assert check_identity(server.url, expected_name=MODEL_NAME, timeout_s=5)["model_path"] == f"/models/{MODEL_NAME}"
    assert server.gets == ["/model_info", "/get_model_info"]
    assert server_info(server.url, timeout_s=5)["version"] == "0.3.0"
    assert server.gets[-2:] == ["/server_info", "/get_server_info"]
    # served_model_name read from /get_server_info when model_path does not match
    other = canned(legacy_info("/models/0123abcd"))
    assert check_identity(other.url, expected_name="served-name", timeout_s=5)["model_path"] == "/models/0123abcd"
    client = SGLangService(service_settings(server.url, tmp_path)).start()
    assert client.model_info["model_path"] == f"/models/{MODEL_NAME}"


def test_missing_info_under_both_names_names_both(canned: Callable) -> None:
    server = canned(lambda path, req: (404, b'{"detail": "Not Found"}'))
    with pytest.raises(SGLangError, match=r"/get_model_info .*HTTP 404.*also tried /model_info") as err:
        check_identity(server.url, expected_name=MODEL_NAME, timeout_s=5)
    assert server.url in str(err.value)
    server = canned(lambda path, req: (500, b"boom") if path == "/model_info" else (200, b"{}"))
    with pytest.raises(SGLangError, match="HTTP 500"):  # only a 404 falls back
        check_identity(server.url, expected_name=MODEL_NAME, timeout_s=5)
    assert server.gets == ["/model_info"]


def test_standin_of_an_older_release(standins: Callable[..., StandIn], tiny_model_dir: Path) -> None:
    s = standins("generate-500", extra=("--legacy-info",))
    ready(s)
    assert requests.get(s.url + "/model_info", timeout=5).status_code == 404
    assert check_identity(s.url, expected_name=MODEL_NAME, timeout_s=5)["model_path"] == str(tiny_model_dir)
    assert server_info(s.url, timeout_s=5)["version"] == "dflash-eval-standin"


def test_launch_on_a_taken_port_names_the_holder_and_launches_nothing(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = LaunchedServer(f"{PYTHON} -c 'import time; time.sleep(60)'", url=f"http://127.0.0.1:{port}",
                                log_path=tmp_path / "s.log", ready_timeout_s=5)
        with pytest.raises(SGLangError) as err:
            server.start()
    msg = str(err.value)
    assert f"port {port} is already in use by pid {os.getpid()}" in msg and "stale server" in msg
    assert server.process is None and not (tmp_path / "s.log").exists()


def test_launch_next_to_a_stale_server_names_its_pid(standins: Callable[..., StandIn], tiny_model_dir: Path,
                                                     tmp_path: Path) -> None:
    stale = standins("generate-500")
    ready(stale)
    cmd = shlex.join(standin_argv(tiny_model_dir, stale.port, "generate-500"))
    with pytest.raises(SGLangError, match=f"in use by pid {stale.process.pid} .*sglang_standin.py"):
        LaunchedServer(cmd, url=stale.url, log_path=tmp_path / "s.log", ready_timeout_s=30).start()
    assert not (tmp_path / "s.log").exists()  # nothing was launched


def test_launched_server_that_exits_after_ready_is_reported_with_code_and_log(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    """The process the suite launched exits once ready (its worker keeps the port): the next request fails with
    the exit code and the log tail, not with whatever the port answers."""
    port, stop = free_port(), tmp_path / "stop"
    inner = shlex.join(standin_argv(tiny_model_dir, port, "generate-500"))
    script = f"{inner} & while [ ! -e {shlex.quote(str(stop))} ]; do sleep 0.05; done; echo leader quits; exit 5"
    settings = service_settings(f"http://127.0.0.1:{port}", tmp_path, sglang_launch=f"sh -c {shlex.quote(script)}")
    svc = SGLangService(settings)
    try:
        client = svc.start()
        stop.touch()
        svc.server.process.wait(timeout=30)
        with pytest.raises(SGLangError) as err:
            client.generate_greedy([[1, 2]], max_new_tokens=2)
        msg = str(err.value)
        assert "exited with code 5 before POST /generate" in msg and "leader quits" in msg
        assert str(svc.log_path) in msg
    finally:
        svc.stop()


@pytest.mark.parametrize(("delay_s", "wait_s", "exited"), [(3.0, 120.0, True), (600.0, 0.5, False)],
                         ids=["exits-after-the-break", "still-running"])
def test_launched_server_dying_during_generate_is_reported_with_code_and_log(
        tiny_model_dir: Path, tmp_path: Path, delay_s: float, wait_s: float, exited: bool) -> None:
    """The launched server closes the connection of a ``POST /generate`` and exits ``delay_s`` later (a crash whose
    teardown takes a moment): the client waits (bounded) for the exit, so the error quotes the exit code and the log
    tail, not a bare ``connection error``; a process still running after the wait is said to be.

    Not timing dependent: the wait returns as soon as the process exits, so it is made generous (120 s) against a
    3 s delay (a poll right after the break finds the process still alive), and the still-running case keeps the
    process alive for 600 s against a 0.5 s wait."""
    port = free_port()
    cmd = shlex.join(standin_argv(tiny_model_dir, port, "die-during-generate", 0.0, 0.0, "--die-delay-s", str(delay_s)))
    svc = SGLangService(service_settings(f"http://127.0.0.1:{port}", tmp_path, sglang_launch=cmd))
    try:
        client = svc.start()
        assert client.exit_wait_s == 5.0 and client.log_path == svc.log_path  # the service's defaults
        client.exit_wait_s = wait_s
        with pytest.raises(SGLangError) as err:
            client.generate_greedy([[1, 2]], max_new_tokens=2)
        msg = str(err.value)
        assert "RemoteDisconnected" in msg and "simulated crash while answering /generate" in msg, msg
        assert f"--- server log tail ({svc.log_path}) ---" in msg, msg
        if exited:
            assert f"exited with code {DIE_EXIT_CODE} while answering POST /generate (the connection broke" in msg, msg
            assert f"exiting with code {DIE_EXIT_CODE}" in msg.split("--- server log tail")[1], msg
        else:
            assert f"still running {wait_s:g}s after the connection broke" in msg, msg
            assert svc.server.process.poll() is None
    finally:
        svc.stop()


def test_a_signal_during_the_launch_is_held_until_the_server_is_recorded() -> None:
    """A SIGTERM (or Ctrl-C) between the fork and the recording of the process is delivered after it, in order,
    to the handler that was installed; the handler in force again afterwards."""
    import signal as _signal

    from dflash_eval.sglang.launch import _signals_held

    seen: list[str] = []
    previous = _signal.signal(_signal.SIGTERM, lambda signum, frame: seen.append("handler"))
    previous_int = _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # an xdist worker ignores SIGINT
    try:
        with _signals_held():
            _signal.raise_signal(_signal.SIGTERM)
            seen.append("recorded")
        assert seen == ["recorded", "handler"]
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C too: raised where the block ends
            with _signals_held():
                _signal.raise_signal(_signal.SIGINT)
                seen.append("recorded again")
        assert seen[-1] == "recorded again"
        assert _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
    finally:
        _signal.signal(_signal.SIGTERM, previous)
        _signal.signal(_signal.SIGINT, previous_int)
