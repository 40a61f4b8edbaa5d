"""Content-addressed on-disk cache of reference completions and target hidden-state features.

Layout (``root`` = ``--cache-dir``, default ``.dflash_cache``)::

    root/v1/<kind>/<key[:2]>/<key>/data.safetensors   tensors (safetensors: no pickle)
    root/v1/<kind>/<key[:2]>/<key>/manifest.json      key fields, provenance, meta, sha256 + size of data
    root/v1/locks/<kind>-<key>.lock                   filelock, one per entry (or per production group)
    root/v1/produce.log                               one JSON line per entry produced (audit / benchmarks)

The key is the sha256 of the canonical JSON of the *key fields* (for features: target identity, the exact token
ids, the target layer id, the backend actually used, dtype, device kind and library versions; for completions:
target identity, prompt ids, max_new_tokens and the source). An entry from one backend is therefore never served
for another. Each file is written atomically (:mod:`dflash_eval.common.atomic`) and the manifest is written LAST: an
entry without a manifest does not exist. On read the data file's size is checked against the manifest, and its
sha256, computed over the bytes read (the file is read once), on the first read of the entry in this process and
whenever the file's size, mtime or inode changed since; then the entry against what the reader expects
(:class:`~dflash_eval.cache.entry_checks.Expected`: the manifest's key fields, each tensor's dtype and shape,
provenance); a truncated, corrupted or unfitting entry is reported
(:class:`CacheCorruption` warning) and treated as a miss (recomputed), or raises
:class:`~dflash_eval.errors.CacheError` in ``cache_only`` mode.

An entry is written as a whole: its data file and manifest go into a fresh folder under ``root/v1/.tmp/``, which
is then renamed onto the entry's folder (the same file system: one atomic rename). A write that fails (no space
left, a quota, a read-only file system, no permission) removes that folder and raises one
:class:`~dflash_eval.errors.StorageError` naming the entry's folder and the cause: no half entry is left behind, and
the pytest plugin stops the run at it (every later write would fail the same way). A process killed between the two
leaves only a folder under ``.tmp/``, which no reader looks at.

Entries are written without fsync: the rename keeps a reader of a running machine from ever seeing a partial file,
and an entry torn by a power loss or kernel crash fails its size or sha256 on its first read in the next session,
like any truncated or planted entry, and is recomputed. What is not re-checked: a file rewritten in place, after this
process verified it, to the same size within the same mtime tick.

What a stage needs is stated as typed requests (:class:`~dflash_eval.cache.requests.Request`, grouped into
:class:`~dflash_eval.cache.requests.Batch` es that one computation produces) and served by :meth:`Cache.ensure`: the
one production protocol (lookup, miss counting, production under file locks spread over pytest-xdist workers,
write, re-read; :mod:`dflash_eval.cache.requests`). :meth:`Cache.memo` memoises a small JSON value under a stamp
(the target's content hash).

Example::

    cache = Cache(".dflash_cache")
    req = Request("features", {"target": ident, "layer": 3, ...}, what="features of prompt 'p0', layer 3")
    entry = cache.ensure([Batch([req], lambda todo: [Produced({"features": tensor}, {"note": "..."})])])[req.key]
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError
from safetensors.torch import load, save

from dflash_eval.cache.entry import CacheEntry
from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import cache_key, canonical_json, ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request, StepReporter, ensure
from dflash_eval.common.atomic import atomic_write_text, file_mode, folder_mode
from dflash_eval.common.paths import storage_error
from dflash_eval.errors import CacheError

__all__ = ["Batch", "Cache", "CacheEntry", "CacheCorruption", "Expected", "Produced", "Request", "cache_key",
           "canonical_json", "ids_digest"]

SCHEMA = 1
_DATA = "data.safetensors"
_MANIFEST = "manifest.json"


class CacheCorruption(UserWarning):
    """A cache entry failed its integrity check and will be recomputed."""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    produced: int = 0
    corrupted: list[str] = field(default_factory=list)
    read_s: float = 0.0
    write_s: float = 0.0
    lock_wait_s: dict[str, float] = field(default_factory=dict)  # lock family (name before its key) -> seconds

    def to_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "produced": self.produced,
                "corrupted": list(self.corrupted), "read_s": round(self.read_s, 4), "write_s": round(self.write_s, 4),
                "lock_wait_s": {k: round(v, 3) for k, v in sorted(self.lock_wait_s.items())}}


class Cache:
    """A content-addressed cache directory (see module docstring).

    Args:
        root: the cache directory (created on first write).
        cache_only: never produce: a miss or a corrupted entry raises :class:`CacheError`.
        worker: a name written into manifests and the produce log (e.g. the xdist worker id).
        lock_timeout_s: how long to wait for another process producing the same entry.
    """

    def __init__(self, root: str | Path, *, cache_only: bool = False, worker: str = "master",
                 lock_timeout_s: float = 3600.0) -> None:
        self.root = Path(root)
        self.base = self.root / f"v{SCHEMA}"
        self.cache_only = cache_only
        self.worker = worker
        self.lock_timeout_s = lock_timeout_s
        self.stats = CacheStats()
        self._verified: dict[str, tuple[int, int, int, str]] = {}  # data file -> (size, mtime_ns, inode, sha256)

    # ------------------------------------------------------------------------------------------------ paths
    def entry_dir(self, kind: str, key: str) -> Path:
        return self.base / kind / key[:2] / key

    def lock_path(self, name: str) -> Path:
        return self.base / "locks" / f"{name}.lock"

    def lock(self, name: str) -> FileLock:
        path = self.lock_path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(path.parent, exc, "cannot make the cache's lock folder", "--cache-dir") from exc
        return FileLock(str(path), timeout=self.lock_timeout_s)

    @property
    def staging(self) -> Path:
        """Where an entry is written before it is renamed into place (see the module docstring)."""
        return self.base / ".tmp"

    @property
    def produce_log(self) -> Path:
        return self.base / "produce.log"

    # ------------------------------------------------------------------------------------------------ read
    def _corrupt(self, kind: str, key: str, why: str, state: str = "is corrupted") -> None:
        d = self.entry_dir(kind, key)
        msg = f"cache entry {kind}/{key[:16]} at {d} {state} ({why})"
        self.stats.corrupted.append(msg)
        if self.cache_only:
            raise CacheError(msg + "; --cache-only forbids recomputing it (delete the entry or drop --cache-only)")
        warnings.warn(CacheCorruption(msg + "; recomputing it"), stacklevel=3)
        shutil.rmtree(d, ignore_errors=True)

    def read(self, kind: str, key: str, *, count: bool = True, expect: Expected | None = None) -> CacheEntry | None:
        """The verified entry, or None on a miss (a corrupted entry, or one that does not hold what ``expect``
        asks for, is reported, removed and counted a miss)."""
        t0 = time.perf_counter()
        try:
            d = self.entry_dir(kind, key)
            man_path = d / _MANIFEST
            if not man_path.is_file():
                return None
            try:
                manifest = json.loads(man_path.read_text())
                info = manifest["files"][_DATA]
                size, sha = int(info["size"]), str(info["sha256"])
                if manifest.get("key") != key or manifest.get("kind") != kind:
                    raise ValueError("manifest key/kind does not match its location")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._corrupt(kind, key, f"unreadable manifest: {type(exc).__name__}: {exc}")
                return None
            tensors = self._data(kind, key, d / _DATA, size, sha)
            if tensors is None:
                return None
            why = expect.problem(manifest, tensors) if expect is not None else None
            if why is not None:
                self._corrupt(kind, key, why, "does not fit its request")
                return None
            if count:
                self.stats.hits += 1
            return CacheEntry(kind, key, tensors, manifest.get("meta", {}), manifest)
        finally:
            self.stats.read_s += time.perf_counter() - t0

    def _data(self, kind: str, key: str, data: Path, size: int, sha: str) -> dict[str, torch.Tensor] | None:
        """The tensors of an entry's data file, read once: its size checked against the manifest on every read, its
        sha256 (over the bytes read, not a second pass over the file) on the first read in this process and again
        whenever the file's size, mtime or inode changed since; None (reported, removed) when either fails or
        safetensors cannot read it."""
        try:
            st = data.stat()
            if st.st_size != size:
                self._corrupt(kind, key, f"{_DATA} has {st.st_size} bytes, manifest says {size}: truncated?")
                return None
            raw = data.read_bytes()
        except FileNotFoundError:
            self._corrupt(kind, key, f"{_DATA} is missing")
            return None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino, sha)
        if self._verified.get(str(data)) != stamp:
            if len(raw) != size or hashlib.sha256(raw).hexdigest() != sha:
                self._corrupt(kind, key, f"{_DATA} sha256 does not match the manifest")
                return None
            self._verified[str(data)] = stamp
        try:
            return load(raw)
        except (SafetensorError, OSError) as exc:
            self._corrupt(kind, key, f"safetensors cannot read it: {exc}")
            return None

    def exists(self, kind: str, key: str) -> bool:
        """Cheap presence test (manifest present); integrity is checked by :meth:`read`."""
        return (self.entry_dir(kind, key) / _MANIFEST).is_file()

    def lookup(self, request: Request, *, count: bool = True) -> CacheEntry | None:
        """The entry serving ``request`` (it, else its first alternative present), checked against what each must
        hold; None on a miss (never produces)."""
        for q in (request, *request.alternatives):
            e = self.read(q.kind, q.key, count=count, expect=q.expected)
            if e is not None:
                return e
        return None

    def has(self, request: Request) -> bool:
        """Cheap presence test of ``request`` or one of its alternatives (integrity is checked on reading)."""
        return any(self.exists(q.kind, q.key) for q in (request, *request.alternatives))

    # ------------------------------------------------------------------------------------------------ write
    def write(self, kind: str, key: str, tensors: dict[str, torch.Tensor], *, fields: dict[str, Any],
              meta: dict[str, Any] | None = None, seconds: float | None = None) -> CacheEntry:
        """Write an entry as a whole: its data file and its manifest (with the data's sha256) into a fresh folder,
        renamed onto the entry's folder. StorageError (naming the entry's folder) when it cannot be written; nothing
        of it is left then."""
        if self.cache_only:
            raise CacheError(f"refusing to write cache entry {kind}/{key[:16]} in --cache-only mode")
        t0 = time.perf_counter()
        d = self.entry_dir(kind, key)
        clean = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        raw = save(clean, metadata={"kind": kind, "key": key})
        manifest = {
            "schema": SCHEMA,
            "kind": kind,
            "key": key,
            "fields": fields,
            "meta": meta or {},
            "files": {_DATA: {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "producer": {"worker": self.worker, "pid": os.getpid(), "seconds": seconds},
        }
        self._publish(d, {_DATA: raw, _MANIFEST: (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()})
        self.stats.produced += 1
        self.stats.write_s += time.perf_counter() - t0
        try:
            self._log_production(kind, key, seconds)
        except OSError as exc:
            raise storage_error(self.produce_log, exc, "cannot append to the cache's produce log",
                                "--cache-dir") from exc
        return CacheEntry(kind, key, clean, meta or {}, manifest, produced=True)

    def _publish(self, d: Path, files: dict[str, bytes]) -> None:
        """``files`` (name -> bytes; the manifest last) written into a fresh folder under :attr:`staging` and
        renamed onto ``d``, replacing what is there (a corrupted entry being recomputed); the fresh folder removed
        whatever happens. No fsync: verified on reading (see the module docstring)."""
        tmp: Path | None = None
        try:
            self.staging.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{d.parent.parent.name}-{d.name[:16]}-", dir=self.staging))
            os.chmod(tmp, folder_mode())
            for name, data in files.items():
                fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            d.parent.mkdir(parents=True, exist_ok=True)
            self._rename_into_place(tmp, d)
            tmp = None
        except OSError as exc:
            raise storage_error(d, exc, "cannot write cache entry", "--cache-dir") from exc
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def _rename_into_place(self, tmp: Path, d: Path) -> None:
        """Rename the folder ``tmp`` onto ``d``; an entry folder already there (not empty: a rename cannot replace
        it) is moved aside first and removed after."""
        try:
            os.rename(tmp, d)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        old = Path(tempfile.mkdtemp(prefix="replaced-", dir=self.staging))
        os.rename(d, old / d.name)
        os.rename(tmp, d)
        shutil.rmtree(old, ignore_errors=True)

    def _log_production(self, kind: str, key: str, seconds: float | None) -> None:
        line = canonical_json({"kind": kind, "key": key, "worker": self.worker, "pid": os.getpid(),
                               "seconds": seconds, "time": time.time()}) + "\n"
        self.produce_log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.produce_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def productions(self) -> list[dict[str, Any]]:
        """Every line of the produce log (for audits and tests)."""
        if not self.produce_log.is_file():
            return []
        return [json.loads(x) for x in self.produce_log.read_text().splitlines() if x.strip()]

    # ------------------------------------------------------------------------------------------------ produce
    def miss(self, kind: str, key: str, what: str) -> None:
        """Count a miss; raise in cache-only mode."""
        self.stats.misses += 1
        if self.cache_only:
            raise CacheError(f"cache miss for {what} ({kind}/{key[:16]} under {self.root}) and --cache-only is set: "
                             "run once without --cache-only to fill the cache")

    @contextmanager
    def locked(self, name: str, *, blocking: bool = True) -> Iterator[bool]:
        """Hold the named file lock; yields False (without holding it) when ``blocking`` is False and it is busy."""
        lk = self.lock(name)
        t0 = time.perf_counter()
        try:
            lk.acquire(timeout=None if blocking else 0)
            if blocking:  # time spent waiting for another process (xdist worker) holding it
                family = name.rsplit("-", 1)[0] if "-" in name else name
                self.stats.lock_wait_s[family] = self.stats.lock_wait_s.get(family, 0.0) + time.perf_counter() - t0
        except Timeout as exc:
            if blocking:
                raise CacheError(f"timed out after {self.lock_timeout_s}s waiting for lock "
                                 f"{self.lock_path(name)}") from exc
            yield False
            return
        except OSError as exc:  # the lock file cannot be made (Timeout, a TimeoutError, is an OSError: first)
            raise storage_error(self.lock_path(name), exc, "cannot create the cache lock", "--cache-dir") from exc
        try:
            yield True
        finally:
            lk.release()

    def ensure(self, batches: Sequence[Batch], *, prepare: Callable[[list[Request]], None] | None = None,
               progress: Callable[[int], StepReporter] | None = None, worker_index: int = 0,
               worker_count: int = 1, keep: bool = True) -> dict[str, CacheEntry]:
        """Serve every request of ``batches``: lookup, production of the misses (each batch under its lock, spread
        over ``worker_count`` processes), write, re-read (:func:`dflash_eval.cache.requests.ensure`);
        ``{request.key: entry}``."""
        return ensure(self, batches, prepare=prepare, progress=progress, worker_index=worker_index,
                      worker_count=worker_count, keep=keep)

    def memo(self, name: str, stamp: dict[str, Any], compute: Callable[[], str], *, refresh: bool = False) -> str:
        """``compute()`` memoised in ``<root>/v1/<name>.json`` under ``stamp`` (e.g. the inodes, sizes and mtimes of
        the files it reads). For values that are slow to compute but cheap to check (the target's content hash).
        ``refresh``: compute even when memoised, and overwrite the memo. Not counted in the cache stats; nothing is
        written under ``cache_only``; an unwritable cache only costs the memo."""
        key = cache_key(name, stamp)
        path = self.base / f"{name}.json"
        try:
            memo = json.loads(path.read_text())
        except (OSError, ValueError):
            memo = {}
        memo = memo if isinstance(memo, dict) else {}
        if isinstance(memo.get(key), str) and not refresh:
            return memo[key]
        value = compute()
        if not self.cache_only:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, json.dumps({**memo, key: value}, indent=1, sort_keys=True) + "\n")
            except OSError:
                pass
        return value
