"""Train a DFlash drafter for the bundled target and evaluate it every N steps through dflash_eval.Evaluator.

Needs a checkout of this repository: it trains with the recipe and corpus the bundled fixtures were built with
(``dflash_eval.testing``, which the wheel does not ship). With the installed package alone, see
``train_loop.py`` (a plain PyTorch loop) and ``specforge_callback.py`` (a SpecForge-style callback) beside it.

The project's training recipe (dflash_eval.testing.training: random anchors, blocks [anchor token, MASK x (B-1)],
context strictly before the anchor, slot weights exp(-(k-1)/gamma), the target's frozen embedding and lm_head) on
the target's greedy continuations of line-aligned windows of a few standard-library files, from a random drafter.
Every ``--every`` steps the live module (in training mode, on its device) is evaluated in-process: the first call
produces the reference completions and features of the evaluation prompts, every later call costs drafter work
only. Each evaluation appends a record to ``<report-dir>/history.jsonl``; at the end the evaluator is closed, which
writes the trend table (``history.md``) and the τ-vs-step plot (``history.png``) beside it.

Run from a checkout (docs/training-loop.md shows the output of the second command: τ 1.00 -> 4.24 in 34 min on 2
CPU cores)::

    PYTHONPATH=src .venv/bin/python docs/examples/train_with_eval.py --steps 300 --every 50
    PYTHONPATH=src .venv/bin/python docs/examples/train_with_eval.py --steps 1200 --every 200 --windows 1536 \\
        --new-tokens 128
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from dflash_eval import Evaluator, trend_table
from dflash_eval.drafter import DFlashDrafter, load_config_file
from dflash_eval.target.head import TargetHead
from dflash_eval.testing.training import (
    build_drafter_examples,
    corpus_windows,
    cosine_lr,
    default_gamma,
    dflash_loss,
    greedy_continuations,
    sample_anchors,
    slot_weights,
)

ROOT = Path(__file__).resolve().parents[2]


def training_examples(model, tokenizer, layer_ids, n: int, new_tokens: int, seed: int) -> list:
    """The target's greedy continuations of ``n`` line-aligned windows of the standard-library corpus, with their
    features."""
    prefixes = corpus_windows(tokenizer, n, seed)
    conts = greedy_continuations(model, prefixes, new_tokens, batch_size=32)
    return build_drafter_examples(model, [p + c for p, c in zip(prefixes, conts)], [len(p) for p in prefixes],
                                  list(layer_ids))


def collate(examples: list) -> tuple[torch.Tensor, ...]:
    t = max(e.tokens.numel() for e in examples)
    tok = torch.zeros(len(examples), t, dtype=torch.long)
    feat = torch.zeros(len(examples), t, examples[0].features.shape[-1])
    for i, e in enumerate(examples):
        tok[i, :e.tokens.numel()], feat[i, :e.tokens.numel()] = e.tokens, e.features
    lengths = torch.tensor([e.tokens.numel() for e in examples])
    return tok, feat, lengths, torch.tensor([e.anchor_lo for e in examples]), torch.tensor([e.anchor_hi for e in
                                                                                            examples])


def make_evaluator(args: argparse.Namespace, target_dir: Path) -> Evaluator:
    """The Evaluator of the bundled prompts, with a history of its own in the report folder."""
    history = Path(args.report_dir) / "history.jsonl"
    if history.exists():  # a new run: its own history (the records of one run are compared across steps)
        history.unlink()
    evaluator = Evaluator({"target_model": str(target_dir), "prompts": str(ROOT / "fixtures" / "prompts.jsonl"),
                           "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                           "report_dir": args.report_dir, "cache_dir": args.cache_dir, "dtype": "fp32",
                           # a drafter in training has no floors of its own yet (not the checkout's golden ones):
                           # the trend across steps (the history's verdicts) is what this run judges
                           "floors_file": str(Path(args.report_dir) / "tau_floors.json")},
                          history=history)
    evaluator.check_inputs()
    return evaluator


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50, help="evaluate every N steps (and at step 0 and the last)")
    ap.add_argument("--windows", type=int, default=128, help="training sequences")
    ap.add_argument("--new-tokens", type=int, default=64, help="greedy continuation length of each sequence")
    ap.add_argument("--num-prompts", type=int, default=None, help="evaluate on the first N bundled prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="reference completion length of the evaluation")
    ap.add_argument("--report-dir", default="reports/train_with_eval")
    ap.add_argument("--cache-dir", default=".dflash_cache")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> list[tuple[int, float, float]]:
    """Train, evaluating every ``--every`` steps; returns (step, mean chain τ, mean DDTree-8 τ) per evaluation."""
    args = parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    target_dir = ROOT / "fixtures" / "target"
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), local_files_only=True, dtype=torch.float32).eval()
    head = TargetHead.from_model(model)
    for p in [*head.embed_tokens.parameters(), *head.lm_head.parameters()]:
        p.requires_grad_(False)
    drafter = DFlashDrafter(load_config_file(ROOT / "fixtures" / "drafter" / "config.json")).train()  # random init
    t0 = time.perf_counter()
    examples = training_examples(model, tokenizer, drafter.config.target_layer_ids, args.windows, args.new_tokens,
                                 args.seed)
    print(f"training data: {len(examples)} sequences in {time.perf_counter() - t0:.0f} s")

    evaluator = make_evaluator(args, target_dir)
    opt = torch.optim.AdamW([{"params": [p for p in drafter.parameters() if p.ndim >= 2], "weight_decay": 0.01},
                             {"params": [p for p in drafter.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95))
    weights = slot_weights(drafter.block_size, default_gamma(drafter.block_size))
    gen = torch.Generator().manual_seed(args.seed)
    out, loss = [], float("nan")
    print(f"{'step':>5} {'loss':>7} {'mean τ':>7} {'DDTree-8 τ':>10} {'eval s':>7}")
    for step in range(args.steps + 1):
        if step % args.every == 0 or step == args.steps:
            t1 = time.perf_counter()
            result = evaluator.evaluate(drafter, step=step)  # the live module, in training mode
            out.append((step, result.tau.mean_tau, result.tau.mean_ddtree.get("8", float("nan"))))
            print(f"{step:>5} {loss:>7.3f} {out[-1][1]:>7.3f} {out[-1][2]:>10.3f} {time.perf_counter() - t1:>7.2f}",
                  flush=True)
        if step == args.steps:
            break
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, args.steps, min(50, args.steps // 6), 2e-3)
        tok, feat, lengths, lo, hi = collate([examples[i] for i in torch.randint(0, len(examples), (8,),
                                                                                 generator=gen).tolist()])
        value, _ = dflash_loss(drafter, head, feat, tok, lengths, sample_anchors(lo, hi, 48, gen), weights)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        loss = float(value)
    evaluator.close()  # history.md and history.png beside history.jsonl
    print(trend_table(evaluator.records), end="")
    return out


if __name__ == "__main__":
    main()
