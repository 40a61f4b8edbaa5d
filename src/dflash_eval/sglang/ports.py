"""Is the port a launched SGLang server would bind already taken, and by which process?

A server launched on a port that a stale server (e.g. from a killed run) still holds dies with "Address already in
use" while the stale one answers every request: :func:`check_port_free` refuses to launch in that case, naming the
process that listens on the port when Linux's ``/proc`` shows it (:func:`port_holder`; processes of other users
are not visible).

Example::

    python -c "from dflash_eval.sglang.ports import port_holder; print(port_holder(30000))"
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from dflash_eval.sglang.transport import SGLangError, normalize_url

__all__ = ["port_holder", "process_description", "check_port_free"]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == _LISTEN and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    return inodes


def port_holder(port: int) -> int | None:
    """PID of a process listening on TCP ``port`` (from ``/proc/net/tcp*`` and ``/proc/<pid>/fd``), or None when
    no listener is visible (another user's process, or no ``/proc``)."""
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not targets:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in targets:
                    return int(entry.name)
            except OSError:
                continue
    return None


def process_description(pid: int) -> str:
    """``pid 123 (python -m sglang.launch_server ...)``, the command line cut to 200 characters."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cmd = " ".join(a.decode(errors="replace") for a in argv if a)
    except OSError:
        cmd = ""
    cmd = cmd if len(cmd) <= 200 else cmd[:200] + "..."
    return f"pid {pid}" + (f" ({cmd})" if cmd else "")


def check_port_free(url: str) -> None:
    """Raise :class:`SGLangError` when the host:port of ``url`` is a local address whose port is already bound,
    naming the process holding it where it can be found. A host that is not a local address is not checked."""
    base = normalize_url(url)
    parts = urlsplit(base)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return  # an unresolvable host fails readiness later with its own message
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return  # not a local address (EADDRNOTAVAIL) or a privileged port: nothing to say here
            pid = port_holder(port)
            who = process_description(pid) if pid is not None else \
                "another process (not visible here: another user's, or no /proc)"
            raise SGLangError(
                f"cannot launch the SGLang server for {base}: port {port} is already in use by {who}. A stale server "
                "from an earlier run? The launched server would die with 'Address already in use' while the old "
                "one answers. Stop it, or give --sglang-url a free port (and the same port in --sglang-launch)"
            ) from None
