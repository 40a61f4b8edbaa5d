"""What the first generation call of a new batch shape costs on a GPU, and where that time goes.

Generates with a random target at Qwen3.6-27B widths (as ``bench_generation.py --wide``) for a sequence of batch
shapes (rows x prompt width), each twice in a row: the first call pays Triton compilation and fla's autotuning for
any shape-dependent kernel variant, the second is the steady state. Each first call runs under cProfile; its time
inside Triton's compiler and autotuner benchmarking is reported next to the wall time::

    python benchmarks/bench_first_call.py --shapes 1x133,18x152,19x199,18x152,32x192,32x256 \\
        --out $OUT/first_call.json

Set ``TRITON_PRINT_AUTOTUNING=1`` to have Triton print each autotuning (kernel, key, chosen config) as it happens.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import add_target_args, wide_inputs

from dflash_eval.target.generation import greedy_generate_batch


def _profile_split(prof: cProfile.Profile) -> dict[str, Any]:
    """Seconds inside Triton's compiler and autotuner benchmarking, and the top functions by cumulative time."""
    stats = pstats.Stats(prof)
    split = {"triton_compile_s": 0.0, "triton_autotune_bench_s": 0.0}
    top, own = [], []
    for (file, _line, func), (_cc, _nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        own.append((tt, f"{Path(file).parent.name}/{Path(file).name}:{func}"))
        if "triton/compiler/compiler.py" in file and func == "compile":
            split["triton_compile_s"] += ct
        if "triton/runtime/autotuner.py" in file and func == "_bench":
            split["triton_autotune_bench_s"] += ct
        if "/" in file:
            top.append((ct, f"{Path(file).parent.name}/{Path(file).name}:{func}"))
    top.sort(reverse=True)
    own.sort(reverse=True)
    split["top_cumulative"] = [{"s": round(ct, 3), "function": name} for ct, name in top[:25]]
    split["top_own_time"] = [{"s": round(tt, 3), "function": name} for tt, name in own[:15]]
    return split


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x133,18x152,19x199,18x152,32x192,32x256",
                    help="comma list of ROWSxWIDTH batch shapes, each generated twice (first call, then warm)")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="tokens per call")
    ap.add_argument("--cudnn-attention", action="store_true", help="let torch pick cuDNN attention (off in the suite)")
    add_target_args(ap)
    args = ap.parse_args(argv)
    args.num_prompts = 1
    target, _ = wide_inputs(args)
    rng = random.Random(1)
    rows_out = []
    print(f"first call vs warm call per batch shape, {args.max_new_tokens} new tokens, {args.wide_layers} layers, "
          f"cuDNN attention {'allowed' if args.cudnn_attention else 'off'}")
    for spec in args.shapes.split(","):
        rows, width = (int(x) for x in spec.lower().split("x"))
        prompts = [[rng.randrange(2, args.wide_vocab) for _ in range(width)] for _ in range(rows)]
        times = []
        split: dict[str, Any] = {}
        for attempt in range(2):
            prof = cProfile.Profile() if attempt == 0 else None
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            greedy_generate_batch(target, prompts, args.max_new_tokens, backend=args.backend, stop_at_eos=False,
                                  cudnn_attention=args.cudnn_attention)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            if prof:
                prof.disable()
                split = _profile_split(prof)
        row = {"rows": rows, "width": width, "first_s": round(times[0], 3), "warm_s": round(times[1], 3),
               "first_call_extra_s": round(times[0] - times[1], 3), **split}
        rows_out.append(row)
        print(f"  {rows:3d} x {width:4d}: first {times[0]:7.2f} s  warm {times[1]:6.2f} s  "
              f"(compile {split['triton_compile_s']:.2f} s, autotune benchmarking "
              f"{split['triton_autotune_bench_s']:.2f} s in the first)", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": str(target.device), "cudnn_attention": args.cudnn_attention,
                                              "max_new_tokens": args.max_new_tokens, "calls": rows_out}, indent=2)
                                  + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
