"""Typed cache requests and the one call that serves a batch of them (:meth:`dflash_eval.cache.store.Cache.ensure`).

A stage states what it needs as :class:`Request` s (the kind, the key fields, what the entry must hold, the words
naming it in messages) grouped into :class:`Batch` es (the requests one production makes together, e.g. the
completions of one generation batch, or every layer of one prompt's target forward, and the function that produces
them). :func:`ensure` serves them the same way for every kind:

1. **lookup**: each request is read and checked against its :class:`~dflash_eval.cache.entry_checks.Expected`
   (:meth:`Cache.read`); an entry that is there and fits is served (a hit).
2. **misses**: ``prepare`` sees them first (e.g. the kernel-change check, which has a better message than a plain
   miss); each miss of a kind that is not ``derived`` is counted and, under ``--cache-only``, is a
   :class:`~dflash_eval.errors.CacheError` naming it. A ``derived`` request (cheap to recompute from other entries or
   inputs: prompt ids, memoised τ) is no miss; under ``--cache-only`` it is produced but not written.
3. **produce**: each batch holding a miss, under the batch's file lock, at most once across processes: worker ``k`` of
   ``n`` starts ``k/n`` of the way into the batches and first only *tries* each lock, so parallel pytest-xdist
   workers produce different batches; then it waits for the batches other processes held and re-checks each. The
   producer gets the batch's requests still missing (and its absent ``also`` requests, produced along by the same
   computation) and returns a :class:`Produced` for each; every one is written atomically as soon as its batch is done.
4. **re-read**: a request another process produced is read (counted a hit instead of a miss); one that is still
   missing is a :class:`~dflash_eval.errors.CacheError` naming it (the cache dir is not writable?).

Every request is counted once in the cache's stats: a hit when served from an entry this process did not write, a
miss when this process had to produce it; ``produced`` counts the entries written. ``progress`` (a factory of a
:class:`StepReporter` given the number of missing items) reports one step per produced *item* (``Request.item``:
the prompt a request belongs to; several requests of one item, e.g. the layers of one prompt, are one step).

A new cache kind is one more request builder in the stage that owns it (its key fields, its ``Expected``, its batch
producer); nothing here changes. Example::

    req = Request("completion", fields, expect=Expected(tensors={"output_ids": (torch.int64, (None,))}),
                  what="the reference completion of prompt 'p0'", item="p0")
    batch = Batch([req], lambda todo: [Produced({"output_ids": ids}, {"text": text}, tokens=len(ids))])
    entries = cache.ensure([batch])  # {req.key: CacheEntry}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import torch

from dflash_eval.cache.entry import CacheEntry
from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import cache_key
from dflash_eval.errors import CacheError

__all__ = ["Batch", "EntryCache", "Produced", "Producer", "Request", "StepReporter", "ensure"]


@dataclass(frozen=True, eq=False)
class Request:
    """One cache entry a stage needs: ``kind`` and key ``fields`` (its key is their sha256), what it must hold
    (``expect``; the key fields are always checked), the words naming it in a miss or lost message (``what``), the
    item it belongs to for progress (``item``), and whether it is ``derived`` (see module docstring).
    ``alternatives``: other entries that serve the request as well when it is missing (looked up in order, never
    produced; e.g. a completion from either source)."""

    kind: str
    fields: Mapping[str, Any]
    expect: Expected = field(default_factory=Expected)
    what: str = ""
    item: str = ""
    derived: bool = False
    alternatives: tuple[Request, ...] = ()

    @cached_property
    def key(self) -> str:
        return cache_key(self.kind, dict(self.fields))

    @cached_property
    def expected(self) -> Expected:
        """``expect`` with the request's own key fields."""
        e = self.expect
        return Expected(fields=self.fields, tensors=e.tensors, meta=e.meta, validate=e.validate)

    @property
    def label(self) -> str:
        return self.what or self.kind


@dataclass(frozen=True)
class Produced:
    """What a producer made for one request: its tensors and meta; ``tokens``: how many tokens the production
    handled (progress lines only)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0


#: Produces the given requests (those of one batch still missing, and its absent ``also`` requests), one
#: :class:`Produced` per request, in order.
Producer = Callable[[list[Request]], Sequence[Produced]]


@dataclass(frozen=True, eq=False)
class Batch:
    """Requests produced together by ``produce`` under one lock (``lock``: its name, by default made from the
    requests' keys; batches must be formed from every request a stage needs, not from what is missing now, so that
    every worker forms the same batches and takes the same locks). ``also``: requests the same computation can
    produce along when they are absent at production time (not looked up, not counted as misses; e.g. the
    teacher-forced argmax from the forward that extracts features)."""

    requests: Sequence[Request]
    produce: Producer
    lock: str = ""
    also: Sequence[Request] = ()

    @cached_property
    def lock_name(self) -> str:
        if self.lock:
            return self.lock
        if len(self.requests) == 1:
            r = self.requests[0]
            return f"{r.kind}-{r.key}"
        return f"{self.requests[0].kind}-" + cache_key("batch", {"keys": [r.key for r in self.requests]})


class StepReporter(Protocol):
    """What ``progress`` makes: one step per produced item (e.g. :class:`dflash_eval.common.progress.Progress`)."""

    def step(self, tokens: int = 0, n: int = 1) -> None: ...


class HitCounts(Protocol):
    """The counters :func:`ensure` updates (:class:`dflash_eval.cache.store.CacheStats`)."""

    hits: int
    misses: int


class EntryCache(Protocol):
    """What :func:`ensure` uses of a cache (:class:`dflash_eval.cache.store.Cache`, which imports this module)."""

    root: Path
    cache_only: bool

    @property
    def stats(self) -> HitCounts: ...

    def lookup(self, request: Request, *, count: bool = True) -> CacheEntry | None: ...

    def has(self, request: Request) -> bool: ...

    def exists(self, kind: str, key: str) -> bool: ...

    def write(self, kind: str, key: str, tensors: dict[str, torch.Tensor], *, fields: dict[str, Any],
              meta: dict[str, Any] | None = None, seconds: float | None = None) -> CacheEntry: ...

    def miss(self, kind: str, key: str, what: str) -> None: ...

    def locked(self, name: str, *, blocking: bool = True) -> AbstractContextManager[bool]: ...


class _Run:
    """One :func:`ensure` call's state: the entries served so far, and what this process produced."""

    def __init__(self, cache: EntryCache, batches: Sequence[Batch], progress: Callable[[int], StepReporter] | None,
                 keep: bool = True) -> None:
        self.cache, self.batches, self.progress_factory, self.keep = cache, list(batches), progress, keep
        self.entries: dict[str, CacheEntry] = {}
        self.reporter: StepReporter | None = None

    def _find(self, r: Request, *, count: bool = True) -> CacheEntry | None:
        """The entry serving ``r`` (read and checked), or, when entries are not kept, a tensorless stand-in for an
        entry that is present (its consumer reads and checks it: :meth:`Cache.lookup`)."""
        if self.keep:
            return self.cache.lookup(r, count=count)
        if not self.cache.has(r):
            return None
        if count:
            self.cache.stats.hits += 1
        return CacheEntry(r.kind, r.key, {}, {}, {})

    def lookup(self) -> list[Request]:
        """Read every request (its alternatives too); the misses, in order."""
        misses = []
        for b in self.batches:
            for r in b.requests:
                e = self._find(r)
                if e is None:
                    misses.append(r)
                else:
                    self.entries[r.key] = e
        return misses

    def _missing(self, b: Batch) -> list[Request]:
        return [r for r in b.requests if r.key not in self.entries and not self.cache.has(r)]

    def produce_batch(self, b: Batch, *, write: bool = True) -> None:
        """Produce what of ``b`` is missing (and its absent ``also`` requests) and keep (write) each entry."""
        todo = self._missing(b) if write else [r for r in b.requests if r.key not in self.entries]
        if not todo:
            return
        todo += [r for r in b.also if not self.cache.exists(r.kind, r.key)] if write else []
        t0 = time.perf_counter()
        made = list(b.produce(todo))
        if len(made) != len(todo):
            raise CacheError(f"the producer of {todo[0].label} returned {len(made)} entries for {len(todo)} requests")
        seconds = (time.perf_counter() - t0) / len(todo)
        tokens: dict[str, int] = {}
        for r, p in zip(todo, made):
            if write:
                e = self.cache.write(r.kind, r.key, p.tensors, fields=dict(r.fields), meta=p.meta, seconds=seconds)
            else:
                e = CacheEntry(r.kind, r.key, p.tensors, p.meta, {"fields": dict(r.fields)}, produced=True)
            self.entries[r.key] = e if self.keep else replace(e, tensors={})
            if r in b.requests and r.item:
                tokens[r.item] = max(tokens.get(r.item, 0), p.tokens)
        if self.reporter is not None and tokens:  # one step for the batch: its items finished together, and an
            # ETA taken between the first item's step and the others' would extrapolate one item from the whole time
            self.reporter.step(sum(tokens.values()), n=len(tokens))

    def produce_all(self, misses: list[Request], worker_index: int, worker_count: int) -> None:
        needed = [b for b in self.batches if any(r.key not in self.entries for r in b.requests)]
        if self.progress_factory is not None:
            self.reporter = self.progress_factory(len({r.item or r.key for r in misses}))
        if self.cache.cache_only:  # only derived misses get here: produced, not written
            for b in needed:
                self.produce_batch(b, write=False)
            return
        k = (worker_index * len(needed)) // worker_count if needed and worker_count > 1 else 0
        deferred = []
        for b in needed[k:] + needed[:k]:
            if not self._missing(b):
                continue
            with self.cache.locked(b.lock_name, blocking=False) as got:
                if got:
                    self.produce_batch(b)
                else:
                    deferred.append(b)
        for b in deferred:
            if self._missing(b):
                with self.cache.locked(b.lock_name):
                    self.produce_batch(b)

    def reread(self, misses: list[Request]) -> None:
        """Read what another process produced; a request still missing is an error."""
        for r in misses:
            if r.key in self.entries:
                continue
            e = self._find(r, count=False)
            if e is None:
                raise CacheError(f"{r.label} ({r.kind}/{r.key[:16]} under {self.cache.root}) is missing after its "
                                 "production: is the cache directory writable, or did another process remove it?")
            self.entries[r.key] = e
            if not r.derived:  # served from the cache after all: a hit, not a miss
                self.cache.stats.misses -= 1
                self.cache.stats.hits += 1


def ensure(cache: EntryCache, batches: Sequence[Batch], *, prepare: Callable[[list[Request]], None] | None = None,
           progress: Callable[[int], StepReporter] | None = None, worker_index: int = 0,
           worker_count: int = 1, keep: bool = True) -> dict[str, CacheEntry]:
    """Every request of ``batches`` served (see module docstring): ``{request.key: entry}``. ``keep=False``: the
    entries are made present (produced where missing) but not read: their tensors are not held (``{}``), and each
    is read and checked by its consumer when needed (a stage whose entries together exceed memory)."""
    run = _Run(cache, batches, progress, keep)
    misses = run.lookup()
    if not misses:
        return run.entries
    if prepare is not None:
        prepare(misses)
    for r in misses:
        if not r.derived:
            cache.miss(r.kind, r.key, r.label)
    run.produce_all(misses, worker_index, worker_count)
    run.reread(misses)
    return run.entries
