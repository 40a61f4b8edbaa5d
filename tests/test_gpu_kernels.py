"""GPU-only checks of the fla backend (skipped on CPU machines with a reason naming what was not checked).

Run on a CUDA machine with flash-linear-attention installed: ``pytest tests/test_gpu_kernels.py``.
"""

from __future__ import annotations

import pytest
import torch

from dflash_eval.metrics.drift import layer_drift
from dflash_eval.target.backends import use_backend
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.loader import load_target

pytestmark = [pytest.mark.gpu, pytest.mark.fla]


def test_fla_matches_torch_fallback_fp32(tiny_target_dir) -> None:  # type: ignore[no-untyped-def]
    target = load_target(tiny_target_dir, device="cuda", dtype="fp32")
    ids = torch.arange(2, 300) % 290
    layers = list(range(target.num_layers))
    with use_backend("fla", "cuda") as info:
        assert info.name == "fla" and "fla" in info.chunk_impl
        fla = layer_features(target.model, ids, layers)
    with use_backend("torch", "cuda"):
        ref = layer_features(target.model, ids, layers)
    for i in layers:
        d = layer_drift(fla[i], ref[i])
        assert d.rel_err < 5e-3 and d.cos > 0.9999, (i, d)


def test_fla_greedy_generation_runs_and_restores(tiny_target_dir) -> None:  # type: ignore[no-untyped-def]
    from dflash_eval.target import backends
    from dflash_eval.target.generation import greedy_generate

    target = load_target(tiny_target_dir, device="cuda", dtype="bf16")
    mod = backends.loaded_hybrid_modules()[0]
    before = mod.torch_chunk_gated_delta_rule
    out = greedy_generate(target, list(range(3, 40)), 16, backend="fla", stop_at_eos=False)
    assert len(out) == 16
    assert mod.torch_chunk_gated_delta_rule is before


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="not checked: --device-map across GPUs needs >= 2 GPUs")
def test_device_map_spreads_target_and_features_agree(tiny_target_dir) -> None:  # type: ignore[no-untyped-def]
    from dflash_eval.target.hidden_states import extract_features

    single = load_target(tiny_target_dir, device="cuda:0", dtype="fp32")
    split = load_target(tiny_target_dir, dtype="fp32", device_map="balanced")
    devices = {p.device for p in split.model.parameters()}
    assert len(devices) >= 2, devices
    ids = torch.arange(2, 200) % 290
    layers = list(range(split.num_layers))
    a, _ = extract_features(single, ids, layers, backend="fla")
    b, _ = extract_features(split, ids, layers, backend="fla")
    d = layer_drift(b.to(a.device), a)
    assert d.rel_err < 1e-5, d


_COMPILE_SCRIPT = """
import json, sys, torch
from pathlib import Path
from dflash_eval.common.progress import Meter
from dflash_eval.target.backends import use_backend
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.kernel_cache import add_sink, use_kernel_cache
from dflash_eval.target.loader import load_target

where = use_kernel_cache(Path(sys.argv[1]))
meter = Meter()
add_sink(meter.note_compile)
target = load_target(Path(sys.argv[2]), device="cuda", dtype="bf16")
with meter.timed("features"), use_backend("fla", "cuda"):
    layer_features(target.model, torch.arange(2, 300) % 290, list(range(target.num_layers)))
print(json.dumps({**meter.compilation.to_dict(), "where": where.to_dict()}))
"""


def test_fla_kernels_compile_into_the_cache_dir_and_a_second_process_loads_them(  # type: ignore[no-untyped-def]
        tiny_target_dir, tmp_path) -> None:
    """A fresh process compiles (and autotunes) fla's kernels into ``<cache>/triton``, timed as compilation of the
    stage it ran in; a second process with that folder restored compiles nothing and loads them."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, str(tmp_path / "cache"), str(tiny_target_dir)],
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["where"] == {"path": str(tmp_path / "cache" / "triton"), "source": "--cache-dir"}
    assert first["kernels_compiled"] > 0 and first["by_stage"].get("features", 0) > 0, first
    assert list((tmp_path / "cache" / "triton").rglob("*.json")), "no compiled kernel in the cache folder"
    # autotuned kernels: the second process reads the tuning results and loads only the chosen configurations
    assert second["kernels_compiled"] == 0 and second["kernels_loaded"] > 0, second


@pytest.mark.parametrize("dtype,atol", [("fp32", 2e-3), ("bf16", 0.15)])
def test_fla_tree_verify_equals_each_root_path_run_alone(tiny_target_dir, dtype: str, atol: float) -> None:  # type: ignore[no-untyped-def]
    """fla's fused recurrent kernel over every node's padded root path gives each node the logits of its path run
    on its own (a plain forward on a copy of the cache), and keeping a path leaves the states that path makes."""
    import copy
    import random

    from dflash_eval.target.tree_verify import VerifyTree, tree_cache

    target = load_target(tiny_target_dir, device="cuda", dtype=dtype)
    model, rng = target.model, random.Random(3)
    parents = [-1] + [rng.randrange(i) for i in range(1, 17)]
    tree = VerifyTree(tuple(rng.randrange(3, 290) for _ in parents), tuple(parents), 9)
    with use_backend("fla", "cuda"), torch.no_grad():
        cache = tree_cache(model.config)
        model(torch.arange(3, 120, device="cuda")[None], cache=cache, use_cache=True)
        with cache.verifying(tree) as ver:
            ids, pos, mask = tree.inputs(ver.start, target.dtype, target.device)
            logits = model(ids, cache=cache, use_cache=True, position_ids=pos,
                           attention_mask={"full_attention": mask, "linear_attention": None}).logits[0].float()
        for node in range(tree.size):
            path = tree.path(node)
            alone = copy.deepcopy(cache)
            for layer in alone.layers:  # the context's KV only, as before the verify
                if isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.numel():
                    layer.keys, layer.values = layer.keys[..., :ver.start, :], layer.values[..., :ver.start, :]
            ref = model(torch.tensor([[tree.tokens[j] for j in path]], device="cuda"), cache=alone,
                        use_cache=True).logits[0, -1].float()
            assert (logits[node] - ref).abs().max().item() < atol * max(1.0, ref.abs().max().item()), node
            kept = copy.deepcopy(cache)
            kept.keep(ver, path)
            for a, b in zip(kept.layers, alone.layers):
                for name in ("conv_states", "recurrent_states"):
                    for x, y in zip(getattr(a, name, {}).values(), getattr(b, name, {}).values()):
                        if x is not None:
                            assert (x.float() - y.float()).abs().max().item() < atol * max(1.0, y.abs().max().item())
