"""HTTP client for an SGLang server: readiness, identity, greedy generation, server info.

Everything here speaks SGLang's native HTTP protocol (see ``shared/reference/sglang.md``):

* readiness is ``GET /health_generate`` answering 200. Connection refused (weights still loading) and 503
  (warm-up) mean "not yet"; ``/model_info`` and ``/server_info`` answer 200 during warm-up and are therefore
  never used as readiness signals;
* identity is ``GET /model_info`` -> ``model_path``;
* greedy completions come from ``POST /generate`` with ``input_ids`` and ``temperature: 0``.

Every failure raises :class:`SGLangError`, whose message names the URL, the time waited, the last HTTP status
(or exception) seen and, when a server log is known, its tail. Every network call is bounded by a timeout, so
no function here can hang. :func:`generate_greedy` validates the whole response before returning anything, so a
caller that caches its result can never cache a partial or malformed answer.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from dflash_eval.errors import DFlashEvalError

__all__ = [
    "SGLangError",
    "Completion",
    "normalize_url",
    "log_tail",
    "wait_until_ready",
    "check_identity",
    "generate_greedy",
    "server_info",
]

logger = logging.getLogger("dflash_eval.sglang")

#: How much of a response body or log file goes into an error message.
BODY_EXCERPT_CHARS = 500
LOG_TAIL_LINES = 30
LOG_TAIL_CHARS = 4000


class SGLangError(DFlashEvalError, RuntimeError):
    """An SGLang server could not be reached, was not ready in time, serves the wrong model or answered badly.

    The message names the URL, the time waited, the last status seen and (when known) the server log tail.
    """


@dataclass(frozen=True)
class Completion:
    """One greedy completion as returned by ``POST /generate``.

    ``output_ids`` are the generated ids only (no prompt). ``finish_reason`` is SGLang's dict, e.g.
    ``{"type": "length", "length": 64}`` or ``{"type": "stop", "matched": 151645}``. The two ``spec_*`` fields
    are present only when the server runs a speculative algorithm (``meta_info.spec_accept_length`` /
    ``spec_verify_ct``), else ``None``.
    """

    output_ids: list[int]
    text: str
    finish_reason: dict
    spec_accept_length: float | None
    spec_verify_ct: int | None


# ---------------------------------------------------------------------------------------------------------------
# helpers


def normalize_url(url: str) -> str:
    """Return ``url`` without trailing slashes; raise :class:`SGLangError` unless it is ``http(s)://host[:port]``."""
    if not isinstance(url, str) or not url.strip():
        raise SGLangError(f"SGLang URL must be a non-empty string like 'http://127.0.0.1:30000', got {url!r}")
    stripped = url.strip()
    parts = urlsplit(stripped)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SGLangError(
            f"SGLang URL {url!r} has no http:// or https:// scheme (or no host); write it like 'http://127.0.0.1:30000'"
        )
    if parts.query or parts.fragment:
        raise SGLangError(f"SGLang URL {url!r} must not carry a query or fragment; give the server root")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise SGLangError(f"SGLang URL {url!r} has an invalid port: {exc}") from None
    return stripped.rstrip("/")


def log_tail(log_path: Path | None, *, lines: int = LOG_TAIL_LINES, max_chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``lines`` lines (at most ``max_chars`` characters) of a server log, or a note why there are none."""
    if log_path is None:
        return "(no server log given)"
    path = Path(log_path)
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except FileNotFoundError:
        return f"(server log {path} does not exist)"
    except OSError as exc:
        return f"(server log {path} unreadable: {exc})"
    text = data.decode("utf-8", errors="replace")
    tail = "\n".join(text.splitlines()[-lines:])
    if len(tail) > max_chars:
        tail = "..." + tail[-max_chars:]
    return tail if tail.strip() else f"(server log {path} is empty)"


def _excerpt(body: bytes | str, limit: int = BODY_EXCERPT_CHARS) -> str:
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _describe_exception(exc: BaseException) -> str:
    if isinstance(exc, requests.exceptions.ConnectionError) and not isinstance(exc, requests.exceptions.Timeout):
        text = str(exc)
        if "refused" in text.lower():
            return "connection refused"
        return f"connection error ({type(exc).__name__}: {_excerpt(text, 200)})"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"request timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {_excerpt(str(exc), 200)}"


def _get_json(url: str, path: str, *, timeout_s: float, what: str) -> Any:
    """GET ``url + path``; return the decoded JSON or raise :class:`SGLangError`."""
    base = normalize_url(url)
    full = base + path
    start = time.monotonic()
    try:
        response = requests.get(full, timeout=(min(timeout_s, 10.0), timeout_s))
    except requests.exceptions.RequestException as exc:
        raise SGLangError(
            f"GET {full} ({what}) failed after {time.monotonic() - start:.1f}s: {_describe_exception(exc)}"
        ) from exc
    if response.status_code != 200:
        raise SGLangError(
            f"GET {full} ({what}) answered HTTP {response.status_code} after {time.monotonic() - start:.1f}s: "
            f"{_excerpt(response.content)!r}"
        )
    try:
        return response.json()
    except ValueError as exc:
        raise SGLangError(
            f"GET {full} ({what}) answered HTTP 200 but the body is not JSON ({exc}): {_excerpt(response.content)!r}"
        ) from exc


# ---------------------------------------------------------------------------------------------------------------
# readiness


def wait_until_ready(
    url: str,
    *,
    timeout_s: float = 600.0,
    request_timeout_s: float = 5.0,
    poll_interval_s: float = 0.5,
    max_interval_s: float = 5.0,
    process: subprocess.Popen | None = None,
    log_path: Path | None = None,
) -> float:
    """Poll ``GET /health_generate`` until it answers 200; return the seconds waited.

    Connection refused (the server is still loading weights), a 503 (warm-up) or any other non-200 answer mean
    "not yet". The pause between polls starts at ``poll_interval_s`` and doubles up to ``max_interval_s``. If
    ``process`` (the launched server) exits, raise at once with its exit code and the log tail. After
    ``timeout_s`` raise :class:`SGLangError` naming the URL, the seconds waited, the last status (or exception)
    seen and the tail of ``log_path``.
    """
    base = normalize_url(url)
    probe = base + "/health_generate"
    if timeout_s <= 0:
        raise SGLangError(f"wait_until_ready({base!r}): timeout_s must be > 0, got {timeout_s}")
    start = time.monotonic()
    deadline = start + timeout_s
    interval = max(0.01, poll_interval_s)
    last_seen = "no answer yet"
    attempts = 0

    def process_exit_error() -> SGLangError | None:
        if process is None:
            return None
        code = process.poll()
        if code is None:
            return None
        return SGLangError(
            f"SGLang server for {base} (pid {process.pid}) exited with code {code} after "
            f"{time.monotonic() - start:.1f}s, before {probe} answered 200 (last status: {last_seen}).\n"
            f"--- server log tail ({log_path}) ---\n{log_tail(log_path)}"
        )

    while True:
        err = process_exit_error()
        if err is not None:
            raise err
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        attempts += 1
        req_timeout = max(0.05, min(request_timeout_s, remaining))
        try:
            response = requests.get(probe, timeout=(req_timeout, req_timeout))
        except requests.exceptions.RequestException as exc:
            last_seen = _describe_exception(exc)
        else:
            if response.status_code == 200:
                waited = time.monotonic() - start
                logger.info("SGLang %s ready after %.1fs (%d polls)", base, waited, attempts)
                return waited
            body = _excerpt(response.content, 200)
            last_seen = f"HTTP {response.status_code}" + (f" {body!r}" if body else "")
        logger.debug("SGLang %s not ready after %.1fs: %s", base, time.monotonic() - start, last_seen)
        # Sleep in short slices so that a dying process is noticed at once.
        wake = min(deadline, time.monotonic() + interval)
        while True:
            now = time.monotonic()
            if now >= wake:
                break
            if process is not None and process.poll() is not None:
                break
            time.sleep(min(0.1, wake - now))
        interval = min(max_interval_s, interval * 2)

    err = process_exit_error()
    if err is not None:
        raise err
    waited = time.monotonic() - start
    tail = f"\n--- server log tail ({log_path}) ---\n{log_tail(log_path)}" if log_path is not None else ""
    raise SGLangError(
        f"SGLang server at {base} not ready after {waited:.1f}s (timeout {timeout_s:g}s, {attempts} polls of "
        f"{probe}); last status: {last_seen}{tail}"
    )


# ---------------------------------------------------------------------------------------------------------------
# identity and info


def server_info(url: str, timeout_s: float = 10.0) -> dict:
    """``GET /server_info`` as a dict (server args, ``version``, ``internal_states``)."""
    info = _get_json(url, "/server_info", timeout_s=timeout_s, what="server info")
    if not isinstance(info, dict):
        raise SGLangError(f"GET {normalize_url(url)}/server_info answered {type(info).__name__}, expected an object")
    return info


def _basename(path: str) -> str:
    return os.path.basename(path.rstrip("/\\")) or path


def _names_of(model_path: str) -> set[str]:
    """Names a ``model_path`` answers to: itself, its basename, and for a Hugging Face cache snapshot
    (``.../models--ORG--NAME/snapshots/<commit>``) also ``NAME`` and ``ORG/NAME``."""
    names = {model_path, _basename(model_path)}
    parts = model_path.replace("\\", "/").rstrip("/").split("/")
    for i, part in enumerate(parts):
        if part.startswith("models--") and i + 1 < len(parts) and parts[i + 1] == "snapshots":
            repo = part[len("models--") :].split("--")
            names.add(repo[-1])
            names.add("/".join(repo))
    return names


def check_identity(url: str, *, expected_name: str, timeout_s: float = 10.0) -> dict:
    """Check that the server serves ``expected_name``; return its ``/model_info`` dict.

    The server matches when ``expected_name`` equals the basename of ``model_info["model_path"]`` (so
    ``/models/Qwen3-8B`` and ``Qwen/Qwen3-8B`` both match ``"Qwen3-8B"``), the full ``model_path``, the repo name
    of a Hugging Face cache snapshot path (``.../models--Qwen--Qwen3-8B/snapshots/<commit>``), or the
    ``served_model_name`` (from ``/model_info``, else from ``/server_info``). A mismatch raises
    :class:`SGLangError` naming both.
    """
    base = normalize_url(url)
    if not isinstance(expected_name, str) or not expected_name:
        raise SGLangError(f"check_identity({base!r}): expected_name must be a non-empty string")
    info = _get_json(base, "/model_info", timeout_s=timeout_s, what="model identity")
    if not isinstance(info, dict):
        raise SGLangError(f"GET {base}/model_info answered {type(info).__name__}, expected an object")
    model_path = info.get("model_path")
    if not isinstance(model_path, str) or not model_path:
        raise SGLangError(f"GET {base}/model_info has no string field 'model_path': {_excerpt(json.dumps(info))}")
    candidates = _names_of(model_path)
    if expected_name in candidates:
        return info
    served = info.get("served_model_name")
    if not (isinstance(served, str) and served):
        try:  # older and current SGLang report served_model_name only among the server args
            served = server_info(base, timeout_s=timeout_s).get("served_model_name")
        except SGLangError:
            served = None
    if isinstance(served, str) and served:
        candidates.add(served)
        if expected_name == served:
            return info
    served_note = f", served_model_name={served!r}" if isinstance(served, str) and served else ""
    raise SGLangError(
        f"SGLang server at {base} serves the wrong model: expected {expected_name!r}, "
        f"but /model_info says model_path={model_path!r}{served_note} "
        f"(names it answers to: {sorted(candidates)})"
    )


# ---------------------------------------------------------------------------------------------------------------
# greedy generation


def _check_prompts(batch_input_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    if isinstance(batch_input_ids, (str, bytes)) or not isinstance(batch_input_ids, Sequence):
        raise SGLangError(f"batch_input_ids must be a list of lists of ints, got {type(batch_input_ids).__name__}")
    prompts: list[list[int]] = []
    for i, ids in enumerate(batch_input_ids):
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise SGLangError(f"batch_input_ids[{i}] must be a list of ints, got {type(ids).__name__}")
        if len(ids) == 0:
            raise SGLangError(f"batch_input_ids[{i}] is empty: SGLang cannot generate from an empty prompt")
        out = []
        for tok in ids:
            if isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
                raise SGLangError(f"batch_input_ids[{i}] contains {tok!r} ({type(tok).__name__}), expected int")
            out.append(int(tok))
        prompts.append(out)
    return prompts


def _abort_response(response: requests.Response) -> None:
    """Best effort: shut down the socket under a streamed response so that a read blocked on it returns.

    Only ``shutdown`` is used: ``close()`` would block on the lock the reading thread holds. The socket is found
    on the pooled connection (keep-alive) or, for a connection that closes after the answer, on the file object
    of ``http.client``'s response. If neither is there, the reading daemon thread simply runs out on its own.
    """
    raw = getattr(response, "raw", None)
    candidates = [getattr(getattr(raw, "_connection", None), "sock", None)]
    fp = getattr(getattr(raw, "_fp", None), "fp", None)  # BufferedReader over socket.SocketIO
    candidates.append(getattr(getattr(fp, "raw", None), "_sock", None))
    for sock in candidates:
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _post_json(endpoint: str, payload: Any, deadline: float) -> tuple[int, bytes]:
    """POST ``payload`` and read the whole answer, returning by ``deadline`` whatever the server does.

    A read timeout alone does not bound the total time (a server trickling one byte per second never trips it),
    so the request runs in a daemon thread and the caller waits at most until ``deadline``; then the socket is
    shut down and :class:`TimeoutError` raised.
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            remaining = max(0.05, deadline - time.monotonic())
            with requests.post(endpoint, json=payload, timeout=(min(remaining, 10.0), remaining), stream=True) as r:
                box["response"] = r
                chunks = [chunk for chunk in r.iter_content(chunk_size=64 * 1024)]
                box["result"] = (r.status_code, b"".join(chunks))
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"sglang-post {endpoint}", daemon=True)
    worker.start()
    worker.join(timeout=max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        response = box.get("response")
        if response is not None:
            _abort_response(response)
        raise TimeoutError("no complete answer by the deadline")
    if "error" in box:
        raise box["error"]
    return box["result"]


def _parse_item(item: Any, *, index: int, where: str, max_new_tokens: int) -> Completion:
    def bad(field: str, problem: str) -> SGLangError:
        return SGLangError(f"{where}: malformed response item [{index}]: field {field!r} {problem}")

    if not isinstance(item, dict):
        raise bad("<item>", f"is {type(item).__name__}, expected an object: {_excerpt(json.dumps(item))}")
    if "error" in item and "output_ids" not in item:
        raise SGLangError(f"{where}: item [{index}] is an error: {_excerpt(json.dumps(item['error']))}")
    if "output_ids" not in item:
        raise bad("output_ids", f"is missing (keys: {sorted(item)})")
    output_ids = item["output_ids"]
    if not isinstance(output_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in output_ids):
        raise bad("output_ids", f"is not a list of ints: {_excerpt(json.dumps(output_ids), 200)}")
    meta = item.get("meta_info")
    if not isinstance(meta, dict):
        raise bad("meta_info", "is missing" if meta is None else f"is {type(meta).__name__}, expected an object")
    finish = meta.get("finish_reason")
    if not isinstance(finish, dict) or not isinstance(finish.get("type"), str):
        raise bad("meta_info.finish_reason", f"is not an object with a string 'type': {finish!r}")
    if finish["type"] == "abort":
        raise SGLangError(f"{where}: item [{index}] was aborted by the server: finish_reason={finish!r}")
    if not output_ids:
        raise SGLangError(
            f"{where}: item [{index}] has an empty output_ids (finish_reason={finish!r}); "
            f"a greedy completion must contain at least one token"
        )
    if len(output_ids) > max_new_tokens:
        raise bad("output_ids", f"has {len(output_ids)} tokens, more than max_new_tokens={max_new_tokens}")
    text = item.get("text", "")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise bad("text", f"is {type(text).__name__}, expected a string")
    accept = meta.get("spec_accept_length")
    if accept is not None:
        if isinstance(accept, bool) or not isinstance(accept, (int, float)) or not math.isfinite(accept):
            raise bad("meta_info.spec_accept_length", f"is {accept!r}, expected a finite number")
        accept = float(accept)
    verify = meta.get("spec_verify_ct")
    if verify is not None:
        if isinstance(verify, bool) or not isinstance(verify, int):
            if isinstance(verify, float) and verify.is_integer():
                verify = int(verify)
            else:
                raise bad("meta_info.spec_verify_ct", f"is {verify!r}, expected an int")
    return Completion(
        output_ids=list(output_ids),
        text=text,
        finish_reason=dict(finish),
        spec_accept_length=accept,
        spec_verify_ct=verify,
    )


def generate_greedy(
    url: str,
    batch_input_ids: list[list[int]],
    *,
    max_new_tokens: int,
    timeout_s: float = 600.0,
    batch_size: int = 32,
    stop_token_ids: list[int] | None = None,
) -> list[Completion]:
    """Greedy completions of ``batch_input_ids`` from ``POST /generate``, one :class:`Completion` per prompt.

    Prompts go in requests of at most ``batch_size`` (SGLang answers a batch with a list in the same order),
    with ``temperature: 0`` (argmax), ``max_new_tokens`` and, when given, ``stop_token_ids``. ``timeout_s``
    bounds each request (one batch, from sending it to the last byte of the answer, even if the server trickles
    bytes), so a call takes at most ``ceil(len(batch_input_ids) / batch_size) * timeout_s``; requests go one
    after another.

    The result is returned only after every item of every request was validated: an HTTP error (the body
    excerpt is quoted), undecodable JSON, a list of the wrong length, a missing or ill-typed ``output_ids`` or
    ``meta_info.finish_reason``, an aborted or empty completion, more than ``max_new_tokens`` tokens, each
    raise :class:`SGLangError` naming the field and the URL, and nothing is returned (so nothing can be cached).
    """
    base = normalize_url(url)
    endpoint = base + "/generate"
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise SGLangError(f"generate_greedy({base!r}): max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SGLangError(f"generate_greedy({base!r}): batch_size must be an int >= 1, got {batch_size!r}")
    if timeout_s <= 0:
        raise SGLangError(f"generate_greedy({base!r}): timeout_s must be > 0, got {timeout_s}")
    prompts = _check_prompts(batch_input_ids)
    if not prompts:
        return []
    sampling_params: dict[str, Any] = {
        "temperature": 0.0,
        "max_new_tokens": max_new_tokens,
        "ignore_eos": False,
        "skip_special_tokens": True,
    }
    if stop_token_ids:
        sampling_params["stop_token_ids"] = [int(t) for t in stop_token_ids]

    start = time.monotonic()
    results: list[Completion] = []
    for first in range(0, len(prompts), batch_size):
        chunk = prompts[first : first + batch_size]
        where = f"POST {endpoint} (prompts {first}..{first + len(chunk) - 1} of {len(prompts)})"
        payload = {"input_ids": chunk, "sampling_params": sampling_params}
        sent = time.monotonic()
        try:
            status, body = _post_json(endpoint, payload, sent + timeout_s)
        except (requests.exceptions.RequestException, TimeoutError) as exc:
            raise SGLangError(
                f"{where}: no complete answer after {time.monotonic() - sent:.1f}s (timeout {timeout_s:g}s per "
                f"request): {_describe_exception(exc)}"
            ) from exc
        if status != 200:
            raise SGLangError(f"{where}: HTTP {status} after {time.monotonic() - sent:.1f}s; body: {_excerpt(body)!r}")
        try:
            decoded = json.loads(body)
        except ValueError as exc:
            raise SGLangError(
                f"{where}: HTTP 200 but the body is not valid JSON ({exc}); body: {_excerpt(body)!r}"
            ) from exc
        if isinstance(decoded, dict) and len(chunk) == 1 and "output_ids" in decoded:
            decoded = [decoded]  # tolerate a single-prompt batch answered with a bare object
        if not isinstance(decoded, list):
            raise SGLangError(
                f"{where}: malformed response: expected a JSON list of {len(chunk)} items, got "
                f"{type(decoded).__name__}: {_excerpt(json.dumps(decoded))!r}"
            )
        if len(decoded) != len(chunk):
            raise SGLangError(
                f"{where}: malformed response: list has {len(decoded)} items for a batch of {len(chunk)} prompts"
            )
        for i, item in enumerate(decoded):
            results.append(_parse_item(item, index=first + i, where=where, max_new_tokens=max_new_tokens))
    logger.debug("SGLang %s: %d greedy completions in %.1fs", base, len(results), time.monotonic() - start)
    return results
