"""Benchmark: what the kernel probe (:mod:`dflash_eval.target.kernel_probe`) costs per shape, and that its digest is
the same in separate processes.

For the bundled target (and, with ``--wide``, a config at Qwen3.6-27B widths: hidden 5120, intermediate 17408; Gated
DeltaNet 16 key / 48 value heads of dim 128; attention 24 heads / 4 key-value heads of dim 256; the probe model is
one layer of each type at those widths), every backend that can run here (torch, torch-recurrent, and fla on CUDA
when it imports) in each ``--dtypes``, at each probe shape: the extraction probe of every ``--buckets`` length, and the
generation probe (2 left-padded rows of the first bucket, ``--new-tokens`` decode steps). Each case runs in
``--processes`` fresh interpreters, one after the other, whose digests must agree bit for bit; one line per case:
the first probe of the process (``first_s``, with the modeling module's import in ``import_s``) and the median of
``--repeats`` more (``probe_s``: building the probe model and running it).

Run (a few minutes on a 2-core CPU)::

    .venv/bin/python benchmarks/bench_kernel_probe.py [--device cpu|cuda] [--backends torch fla] [--repeats 3]
        [--processes 2] [--buckets 300 2000] [--new-tokens 128] [--dtypes fp32 bf16] [--wide] [--out F]
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
        "intermediate_size": 17408, "num_hidden_layers": 4, "vocab_size": 1000, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}


def child(target: str, backend: str, dtype: str, device: str, shape: str, repeats: int) -> dict:
    """One fresh process: the first probe of ``shape`` (``tokens,rows,new_tokens``), then ``repeats`` more."""
    import torch

    from dflash_eval.common.dtypes import parse_dtype
    from dflash_eval.target.kernel_probe import ProbeShape, probe
    from dflash_eval.target.loader import TargetDir

    dt = parse_dtype(dtype)
    tokens, rows, new = (int(x) for x in shape.split(","))
    sh = ProbeShape.for_generation(tokens, rows, new) if new else ProbeShape.for_sequence(tokens)
    first = probe(TargetDir(target), backend, dt, device, sh)
    again = [probe(TargetDir(target), backend, dt, device, sh) for _ in range(repeats)]
    return {"digest": first.digest, "kernels": first.digests(), "label": sh.label, "n_kernels": len(first.kernels),
            "stable_in_process": all(r.digest == first.digest for r in again),
            "import_s": first.import_seconds, "first_s": first.seconds,
            "probe_s": statistics.median(r.seconds for r in again) if again else first.seconds,
            "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3, help="probes after the first one, per process")
    ap.add_argument("--processes", type=int, default=2, help="fresh processes per case (digests must agree)")
    ap.add_argument("--backends", nargs="+", help="default: torch, torch-recurrent, and fla on CUDA")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], help="dtypes to probe")
    ap.add_argument("--buckets", nargs="+", type=int, default=[300, 2000],
                    help="sequence lengths whose extraction probe to run (each runs its bucket + 37 tokens)")
    ap.add_argument("--new-tokens", type=int, default=128, help="decode steps of the generation probe (0: none)")
    ap.add_argument("--wide", action="store_true", help="also the config at 27B widths (slow on a CPU)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    ap.add_argument("--child", nargs=6, metavar=("TARGET", "BACKEND", "DTYPE", "DEVICE", "SHAPE", "REPEATS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        t, b, d, dev, shape, n = args.child
        print(json.dumps(child(t, b, d, dev, shape, int(n))))
        return
    from dflash_eval.target.backends import fla_available

    backends = args.backends or (["torch", "torch-recurrent"]
                                 + (["fla"] if args.device.startswith("cuda") and fla_available() else []))
    shapes = [f"{n},1,0" for n in args.buckets] + ([f"{args.buckets[0]},2,{args.new_tokens}"] if args.new_tokens
                                                   else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        wide = Path(tmp) / "wide"
        wide.mkdir()
        (wide / "config.json").write_text(json.dumps(WIDE))
        targets = [("bundled", ROOT / "fixtures" / "target")] + ([("27B widths", wide)] if args.wide else [])
        for name, target in targets:
            for backend in backends:
                for dtype in args.dtypes:
                    for shape in shapes:
                        runs = []
                        for _ in range(args.processes):
                            p = subprocess.run([sys.executable, __file__, "--child", str(target), backend, dtype,
                                                args.device, shape, str(args.repeats)], capture_output=True,
                                               text=True, timeout=600, cwd=ROOT)
                            if p.returncode != 0:
                                raise SystemExit(f"{name} {backend} {dtype} {shape}: {p.stderr[-3000:]}")
                            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
                        row = {"target": name, "backend": backend, "dtype": dtype, "device": args.device,
                               "shape": runs[0]["label"], "kernels": runs[0]["n_kernels"],
                               "digest": runs[0]["digest"][:12],
                               "same_in_all_processes": all(r["kernels"] == runs[0]["kernels"] for r in runs),
                               "stable_in_process": all(r["stable_in_process"] for r in runs),
                               "import_s": [round(r["import_s"], 3) for r in runs],
                               "first_s": [round(r["first_s"], 3) for r in runs],
                               "probe_s": [round(r["probe_s"], 3) for r in runs]}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
