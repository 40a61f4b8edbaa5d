"""GPU lane measurements: fla vs torch hidden-state drift, functional τ drift, extraction speed vs the FLOP floor.

Run on the H200 (fla installed; see docs/gpu-lab.md):

    python benchmarks/gpu_drift.py --out $OUT/gpu_drift.json

On a CPU (no fla) it compares ``torch`` against ``torch-recurrent`` instead, so the script itself is testable:

    .venv/bin/python benchmarks/gpu_drift.py --wide-hidden 64 --wide-layers 4 --wide-tokens 256 --out /tmp/d.json

Measures, per layer ``i`` (``hidden_states[i + 1]``), the relative L2 error and cosine of
(a) fla bf16 vs torch bf16, (b) fla bf16 vs a torch fp32 reference, (c) torch bf16 vs the fp32 reference,
for (1) the bundled target on the bundled prompts + greedy completions and (2) a randomly initialised Qwen3.5
text model at Qwen3.6-27B widths (hidden 5120, GDN 16 key / 48 value heads of dim 128, attention 24 / 4 heads
of dim 256). Then the bundled drafter's τ from each feature set and |τ(fla) - τ(torch)| per prompt; and the
extraction throughput of the wide model against its forward-FLOP floor at a measured bf16 matmul rate.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

from dflash_eval.drafter import TargetSpec, build_drafter, read_checkpoint
from dflash_eval.metrics.drift import layer_drift
from dflash_eval.metrics.tau import chain_tau, draft_table
from dflash_eval.target.backends import fla_available, use_backend
from dflash_eval.target.generation import greedy_generate
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.loader import load_target
from dflash_eval.target.provenance import library_versions
from dflash_eval.testing.tiny import qwen35_text_config

ROOT = Path(__file__).resolve().parents[1]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _feats(model: torch.nn.Module, ids: torch.Tensor, layers: list[int], backend: str) -> dict[int, torch.Tensor]:
    dev = next(model.parameters()).device
    with use_backend(backend, dev):
        return layer_features(model, ids.to(dev), layers)


def _compare(sets: dict[str, dict[int, torch.Tensor]], pairs: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for a, e in pairs:
        out[f"{a}_vs_{e}"] = {str(i): layer_drift(sets[a][i], sets[e][i]).to_dict() for i in sets[a]}
    return out


def bundled(args: argparse.Namespace, fast: str, ref: str) -> dict[str, Any]:
    """Drift and functional τ drift on the bundled target and drafter."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t32 = load_target(args.target, device=dev, dtype="fp32")
    t16 = load_target(args.target, device=dev, dtype="bf16")
    head32 = TargetHead.from_model(t32.model)
    drafter = build_drafter(read_checkpoint(args.drafter), device=dev, dtype="fp32", spec=TargetSpec.from_target(t32))
    prompts = [json.loads(x) for x in Path(args.prompts).read_text().splitlines() if x.strip()][: args.num_prompts]
    layers_all = list(range(t32.num_layers))
    layer_ids = list(drafter.config.target_layer_ids)
    per_prompt = []
    agg: dict[str, dict[str, list[float]]] = {}
    for p in prompts:
        ids = t32.tokenizer(p["text"], add_special_tokens=False)["input_ids"]
        comp = greedy_generate(t32, ids, args.max_new_tokens, backend=ref, stop_at_eos=False)
        seq = torch.tensor(ids + comp)
        sets = {
            "fp32ref": _feats(t32.model, seq, layers_all, ref),
            f"{fast}_bf16": _feats(t16.model, seq, layers_all, fast),
            f"{ref}_bf16": _feats(t16.model, seq, layers_all, ref),
        }
        cmp = _compare(sets, [(f"{fast}_bf16", f"{ref}_bf16"), (f"{fast}_bf16", "fp32ref"), (f"{ref}_bf16", "fp32ref")])
        taus = {}
        for name, fs in sets.items():
            feats = torch.cat([fs[i].float() for i in layer_ids], dim=-1)
            taus[name] = chain_tau(draft_table(drafter, head32, [(feats, seq, len(ids))])[0]).tau
        per_prompt.append({"id": p["id"], "tokens": int(seq.numel()), "drift": cmp, "tau": taus,
                           "abs_tau_diff_fast_vs_ref_bf16": abs(taus[f"{fast}_bf16"] - taus[f"{ref}_bf16"])})
        for key, layers in cmp.items():
            for i, d in layers.items():
                agg.setdefault(key, {}).setdefault(i, []).append(d["rel_err"])
    summary = {k: {i: {"mean_rel_err": sum(v) / len(v), "max_rel_err": max(v)} for i, v in d.items()}
               for k, d in agg.items()}
    diffs = [pp["abs_tau_diff_fast_vs_ref_bf16"] for pp in per_prompt]
    return {"per_prompt": per_prompt, "per_layer_summary": summary,
            "tau_diff": {"mean": sum(diffs) / len(diffs), "max": max(diffs)}}


def wide(args: argparse.Namespace, fast: str, ref: str) -> dict[str, Any]:
    """Random Qwen3.5 model at Qwen3.6-27B widths: per-layer drift and extraction speed vs the FLOP floor."""
    from transformers import Qwen3_5ForCausalLM

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    h = args.wide_hidden
    scale = h / 5120
    cfg = qwen35_text_config(
        vocab_size=args.wide_vocab, hidden_size=h, num_hidden_layers=args.wide_layers,
        intermediate_size=max(8, int(17408 * scale)),
        num_attention_heads=max(1, int(24 * scale)), num_key_value_heads=max(1, int(4 * scale)),
        head_dim=256 if h >= 1024 else 16,
        linear_num_key_heads=max(1, int(16 * scale)), linear_num_value_heads=max(1, int(48 * scale)),
        linear_key_head_dim=128 if h >= 1024 else 16, linear_value_head_dim=128 if h >= 1024 else 16,
    )
    torch.manual_seed(0)
    with torch.device(dev):
        m32 = Qwen3_5ForCausalLM(cfg).float().eval()
    m16 = copy.deepcopy(m32).to(torch.bfloat16).eval()  # the same weights, rounded to bf16
    n_params = sum(p.numel() for n, p in m16.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.wide_vocab, (args.wide_tokens,), generator=g)
    layers = list(range(args.wide_layers))
    sets = {"fp32ref": _feats(m32, ids, layers, ref), f"{fast}_bf16": _feats(m16, ids, layers, fast),
            f"{ref}_bf16": _feats(m16, ids, layers, ref)}
    fp32_fast = _feats(m32, ids, layers, fast) if fast == "fla" else None
    cmp = _compare(sets, [(f"{fast}_bf16", f"{ref}_bf16"), (f"{fast}_bf16", "fp32ref"), (f"{ref}_bf16", "fp32ref")])
    if fp32_fast is not None:
        cmp[f"{fast}_fp32_vs_fp32ref"] = {str(i): layer_drift(fp32_fast[i], sets["fp32ref"][i]).to_dict()
                                          for i in layers}
    del m32, sets
    # Extraction speed: bf16 forward through all layers (features of 3 layers kept), vs FLOP floor.
    timings = {}
    for backend in (fast, ref):
        for _ in range(2):
            _feats(m16, ids, [1, layers[-2]], backend)
        _sync()
        t0 = time.perf_counter()
        reps = 3
        for _ in range(reps):
            _feats(m16, ids, [1, layers[-2]], backend)
        _sync()
        timings[backend] = (time.perf_counter() - t0) / reps
    flops = 2 * n_params * args.wide_tokens  # matmul FLOPs of the forward (attention/scan terms excluded)
    rate = None
    if dev.type == "cuda":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            a @ a
        _sync()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ a
        _sync()
        rate = 10 * 2 * 8192**3 / (time.perf_counter() - t0)
    return {
        "config": {"hidden": h, "layers": args.wide_layers, "tokens": args.wide_tokens, "params_no_embed": n_params},
        "drift": cmp,
        "forward_s": timings,
        "tokens_per_s": {k: args.wide_tokens / v for k, v in timings.items()},
        "flop_floor_s": (flops / rate) if rate else None,
        "measured_bf16_matmul_tflops": rate / 1e12 if rate else None,
        "fraction_of_floor": {k: (flops / rate) / v for k, v in timings.items()} if rate else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "fixtures" / "target"), help="bundled target dir")
    ap.add_argument("--drafter", default=str(ROOT / "fixtures" / "drafter"), help="bundled drafter dir")
    ap.add_argument("--prompts", default=str(ROOT / "fixtures" / "prompts.jsonl"), help="prompts JSONL")
    ap.add_argument("--num-prompts", type=int, default=16, help="bundled prompts to use")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="completion length")
    ap.add_argument("--wide-hidden", type=int, default=5120, help="hidden size of the wide random model")
    ap.add_argument("--wide-layers", type=int, default=16, help="layers of the wide random model")
    ap.add_argument("--wide-tokens", type=int, default=4096, help="sequence length for the wide model")
    ap.add_argument("--wide-vocab", type=int, default=4096, help="vocabulary of the wide random model")
    ap.add_argument("--skip-wide", action="store_true", help="only the bundled model")
    ap.add_argument("--out", required=True, help="JSON output path")
    args = ap.parse_args()
    fast = "fla" if torch.cuda.is_available() and fla_available() else "torch-recurrent"
    ref = "torch"
    res: dict[str, Any] = {"fast_backend": fast, "reference_backend": ref, "versions": library_versions(),
                           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    t0 = time.perf_counter()
    res["bundled"] = bundled(args, fast, ref)
    print(f"bundled done in {time.perf_counter() - t0:.1f}s; tau diff {res['bundled']['tau_diff']}", flush=True)
    if not args.skip_wide:
        res["wide"] = wide(args, fast, ref)
        print(f"wide done; tokens/s {res['wide']['tokens_per_s']}", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res["bundled"]["per_layer_summary"], indent=1))
    if "wide" in res:
        drift = res["wide"]["drift"]
        print(json.dumps({k: {i: round(d['rel_err'], 6) for i, d in v.items()} for k, v in drift.items()}, indent=1))


if __name__ == "__main__":
    main()
