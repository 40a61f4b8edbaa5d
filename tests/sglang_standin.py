"""A stand-in for an SGLang server, for tests. It is NOT SGLang.

It speaks the subset of SGLang's native HTTP protocol that :mod:`dflash_eval.sglang` uses, on 127.0.0.1, and
says what it is: ``GET /server_info`` answers ``"version": "dflash-eval-standin"``. Completions come from greedy
``model.generate(..., do_sample=False)`` of a transformers causal LM loaded from a local folder (one prompt at a
time, float32, so they equal the model's own greedy output for the same ids).

    python tests/sglang_standin.py --model-path DIR --port P [--warmup-refuse-s X] [--warmup-503-s Y]
                                   [--mode happy|never-ready|die-during-warmup|generate-500|slow|
                                           malformed-json|wrong-model-info|die-during-generate] [--slow-s S]

Start-up mimics SGLang's phases:

1. for ``--warmup-refuse-s`` seconds after start (and at least until the model is loaded) the port is not bound,
   so every request gets *connection refused*;
2. for ``--warmup-503-s`` seconds ``GET /health`` and ``GET /health_generate`` answer 503 while ``/model_info``,
   ``/server_info`` and ``/v1/models`` already answer 200;
3. then ``/health_generate`` answers 200 (ready).

Modes (failure injection):

* ``happy`` - as above;
* ``never-ready`` - stays in phase 2 forever;
* ``die-during-warmup`` - prints a crash message and exits with code 3 at the end of phase 2;
* ``generate-500`` - ready, but ``POST /generate`` answers HTTP 500;
* ``slow`` - ready, but ``POST /generate`` answers only after ``--slow-s`` seconds (default 30);
* ``malformed-json`` - ready, but ``POST /generate`` answers 200 with a truncated JSON body;
* ``wrong-model-info`` - ``/model_info`` claims another model (``/models/Some-Other-Model-7B``);
* ``die-during-generate`` - ready, but on ``POST /generate`` it prints a crash message, closes the connection
  without an answer (the client sees ``RemoteDisconnected``) and exits with code 3 ``--die-delay-s`` seconds later
  (default 1), as a server that takes a moment to tear its workers down after the crash.

``--legacy-info`` (any mode): answer ``/model_info`` and ``/server_info`` with 404, as SGLang releases that serve
only ``/get_model_info`` and ``/get_server_info`` do. ``--skip-tokenizer-init`` (any mode): completions carry no
text (``""``), as a server started with SGLang's ``--skip-tokenizer-init``.

``--wrong-answer-at K`` (any mode that answers ``/generate``) answers the K-th prompt it is asked (counting from 0
over all requests) wrongly: every token of its greedy completion is shifted by one in the vocabulary
(``(t + 1) % vocab_size``), as a replica behind a router that serves other weights would answer, while every other
prompt gets the right completion.

``--sampling-fault F`` (any mode that answers ``/generate``) answers every SAMPLED request (``temperature`` >=
1e-6) with other sampling than it asks, as a proxy that drops or rewrites ``sampling_params`` keys, or a server
with other defaults, would: ``greedy`` (argmax, the request's temperature ignored), ``half-temperature`` /
``double-temperature`` (the asked temperature x 0.5 / x 2), ``ignore-top-k`` (the asked ``top_k`` dropped: no
truncation), ``ignore-top-p`` (likewise ``top_p``), ``extra-top-k`` (top-k 20 where the request asks none) and
``extra-top-p`` (top-p 0.8 where the request asks none). Greedy requests are answered as asked.

``--synthetic-spec-accept-length X`` (any mode) adds a SYNTHETIC ``meta_info.spec_accept_length`` (about X),
``spec_verify_ct`` and ``spec_accept_histogram`` to every completion, as a server running ``--speculative-algorithm``
would; no drafter runs, the number only exercises the suite's reporting of the server's accept length.

Only ``happy`` loads the model before binding (like SGLang). To keep tests fast, ``slow`` and
``wrong-model-info`` load it on the first ``POST /generate``, and the modes whose ``/generate`` never succeeds
(``never-ready``, ``die-during-warmup``, ``generate-500``, ``malformed-json``, ``die-during-generate``) never load
it (nor import torch): they start in a fraction of a second.

``POST /generate`` accepts exactly one of ``input_ids`` (``list[int]`` -> one object, ``list[list[int]]`` -> a list
in the same order) or ``text`` (needs a tokenizer in the folder), and ``sampling_params`` as one dict or a list of
dicts (one per prompt). ``temperature`` < 1e-6 is greedy; above it the stand-in samples with transformers'
``generate(do_sample=True)`` under the request's ``temperature``, ``top_k`` (-1: all), ``top_p`` and ``min_p``
(its own sampler: not the suite's, not SGLang's). As SGLang, it honours a request's ``sampling_seed`` only when
started with ``--enable-deterministic-inference`` (``/server_info`` then says ``enable_deterministic_inference:
true``): the draw is then a function of the seed and the prompt alone; otherwise the seed is ignored.

Every answered request is logged as ``"METHOD PATH HTTP/1.1" STATUS``; :func:`request_counts` tallies a log's
requests per path (how tests check that a client asked for readiness or identity only once).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VERSION = "dflash-eval-standin"
MODES = (
    "happy",
    "never-ready",
    "die-during-warmup",
    "generate-500",
    "slow",
    "malformed-json",
    "wrong-model-info",
    "die-during-generate",
)
EAGER_LOAD_MODES = frozenset({"happy"})
WRONG_MODEL_PATH = "/models/Some-Other-Model-7B"
DIE_EXIT_CODE = 3
SAMPLING_FAULTS = ("none", "greedy", "half-temperature", "double-temperature", "ignore-top-k", "ignore-top-p",
                   "extra-top-k", "extra-top-p")


def log(msg: str) -> None:
    print(f"[standin {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


#: How every answered request appears in the log: ``"GET /model_info HTTP/1.1" 200``.
REQUEST_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


def request_counts(log_text: str, *, status: int | None = None) -> Counter[str]:
    """``{"GET /model_info": n, "POST /generate": m, ...}``: the requests a stand-in answered, read from its log
    (only those answered with ``status`` when given). Each request is logged before its answer is sent, so a
    client that got an answer finds its request counted."""
    counts: Counter[str] = Counter()
    for m in REQUEST_LINE.finditer(log_text):
        if status is None or int(m["status"]) == status:
            counts[f"{m['method']} {m['path']}"] += 1
    return counts


class BadRequest(Exception):
    """A request the stand-in rejects with HTTP 400."""


class StandIn:
    """State shared by the request handlers."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mode: str = args.mode
        self.model_path = str(Path(args.model_path))
        self.served_model_name = args.served_model_name or os.path.basename(self.model_path.rstrip("/"))
        self.ready = threading.Event()
        self.lock = threading.Lock()  # one generation at a time, like a scheduler
        self.load_lock = threading.Lock()
        self.model = None
        self.tokenizer = None
        self.stop_ids: set[int] = set()
        self.pad_id = 0
        self.answered = 0  # prompts answered so far (for --wrong-answer-at)
        config_file = Path(self.model_path) / "config.json"
        self.config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}

    # -- model ----------------------------------------------------------------------------------------------
    def load(self) -> None:
        with self.load_lock:
            if self.model is None:
                self._load()

    def _load(self) -> None:
        # Importing torch and transformers makes a few hundred thousand objects that live as long as the server; the
        # cyclic collector would walk them several times while they are made and at every full collection after.
        # Paused while they load, then moved to the permanent generation: as SGLang, the stand-in lives until it is
        # killed, and the tests start it dozens of times.
        gc.disable()
        try:
            import torch
            import transformers
            from transformers import AutoModelForCausalLM
        finally:
            gc.enable()
            gc.freeze()

        transformers.logging.set_verbosity_error()
        torch.set_num_threads(1)
        if not self.args.enable_deterministic_inference:  # SGLang's unseeded draws differ from one start to the next
            torch.manual_seed(int.from_bytes(os.urandom(8), "little"))
        log(f"loading model from {self.model_path}")
        model = AutoModelForCausalLM.from_pretrained(self.model_path, local_files_only=True, dtype=torch.float32).eval()
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = model.config.eos_token_id
        self.stop_ids = set([eos] if isinstance(eos, int) else list(eos or []))
        pad = model.generation_config.pad_token_id
        self.pad_id = pad if isinstance(pad, int) else (min(self.stop_ids) if self.stop_ids else 0)
        # Stop tokens are passed per request; the generation config must not add its own.
        model.generation_config.eos_token_id = None
        try:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - no tokenizer in the folder: text is ""
            log(f"no tokenizer in {self.model_path} ({type(exc).__name__}); responses carry text ''")
        self.model = model
        log("model loaded")

    def generate_one(self, prompt: list[int], params: dict[str, Any]) -> dict[str, Any]:
        import torch

        temperature = float(params.get("temperature", 1.0))
        if temperature < 0:
            raise BadRequest(f"temperature must be a non-negative finite number, got {temperature}")
        max_new = int(params.get("max_new_tokens", 128))
        if max_new < 1:
            raise BadRequest(f"max_new_tokens must be >= 1, got {max_new}")
        stops = set(int(t) for t in (params.get("stop_token_ids") or []))
        if not params.get("ignore_eos", False):
            stops |= self.stop_ids
        start = time.perf_counter()
        ids = torch.tensor([prompt], dtype=torch.long)
        with self.lock, torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                eos_token_id=sorted(stops) if stops else None,
                pad_token_id=self.pad_id,
                **self.sampling(params, temperature),
            )
            index, self.answered = self.answered, self.answered + 1
        gen = out[0, len(prompt) :].tolist()
        # SGLang checks the length limit before stop tokens.
        if len(gen) >= max_new:
            finish: dict[str, Any] = {"type": "length", "length": max_new}
        elif gen and gen[-1] in stops:
            finish = {"type": "stop", "matched": gen[-1]}
        else:  # pragma: no cover - generate stopped for another reason
            finish = {"type": "length", "length": max_new}
        if index == self.args.wrong_answer_at:
            vocab = int(self.model.config.vocab_size)
            gen = [(t + 1) % vocab for t in gen]
            log(f"--wrong-answer-at {index}: answering prompt {index} with a wrong completion")
        text = ""
        if self.tokenizer is not None and not self.args.skip_tokenizer_init:
            text = self.tokenizer.decode(gen, skip_special_tokens=bool(params.get("skip_special_tokens", True)))
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(gen),
            "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - start,
        }
        synthetic = self.args.synthetic_spec_accept_length
        if synthetic is not None:  # SYNTHETIC: no drafter runs here; only exercises the client's spec_* plumbing
            meta["spec_verify_ct"] = max(1, round(len(gen) / synthetic))
            meta["spec_accept_length"] = len(gen) / meta["spec_verify_ct"]
            # and a histogram (index n = rounds that accepted n drafts) spreading the drafts evenly over the rounds
            rounds, drafts = meta["spec_verify_ct"], max(0, len(gen) - meta["spec_verify_ct"])
            hist = [0] * (drafts // rounds + 2)
            hist[drafts // rounds] += rounds - drafts % rounds
            hist[drafts // rounds + 1] += drafts % rounds
            meta["spec_accept_histogram"] = hist
        return {"text": text, "output_ids": gen, "meta_info": meta}

    def sampling(self, params: dict[str, Any], temperature: float) -> dict[str, Any]:
        """transformers ``generate`` arguments of one request's sampling (call under ``self.lock``: seeding sets
        torch's global generator, which transformers' sampling draws from)."""
        import torch

        fault = self.args.sampling_fault
        if temperature < 1e-6 or fault == "greedy":
            return {"do_sample": False}
        seed = params.get("sampling_seed")
        if seed is not None and self.args.enable_deterministic_inference:
            torch.manual_seed(int(seed))
        top_k = int(params.get("top_k", -1))
        top_p = float(params.get("top_p", 1.0))
        if fault in ("half-temperature", "double-temperature"):  # the request's own temperature, rescaled
            temperature *= 0.5 if fault == "half-temperature" else 2.0
        elif fault == "ignore-top-k":
            top_k = -1
        elif fault == "ignore-top-p":
            top_p = 1.0
        elif fault == "extra-top-k" and top_k <= 0:
            top_k = 20
        elif fault == "extra-top-p" and top_p >= 1.0:
            top_p = 0.8
        return {"do_sample": True, "temperature": temperature, "top_k": top_k if top_k > 0 else 0,
                "top_p": top_p, "min_p": float(params.get("min_p", 0.0)) or None}

    def generate(self, request: Any) -> Any:
        self.load()
        if not isinstance(request, dict):
            raise BadRequest("the request body must be a JSON object")
        if ("text" in request) == ("input_ids" in request):
            raise BadRequest("give exactly one of 'text' or 'input_ids'")
        if "input_ids" in request:
            ids = request["input_ids"]
            if not isinstance(ids, list) or not ids:
                raise BadRequest("'input_ids' must be a non-empty list")
            single = all(isinstance(t, int) for t in ids)
            prompts = [ids] if single else ids
            for p in prompts:
                if not isinstance(p, list) or not p or not all(isinstance(t, int) for t in p):
                    raise BadRequest("'input_ids' must be list[int] or list[list[int]] with non-empty prompts")
        else:
            if self.tokenizer is None:
                raise BadRequest("'text' input needs a tokenizer; this model folder has none")
            texts = request["text"]
            single = isinstance(texts, str)
            prompts = [self.tokenizer.encode(t) for t in ([texts] if single else texts)]
        params = request.get("sampling_params") or {}
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise BadRequest(f"{len(params)} sampling_params for {len(prompts)} prompts")
            per_prompt = params
        elif isinstance(params, dict):
            per_prompt = [params] * len(prompts)
        else:
            raise BadRequest("'sampling_params' must be an object or a list of objects")
        results = [self.generate_one(p, sp) for p, sp in zip(prompts, per_prompt, strict=True)]
        return results[0] if single else results

    # -- static info ----------------------------------------------------------------------------------------
    def model_info(self) -> dict[str, Any]:
        path = WRONG_MODEL_PATH if self.mode == "wrong-model-info" else self.model_path
        return {
            "model_path": path,
            "tokenizer_path": path,
            "is_generation": True,
            "model_type": self.config.get("model_type"),
            "architectures": self.config.get("architectures"),
            "weight_version": "default",
        }

    def server_info(self) -> dict[str, Any]:
        info = self.model_info()
        return {
            "model_path": info["model_path"],
            "tokenizer_path": info["tokenizer_path"],
            "served_model_name": os.path.basename(info["model_path"].rstrip("/"))
            if self.mode == "wrong-model-info"
            else self.served_model_name,
            "host": self.args.host,
            "port": self.args.port,
            "speculative_algorithm": None,
            "enable_deterministic_inference": bool(self.args.enable_deterministic_inference),
            "version": VERSION,
            "standin_mode": self.mode,
            "internal_states": [{"last_gen_throughput": 0.0}],
        }


def make_handler(state: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "dflash-eval-standin"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            log(f"{self.address_string()} {format % args}")

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                log("client went away before the answer was written")

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode())

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            if path in ("/health", "/health_generate"):
                if state.ready.is_set():
                    self._send(200, b"", "text/plain")
                else:
                    self._send(503, b"", "text/plain")
            elif path in ("/model_info", "/server_info") and state.args.legacy_info:
                self._json(404, {"detail": "Not Found"})
            elif path in ("/model_info", "/get_model_info"):
                self._json(200, state.model_info())
            elif path in ("/server_info", "/get_server_info"):
                self._json(200, state.server_info())
            elif path == "/v1/models":
                info = state.model_info()
                self._json(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": state.server_info()["served_model_name"],
                                "object": "model",
                                "owned_by": "dflash-eval-standin",
                                "root": info["model_path"],
                            }
                        ],
                    },
                )
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path == "/flush_cache":
                self._send(200, b"Cache flushed.", "text/plain")
                return
            if path != "/generate":
                self._json(404, {"detail": "Not Found"})
                return
            if not state.ready.is_set():
                self._json(503, {"error": {"message": "the stand-in is still warming up"}})
                return
            mode = state.mode
            if mode == "generate-500":
                self._send(500, b"Internal Server Error: stand-in failure injection (mode generate-500)", "text/plain")
                return
            if mode == "malformed-json":
                self._send(200, b'[{"text": "abc", "output_ids": [1, 2, 3], "meta_info": {"finish_rea')
                return
            if mode == "die-during-generate":
                delay = state.args.die_delay_s
                log(f"simulated crash while answering /generate (mode die-during-generate): connection closed, "
                    f"exiting with code {DIE_EXIT_CODE} in {delay:g}s")
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                time.sleep(delay)
                log(f"exiting with code {DIE_EXIT_CODE}")
                os._exit(DIE_EXIT_CODE)
            if mode == "slow":
                log(f"mode slow: sleeping {state.args.slow_s}s before answering /generate")
                time.sleep(state.args.slow_s)
            try:
                request = json.loads(raw or b"null")
                self._json(200, state.generate(request))
            except (BadRequest, ValueError, TypeError) as exc:
                self._json(400, {"error": {"message": f"{type(exc).__name__}: {exc}", "code": 400}})

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Stand-in for an SGLang server (tests only; NOT SGLang).")
    parser.add_argument("--model-path", required=True, help="local folder with a transformers causal LM")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--warmup-refuse-s", type=float, default=0.0, help="seconds with the port unbound")
    parser.add_argument("--warmup-503-s", type=float, default=0.0, help="seconds of 503 on /health*")
    parser.add_argument("--mode", choices=MODES, default="happy")
    parser.add_argument("--slow-s", type=float, default=30.0, help="delay of /generate in mode 'slow'")
    parser.add_argument("--die-delay-s", type=float, default=1.0,
                        help="seconds mode 'die-during-generate' lives on after closing the connection")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--legacy-info", action="store_true",
                        help="404 on /model_info and /server_info (only /get_model_info, /get_server_info), as older "
                             "SGLang releases")
    parser.add_argument("--skip-tokenizer-init", action="store_true",
                        help="completions carry no text, as SGLang's --skip-tokenizer-init")
    parser.add_argument("--wrong-answer-at", type=int, default=None, metavar="K",
                        help="answer the K-th prompt asked (from 0, over all requests) with a wrong completion (each "
                             "token shifted by one in the vocabulary); the others right")
    parser.add_argument("--sampling-fault", choices=SAMPLING_FAULTS, default="none",
                        help="answer sampled requests with other sampling than asked (greedy, the temperature "
                             "halved or doubled, top-k / top-p ignored or added), as a proxy that drops "
                             "sampling_params keys would; 'none': as asked")
    parser.add_argument("--synthetic-spec-accept-length", type=float, default=None, metavar="X",
                        help="SYNTHETIC (no drafter runs): emit meta_info.spec_accept_length ~= X and spec_verify_ct, "
                             "as a server with --speculative-algorithm would; for testing the reporting only")
    parser.add_argument("--enable-deterministic-inference", action="store_true",
                        help="honour each request's sampling_seed, as SGLang's flag of that name")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    args = parse_args(argv)
    log(f"stand-in for SGLang (version {VERSION}, NOT SGLang), mode={args.mode}, sampling fault={args.sampling_fault}, "
        f"pid={os.getpid()}")
    state = StandIn(args)
    if args.mode in EAGER_LOAD_MODES:
        state.load()
    time.sleep(max(0.0, t0 + args.warmup_refuse_s - time.monotonic()))
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    except OSError as exc:
        log(f"cannot bind {args.host}:{args.port}: {exc}")
        return 2
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    log(f"listening on http://{args.host}:{args.port}; warming up for {args.warmup_503_s}s (503 on /health*)")
    time.sleep(max(0.0, args.warmup_503_s))
    if args.mode == "die-during-warmup":
        log(f"simulated crash during warm-up (mode die-during-warmup): exiting with code {DIE_EXIT_CODE}")
        os._exit(DIE_EXIT_CODE)
    if args.mode == "never-ready":
        log("mode never-ready: /health_generate will answer 503 forever")
    else:
        state.ready.set()
        log("ready: /health_generate answers 200")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
