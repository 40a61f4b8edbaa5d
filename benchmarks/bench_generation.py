"""Reference generation: batched (left-padded) vs one prompt at a time, side by side in one run.

Bundled mode (CPU, the suite's default prompts and prompt formatting, fp32)::

    .venv/bin/python benchmarks/bench_generation.py --batch 32,16 --threads 1 --out /tmp/gen.json

Wide mode (GPU lane: a randomly initialised Qwen3.5 text target at Qwen3.6-27B widths, random prompts with the
bundled prompts' lengths, no EOS stop so every row runs the full length)::

    python benchmarks/bench_generation.py --wide --dtype bf16 --variants suite,cudnn --warm-pass \
        --out $OUT/bench_generation_h200.json

Prints tokens/s of both ways and their ratio (``--batch 32,16``: each size; ``--variants suite,cudnn``: each size
as the suite generates and with cuDNN attention allowed, see ``dflash_eval.target.generation``; one-at-a-time generation
runs interleaved with the first combination, batch by batch, so both see the same load), and whether every
prompt's ids are identical. A prompt whose ids differ is reported with the first differing position and the
one-at-a-time target's top1 - top2 logit margin there: a tiny margin is a near-tie flipped by summation order, a
large one a bug.

Every batched pass includes the first calls of its shapes (compilation, autotuning), as a suite run would; a first
call of one-at-a-time generation is made before timing, as a run's first prompt pays it once. ``--warm-pass``
repeats the first combination once its shapes are compiled: the steady-state throughput.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from dflash_eval.target.backends import use_backend
from dflash_eval.target.generation import generation_groups, greedy_generate, greedy_generate_batch

ROOT = Path(__file__).resolve().parents[1]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bundled_inputs(args: argparse.Namespace) -> tuple[Any, dict[str, list[int]]]:
    """The bundled target and the suite's prompt ids (same sets, chat template and tokenization as the suite)."""
    from dflash_eval.inputs.run_inputs import Inputs
    from dflash_eval.options.settings import EvalSettings

    values = {"target_model": args.target, "device": args.device, "dtype": args.dtype,
              "cache_dir": args.scratch, "max_new_tokens": args.max_new_tokens}
    if args.prompts:
        values["prompts"] = args.prompts
    if args.num_prompts:
        values["num_prompts"] = args.num_prompts
    inp = Inputs(EvalSettings.from_mapping(values), worker=("master", 0, 1))  # sets the suite's CPU threads
    return inp.target, {p.id: inp.prompt_ids[p.id] for p in inp.prompts}


def wide_inputs(args: argparse.Namespace) -> tuple[Any, dict[str, list[int]]]:
    """A random target at Qwen3.6-27B widths (``--wide-layers`` layers) and random prompts."""
    from transformers import Qwen3_5ForCausalLM

    from dflash_eval.common.dtypes import parse_dtype
    from dflash_eval.testing.tiny import qwen35_text_config

    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = qwen35_text_config(vocab_size=args.wide_vocab, hidden_size=args.wide_hidden,
                             num_hidden_layers=args.wide_layers, intermediate_size=args.wide_intermediate,
                             num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                             linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128)
    torch.manual_seed(0)
    dt = parse_dtype(args.dtype if args.dtype != "auto" else ("bf16" if dev.type == "cuda" else "fp32"))
    with torch.device(dev):
        model = Qwen3_5ForCausalLM(cfg).to(dt).eval()
    rng = random.Random(0)
    lengths = [133, 152, 100, 137, 142, 104, 145, 109, 133, 107, 199, 85, 113, 82, 64, 67, 98, 147, 41, 42, 67, 89,
               58, 100, 116, 103, 131, 55, 45, 101, 69, 90, 107, 107, 84, 100, 92]  # the bundled prompts' lengths
    lengths = lengths[: args.num_prompts or len(lengths)]
    prompts = {f"p{i}": [rng.randrange(2, args.wide_vocab) for _ in range(n)] for i, n in enumerate(lengths)}
    return SimpleNamespace(model=model, device=dev, eos_token_id=None), prompts


def add_target_args(ap: argparse.ArgumentParser) -> None:
    """Device, dtype and backend options, the wide target's widths, and ``--out`` (shared with
    ``bench_first_call.py``)."""
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), fp32, bf16")
    ap.add_argument("--backend", default="auto", help="linear-attention backend (auto: fla on CUDA, else torch)")
    ap.add_argument("--wide-layers", type=int, default=8, help="layers of the wide target (3 linear : 1 full)")
    ap.add_argument("--wide-hidden", type=int, default=5120, help="hidden size of the wide target")
    ap.add_argument("--wide-intermediate", type=int, default=17408, help="MLP width of the wide target")
    ap.add_argument("--wide-vocab", type=int, default=248320, help="vocabulary of the wide target")
    ap.add_argument("--out", default=None, help="write the numbers to this JSON file")


def _timer(dev: torch.device) -> float:
    _sync(dev)
    return time.perf_counter()


def _run_batches(target: Any, prompts: dict[str, list[int]], groups: list[list[str]], n: int, backend: str,
                 stop: bool, variant: str, out: dict[str, Any]) -> None:
    """Generate ``groups`` batch by batch; accumulate ids (``out["ids"]``), seconds (``out["seconds"]``) and each
    batch's seconds (``out["batch_seconds"]``)."""
    ids = out.setdefault("ids", {})
    for grp in groups:
        t0 = _timer(target.device)
        ids.update(zip(grp, greedy_generate_batch(target, [prompts[p] for p in grp], n, backend=backend,
                                                  stop_at_eos=stop, cudnn_attention=variant == "cudnn")))
        dt = _timer(target.device) - t0
        out["seconds"] = out.get("seconds", 0.0) + dt
        out.setdefault("batch_seconds", []).append(round(dt, 3))


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin_at(target: Any, prompt: list[int], completion: list[int], pos: int, backend: str) -> float:
    """top1 - top2 logit of the target (teacher-forced, one sequence) at completion position ``pos``."""
    seq = torch.tensor([prompt + completion[:pos]], device=target.device)
    with torch.no_grad(), use_backend(backend, target.device):
        logits = target.model(input_ids=seq).logits[0, -1].float()
    top = logits.topk(2)
    return float(top.values[0] - top.values[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "fixtures" / "target"), help="target model directory (bundled mode)")
    ap.add_argument("--prompts", default=None, help="prompt spec as --prompts of the suite (default: the suite's)")
    ap.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per completion")
    ap.add_argument("--batch", default="32", help="prompts per batch (as --generation-batch of the suite); a comma "
                                                  "list measures each, e.g. 32,8,16,37 (the first is interleaved "
                                                  "with one-at-a-time generation, batch by batch)")
    ap.add_argument("--variants", default="suite", help="comma list of suite, cudnn (each measured): batched "
                                                        "generation as the suite runs it, or with torch free to "
                                                        "pick cuDNN attention")
    ap.add_argument("--warm-pass", action="store_true", help="repeat the first combination with its shapes compiled")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--scratch", default="/tmp/dflash-bench-generation", help="cache dir for the bundled inputs")
    ap.add_argument("--wide", action="store_true", help="random target at Qwen3.6-27B widths instead of the bundled")
    add_target_args(ap)
    args = ap.parse_args(argv)

    target, prompts = wide_inputs(args) if args.wide else bundled_inputs(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(target.device)
    stop = not args.wide  # a random wide target's EOS is arbitrary: run every row the full length
    n = args.max_new_tokens
    greedy_generate(target, next(iter(prompts.values()))[:8], 2, backend=args.backend, stop_at_eos=stop)  # warm-up

    sizes = [int(b) for b in str(args.batch).split(",")]
    variants = args.variants.split(",")
    if not set(variants) <= {"suite", "cudnn"}:
        ap.error(f"--variants: a comma list of suite, cudnn, got {args.variants!r}")
    combos = [(size, variant) for variant in variants for size in sizes]
    # One at a time and the first combination interleaved batch by batch, so both see the same machine load.
    one: dict[str, list[int]] = {}
    t_one = 0.0
    first: dict[str, Any] = {}
    for grp in generation_groups({p: len(ids) for p, ids in prompts.items()}, sizes[0]):
        t0 = _timer(dev)
        one.update({p: greedy_generate(target, prompts[p], n, backend=args.backend, stop_at_eos=stop) for p in grp})
        t_one += _timer(dev) - t0
        _run_batches(target, prompts, [grp], n, args.backend, stop, combos[0][1], first)
    tokens_one = sum(map(len, one.values()))
    res: dict[str, Any] = {
        "mode": "wide" if args.wide else "bundled", "device": str(dev),
        "dtype": str(next(target.model.parameters()).dtype), "threads": torch.get_num_threads(),
        "prompts": len(prompts), "max_new_tokens": n, "one_at_a_time_s": t_one,
        "one_at_a_time_tokens_per_s": tokens_one / t_one, "batched": [],
    }
    print(f"{res['mode']} target on {dev} ({res['dtype']}, {res['threads']} threads), {len(prompts)} prompts x {n} "
          f"tokens; one at a time interleaved with batches of {sizes[0]}")
    print(f"  one at a time:     {t_one:8.2f} s  {res['one_at_a_time_tokens_per_s']:9.1f} tokens/s")
    if args.warm_pass:
        combos.append(combos[0])
    for k, (size, variant) in enumerate(combos):
        groups = generation_groups({p: len(ids) for p, ids in prompts.items()}, size)
        out = first if k == 0 else {}
        if k:
            _run_batches(target, prompts, groups, n, args.backend, stop, variant, out)
        warm = args.warm_pass and k == len(combos) - 1
        batched, t_batch = out["ids"], out["seconds"]
        tokens = sum(map(len, batched.values()))
        diffs = []
        for p in prompts:
            pos = first_difference(one[p], batched[p])
            if pos is not None:
                m = margin_at(target, prompts[p], one[p], pos, args.backend) if pos < len(one[p]) else float("nan")
                diffs.append({"prompt": p, "position": pos, "margin": m, "one": one[p][pos:pos + 4],
                              "batched": batched[p][pos:pos + 4]})
        row = {"batch": size, "variant": variant, "warm_pass": warm, "groups": [len(g) for g in groups],
               "batch_seconds": out["batch_seconds"], "seconds": t_batch, "tokens_per_s": tokens / t_batch,
               "speedup": (tokens / t_batch) / res["one_at_a_time_tokens_per_s"], "interleaved": k == 0,
               "identical_prompts": f"{len(prompts) - len(diffs)}/{len(prompts)}", "differences": diffs}
        res["batched"].append(row)
        print(f"  batches of {size:3d} ({variant}{', warm' if warm else ''}): {t_batch:8.2f} s  "
              f"{row['tokens_per_s']:9.1f} tokens/s   speedup {row['speedup']:.1f}x   identical ids "
              f"{row['identical_prompts']}   groups {row['groups']}   seconds per batch {row['batch_seconds']}"
              + ("" if k == 0 else "   (after the interleaved pass)"))
        for d in diffs:
            print(f"    {d['prompt']}: first difference at completion token {d['position']}, one-at-a-time "
                  f"top1-top2 margin {d['margin']:.3g} ({d['one']} vs {d['batched']})")
    if args.wide:
        res["wide"] = {"layers": args.wide_layers, "hidden": args.wide_hidden, "vocab": args.wide_vocab}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
