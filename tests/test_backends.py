"""Switching the Gated DeltaNet backend of hybrid modeling modules, and refusing impossible choices."""

from __future__ import annotations

import pytest
import torch

from dflash_eval import backends
from dflash_eval.backends import resolve_backend, use_backend
from dflash_eval.errors import BackendError
from dflash_eval.features import layer_features
from dflash_eval.target import Target


def test_switch_and_restore() -> None:
    mod = backends.loaded_hybrid_modules()[0]
    before = (mod.torch_chunk_gated_delta_rule, mod.torch_recurrent_gated_delta_rule)
    with use_backend("torch-recurrent") as info:
        assert info.name == "torch-recurrent"
        assert mod.torch_chunk_gated_delta_rule is mod.torch_recurrent_gated_delta_rule
        assert "recurrent" in info.chunk_impl
    assert (mod.torch_chunk_gated_delta_rule, mod.torch_recurrent_gated_delta_rule) == before


def test_restored_after_exception() -> None:
    mod = backends.loaded_hybrid_modules()[0]
    before = mod.torch_chunk_gated_delta_rule
    with pytest.raises(RuntimeError), use_backend("torch-recurrent"):
        raise RuntimeError("boom")
    assert mod.torch_chunk_gated_delta_rule is before


def test_fla_on_cpu_is_a_clear_error() -> None:
    with pytest.raises(BackendError, match="CUDA"):
        resolve_backend("fla", "cpu")
    with pytest.raises(BackendError, match="CUDA"), use_backend("fla", "cpu"):
        pass


def test_unknown_backend() -> None:
    with pytest.raises(BackendError, match="unknown linear-attention backend 'triton'"):
        resolve_backend("triton", "cpu")


def test_auto_is_torch_on_cpu() -> None:
    assert resolve_backend("auto", "cpu") == "torch"


def test_chunked_and_recurrent_paths_agree_in_fp32_but_not_bitwise(tiny_target: Target) -> None:
    ids = torch.arange(2, 150)
    with use_backend("torch"):
        a = layer_features(tiny_target.model, ids, [2])[2]
    with use_backend("torch-recurrent"):
        b = layer_features(tiny_target.model, ids, [2])[2]
    rel = ((a - b).norm() / a.norm()).item()
    assert rel < 1e-5
    assert not torch.equal(a, b), "the two paths should be different kernels"
