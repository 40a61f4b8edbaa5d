"""The eval suite's SGLang server: connect to (or launch) it, check once that it serves the target, and hand a
ready :class:`~dflash_eval.sglang.client.SGLangClient` to whoever fetches the reference completions; tear it down.

Used by the ``sglang`` session fixture of :mod:`dflash_eval.pytest_plugin`, and only when reference completions
are not cached yet (``--completions sglang``):

* ``--sglang-url URL`` alone: wait (``--sglang-timeout`` seconds in all, polling ``GET /health_generate`` with
  backoff, never a fixed sleep) for a server someone else runs. Not reachable/ready in time ->
  :class:`SGLangUnavailable` (the plugin skips the completion-dependent tests, or fails them under
  ``--require-sglang``).
* ``--sglang-launch "CMD"``: refuse to start when the URL's port is already taken (naming the process holding
  it), else start ``CMD`` in its own process group, its output in
  ``<report-dir>/sglang-server.log``; wait for readiness (failing at once if it exits); stop the whole group at
  session end, on failures, on KeyboardInterrupt and on SIGTERM (:meth:`SGLangService.install_signal_handlers`:
  the handler stops the server, then re-raises the signal with the previous handler). If the launched process
  exits at any point before the completions are fetched, the error quotes its exit code and log tail (a connection
  that breaks during ``POST /generate`` first gives the process a bounded moment to finish exiting, and says so
  when it is still running).
* either way, ``GET /model_info`` must name the target (``--sglang-model-name`` or the target directory's
  basename) before any completion is requested: a mismatch is an :class:`SGLangError` (a failure, never a skip).

Readiness and identity are checked here, once: :meth:`SGLangService.start` returns the
:class:`~dflash_eval.sglang.client.SGLangClient` (its requests bounded by ``--sglang-request-timeout``), and the
completion stage only asks it for completions.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from dflash_eval.sglang.client import SGLangClient, check_identity, wait_until_ready
from dflash_eval.sglang.launch import LaunchedServer
from dflash_eval.sglang.transport import SGLangError, normalize_url

__all__ = ["DEFAULT_LAUNCH_URL", "SERVER_LOG_NAME", "SGLangUnavailable", "SGLangService"]

logger = logging.getLogger("dflash_eval.sglang")

DEFAULT_LAUNCH_URL = "http://127.0.0.1:30000"
SERVER_LOG_NAME = "sglang-server.log"


class SGLangUnavailable(SGLangError):
    """No SGLang server answered ready at the URL within ``--sglang-timeout`` (nothing was launched)."""


class ServiceSettings(Protocol):
    """What the service reads of the run's :class:`~dflash_eval.options.settings.EvalSettings` (a layer above this
    package); ``sglang_launch``, ``sglang_timeout``, ``sglang_request_timeout`` and ``sglang_model_name`` are read
    when present."""

    @property
    def sglang_url(self) -> str | None: ...
    @property
    def target_model(self) -> Path: ...
    @property
    def report_dir(self) -> Path: ...


class SGLangService:
    """The suite's connection to one SGLang server (launched or external); :meth:`stop` is idempotent."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.launch_cmd: str | None = getattr(settings, "sglang_launch", None) or None
        raw_url = settings.sglang_url or (DEFAULT_LAUNCH_URL if self.launch_cmd else None)
        if not raw_url:
            raise SGLangError("--completions sglang needs --sglang-url URL or --sglang-launch CMD")
        self.url = normalize_url(raw_url)
        self.timeout_s = float(getattr(settings, "sglang_timeout", 600.0))
        self.request_timeout_s = float(getattr(settings, "sglang_request_timeout", 600.0))
        self.expected_name = getattr(settings, "sglang_model_name", None) or Path(settings.target_model).name
        self.log_path: Path | None = Path(settings.report_dir) / SERVER_LOG_NAME if self.launch_cmd else None
        self.server: LaunchedServer | None = None
        self.model_info: dict | None = None
        self.ready_after_s: float | None = None
        self.client: SGLangClient | None = None
        self._previous_handlers: dict[int, Any] = {}

    # ------------------------------------------------------------------------------------------------ start
    def start(self) -> SGLangClient:
        """Launch (if configured) or wait for the server, check its identity, and return a client bound to it.

        Readiness and identity are checked here and nowhere else; the returned client's requests are bounded by
        ``--sglang-request-timeout``. Raises :class:`SGLangUnavailable` when an external server is not ready in
        time, :class:`SGLangError` for a launch that failed, a wrong model or a bad answer.
        """
        if self.launch_cmd and self.log_path is not None:  # log_path is set exactly when launch_cmd is
            self.server = LaunchedServer(self.launch_cmd, url=self.url, log_path=self.log_path,
                                         ready_timeout_s=self.timeout_s)
            self.install_signal_handlers()
            self.server.start()  # tears the group down itself when it fails
            self.ready_after_s = self.server.ready_after_s
        else:
            try:
                self.ready_after_s = wait_until_ready(self.url, timeout_s=self.timeout_s)
            except SGLangError as exc:
                raise SGLangUnavailable(
                    f"no SGLang server ready at {self.url} within --sglang-timeout {self.timeout_s:g}s: {exc}"
                ) from None
        self.model_info = check_identity(self.url, expected_name=self.expected_name)
        alive = None
        if self.server is not None:
            self.server.check_running("while its identity was checked")
            alive = self.server.check_running
        self.client = SGLangClient(self.url, model_info=self.model_info, request_timeout_s=self.request_timeout_s,
                                   alive=alive, log_path=self.log_path)
        return self.client

    # ------------------------------------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Stop a launched server's whole process group (no-op for an external server) and restore handlers."""
        if self.server is not None:
            self.server.stop()
        self.restore_signal_handlers()

    def install_signal_handlers(self) -> None:
        """On SIGTERM (and SIGHUP): stop the launched server, then re-raise the signal with the previous handler.

        Only from the main thread (``signal.signal`` requires it); KeyboardInterrupt needs no handler, as pytest
        tears the session fixtures down on it (and :class:`LaunchedServer` also registers an ``atexit`` stop).
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None or sig in self._previous_handlers:
                continue
            try:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):  # pragma: no cover - not the main thread / unsupported
                pass

    def restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in list(self._previous_handlers.items()):
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, OSError):  # pragma: no cover
                pass
            self._previous_handlers.pop(sig, None)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        logger.warning("signal %d: stopping the launched SGLang server at %s", signum, self.url)
        try:
            if self.server is not None:
                self.server.stop()
        finally:
            self.restore_signal_handlers()
            if callable(previous):
                previous(signum, frame)
            else:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
                signal.raise_signal(signum)

    # ------------------------------------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        """JSON-ready description for eval.json."""
        out: dict[str, Any] = {"url": self.url, "expected_name": self.expected_name,
                               "ready_after_s": None if self.ready_after_s is None else round(self.ready_after_s, 3)}
        if self.model_info is not None:
            out["model_path"] = self.model_info.get("model_path")
        if self.launch_cmd:
            out["launch"] = self.launch_cmd
            out["log"] = str(self.log_path)
            if self.server is not None and self.server.pid is not None:
                out["pid"] = self.server.pid
        return out

    def __repr__(self) -> str:
        return f"SGLangService({self.url}, launch={self.launch_cmd!r})"
