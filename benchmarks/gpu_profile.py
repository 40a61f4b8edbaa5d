"""Where the GPU time of the two target-forward stages goes, at Qwen3.6-27B widths: feature extraction against its
matmul-FLOP floor, and batched greedy generation, each broken down by kernel family with ``torch.profiler``.

Run on a CUDA machine with fla (see docs/gpu-lab.md)::

    python benchmarks/gpu_profile.py --out $OUT/gpu_profile.json

A random Qwen3.5 target (hidden 5120, ``--layers`` layers, bf16, built in memory) is timed, after a warm-up that
compiles and autotunes the kernels, on:

- extraction: one forward over ``--tokens`` tokens through every layer (what the feature stage runs per prompt),
  against ``2 x parameters x tokens`` FLOPs at the bf16 matmul rate measured in the same run;
- generation: ``--batch`` prompts of ``--prompt-len`` tokens, ``--new-tokens`` greedy tokens each
  (:func:`dflash_eval.target.generation.greedy_generate_batch`), wall time per decode step.

For each, one profiled repetition gives the CUDA time per kernel family (matmul, fla's linear-attention kernels,
attention, normalisation / activation / elementwise, copies, other) and the share of the wall time the GPU was busy;
the rest is host time (Python, kernel launches, synchronisation). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dflash_eval.target.backends import fla_available, use_backend  # noqa: E402
from dflash_eval.target.generation import greedy_generate_batch  # noqa: E402
from dflash_eval.target.hidden_states import layer_features  # noqa: E402
from dflash_eval.target.provenance import library_versions  # noqa: E402
from dflash_eval.testing.tiny import qwen35_text_config  # noqa: E402

FAMILIES = [  # (family, pattern on the kernel name), first match wins
    ("matmul", r"gemm|cutlass|sm90_xmma|nvjet|cublas|matmul|wgmma"),
    ("fla linear attention", r"chunk|fused_recurrent|gated_delta|delta_rule|recompute_w_u|solve_tril|fwd_kernel_o|"
                             r"cumsum|l2norm|kkt"),
    ("attention", r"flash|fmha|attention|sdpa|softmax"),
    ("conv1d", r"conv"),
    ("norm / activation / elementwise", r"norm|silu|sigmoid|gelu|elementwise|vectorized|unrolled|mul_|add_|"
                                       r"reduce|exp|rsqrt|pow|where|index|cat|fill"),
    ("copy", r"copy|memcpy|memset|transpose|contiguous"),
]


class Target:
    """The random wide target and a way to call it with a backend (``fla`` here; ``torch`` for comparison)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.device, self.dtype = model, next(model.parameters()).device, torch.bfloat16
        self.eos_token_id = None


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, pat in FAMILIES if re.search(pat, low)), "other")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def profile(fn) -> dict[str, Any]:
    """CUDA time by kernel family for one call of ``fn``, the wall time of that call, and the top kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    sync()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - t0
    by_family: dict[str, float] = {}
    kernels: dict[str, float] = {}
    launches = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        dur = e.device_time / 1e6 if hasattr(e, "device_time") else e.cuda_time / 1e6
        by_family[family(e.name)] = by_family.get(family(e.name), 0.0) + dur
        kernels[e.name] = kernels.get(e.name, 0.0) + dur
        launches += 1
    busy = sum(by_family.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {"wall_s": wall, "gpu_busy_s": busy, "gpu_busy_share": busy / wall if wall else None,
            "kernels_launched": launches,
            "by_family_s": dict(sorted(by_family.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": n[:120], "s": s, "family": family(n)} for n, s in top]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096, help="extraction sequence length")
    ap.add_argument("--batch", type=int, default=16, help="generation batch")
    ap.add_argument("--prompt-len", type=int, default=512, help="generation prompt length")
    ap.add_argument("--new-tokens", type=int, default=64, help="generated tokens per prompt")
    ap.add_argument("--backends", nargs="*", default=None, help="default: fla and torch (fla where it runs)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cuda", help="cpu only to smoke-test this script (no kernel profile)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (the profile is of GPU kernels)")
        return 2
    from transformers import Qwen3_5ForCausalLM

    backends = a.backends or (["fla", "torch"] if fla_available() else ["torch"])
    h, scale = a.hidden, a.hidden / 5120
    cfg = qwen35_text_config(
        vocab_size=4096, hidden_size=h, num_hidden_layers=a.layers, intermediate_size=int(17408 * scale),
        num_attention_heads=max(1, int(24 * scale)), num_key_value_heads=max(1, int(4 * scale)), head_dim=256,
        linear_num_key_heads=max(1, int(16 * scale)), linear_num_value_heads=max(1, int(48 * scale)),
        linear_key_head_dim=128, linear_value_head_dim=128)
    torch.manual_seed(0)
    with dev:
        model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16).eval()
    target = Target(model)
    n_params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    n = 8192 if dev.type == "cuda" else 512
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ x
    rate = 2 * n ** 3 / timed(lambda: x @ x, 10)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4096, (a.tokens,), generator=g)
    prompts = [torch.randint(0, 4096, (a.prompt_len,), generator=g).tolist() for _ in range(a.batch)]
    layers = list(range(a.layers))
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    out: dict[str, Any] = {"versions": library_versions(), "device": name,
                           "config": {"hidden": h, "layers": a.layers, "params_no_embed": n_params,
                                      "tokens": a.tokens, "batch": a.batch, "prompt_len": a.prompt_len,
                                      "new_tokens": a.new_tokens},
                           "bf16_matmul_tflops": rate / 1e12, "extraction": {}, "generation": {}}
    floor = 2 * n_params * a.tokens / rate
    for be in backends:
        def extract(be: str = be) -> None:
            with use_backend(be, dev), torch.no_grad():
                layer_features(model, ids, layers)

        def generate(be: str = be) -> None:
            greedy_generate_batch(target, prompts, a.new_tokens, backend=be, stop_at_eos=False)

        t0 = time.perf_counter()
        extract()
        sync()
        first = time.perf_counter() - t0
        extract()
        s = timed(extract, 3)
        out["extraction"][be] = {"first_call_s": first, "s": s, "tokens_per_s": a.tokens / s, "flop_floor_s": floor,
                                 "fraction_of_floor": floor / s, "profile": profile(extract)}
        t0 = time.perf_counter()
        generate()
        sync()
        first = time.perf_counter() - t0
        s = timed(generate, 2)
        out["generation"][be] = {"first_call_s": first, "s": s, "s_per_step": s / a.new_tokens,
                                 "tokens_per_s": a.batch * a.new_tokens / s, "profile": profile(generate)}
        e, gen = out["extraction"][be], out["generation"][be]
        print(f"[{be}] extraction {a.tokens} tokens: {e['s'] * 1e3:.1f} ms ({e['fraction_of_floor']:.0%} of the "
              f"{floor * 1e3:.1f} ms FLOP floor at {rate / 1e12:.0f} TFLOP/s; first call {e['first_call_s']:.2f} s); "
              f"GPU busy {e['profile']['gpu_busy_share']:.0%}: " + ", ".join(
                  f"{k} {v * 1e3:.1f} ms" for k, v in e["profile"]["by_family_s"].items()), flush=True)
        print(f"[{be}] generation {a.batch} x {a.new_tokens} tokens (prompts of {a.prompt_len}): {gen['s']:.2f} s, "
              f"{gen['s_per_step'] * 1e3:.1f} ms per step (first call {gen['first_call_s']:.2f} s); GPU busy "
              f"{gen['profile']['gpu_busy_share']:.0%} over {gen['profile']['kernels_launched']} kernels: " + ", ".join(
                  f"{k} {v * 1e3:.0f} ms" for k, v in gen["profile"]["by_family_s"].items()), flush=True)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
