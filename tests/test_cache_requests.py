"""Unit tests of dflash_eval.cache.requests (Cache.ensure): the order in which workers produce batches, busy batches
deferred and not produced twice, what another process produced read as a hit, an entry lost after its production,
``also`` requests, alternatives, ``prepare``, progress steps per item, and a producer answering the wrong count.

Run: ``pytest tests/test_cache_requests.py -p no:cacheprovider``
"""

from __future__ import annotations

import pytest
import torch

from dflash_eval.cache.store import Batch, Cache, CacheCorruption, Expected, Produced, Request
from dflash_eval.errors import CacheError


def _req(i: int, kind: str = "features", **kw) -> Request:
    return Request(kind, {"n": i}, what=f"entry {i}", item=kw.pop("item", f"p{i}"), **kw)


def _batches(n: int, order: list[int]) -> list[Batch]:
    def producer(i: int):
        def produce(todo: list[Request]) -> list[Produced]:
            order.append(i)
            return [Produced({"x": torch.full((2,), float(i))}, {"i": i}, tokens=i) for _ in todo]
        return produce
    return [Batch([_req(i)], producer(i)) for i in range(n)]


@pytest.mark.parametrize("index, count, expected", [(0, 1, [0, 1, 2, 3]), (0, 2, [0, 1, 2, 3]),
                                                    (1, 2, [2, 3, 0, 1]), (2, 4, [2, 3, 0, 1]),
                                                    (3, 4, [3, 0, 1, 2]), (1, 3, [1, 2, 3, 0])])
def test_each_worker_starts_at_its_own_offset(tmp_path, index, count, expected):
    order: list[int] = []
    entries = Cache(tmp_path).ensure(_batches(4, order), worker_index=index, worker_count=count)
    assert order == expected
    assert [entries[_req(i).key].tensors["x"][0].item() for i in range(4)] == [0.0, 1.0, 2.0, 3.0]


def test_present_entries_are_served_and_busy_batches_deferred(tmp_path):
    cache = Cache(tmp_path)
    order: list[int] = []
    cache.ensure(_batches(5, order)[4:])  # entry 4 is cached already
    order.clear()
    batches = _batches(5, order)
    other = cache.lock(batches[2].lock_name)  # another process is producing batch 2
    other.acquire()
    produce_1 = batches[1].produce

    def release_after_1(todo: list[Request]) -> list[Produced]:
        other.release()  # the other process gave up: this worker produces batch 2 after all
        return produce_1(todo)

    batches[1] = Batch(batches[1].requests, release_after_1)
    cache.ensure(batches, worker_index=1, worker_count=2)
    assert order == [3, 0, 1, 2]  # starts at 2 (busy: deferred), 4 already present, 2 last
    assert (cache.stats.hits, cache.stats.misses, cache.stats.produced) == (1, 5, 5)  # entry 4 a miss first
    order.clear()
    again = Cache(tmp_path)
    again.ensure(_batches(5, order))
    assert order == [] and (again.stats.hits, again.stats.misses, again.stats.produced) == (5, 0, 0)


def test_a_batch_another_process_finished_is_read_as_a_hit(tmp_path):
    cache = Cache(tmp_path)
    order: list[int] = []
    batches = _batches(2, order)
    other = cache.lock(batches[0].lock_name)
    other.acquire()

    def produce_1_and_finish_0(todo: list[Request]) -> list[Produced]:
        order.append(1)
        r0 = _req(0)  # the other process writes entry 0 ...
        Cache(tmp_path, worker="other").write(r0.kind, r0.key, {"x": torch.zeros(2)}, fields=dict(r0.fields))
        other.release()  # ... and releases its lock
        return [Produced({"x": torch.ones(2)})]

    batches[1] = Batch(batches[1].requests, produce_1_and_finish_0)
    entries = cache.ensure(batches)
    assert order == [1] and entries[_req(0).key].tensors["x"].tolist() == [0.0, 0.0]
    assert (cache.stats.hits, cache.stats.misses, cache.stats.produced) == (1, 1, 1)


def test_an_entry_lost_after_its_production_is_an_error_naming_it(tmp_path):
    cache = Cache(tmp_path)
    batches = _batches(2, [])
    other = cache.lock(batches[0].lock_name)
    other.acquire()

    def produce_1_and_break_0(todo: list[Request]) -> list[Produced]:
        r0 = _req(0)
        Cache(tmp_path).write(r0.kind, r0.key, {"x": torch.ones(2)}, fields=dict(r0.fields))
        (cache.entry_dir(r0.kind, r0.key) / "data.safetensors").write_bytes(b"garbage")  # a broken write elsewhere
        other.release()
        return [Produced({"x": torch.ones(2)})]

    batches[1] = Batch(batches[1].requests, produce_1_and_break_0)
    with pytest.warns(CacheCorruption), pytest.raises(CacheError, match=r"entry 0 \(features/.*missing after its pro"):
        cache.ensure(batches)


def test_also_requests_are_produced_along_only_when_the_batch_runs(tmp_path):
    cache = Cache(tmp_path)
    seen: list[list[str]] = []
    extra = _req(9, kind="argmax", item="p0")

    def produce(todo: list[Request]) -> list[Produced]:
        seen.append([r.kind for r in todo])
        return [Produced({"x": torch.zeros(1)}) for _ in todo]

    cache.ensure([Batch([_req(0)], produce, also=[extra])])
    assert seen == [["features", "argmax"]] and cache.exists(extra.kind, extra.key)
    assert (cache.stats.misses, cache.stats.produced) == (1, 2)  # the argmax: produced, not a miss
    cache.ensure([Batch([_req(1)], produce, also=[extra])])  # the argmax is cached now: not produced again
    assert seen[-1] == ["features"]
    cache.ensure([Batch([_req(0)], produce, also=[_req(10, kind="argmax")])])  # nothing missing: nothing runs
    assert len(seen) == 2


def test_an_alternative_entry_serves_a_request_and_is_never_produced(tmp_path):
    cache = Cache(tmp_path)
    sglang = Request("completion", {"source": "sglang"}, expect=Expected(tensors={"x": (torch.float32, (2,))}))
    cache.ensure([Batch([sglang], lambda todo: [Produced({"x": torch.ones(2)})])])
    local = Request("completion", {"source": "local"}, alternatives=(sglang,))
    got = Cache(tmp_path).ensure([Batch([local], lambda todo: pytest.fail("produced"))])
    assert got[local.key].manifest["fields"] == {"source": "sglang"}
    assert Cache(tmp_path).has(local) and not Cache(tmp_path).has(Request("completion", {"source": "local"}))


def test_prepare_sees_the_misses_before_they_are_counted_or_refused(tmp_path):
    Cache(tmp_path).ensure(_batches(1, []))
    seen: list[list[str]] = []

    def prepare(misses: list[Request]) -> None:
        seen.append([r.what for r in misses])
        raise CacheError("the kernels changed")

    only = Cache(tmp_path, cache_only=True)
    with pytest.raises(CacheError, match="the kernels changed"):  # prepare's error, not the plain miss
        only.ensure(_batches(3, []), prepare=prepare)
    assert seen == [["entry 1", "entry 2"]] and only.stats.misses == 0
    with pytest.raises(CacheError, match=r"cache miss for entry 1 .*--cache-only"):
        only.ensure(_batches(3, []))


def test_progress_counts_items_and_steps_once_per_produced_item(tmp_path):
    events: list[tuple[str, int]] = []

    class Steps:
        def __init__(self, total: int) -> None:
            events.append(("total", total))

        def step(self, tokens: int = 0, n: int = 1) -> None:
            events.append(("step", tokens))

    layers = [Request("features", {"p": 0, "layer": i}, item="p0") for i in range(3)]
    one = Batch(layers, lambda todo: [Produced({"x": torch.zeros(1)}, tokens=7) for _ in todo])
    two = Batch([Request("features", {"p": 1}, item="p1")], lambda todo: [Produced({"x": torch.zeros(1)}, tokens=5)])
    Cache(tmp_path).ensure([one, two], progress=Steps)
    assert events == [("total", 2), ("step", 7), ("step", 5)]  # three layers of one prompt: one step
    events.clear()
    Cache(tmp_path).ensure([one, two], progress=Steps)
    assert events == []  # nothing produced, nothing shown


def test_a_producer_answering_the_wrong_count_writes_nothing(tmp_path):
    cache = Cache(tmp_path)
    with pytest.raises(CacheError, match="returned 1 entries for 2 requests"):
        cache.ensure([Batch([_req(0), _req(1)], lambda todo: [Produced({"x": torch.zeros(1)})])])
    assert cache.productions() == []


def test_derived_requests_under_cache_only_are_produced_not_written(tmp_path):
    only = Cache(tmp_path, cache_only=True)
    reqs = [_req(i, derived=True) for i in range(2)]
    got = only.ensure([Batch(reqs, lambda todo: [Produced({"x": torch.zeros(1)}) for _ in todo])])
    assert all(got[r.key].produced for r in reqs) and not (tmp_path / "v1").exists()
    assert (only.stats.misses, only.stats.produced) == (0, 0)
