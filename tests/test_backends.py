"""Switching the Gated DeltaNet backend of hybrid modeling modules, and refusing impossible choices."""

from __future__ import annotations

import pytest
import torch

from dflash_eval.errors import BackendError
from dflash_eval.target import backends
from dflash_eval.target.backends import attention_backends, resolve_backend, use_backend
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.loader import Target


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


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_kernel_fault_hook_perturbs_the_delta_rule_output(tiny_target: Target) -> None:
    ids = torch.arange(2, 120)
    mod = backends.loaded_hybrid_modules()[0]
    before = (mod.torch_chunk_gated_delta_rule, mod.torch_recurrent_gated_delta_rule)
    with use_backend("torch"):
        clean = layer_features(tiny_target.model, ids, [2])[2]
    errs = {}
    for size in (1e-3, 1e-1, 1.0):
        with use_backend(f"torch+noise={size}") as info:
            assert info.name == f"torch+noise={size:g}" and f"[noise={size:g}]" in info.chunk_impl
            a = layer_features(tiny_target.model, ids, [2])[2]
        with use_backend(f"torch+noise={size}"):
            b = layer_features(tiny_target.model, ids, [2])[2]
        assert torch.equal(a, b), "the fault's noise is seeded: the same forward gives the same features"
        errs[size] = _rel(a, clean)
    assert 0 < errs[1e-3] < errs[1e-1] < errs[1.0], errs
    with use_backend("torch-recurrent+round=fp8"):
        r = layer_features(tiny_target.model, ids, [2])[2]
    assert 0 < _rel(r, clean) < 0.1
    assert (mod.torch_chunk_gated_delta_rule, mod.torch_recurrent_gated_delta_rule) == before


def test_kernel_fault_names() -> None:
    assert backends.split_backend("torch+noise=0.01") == ("torch", backends.KernelFault("noise", size=0.01))
    assert backends.split_backend("fla") == ("fla", None)
    assert resolve_backend("auto+round:bf16", "cpu") == "torch+round=bf16"
    with pytest.raises(BackendError, match="CUDA"):
        resolve_backend("fla+noise=0.1", "cpu")
    for bad in ("noise", "noise:0", "noise:x", "round:int8", "shift:1"):
        with pytest.raises(BackendError, match="unknown kernel fault"):
            backends.parse_fault(bad)


def _fla_installed_but_broken(monkeypatch: pytest.MonkeyPatch, imported: list[str]) -> None:
    """fla found on the path, its ops failing to import (recorded in ``imported`` when tried)."""
    monkeypatch.setattr(backends, "fla_installed", lambda: True)

    def broken():
        imported.append("fla.ops.gated_delta_rule")
        return None

    monkeypatch.setattr(backends, "_fla_functions", broken)


def test_choosing_fla_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    _fla_installed_but_broken(monkeypatch, imported)
    assert resolve_backend("auto", "cuda") == "fla"
    assert resolve_backend("fla+noise=0.01", "cuda") == "fla+noise=0.01"
    backends.check_backend_device("fla", "cuda", imports=False)
    assert imported == []


def test_fla_that_does_not_import_fails_where_it_is_first_used(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    _fla_installed_but_broken(monkeypatch, imported)
    with pytest.raises(BackendError, match="fla is installed.*does not import|does not import.*fla is installed"):
        with use_backend("fla", "cuda"):
            pytest.fail("the block ran with fla unusable")
    assert imported == ["fla.ops.gated_delta_rule"]


def test_fla_not_installed_is_a_clear_error_when_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "fla_installed", lambda: False)
    assert resolve_backend("auto", "cuda") == "torch"
    with pytest.raises(BackendError, match="not installed"):
        resolve_backend("fla", "cuda")


def _sdp_flags() -> tuple[bool, bool, bool, bool]:
    cuda = torch.backends.cuda
    return cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()


def test_cuda_attention_excludes_cudnn_only() -> None:
    """On CUDA the target's attention may use flash, memory-efficient or math kernels but not cuDNN (a plan per new
    shape); the flag is restored after, ``cudnn=True`` allows it again inside, and CPU runs are untouched."""
    before = _sdp_flags()
    assert before == (True, True, True, True), "test premise: every attention backend enabled by default"
    with attention_backends("cuda"):
        assert _sdp_flags() == (False, True, True, True)
        with attention_backends("cuda", cudnn=True):
            assert _sdp_flags() == before
        assert _sdp_flags() == (False, True, True, True)
    assert _sdp_flags() == before
    with attention_backends("cpu"):
        assert _sdp_flags() == before


def test_every_target_forward_on_cuda_runs_without_cudnn_attention() -> None:
    """use_backend (the block every target forward runs in: features, probe, teacher-forced checks, generation) turns
    cuDNN attention off on CUDA for its whole block, a nested block of the same backend included, and restores it;
    on a CPU device it leaves the switches alone."""
    before = _sdp_flags()
    with use_backend("torch", "cuda"):
        assert _sdp_flags()[0] is False
        with use_backend("torch", "cuda"):
            assert _sdp_flags()[0] is False
        with use_backend("torch-recurrent", "cuda"):
            assert _sdp_flags()[0] is False
        assert _sdp_flags()[0] is False
    assert _sdp_flags() == before
    with pytest.raises(RuntimeError), use_backend("torch", "cuda"):
        raise RuntimeError("boom")
    assert _sdp_flags() == before
    with use_backend("torch", "cpu"):
        assert _sdp_flags() == before
