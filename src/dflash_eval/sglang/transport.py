"""Low-level pieces every SGLang HTTP call shares: the error type, URL normalisation, a bounded JSON ``GET``,
and the excerpts (response body, exception, server log tail) that error messages quote.

Every failure raises :class:`SGLangError`, whose message names the URL, the time waited, the last HTTP status
(or exception) seen and, when a server log is known, its tail.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from dflash_eval.errors import DFlashEvalError

__all__ = ["SGLangError", "normalize_url", "log_tail", "get_json", "excerpt", "describe_exception", "connection_broke"]

#: How much of a response body or log file goes into an error message.
BODY_EXCERPT_CHARS = 500
LOG_TAIL_LINES = 30
LOG_TAIL_CHARS = 4000


class SGLangError(DFlashEvalError, RuntimeError):
    """An SGLang server could not be reached, was not ready in time, serves the wrong model or answered badly.

    The message names the URL, the time waited, the last status seen and (when known) the server log tail.
    """


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
        port = parts.port  # ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise SGLangError(f"SGLang URL {url!r} has an invalid port: {exc}") from None
    if port == 0:
        raise SGLangError(f"SGLang URL {url!r} has an invalid port: 0 (a server listens on 1..65535)")
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


def excerpt(body: bytes | str, limit: int = BODY_EXCERPT_CHARS) -> str:
    """``body`` as text, stripped and cut to ``limit`` characters (noting the full length when cut)."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def describe_exception(exc: BaseException) -> str:
    """A short description of a failed request: "connection refused", "request timed out (...)", ..."""
    if isinstance(exc, requests.exceptions.ConnectionError) and not isinstance(exc, requests.exceptions.Timeout):
        text = str(exc)
        if "refused" in text.lower():
            return "connection refused"
        return f"connection error ({type(exc).__name__}: {excerpt(text, 200)})"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"request timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {excerpt(str(exc), 200)}"


def connection_broke(exc: BaseException) -> bool:
    """Whether ``exc`` (or the exception it was raised from) is a connection that failed or broke: refused, reset,
    closed without an answer (``RemoteDisconnected``) or cut mid-body; not a timeout."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, requests.exceptions.Timeout):
            return False
        if isinstance(seen, (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)):
            return True
        seen = seen.__cause__
    return False


def get_json(url: str, path: str, *, timeout_s: float, what: str, fallbacks: tuple[str, ...] = ()) -> Any:
    """GET ``url + path``; return the decoded JSON or raise :class:`SGLangError`.

    ``fallbacks``: paths tried in order when the previous one answers 404 (older SGLang releases serve
    ``/get_model_info`` and ``/get_server_info`` only; newer ones keep them as aliases of ``/model_info`` and
    ``/server_info``)."""
    base = normalize_url(url)
    start = time.monotonic()
    paths = (path, *fallbacks)
    for i, p in enumerate(paths):
        full = base + p
        try:
            response = requests.get(full, timeout=(min(timeout_s, 10.0), timeout_s))
        except requests.exceptions.RequestException as exc:
            raise SGLangError(
                f"GET {full} ({what}) failed after {time.monotonic() - start:.1f}s: {describe_exception(exc)}"
            ) from exc
        if response.status_code != 404 or i + 1 == len(paths):
            break
    tried = f" (also tried {', '.join(paths[:-1])}: 404)" if len(paths) > 1 and response.status_code == 404 else ""
    if response.status_code != 200:
        raise SGLangError(
            f"GET {full} ({what}) answered HTTP {response.status_code} after {time.monotonic() - start:.1f}s{tried}: "
            f"{excerpt(response.content)!r}"
        )
    try:
        return response.json()
    except ValueError as exc:
        raise SGLangError(
            f"GET {full} ({what}) answered HTTP 200 but the body is not JSON ({exc}): {excerpt(response.content)!r}"
        ) from exc
