"""Client side of an SGLang server: readiness, identity, server info, and :class:`SGLangClient`, a handle on a
server that was found ready and serving the expected model.

Everything here speaks SGLang's native HTTP protocol:

* readiness is ``GET /health_generate`` answering 200. Connection refused (weights still loading) and 503
  (warm-up) mean "not yet"; ``/model_info`` and ``/server_info`` answer 200 during warm-up and are therefore
  never used as readiness signals;
* identity is ``GET /model_info`` -> ``model_path`` (``/get_model_info`` on older releases: asked on a 404, as
  ``/get_server_info`` for ``/server_info``);
* greedy completions come from ``POST /generate`` (:mod:`dflash_eval.sglang.generate`).

Every failure raises :class:`SGLangError`, whose message names the URL, the time waited, the last HTTP status
(or exception) seen and, when a server log is known, its tail. Every network call is bounded by a timeout, so
no function here can hang.

Readiness and identity are checked once per server, where the connection is made
(:meth:`SGLangClient.connect`, or :meth:`dflash_eval.sglang.service.SGLangService.start`); whoever then holds the
:class:`SGLangClient` only asks it for completions.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import requests

from dflash_eval.sglang.generate import Completion, generate_greedy, generate_sampled
from dflash_eval.sglang.transport import (
    SGLangError,
    connection_broke,
    describe_exception,
    excerpt,
    get_json,
    log_tail,
    normalize_url,
)

__all__ = ["SGLangClient", "ReferenceClient", "wait_until_ready", "check_identity", "server_info",
           "MODEL_INFO_FALLBACKS", "SERVER_INFO_FALLBACKS"]

logger = logging.getLogger("dflash_eval.sglang")

#: Default bound of one ``POST /generate`` request (one batch), in seconds.
DEFAULT_REQUEST_TIMEOUT_S = 600.0
#: Prompts per ``POST /generate`` request.
DEFAULT_BATCH_SIZE = 32
#: How long a launched server whose connection broke during a request is given to finish exiting before the error
#: is written, in seconds (a crashing server closes its sockets before its exit code exists).
DEFAULT_EXIT_WAIT_S = 5.0
#: Older SGLang releases' names of ``/model_info`` and ``/server_info`` (asked when the new name answers 404).
MODEL_INFO_FALLBACKS = ("/get_model_info",)
SERVER_INFO_FALLBACKS = ("/get_server_info",)


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
    while True:
        err = _exit_error(process, base, probe, start, last_seen, log_path)
        if err is not None:
            raise err
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        attempts += 1
        seen = _poll(probe, max(0.05, min(request_timeout_s, remaining)))
        if seen is None:
            waited = time.monotonic() - start
            logger.info("SGLang %s ready after %.1fs (%d polls)", base, waited, attempts)
            return waited
        last_seen = seen
        logger.debug("SGLang %s not ready after %.1fs: %s", base, time.monotonic() - start, last_seen)
        _pause(min(deadline, time.monotonic() + interval), process)
        interval = min(max_interval_s, interval * 2)
    err = _exit_error(process, base, probe, start, last_seen, log_path)
    if err is not None:
        raise err
    waited = time.monotonic() - start
    tail = f"\n--- server log tail ({log_path}) ---\n{log_tail(log_path)}" if log_path is not None else ""
    raise SGLangError(
        f"SGLang server at {base} not ready after {waited:.1f}s (timeout {timeout_s:g}s, {attempts} polls of "
        f"{probe}); last status: {last_seen}{tail}"
    )


def _poll(probe: str, timeout_s: float) -> str | None:
    """One ``GET`` of the readiness URL: None when it answered 200, else what was seen (the status and a body
    excerpt, or the exception)."""
    try:
        response = requests.get(probe, timeout=(timeout_s, timeout_s))
    except requests.exceptions.RequestException as exc:
        return describe_exception(exc)
    if response.status_code == 200:
        return None
    body = excerpt(response.content, 200)
    return f"HTTP {response.status_code}" + (f" {body!r}" if body else "")


def _pause(wake: float, process: subprocess.Popen | None) -> None:
    """Sleep until the monotonic time ``wake``, in short slices so that a dying ``process`` is noticed at once."""
    while True:
        now = time.monotonic()
        if now >= wake:
            return
        if process is not None and process.poll() is not None:
            return
        time.sleep(min(0.1, wake - now))


def _exit_error(process: subprocess.Popen | None, base: str, probe: str, start: float, last_seen: str,
                log_path: Path | None) -> SGLangError | None:
    """The error to raise when the launched server ``process`` has exited (None while it runs, or without one)."""
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


# ---------------------------------------------------------------------------------------------------------------
# identity and info


def server_info(url: str, timeout_s: float = 10.0) -> dict:
    """``GET /server_info`` (``/get_server_info`` on older releases) as a dict (server args, ``version``,
    ``internal_states``)."""
    info = get_json(url, "/server_info", timeout_s=timeout_s, what="server info", fallbacks=SERVER_INFO_FALLBACKS)
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
    info = get_json(base, "/model_info", timeout_s=timeout_s, what="model identity", fallbacks=MODEL_INFO_FALLBACKS)
    if not isinstance(info, dict):
        raise SGLangError(f"GET {base}/model_info answered {type(info).__name__}, expected an object")
    model_path = info.get("model_path")
    if not isinstance(model_path, str) or not model_path:
        raise SGLangError(f"GET {base}/model_info has no string field 'model_path': {excerpt(json.dumps(info))}")
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
# a server found ready and serving the expected model


class ReferenceClient(Protocol):
    """What the suite uses of a ready client for reference completions: :class:`SGLangClient`, or what a plugin's
    ``pytest_dflash_eval_reference_server`` hook answers (:mod:`dflash_eval.hookspec`)."""

    url: str
    model_info: dict

    def generate_greedy(self, batch_input_ids: list[list[int]], *, max_new_tokens: int,
                        stop_token_ids: list[int] | None = None) -> list[Completion]: ...

    def generate_sampled(self, batch_input_ids: list[list[int]], *, sampling: dict, seeds: list[int],
                         max_new_tokens: int, stop_token_ids: list[int] | None = None) -> list[Completion]: ...


class SGLangClient:
    """A handle on an SGLang server that was found ready and serving the expected model.

    Build it with :meth:`connect` (waits for readiness, checks identity) or from a ``/model_info`` answer that
    :func:`check_identity` already accepted; it never re-checks either. ``generate_greedy`` bounds each request
    by the ``request_timeout_s`` it was built with. ``alive`` (for a launched server: its
    :meth:`~dflash_eval.sglang.launch.LaunchedServer.check_running`, called as ``alive(when)`` or
    ``alive(when, wait_s=...)``) is called before and after each call, and when a call fails, so that a server
    process that exited is reported with its exit code and log tail. When the connection broke (refused, reset, closed
    without an answer), the process is first given up to ``exit_wait_s`` seconds to finish exiting; if it is still
    running then, the error says so and quotes the tail of ``log_path`` (the launched server's log).
    """

    def __init__(
        self,
        url: str,
        *,
        model_info: dict,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        batch_size: int = DEFAULT_BATCH_SIZE,
        alive: Callable[..., None] | None = None,
        log_path: Path | None = None,
        exit_wait_s: float = DEFAULT_EXIT_WAIT_S,
    ) -> None:
        self.url = normalize_url(url)
        self.alive = alive
        self.log_path = log_path
        self.exit_wait_s = float(exit_wait_s)
        if not isinstance(model_info, dict):
            raise SGLangError(f"SGLangClient({self.url!r}): model_info must be the /model_info dict")
        if not request_timeout_s > 0:
            raise SGLangError(f"SGLangClient({self.url!r}): request_timeout_s must be > 0, got {request_timeout_s}")
        self.model_info: dict = dict(model_info)
        self.request_timeout_s = float(request_timeout_s)
        self.batch_size = batch_size

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        expected_name: str,
        ready_timeout_s: float = 600.0,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        process: subprocess.Popen | None = None,
        log_path: Path | None = None,
    ) -> SGLangClient:
        """Wait until the server at ``url`` is ready (:func:`wait_until_ready`), check it serves
        ``expected_name`` (:func:`check_identity`), and return a client bound to it."""
        wait_until_ready(url, timeout_s=ready_timeout_s, process=process, log_path=log_path)
        info = check_identity(url, expected_name=expected_name)
        return cls(url, model_info=info, request_timeout_s=request_timeout_s)

    def generate_greedy(
        self,
        batch_input_ids: list[list[int]],
        *,
        max_new_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> list[Completion]:
        """Greedy completions of ``batch_input_ids``, validated as :func:`generate_greedy` does, each request
        bounded by this client's ``request_timeout_s``."""
        return self._call(lambda: generate_greedy(
            self.url, batch_input_ids, max_new_tokens=max_new_tokens, timeout_s=self.request_timeout_s,
            batch_size=self.batch_size, stop_token_ids=stop_token_ids))

    def generate_sampled(
        self,
        batch_input_ids: list[list[int]],
        *,
        sampling: dict,
        seeds: list[int],
        max_new_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> list[Completion]:
        """Sampled completions of ``batch_input_ids`` (prompt i with ``sampling_seed: seeds[i]``), validated as
        :func:`generate_sampled` does, each request bounded by this client's ``request_timeout_s``."""
        return self._call(lambda: generate_sampled(
            self.url, batch_input_ids, sampling=sampling, seeds=seeds, max_new_tokens=max_new_tokens,
            timeout_s=self.request_timeout_s, batch_size=self.batch_size, stop_token_ids=stop_token_ids))

    def _call(self, request: Callable[[], list[Completion]]) -> list[Completion]:
        """Run one ``/generate`` call between liveness checks; a broken connection to a launched server waits for
        its exit (``exit_wait_s``) so that the error carries the exit code and log tail."""
        self._check_alive()
        try:
            out = request()
        except SGLangError as exc:
            if self.alive is None or not connection_broke(exc):
                self._check_alive("while answering POST /generate")
                raise
            broke = describe_exception(exc.__cause__ or exc)
            self._check_alive(f"while answering POST /generate (the connection broke: {broke})", self.exit_wait_s)
            raise SGLangError(
                f"{exc}\nThe launched SGLang server process is still running {self.exit_wait_s:g}s after the "
                "connection broke (a crashed worker under a live launcher, or something else answering on its port?).\n"
                f"--- server log tail ({self.log_path}) ---\n{log_tail(self.log_path)}"
            ) from exc
        self._check_alive("while answering POST /generate")
        return out

    def _check_alive(self, when: str = "before POST /generate", wait_s: float = 0.0) -> None:
        if self.alive is not None:
            if wait_s > 0:
                self.alive(when, wait_s=wait_s)
            else:
                self.alive(when)

    def info(self, timeout_s: float = 10.0) -> dict:
        """The server's ``GET /server_info`` (server args, ``version``, ``internal_states``)."""
        return server_info(self.url, timeout_s=timeout_s)

    def __repr__(self) -> str:
        return f"SGLangClient({self.url}, model_path={self.model_info.get('model_path')!r})"
