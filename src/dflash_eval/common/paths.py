"""Normalised paths for what a run records and prints (option values, eval.json, eval.md, the terminal); whether a
folder a run writes to can be written; what an operating-system error met while writing means.

``/work/firstgate/../myrepo/ckpt/step_a.pt`` becomes ``/work/myrepo/ckpt/step_a.pt``. Only the part up to the last
``..`` is resolved against the file system (as the operating system does when it opens the path: a ``..`` after a
symbolic link leaves the link's target); the rest keeps its names, so a model folder that is a symbolic link keeps
its own name (golden snapshots are filed under the target folder's name).

:func:`folder_problem` answers, before any work, whether a run can write into a folder (the cache, the reports, the
golden records): it is a folder or can be made one (no regular file in its place or on its way), a file can really
be created, written and removed there (the operating system's answer, so a read-only file system, a folder without
write permission for this user or an exhausted quota show; root writes past permission bits, and so does the
probe), and its file system has at least :data:`MIN_FREE_BYTES` free. :func:`storage_error` turns an ``OSError`` met
while writing into one :class:`~dflash_eval.errors.StorageError` naming the path and the likely cause.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from dflash_eval.errors import StorageError

__all__ = ["normal_path", "MIN_FREE_BYTES", "FULL_ERRNOS", "folder_problem", "write_cause", "storage_error"]

#: A folder a run writes to needs at least this much free space on its file system before the run starts: 64 MiB, a
#: floor that only tells a full disk from a usable one (a run's reports take under 1 MiB; the bundled fixtures'
#: cold cache about 28 MiB for 2 prompts; a real target's far more). Running out later is one error naming the
#: file or cache entry (:func:`storage_error`), and the run stops there.
MIN_FREE_BYTES = 64 * 2**20

#: Errors after which no later write to the same file system can succeed: the run stops at the first one.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})

_PROBE_BYTES = 4096
_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied (this user may not write there)",
    errno.EPERM: "operation not permitted (this user may not write there)",
    errno.ENOTDIR: "a path component is a regular file, not a folder",
    errno.EISDIR: "a folder is where a file should be",
    errno.EEXIST: "a regular file is where a folder should be",
    errno.ENAMETOOLONG: "the name is too long for the file system",
    errno.EFBIG: "the file is larger than the file system allows",
    errno.EIO: "input/output error (a failing disk or a lost network mount?)",
}

def normal_path(path: str | os.PathLike[str]) -> Path:
    """``path`` without ``..`` components where it is absolute (a relative path is only tidied: its leading ``..``
    cannot be resolved without a base)."""
    p = Path(path)
    if not p.is_absolute() or ".." not in p.parts:
        return p
    last = max(i for i, part in enumerate(p.parts) if part == "..")
    head = Path(*p.parts[:last + 1])
    try:
        head = head.resolve()
    except (OSError, RuntimeError):  # a symbolic-link loop, an unreadable folder: the lexical answer
        head = Path(os.path.normpath(head))
    return head.joinpath(*p.parts[last + 1:])


def write_cause(exc: OSError) -> str:
    """What an ``OSError`` met while writing means, in words (``"no space left on the device (ENOSPC)"``)."""
    code = exc.errno
    name = errno.errorcode.get(code, "") if code is not None else ""
    words = _CAUSES.get(code) if code is not None else None
    words = words or exc.strerror or str(exc) or type(exc).__name__
    return f"{words} ({name})" if name else words


def storage_error(path: str | os.PathLike[str], exc: OSError, what: str = "cannot write",
                  option: str | None = None) -> StorageError:
    """One error naming ``path`` and the cause of ``exc`` (kept as the error's ``errno``), with what to do when the
    file system is full or read-only (``option``: the option that chose the folder); a StorageError is returned as
    it is."""
    if isinstance(exc, StorageError):
        return exc
    elsewhere = f"point {option} at another disk" if option else "write elsewhere"
    hint = {errno.ENOSPC: f"; free space on that disk or {elsewhere}",
            errno.EDQUOT: f"; free space within the quota or {elsewhere}",
            errno.EROFS: f"; {elsewhere}"}.get(exc.errno or 0, "")
    return StorageError(f"{what} {path}: {write_cause(exc)}{hint}", Path(path), exc.errno)


def _nearest_existing(path: Path) -> tuple[Path, list[str]]:
    """The nearest of ``path`` and its ancestors that exists (followed through symbolic links), and the names below
    it that do not."""
    missing: list[str] = []
    p = path
    while True:
        try:
            os.stat(p)
            return p, missing
        except (FileNotFoundError, NotADirectoryError):  # missing, or under a regular file: look further up
            if p.parent == p:
                return p, missing
            missing.insert(0, p.name)
            p = p.parent


def _probe(folder: Path) -> OSError | None:
    """Create, write, sync and remove a small file in ``folder``: the operating system's own answer to whether the
    run can write there (None: it can)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".dflash-eval-probe-", dir=folder)
    except OSError as exc:
        return exc
    try:
        try:
            os.write(fd, b"\0" * _PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass
    return None


def folder_problem(path: str | os.PathLike[str], *, min_free: int | None = None) -> str | None:
    """Why the run cannot write into the folder ``path`` (made when missing), or None: a regular file where the
    folder or one of its parents should be, a folder that cannot be reached, written (the probe: a file created,
    written and removed there, or in the nearest existing parent when the folder is still to be made) or has less
    than ``min_free`` bytes (default :data:`MIN_FREE_BYTES`) free on its file system."""
    folder = Path(path)
    try:
        existing, missing = _nearest_existing(folder)
    except OSError as exc:  # a parent without search permission, a symbolic-link loop
        return f"cannot be reached: {write_cause(exc)}"
    if not existing.is_dir():
        if not missing:
            return "is a regular file, not a folder"
        return f"{existing} is a regular file, so no folder can be made under it"
    problem = _probe(existing)
    where = "" if not missing else f" (in {existing}, where it would be made)"
    if problem is not None:
        return f"cannot be written{where}: {write_cause(problem)}"
    need = MIN_FREE_BYTES if min_free is None else min_free
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return None
    if free < need:
        return (f"only {free / 2**20:.1f} MiB free on its file system{where}; a run needs at least "
                f"{need / 2**20:.0f} MiB there (free space, or point the option at another disk)")
    return None
