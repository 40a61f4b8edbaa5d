"""Unit tests of dflash_eval.cache: round trip, key separation, corruption detection, --cache-only, locking."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from dflash_eval.cache import Cache, CacheCorruption, cache_key, ids_digest
from dflash_eval.errors import CacheError

FIELDS = {"target": "abc", "tokens": ids_digest([1, 2, 3]), "layer": 1, "backend": "torch", "dtype": "float32"}


def produce_counter():
    calls = []

    def produce():
        calls.append(1)
        return {"features": torch.arange(12, dtype=torch.float32).view(3, 4)}, {"note": "x"}

    return calls, produce


def test_round_trip_and_single_production(tmp_path):
    cache = Cache(tmp_path)
    calls, produce = produce_counter()
    e1 = cache.get_or_produce("features", FIELDS, produce)
    e2 = cache.get_or_produce("features", FIELDS, produce)
    assert len(calls) == 1 and e1.produced and not e2.produced
    assert torch.equal(e2.tensors["features"], torch.arange(12, dtype=torch.float32).view(3, 4))
    assert e2.meta == {"note": "x"} and e2.manifest["fields"] == FIELDS
    assert cache.stats.hits == 1 and cache.stats.produced == 1
    assert [p["kind"] for p in cache.productions()] == ["features"]


def test_keys_separate_backends_dtypes_and_tokens(tmp_path):
    cache = Cache(tmp_path)
    calls, produce = produce_counter()
    cache.get_or_produce("features", FIELDS, produce)
    for change in ({"backend": "fla"}, {"backend": "torch-recurrent"}, {"dtype": "bfloat16"},
                   {"tokens": ids_digest([1, 2, 4])}, {"layer": 2}):
        key = cache_key("features", {**FIELDS, **change})
        assert key != cache_key("features", FIELDS)
        assert cache.read("features", key) is None  # never served for another backend / dtype / sequence
    assert cache_key("features", dict(reversed(list(FIELDS.items())))) == cache_key("features", FIELDS)


def _entry(cache):
    _, produce = produce_counter()
    e = cache.get_or_produce("features", FIELDS, produce)
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
    e = Cache(tmp_path).get_or_produce("features", FIELDS, produce)
    assert len(calls) == 1 and e.produced


def test_cache_only_miss_and_corruption_are_errors(tmp_path):
    only = Cache(tmp_path, cache_only=True)
    calls, produce = produce_counter()
    with pytest.raises(CacheError, match="--cache-only"):
        only.get_or_produce("features", FIELDS, produce, what="features of prompt 'a'")
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


def test_concurrent_processes_produce_once(tmp_path):
    """Four processes race for the same entry: exactly one produces it, the others read it."""
    script = textwrap.dedent(f"""
        import sys, time, torch
        from dflash_eval.cache import Cache
        c = Cache({str(tmp_path)!r}, worker=sys.argv[1])
        def produce():
            time.sleep(0.5)
            return {{"x": torch.ones(3)}}, {{}}
        e = c.get_or_produce("features", {{"k": 1}}, produce)
        print("produced" if e.produced else "read")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, f"w{i}"], stdout=subprocess.PIPE, text=True)
             for i in range(4)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outs) == ["produced", "read", "read", "read"], outs
    assert len(Cache(tmp_path).productions()) == 1
