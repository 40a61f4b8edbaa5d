"""Launch an SGLang server as a subprocess, wait for readiness, and tear down its whole process group.

:class:`LaunchedServer` starts ``command`` in a new session (so the server and every worker it forks share one
process group), sends its stdout and stderr to a log file, and waits for ``GET /health_generate`` to answer 200
(:func:`dflash_eval.sglang.client.wait_until_ready`, which fails at once if the process exits). Before launching it
checks that the URL's port is free (:func:`dflash_eval.sglang.ports.check_port_free`: a stale server holding it is
named); whenever the launched process has exited early (during start-up, after readiness, before or during a
request: :meth:`LaunchedServer.check_running`, which can first wait a bounded moment for a dying process to finish
exiting) the error quotes its exit code and the log tail. On exit - also
when the body raised, and via ``atexit`` when the interpreter exits without leaving the ``with`` block - it sends
SIGTERM to the group, waits up to ``term_timeout_s`` (10 s) for every member to go, then SIGKILLs the group.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType

from dflash_eval.sglang.client import wait_until_ready
from dflash_eval.sglang.ports import check_port_free
from dflash_eval.sglang.transport import SGLangError, log_tail, normalize_url

__all__ = ["LaunchedServer", "group_members", "process_alive"]

logger = logging.getLogger("dflash_eval.sglang")


def process_alive(pid: int) -> bool:
    """Whether ``pid`` names a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        text = stat.read_text()
    except OSError:
        # No /proc (not Linux): trust the signal probe; with /proc, the process vanished meanwhile.
        return not Path("/proc").is_dir() or stat.parent.exists()
    # Field 3 (after the parenthesised command name, which may contain spaces) is the state.
    state = text[text.rfind(")") + 2 :].split(" ", 1)[0]
    return state not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) members of process group ``pgid``; falls back to a signal-0 probe without /proc."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            return [pgid]
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        # fields: state ppid pgrp ...
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held back inside the block and raised again, in order, when it ends: a signal
    between the server's fork and its recording in :class:`LaunchedServer` would otherwise interrupt the launch with
    a child nobody knows to stop. Python-level handlers (not a signal mask, which the child would inherit; a handled
    signal is back to its default in the child after exec). A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    sigs = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {sig: signal.signal(sig, hold) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


class LaunchedServer:
    """Context manager: a server started from ``command`` and torn down (whole process group) on exit.

    >>> with LaunchedServer("python -m sglang.launch_server --model-path M --port 30000",
    ...                     url="http://127.0.0.1:30000", log_path=Path("sglang.log")) as server:
    ...     completions = generate_greedy(server.url, prompts, max_new_tokens=64)   # doctest: +SKIP

    ``env`` entries are added to (not substituted for) the current environment. If the server does not become
    ready within ``ready_timeout_s`` or exits during start-up, the group is torn down and :class:`SGLangError`
    (with the log tail) is raised from ``__enter__``.
    """

    def __init__(
        self,
        command: str,
        *,
        url: str,
        log_path: Path,
        ready_timeout_s: float = 600.0,
        env: dict | None = None,
        term_timeout_s: float = 10.0,
    ) -> None:
        self.command = command
        self.argv = shlex.split(command)
        if not self.argv:
            raise SGLangError("LaunchedServer: empty launch command")
        self.url = normalize_url(url)
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.env = dict(env) if env else None
        self.term_timeout_s = term_timeout_s
        self.process: subprocess.Popen | None = None
        self.ready_after_s: float | None = None
        self._pgid: int | None = None
        self._stopped = False

    # -- properties -----------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def log_tail(self) -> str:
        return log_tail(self.log_path)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> LaunchedServer:
        """Start the process and wait until ready; on failure tear down and raise :class:`SGLangError`."""
        if self.process is not None:
            raise SGLangError(f"LaunchedServer for {self.url} was already started (pid {self.process.pid})")
        check_port_free(self.url)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = None
        if self.env is not None:
            env = {**os.environ, **{str(k): str(v) for k, v in self.env.items()}}
        log_fh = open(self.log_path, "ab")
        with _signals_held():  # a Ctrl-C / SIGTERM arriving now is handled once the process is known to stop()
            try:
                log_fh.write(f"=== dflash-eval launching: {self.command}\n".encode())
                log_fh.flush()
                self.process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise SGLangError(
                    f"could not launch SGLang server for {self.url}: {exc} (command: {self.command!r})"
                ) from exc
            finally:
                log_fh.close()  # the child holds its own descriptor
            self._pgid = self.process.pid  # start_new_session: the child leads a new group
            self._stopped = False
            atexit.register(self.stop)
        logger.info("launched SGLang server pid %d for %s, log %s", self.process.pid, self.url, self.log_path)
        try:
            self.ready_after_s = wait_until_ready(
                self.url, timeout_s=self.ready_timeout_s, process=self.process, log_path=self.log_path
            )
            self.check_running("right after it answered ready (is another server answering on its port?)")
        except BaseException:
            self.stop()
            raise
        return self

    def check_running(self, when: str = "", *, wait_s: float = 0.0) -> None:
        """Raise :class:`SGLangError` quoting the exit code and the log tail if the launched process has exited
        (before :meth:`stop`); ``when`` says at which point it was found gone.

        ``wait_s`` > 0: first give the process up to that long to finish exiting (``Popen.wait`` with a timeout,
        returning as soon as it exits): a crashing server closes its connections before its exit code exists."""
        process = self.process
        if process is None or self._stopped:
            return
        if wait_s > 0:
            try:
                process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        if self._stopped or process.poll() is None:
            return
        raise SGLangError(
            f"SGLang server launched for {self.url} (pid {process.pid}) exited with code {process.returncode}"
            f"{' ' + when if when else ''}.\n--- server log tail ({self.log_path}) ---\n{log_tail(self.log_path)}"
        )

    def stop(self) -> int | None:
        """SIGTERM the process group, wait up to ``term_timeout_s``, then SIGKILL it. Idempotent.

        Returns the exit code of the launched process (``None`` if it was never started).
        """
        process = self.process
        if process is None:
            return None
        if self._stopped:
            return process.returncode
        self._stopped = True
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover  # noqa: BLE001 - interpreter shutting down
            pass
        pgid = self._pgid if self._pgid is not None else process.pid
        self._signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.term_timeout_s
        while time.monotonic() < deadline:
            process.poll()  # reap the leader so it stops counting as a member
            if process.returncode is not None and not group_members(pgid):
                break
            time.sleep(0.05)
        else:
            logger.warning(
                "SGLang server group %d (%s) still alive %.0fs after SIGTERM; sending SIGKILL",
                pgid,
                self.url,
                self.term_timeout_s,
            )
            self._signal_group(pgid, signal.SIGKILL)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                print(f"dflash-eval: SGLang server pid {process.pid} survived SIGKILL", file=sys.stderr)
            kill_deadline = time.monotonic() + 5.0
            while group_members(pgid) and time.monotonic() < kill_deadline:
                time.sleep(0.05)
        logger.info("stopped SGLang server pid %d (%s), exit code %s", process.pid, self.url, process.returncode)
        return process.returncode

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:  # pragma: no cover - group reused by someone else
            logger.warning("cannot signal process group %d: %s", pgid, exc)

    def __enter__(self) -> LaunchedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "not started" if self.process is None else ("stopped" if self._stopped else f"pid {self.process.pid}")
        return f"LaunchedServer({self.url}, {state}, log={self.log_path})"
