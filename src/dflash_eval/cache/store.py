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
entry without a manifest does not exist. On read the data file's size and sha256 are checked against the
manifest, and the entry against what the reader expects (:class:`~dflash_eval.cache.entry_checks.Expected`: the manifest's
key fields, each tensor's dtype and shape, provenance); a truncated, corrupted or unfitting entry is reported
(:class:`CacheCorruption` warning) and treated as a miss (recomputed), or raises
:class:`~dflash_eval.errors.CacheError` in ``cache_only`` mode.

Concurrency (pytest-xdist workers, or parallel runs sharing a cache dir): every producer goes through one of two
methods. :meth:`Cache.get_or_produce` (one entry) takes the entry's file lock, re-checks, and only then produces,
so an entry is produced once per run; waiters read it. :meth:`Cache.produce_many` (many jobs, e.g. one target
forward per prompt) rotates each worker's starting point and try-locks first, so workers produce different jobs
in parallel. :meth:`Cache.memo` memoises a small JSON value under a stamp (the target's content hash).

Example::

    cache = Cache(".dflash_cache")
    fields = {"target": ident, "layer": 3, ...}
    entry = cache.get_or_produce("features", fields, lambda: ({"x": tensor}, {"note": "..."}))
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.common.atomic import atomic_write_text, atomic_write_with
from dflash_eval.errors import CacheError

__all__ = ["Cache", "CacheEntry", "CacheCorruption", "Expected", "Job", "cache_key", "canonical_json", "ids_digest"]

SCHEMA = 1
_DATA = "data.safetensors"
_MANIFEST = "manifest.json"


class CacheCorruption(UserWarning):
    """A cache entry failed its integrity check and will be recomputed."""


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cache_key(kind: str, fields: dict[str, Any]) -> str:
    """sha256 of ``kind`` + canonical JSON of the key fields."""
    return hashlib.sha256(f"{kind}\n{canonical_json(fields)}".encode()).hexdigest()


def ids_digest(ids: list[int] | torch.Tensor) -> str:
    """sha256 of a token-id sequence (as little-endian int64)."""
    t = torch.as_tensor(ids, dtype=torch.int64).contiguous().cpu()
    return hashlib.sha256(t.numpy().astype("<i8").tobytes()).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class CacheEntry:
    """A verified entry: its tensors, meta and manifest."""

    kind: str
    key: str
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    manifest: dict[str, Any]
    produced: bool = False  # True when this process produced it (a miss), False for a hit


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

    # ------------------------------------------------------------------------------------------------ paths
    def entry_dir(self, kind: str, key: str) -> Path:
        return self.base / kind / key[:2] / key

    def lock_path(self, name: str) -> Path:
        return self.base / "locks" / f"{name}.lock"

    def lock(self, name: str) -> FileLock:
        path = self.lock_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path), timeout=self.lock_timeout_s)

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
            data = d / _DATA
            if not data.is_file():
                self._corrupt(kind, key, f"{_DATA} is missing")
                return None
            actual = data.stat().st_size
            if actual != size:
                self._corrupt(kind, key, f"{_DATA} has {actual} bytes, manifest says {size}: truncated?")
                return None
            if _file_sha256(data) != sha:
                self._corrupt(kind, key, f"{_DATA} sha256 does not match the manifest")
                return None
            try:
                tensors = load_file(str(data))
            except (SafetensorError, OSError) as exc:
                self._corrupt(kind, key, f"safetensors cannot read it: {exc}")
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

    def exists(self, kind: str, key: str) -> bool:
        """Cheap presence test (manifest present); integrity is checked by :meth:`read`."""
        return (self.entry_dir(kind, key) / _MANIFEST).is_file()

    # ------------------------------------------------------------------------------------------------ write
    def write(self, kind: str, key: str, tensors: dict[str, torch.Tensor], *, fields: dict[str, Any],
              meta: dict[str, Any] | None = None, seconds: float | None = None) -> CacheEntry:
        """Write an entry atomically: data first, manifest (with the data's sha256) last."""
        if self.cache_only:
            raise CacheError(f"refusing to write cache entry {kind}/{key[:16]} in --cache-only mode")
        t0 = time.perf_counter()
        d = self.entry_dir(kind, key)
        d.mkdir(parents=True, exist_ok=True)
        clean = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        atomic_write_with(d / _DATA, lambda p: save_file(clean, str(p), metadata={"kind": kind, "key": key}))
        data = d / _DATA
        manifest = {
            "schema": SCHEMA,
            "kind": kind,
            "key": key,
            "fields": fields,
            "meta": meta or {},
            "files": {_DATA: {"size": data.stat().st_size, "sha256": _file_sha256(data)}},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "producer": {"worker": self.worker, "pid": os.getpid(), "seconds": seconds},
        }
        atomic_write_text(d / _MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        self.stats.produced += 1
        self.stats.write_s += time.perf_counter() - t0
        self._log_production(kind, key, seconds)
        return CacheEntry(kind, key, clean, meta or {}, manifest, produced=True)

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
        except Timeout:
            if blocking:
                raise CacheError(f"timed out after {self.lock_timeout_s}s waiting for lock {self.lock_path(name)}")
            yield False
            return
        try:
            yield True
        finally:
            lk.release()

    def get_or_produce(
        self,
        kind: str,
        fields: dict[str, Any],
        produce: Callable[[], tuple[dict[str, torch.Tensor], dict[str, Any]]],
        *,
        what: str = "",
        derived: bool = False,
        expect: Expected | None = None,
    ) -> CacheEntry:
        """Read the entry for ``fields``; on a miss take its lock, re-check, produce, write and return it.

        A cached entry must have been written for exactly ``fields`` and hold what ``expect`` asks for (tensor
        dtypes and shapes, meta), else it is recomputed (:meth:`read`).

        ``derived``: the entry is cheap to recompute from other entries or inputs (prompt ids, memoised τ): a
        miss is not counted as one, and under ``cache_only`` it is produced but not written.
        """
        key = cache_key(kind, fields)
        expect = Expected(fields=fields, tensors=expect.tensors, meta=expect.meta, validate=expect.validate) \
            if expect is not None else Expected(fields=fields)
        entry = self.read(kind, key, expect=expect)
        if entry is not None:
            return entry
        if derived and self.cache_only:
            tensors, meta = produce()
            return CacheEntry(kind, key, tensors, meta, {"fields": fields}, produced=True)
        if not derived:
            self.miss(kind, key, what or kind)
        with self.locked(f"{kind}-{key}"):
            entry = self.read(kind, key, count=False, expect=expect)
            if entry is not None:  # produced by another worker while we waited
                if not derived:
                    self.stats.misses -= 1
                    self.stats.hits += 1
                return entry
            t0 = time.perf_counter()
            tensors, meta = produce()
            return self.write(kind, key, tensors, fields=fields, meta=meta, seconds=time.perf_counter() - t0)

    def produce_many(self, jobs: list[Job], *, worker_index: int = 0, worker_count: int = 1) -> None:
        """Run every job whose artifact is not present, each under its own lock, at most once across processes.

        Worker ``k`` of ``n`` starts ``k/n`` of the way into ``jobs`` and first only *tries* each lock, so parallel
        workers produce different jobs; then it waits for the jobs other processes held, re-checking each before
        producing it.
        """
        k = (worker_index * len(jobs)) // worker_count if jobs and worker_count > 1 else 0
        deferred = []
        for job in jobs[k:] + jobs[:k]:
            if job.present():
                continue
            with self.locked(job.lock, blocking=False) as got:
                if not got:
                    deferred.append(job)
                    continue
                if not job.present():
                    job.produce()
        for job in deferred:
            if job.present():
                continue
            with self.locked(job.lock):
                if not job.present():
                    job.produce()

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


@dataclass(frozen=True)
class Job:
    """One artifact to produce with :meth:`Cache.produce_many`: its lock name, a presence test, the producer."""

    lock: str
    present: Callable[[], bool]
    produce: Callable[[], None]
