"""The target's identity (the cache's key for everything computed from the target): what changes it, how it is
memoised and ``--rehash``; and invalid JSON in a target's config or tokenizer files named before any work."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

import dflash_eval.target.loader as target_mod
from dflash_eval.errors import ConfigError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.options.settings import EvalSettings
from dflash_eval.target.loader import TargetDir


@pytest.fixture
def target_copy(tiny_target_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "target"
    shutil.copytree(tiny_target_dir, out)
    return out


def _inputs(target: Path, cache: Path, **extra: object) -> Inputs:
    settings = EvalSettings.from_mapping({"target_model": str(target), "cache_dir": str(cache), "device": "cpu",
                                          "torch_threads": 1, **extra})
    return Inputs(settings)


def _flip_byte(path: Path, offset: int, *, keep_times: bool = True) -> None:
    """Change one byte in place (same inode, same size), restoring atime/mtime to the nanosecond."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))
    if keep_times:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def _tensor_offset(path: Path, key: str | None = None) -> tuple[int, int]:
    """(absolute start, length) of a tensor's bytes in a safetensors file (the largest one when no key)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    spans = {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}
    key = key or max(spans, key=lambda k: spans[k][1] - spans[k][0])
    begin, end = spans[key]
    return 8 + n + begin, end - begin


def test_weights_replaced_with_same_size_and_mtime_change_the_identity(target_copy: Path, tmp_path: Path) -> None:
    weights = target_copy / "model.safetensors"
    first = _inputs(target_copy, tmp_path / "cache").target_identity
    assert _inputs(target_copy, tmp_path / "cache").target_identity == first  # memoised: same answer

    start, length = _tensor_offset(weights)
    _flip_byte(weights, start + length // 3)  # in place: same inode, size and mtime; ctime moves
    edited = _inputs(target_copy, tmp_path / "cache").target_identity
    assert edited != first and edited == TargetDir(target_copy).fingerprint()

    # replaced by another file (new inode) with the old size and mtime restored
    st = weights.stat()
    other = tmp_path / "other.safetensors"
    shutil.copy2(weights, other)
    _flip_byte(other, start + length // 2)
    os.replace(other, weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    replaced = _inputs(target_copy, tmp_path / "cache").target_identity
    assert replaced not in (first, edited) and replaced == TargetDir(target_copy).fingerprint()


def test_memo_keys_on_inode_size_and_times(target_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = TargetDir.fingerprint
    monkeypatch.setattr(TargetDir, "fingerprint", lambda self: calls.append(1) or real(self))
    _inputs(target_copy, tmp_path / "cache").target_identity  # noqa: B018
    _inputs(target_copy, tmp_path / "cache").target_identity  # noqa: B018
    assert len(calls) == 1
    memo = json.loads((tmp_path / "cache" / "v1" / "target_identity.json").read_text())
    assert len(memo) == 1
    os.utime(target_copy / "config.json")  # touched: re-hashed (same content, same identity)
    _inputs(target_copy, tmp_path / "cache").target_identity  # noqa: B018
    assert len(calls) == 2


def test_rehash_recomputes_and_overwrites_the_memo(target_copy: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ident = _inputs(target_copy, tmp_path / "cache").target_identity
    memo_file = tmp_path / "cache" / "v1" / "target_identity.json"
    memo = json.loads(memo_file.read_text())
    memo_file.write_text(json.dumps({k: "stale" for k in memo}))  # a memo that lies
    assert _inputs(target_copy, tmp_path / "cache").target_identity == "stale"
    calls = []
    real = TargetDir.fingerprint
    monkeypatch.setattr(TargetDir, "fingerprint", lambda self: calls.append(1) or real(self))
    assert _inputs(target_copy, tmp_path / "cache", rehash="1").target_identity == ident and calls == [1]
    assert _inputs(target_copy, tmp_path / "cache").target_identity == ident and calls == [1]  # memo rewritten


def test_large_files_hash_header_and_every_tensor_sampled(target_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the full-hash limit: the safetensors header and 4 KiB at the start, middle and end of every tensor."""
    monkeypatch.setattr(target_mod, "_FULL_HASH_LIMIT", 0)
    weights = target_copy / "model.safetensors"
    with safe_open(str(weights), framework="pt") as fh:
        keys = sorted(fh.keys())
    base = TargetDir(target_copy).fingerprint()
    small = min(keys, key=lambda k: _tensor_offset(weights, k)[1])  # e.g. a norm weight: caught wherever it is
    for key, where in [(small, 0), (keys[len(keys) // 2], 0)]:
        start, length = _tensor_offset(weights, key)
        _flip_byte(weights, start + where)
        assert TargetDir(target_copy).fingerprint() != base, key
        _flip_byte(weights, start + where)
    assert TargetDir(target_copy).fingerprint() == base
    start, length = _tensor_offset(weights)  # the largest tensor: its middle and end are sampled too
    for where in (length // 2, length - 1):
        _flip_byte(weights, start + where)
        assert TargetDir(target_copy).fingerprint() != base, where
        _flip_byte(weights, start + where)
    # what sampling does not see (documented): a byte between the samples of a large tensor
    assert length > 3 * target_mod._SAMPLE_BYTES
    _flip_byte(weights, start + target_mod._SAMPLE_BYTES + 10)
    assert TargetDir(target_copy).fingerprint() == base
    monkeypatch.setattr(target_mod, "_FULL_HASH_LIMIT", 512 * 1024 * 1024)  # a full hash sees it
    assert TargetDir(target_copy).fingerprint() != base


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
def test_invalid_json_in_target_files_is_one_message_naming_the_file(target_copy: Path, tmp_path: Path,
                                                                     name: str) -> None:
    (target_copy / name).write_text('{"model": {"type": "BPE",\n  "vocab": ')
    with pytest.raises(ConfigError) as err:
        TargetDir(target_copy).check_json_files()
    msg = str(err.value)
    assert str(target_copy / name) in msg and "not valid JSON" in msg and "line 2 column" in msg
    inputs = _inputs(target_copy, tmp_path / "cache", prompts=str(tmp_path / "p.jsonl"))
    (tmp_path / "p.jsonl").write_text('{"text": "hello"}\n')
    with pytest.raises(ConfigError) as err:
        inputs.preflight()
    assert str(err.value).count(str(target_copy / name)) == 1 and "not valid JSON" in str(err.value)


def test_invalid_tokenizer_config_is_not_read_as_no_chat_template(target_copy: Path) -> None:
    (target_copy / "tokenizer_config.json").write_text('{"chat_template": "{{ x }}",')
    with pytest.raises(ConfigError, match="tokenizer_config.json: not valid JSON"):
        TargetDir(target_copy).chat_template_text()
