"""Atomic file writes: write to a temporary file in the same folder, fsync, then rename over the target.

A reader never sees a half-written file; an interrupted writer leaves only a ``.tmp-*`` file that is ignored. The
file gets the mode an ordinary ``open(path, "w")`` would give it (0666 less the process's umask: 0644 under the
usual 022), not the 0600 of the temporary file, so reports and cache entries stay readable by a CI artifact step or
a colleague.

``durable=False`` skips the fsync: the rename still hides a half-written file from every reader while the machine
runs, but after a power loss or kernel crash the file may be empty or torn. Only for files whose readers verify
them (the cache's entries: size and sha256 against the manifest, refused when they do not match).

A write that fails on the operating system's side (no space left, a quota, a read-only file system, no permission,
a regular file where the folder should be) raises one :class:`~dflash_eval.errors.StorageError` naming the file it
was writing (not its temporary name) and the cause; it is an ``OSError`` still, with the same ``errno``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dflash_eval.common.paths import storage_error

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_write_with", "file_mode", "folder_mode"]


def _read_umask() -> int:
    """The process's umask: from /proc where the kernel shows it (no change to process state), else by setting and
    restoring it (done once, at import, before any thread of this package runs)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def file_mode() -> int:
    """The mode of a newly created regular file under the process's umask."""
    return 0o666 & ~_UMASK


def folder_mode() -> int:
    """The mode of a newly created folder under the process's umask (``tempfile.mkdtemp`` gives 0700)."""
    return 0o777 & ~_UMASK


@contextmanager
def atomic_path(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success (fsync'ed unless not ``durable``) rename it onto
    ``path``, on error delete it. An ``OSError`` (of the body too: it writes the temporary file) becomes a
    StorageError naming ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise storage_error(path, exc) from exc
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, file_mode())
        if durable:
            with open(tmp_path, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except OSError as exc:
        raise storage_error(path, exc) from exc
    finally:
        try:
            tmp_path.unlink(missing_ok=True)
        except OSError:  # the failure that is being raised says more than this one
            pass


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def atomic_write_with(path: Path, writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` and move the result onto ``path`` atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)
