"""What the cache verifies and when: an entry's sha256 once per process (over the bytes read, the file read once),
again after its file changed; entries written without fsync; ``Cache.ensure(keep=False)`` makes entries present
without reading them; and in a run, a feature entry damaged after it was cached is refused when a prompt's features
are read lazily, and extracted again (with the same τ).

Run: ``pytest tests/test_cache_verification.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from test_eval_suite import env_dirs, productions, suite, verdicts  # noqa: F401 - the suite's fixtures

from dflash_eval.cache import store
from dflash_eval.cache.store import Batch, Cache, CacheCorruption, Produced, Request, ids_digest

FIELDS = {"target": "abc", "tokens": ids_digest([1, 2, 3]), "layer": 1, "backend": "torch", "dtype": "float32"}


def _request() -> Request:
    return Request("features", FIELDS, what="features of prompt 'a', layer 1")


def _fill(cache: Cache) -> Path:
    req = _request()
    cache.ensure([Batch([req], lambda todo: [Produced({"features": torch.arange(12.0).reshape(3, 4)})])])
    return cache.entry_dir("features", req.key) / "data.safetensors"


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the byte strings hashed with sha256 (entry data, and the keys' JSON)."""
    seen: list[int] = []
    real = store.hashlib.sha256

    def counting(data: bytes = b""):  # type: ignore[no-untyped-def]
        seen.append(len(data))
        return real(data)

    monkeypatch.setattr(store.hashlib, "sha256", counting)
    return seen


def test_an_entry_is_hashed_on_its_first_read_in_a_process_and_after_its_file_changed(tmp_path, hashes) -> None:
    cache = Cache(tmp_path)
    data = _fill(cache)
    size = data.stat().st_size
    assert hashes.count(size) == 1  # the write hashes the bytes it wrote
    key = _request().key
    for _ in range(3):
        assert torch.equal(cache.read("features", key).tensors["features"], torch.arange(12.0).reshape(3, 4))
    assert hashes.count(size) == 2  # three reads, one hash
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    st = data.stat()
    data.write_bytes(bytes(raw))
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a later write (coarse clocks: the same tick)
    with pytest.warns(CacheCorruption, match="sha256 does not match"):
        assert cache.read("features", key) is None


def test_a_new_process_verifies_again_whatever_the_file_times(tmp_path) -> None:
    data = _fill(Cache(tmp_path))
    key = _request().key
    assert Cache(tmp_path).read("features", key) is not None
    st = data.stat()
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))  # planted: same size
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the times it had
    with pytest.warns(CacheCorruption, match="sha256 does not match"):
        assert Cache(tmp_path).read("features", key) is None


def test_entries_are_written_without_fsync(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    data = _fill(Cache(tmp_path))
    assert synced == [] and data.is_file() and (data.parent / "manifest.json").is_file()
    assert not list(data.parent.glob(".tmp-*"))


def test_ensure_without_keeping_makes_entries_present_and_reads_nothing(tmp_path, hashes) -> None:
    cache = Cache(tmp_path)
    req = _request()
    made = cache.ensure([Batch([req], lambda todo: [Produced({"features": torch.ones(3, 4)})])], keep=False)
    assert made[req.key].tensors == {} and cache.has(req) and cache.stats.produced == 1
    again = Cache(tmp_path)
    size = (cache.entry_dir("features", req.key) / "data.safetensors").stat().st_size
    got = again.ensure([Batch([req], lambda todo: pytest.fail("produced again"))], keep=False)
    assert got[req.key].tensors == {} and hashes.count(size) == 1 and again.stats.hits == 1  # present: not read
    assert torch.equal(again.lookup(req, count=False).tensors["features"], torch.ones(3, 4))


@pytest.mark.slow
def test_a_damaged_feature_entry_is_extracted_again_when_its_prompt_is_read(suite, env_dirs) -> None:  # noqa: F811
    cache = env_dirs["root"] / "cache-damaged-features"
    res, ej = suite(cache, "-k", "tau", "--tau-floor", "1.0", name="fill-f")
    assert res.ret == 0, res.stdout.str()
    first, _ = verdicts(ej)
    n = len(productions(cache))
    victim = next((cache / "v1" / "features").rglob("data.safetensors"))
    raw = bytearray(victim.read_bytes())
    raw[-1] ^= 0xFF
    victim.write_bytes(bytes(raw))
    shutil.rmtree(cache / "v1" / "tau")  # τ simulated again: every prompt's features read
    res, ej = suite(cache, "-k", "tau", "--tau-floor", "1.0", "-W", "default", name="fix-f")
    out = res.stdout.str()
    assert res.ret == 0, out
    assert "corrupted" in out and "sha256" in out
    kinds = [p["kind"] for p in productions(cache)[n:]]
    assert kinds.count("features") == 1 and kinds.count("tau") == 1, kinds  # the one entry, then τ
    again, _ = verdicts(ej)
    assert again == first
    assert json.loads(ej.read_text())["cache"]["master"]["corrupted"]
