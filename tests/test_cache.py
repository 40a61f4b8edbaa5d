"""Unit tests of dflash_eval.cache.store: round trip, key separation, corruption detection, --cache-only, derived
entries, locking across processes, and memo (the batching of Cache.ensure: tests/test_cache_requests.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from dflash_eval.cache.store import Batch, Cache, CacheCorruption, Expected, Produced, Request, cache_key, ids_digest
from dflash_eval.errors import CacheError

FIELDS = {"target": "abc", "tokens": ids_digest([1, 2, 3]), "layer": 1, "backend": "torch", "dtype": "float32"}


def get(cache: Cache, kind: str, fields: dict, produce, *, what: str = "", derived: bool = False,
        expect: Expected | None = None):
    """One request served by Cache.ensure (``produce``: () -> (tensors, meta))."""
    req = Request(kind, fields, expect=expect or Expected(), what=what, derived=derived)
    return cache.ensure([Batch([req], lambda todo: [Produced(*produce())])])[req.key]


def produce_counter():
    calls = []

    def produce():
        calls.append(1)
        return {"features": torch.arange(12, dtype=torch.float32).view(3, 4)}, {"note": "x"}

    return calls, produce


def test_round_trip_and_single_production(tmp_path):
    cache = Cache(tmp_path)
    calls, produce = produce_counter()
    e1 = get(cache, "features", FIELDS, produce)
    e2 = get(cache, "features", FIELDS, produce)
    assert len(calls) == 1 and e1.produced and not e2.produced
    assert torch.equal(e2.tensors["features"], torch.arange(12, dtype=torch.float32).view(3, 4))
    assert e2.meta == {"note": "x"} and e2.manifest["fields"] == FIELDS
    assert cache.stats.hits == 1 and cache.stats.produced == 1
    assert [p["kind"] for p in cache.productions()] == ["features"]


def test_keys_separate_backends_dtypes_and_tokens(tmp_path):
    cache = Cache(tmp_path)
    _, produce = produce_counter()
    get(cache, "features", FIELDS, produce)
    for change in ({"backend": "fla"}, {"backend": "torch-recurrent"}, {"dtype": "bfloat16"},
                   {"tokens": ids_digest([1, 2, 4])}, {"layer": 2}):
        key = cache_key("features", {**FIELDS, **change})
        assert key != cache_key("features", FIELDS)
        assert cache.read("features", key) is None  # never served for another backend / dtype / sequence
    assert cache_key("features", dict(reversed(list(FIELDS.items())))) == cache_key("features", FIELDS)


def _entry(cache):
    _, produce = produce_counter()
    e = get(cache, "features", FIELDS, produce)
    return cache.entry_dir("features", e.key), e.key


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "delete"])
def test_corrupted_entry_is_reported_and_recomputed(tmp_path, damage):
    cache = Cache(tmp_path)
    d, key = _entry(cache)
    data = d / "data.safetensors"
    raw = data.read_bytes()
    if damage == "truncate":
        data.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        data.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))
    elif damage == "manifest":
        (d / "manifest.json").write_text("{broken")
    else:
        data.unlink()
    with pytest.warns(CacheCorruption, match="corrupted"):
        assert cache.read("features", key) is None
    assert not d.exists()
    calls, produce = produce_counter()
    e = get(Cache(tmp_path), "features", FIELDS, produce)
    assert len(calls) == 1 and e.produced


def test_cache_only_miss_and_corruption_are_errors(tmp_path):
    only = Cache(tmp_path, cache_only=True)
    calls, produce = produce_counter()
    with pytest.raises(CacheError, match="--cache-only"):
        get(only, "features", FIELDS, produce, what="features of prompt 'a'")
    assert calls == [] and not (tmp_path / "v1" / "features").exists()
    d, key = _entry(Cache(tmp_path))
    assert Cache(tmp_path, cache_only=True).read("features", key) is not None
    (d / "data.safetensors").write_bytes(b"garbage")
    with pytest.raises(CacheError, match="corrupted.*--cache-only"):
        Cache(tmp_path, cache_only=True).read("features", key)


def test_manifest_is_json_with_sha256(tmp_path):
    d, _ = _entry(Cache(tmp_path))
    man = json.loads((d / "manifest.json").read_text())
    assert len(man["files"]["data.safetensors"]["sha256"]) == 64 and man["schema"] == 1
    assert not list(d.glob(".tmp-*"))  # atomic writes leave no temp files


@pytest.mark.slow
def test_concurrent_processes_produce_once(tmp_path):
    """Four processes race for the same entry: exactly one produces it, the others read it."""
    script = textwrap.dedent(f"""
        import sys, time, torch
        from dflash_eval.cache.store import Batch, Cache, Produced, Request
        c = Cache({str(tmp_path)!r}, worker=sys.argv[1])
        def produce(todo):
            time.sleep(0.5)
            return [Produced({{"x": torch.ones(3)}})]
        req = Request("features", {{"k": 1}})
        e = c.ensure([Batch([req], produce)])[req.key]
        print("produced" if e.produced else "read")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, f"w{i}"], stdout=subprocess.PIPE, text=True)
             for i in range(4)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outs) == ["produced", "read", "read", "read"], outs
    assert len(Cache(tmp_path).productions()) == 1


def test_derived_entry_under_cache_only_is_produced_not_written_not_a_miss(tmp_path):
    only = Cache(tmp_path, cache_only=True)
    calls, produce = produce_counter()
    e = get(only, "prompt_ids", FIELDS, produce, derived=True)
    assert len(calls) == 1 and e.produced
    assert torch.equal(e.tensors["features"], torch.arange(12, dtype=torch.float32).view(3, 4))
    assert e.meta == {"note": "x"}
    assert not (tmp_path / "v1").exists() and only.productions() == []
    assert only.stats.misses == 0 and only.stats.produced == 0
    # Without cache_only a derived entry is written (still not counted a miss) and read back next time.
    rw = Cache(tmp_path)
    assert get(rw, "prompt_ids", FIELDS, produce, derived=True).produced
    assert rw.stats.misses == 0 and rw.stats.produced == 1
    again = get(Cache(tmp_path, cache_only=True), "prompt_ids", FIELDS, produce, derived=True)
    assert not again.produced and len(calls) == 2


def test_memo_computes_once_per_stamp_and_is_not_cache_stats(tmp_path):
    cache = Cache(tmp_path)
    calls: list[int] = []

    def compute(v="v1"):
        calls.append(1)
        return v

    assert cache.memo("target_identity", {"size": 1}, compute) == "v1"
    assert Cache(tmp_path).memo("target_identity", {"size": 1}, lambda: compute("other")) == "v1"
    assert len(calls) == 1  # memoised across processes, in <root>/v1/<name>.json
    assert (tmp_path / "v1" / "target_identity.json").is_file()
    assert cache.memo("target_identity", {"size": 2}, lambda: compute("v2")) == "v2" and len(calls) == 2
    assert cache.memo("target_identity", {"size": 1}, compute) == "v1" and len(calls) == 2  # both stamps kept
    assert cache.stats.to_dict()["hits"] == 0 and cache.stats.misses == 0 and cache.stats.produced == 0
    assert cache.productions() == []


def test_memo_writes_nothing_under_cache_only_and_survives_an_unwritable_cache(tmp_path):
    only = Cache(tmp_path / "c", cache_only=True)
    assert only.memo("target_identity", {"size": 1}, lambda: "v") == "v"
    assert not (tmp_path / "c").exists()
    Cache(tmp_path / "c").memo("target_identity", {"size": 1}, lambda: "v")
    assert only.memo("target_identity", {"size": 1}, lambda: pytest.fail("recomputed a memoised value")) == "v"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert Cache(blocked).memo("target_identity", {"size": 1}, lambda: "w") == "w"
    (tmp_path / "c" / "v1" / "target_identity.json").write_text("{broken")
    assert Cache(tmp_path / "c").memo("target_identity", {"size": 1}, lambda: "again") == "again"


def test_read_checks_dtype_shape_fields_and_meta_against_the_request(tmp_path):
    from dflash_eval.cache.store import Expected

    cache = Cache(tmp_path)
    key = cache_key("features", FIELDS)
    want = Expected(fields=FIELDS, tensors={"features": (torch.float32, (3, 4))},
                    meta={"provenance": {"backend": "torch", "layer_ids": [1]}})
    good_meta = {"provenance": {"backend": "torch", "layer_ids": [1], "dtype": "float32"}}
    cache.write("features", key, {"features": torch.zeros(3, 4)}, fields=FIELDS, meta=good_meta)
    assert cache.read("features", key, expect=want) is not None
    bad_cases = [
        ({"features": torch.zeros(3, 4, dtype=torch.bfloat16)}, FIELDS, good_meta,
         "is torch.bfloat16, the request needs torch.float32"),
        ({"features": torch.zeros(3, 5)}, FIELDS, good_meta, "has shape [3, 5], the request needs [3, 4]"),
        ({"other": torch.zeros(3, 4)}, FIELDS, good_meta, "tensor 'features' is missing"),
        ({"features": torch.zeros(3, 4)}, {**FIELDS, "dtype": "bfloat16"}, good_meta, "fields.dtype is 'bfloat16'"),
        ({"features": torch.zeros(3, 4)}, FIELDS, {"provenance": {"backend": "fla", "layer_ids": [1]}},
         "meta.provenance.backend is 'fla', expected 'torch'"),
        ({"features": torch.zeros(3, 4)}, FIELDS, {"provenance": {"backend": "torch", "layer_ids": [2]}},
         "meta.provenance.layer_ids is [2], expected [1]"),
    ]
    for tensors, fields, meta, needle in bad_cases:
        cache.write("features", key, tensors, fields=fields, meta=meta)  # under the request's key
        with pytest.warns(CacheCorruption, match="does not fit its request") as rec:
            assert cache.read("features", key, expect=want) is None
        assert needle in str(rec[0].message), (needle, str(rec[0].message))
        assert not cache.exists("features", key)  # removed: the next producer recomputes it
        cache.write("features", key, tensors, fields=fields, meta=meta)
        with pytest.raises(CacheError, match="--cache-only") as err:
            Cache(tmp_path, cache_only=True).read("features", key, expect=want)
        assert needle in str(err.value)


def test_ensure_recomputes_an_entry_written_for_other_fields(tmp_path):
    cache = Cache(tmp_path)
    calls, produce = produce_counter()
    key = cache_key("features", FIELDS)
    cache.write("features", key, {"features": torch.zeros(3, 4)}, fields={**FIELDS, "layer": 7})
    with pytest.warns(CacheCorruption, match="fields.layer is 7"):
        e = get(cache, "features", FIELDS, produce)
    assert calls == [1] and e.manifest["fields"] == FIELDS
    cache.write("features", key, {"features": torch.zeros(3, 4, dtype=torch.float64)}, fields=FIELDS)
    with pytest.warns(CacheCorruption, match="torch.float64"):
        get(cache, "features", FIELDS, produce, expect=Expected(tensors={"features": (torch.float32,
                                                                                                (3, 4))}))
    assert calls == [1, 1]
