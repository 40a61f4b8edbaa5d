"""Benchmark: what the kernel probe (:mod:`dflash_eval.target.kernel_probe`) costs, and that its digest is the same in
separate processes.

For the bundled target and a config at 27B widths (hidden 5120; Gated DeltaNet 16 key / 48 value heads of dim 128;
attention 24 heads / 4 key-value heads of dim 256; config.json alone, the probe builds no model), every backend that
can run here (torch, torch-recurrent, and fla on CUDA when it imports) in fp32 and bf16: the first probe of the
process (its ``import_seconds``: the modeling module, and fla for the fla backend), then the kernel calls of
``--repeats`` probes (median ``seconds``), one value per process. Each case runs in ``--processes`` fresh
interpreters, one after the other, whose digests must agree bit for bit (with fla the first process also fills
Triton's kernel cache when it is empty).

Run (about a minute on a 2-core CPU)::

    .venv/bin/python benchmarks/bench_kernel_probe.py [--device cpu|cuda] [--backends torch fla] [--repeats 5]
        [--processes 2] [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDE = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 5120,
        "num_hidden_layers": 4, "vocab_size": 1000, "num_attention_heads": 24, "num_key_value_heads": 4,
        "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}


def child(target: str, backend: str, dtype: str, device: str, repeats: int) -> dict:
    """One fresh process: the first probe, then ``repeats`` more."""
    import torch

    from dflash_eval.common.dtypes import parse_dtype
    from dflash_eval.target.kernel_probe import probe
    from dflash_eval.target.loader import TargetDir

    dt = parse_dtype(dtype)
    first = probe(TargetDir(target), backend, dt, device)
    again = [probe(TargetDir(target), backend, dt, device) for _ in range(repeats)]
    return {"digest": first.digest, "kernels": {k: v.digest for k, v in first.kernels.items()},
            "stable_in_process": all(r.digest == first.digest for r in again),
            "first_import_s": first.import_seconds, "first_kernels_s": first.seconds,
            "kernels_s": statistics.median(r.seconds for r in again), "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--backends", nargs="+", help="default: torch, torch-recurrent, and fla on CUDA")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", nargs=5, metavar=("TARGET", "BACKEND", "DTYPE", "DEVICE", "REPEATS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        t, b, d, dev, n = args.child
        print(json.dumps(child(t, b, d, dev, int(n))))
        return
    from dflash_eval.target.backends import fla_available

    backends = args.backends or (["torch", "torch-recurrent"]
                                 + (["fla"] if args.device.startswith("cuda") and fla_available() else []))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        wide = Path(tmp) / "wide"
        wide.mkdir()
        (wide / "config.json").write_text(json.dumps(WIDE))
        for name, target in (("bundled", ROOT / "fixtures" / "target"), ("27B widths", wide)):
            for backend in backends:
                for dtype in ("fp32", "bf16"):
                    runs = []
                    for _ in range(args.processes):
                        p = subprocess.run([sys.executable, __file__, "--child", str(target), backend, dtype,
                                            args.device, str(args.repeats)], capture_output=True, text=True,
                                           timeout=600, cwd=ROOT)
                        if p.returncode != 0:
                            raise SystemExit(f"{name} {backend} {dtype}: {p.stderr[-3000:]}")
                        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
                    row = {"target": name, "backend": backend, "dtype": dtype, "device": args.device,
                           "digest": runs[0]["digest"][:12],
                           "same_in_all_processes": all(r["kernels"] == runs[0]["kernels"] for r in runs),
                           "stable_in_process": all(r["stable_in_process"] for r in runs),
                           "first_import_s": [round(r["first_import_s"], 3) for r in runs],
                           "first_kernels_s": [round(r["first_kernels_s"], 4) for r in runs],
                           "kernels_s": [round(r["kernels_s"], 4) for r in runs]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
