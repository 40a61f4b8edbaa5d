"""Train a DFlash drafter with a plain PyTorch loop and evaluate it every N steps with the installed dflash-eval.

Needs only the installed dflash-eval package (plus torch) and a target model folder: no repository checkout, no model
hub. The package is on no index: install its wheel, built from a checkout (README, "On your own model"), and copy this
file next to your training code (the wheel does not ship the examples). The drafter is built from scratch for the target
(its config derived from the target's, as SpecForge's DFlash trainer derives one), trained on the target's own greedy
continuations of a few seed texts (the DFlash recipe, written out below), and every ``--every`` steps the live module is
evaluated in-process by :class:`dflash_eval.Evaluator`: τ (mean accepted tokens per verification round) on ``--prompts``
against the target's greedy completions, each evaluation one record of ``<report-dir>/history.jsonl``, judged against
the run's earlier checkpoints (a regression beyond noise fails, a plateau is a notice). At the end ``history.md`` (the
trend table) and ``history.png`` (τ over steps) are written beside it. ``--tensorboard DIR`` also logs τ, its CI, the
floor and the verdict as TensorBoard scalars.

    python train_loop.py --target-model /models/Qwen3-8B --prompts humaneval:20,mt-bench --steps 2000 --every 200

On a tiny target (``--target-model`` a small model folder) a couple of steps take seconds on a CPU. The recipe is
the point of the file, not the numbers: for a drafter worth serving, train on your own data for days.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dflash_eval import DFlashDrafter, DrafterConfig, Evaluator, TensorBoardTracker, trend_table

#: Seed texts whose greedy continuations by the target are the training data (the drafter learns what the target
#: itself writes). Give your own with --train-prompts.
SEEDS = ["def ", "import os\n", "class ", "for i in range(", "    return ", "# ", "The ", "In this ",
         "if __name__ == ", "    def __init__(self", "x = [", "with open("]


# ------------------------------------------------------------------------------------------------ the drafter
def target_config(target_dir: Path) -> dict[str, Any]:
    """The target's text config (a multimodal config.json keeps it under ``text_config``)."""
    cfg = json.loads((target_dir / "config.json").read_text())
    return cfg.get("text_config", cfg)


def drafter_config(target_dir: Path, *, layers: int, block_size: int, mask_token_id: int) -> DrafterConfig:
    """A drafter config for the target: its width, heads and vocabulary; ``layers`` drafter layers; the features
    of ``target_layer_ids`` spread over the target's layers (dflash-eval's default rule, left out of the config)."""
    t = target_config(target_dir)
    rope = t.get("rope_parameters") or {}
    return DrafterConfig.from_dict({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"], "num_hidden_layers": layers,
        "num_attention_heads": t["num_attention_heads"], "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t.get("head_dim", t["hidden_size"] // t["num_attention_heads"]), "vocab_size": t["vocab_size"],
        "rms_norm_eps": t.get("rms_norm_eps", 1e-6), "rope_theta": t.get("rope_theta", rope.get("rope_theta", 1e4)),
        "dtype": "float32", "block_size": block_size, "num_target_layers": t["num_hidden_layers"],
        "dflash_config": {"mask_token_id": mask_token_id}}, source=f"drafter for {target_dir}")


# ------------------------------------------------------------------------------------------------ training data
@dataclass
class Example:
    """One training sequence: its tokens [T], the target's features at the drafter's layers [T, L*H], and the
    first position a block may start at (the continuation's first token)."""

    tokens: torch.Tensor
    features: torch.Tensor
    start: int


@torch.no_grad()
def training_examples(target: Any, tokenizer: Any, seeds: list[str], layer_ids: tuple[int, ...],
                      new_tokens: int, device: torch.device) -> list[Example]:
    """The target's greedy continuation of every seed (one left-padded batch) and its hidden states
    (``hidden_states[i + 1]`` of each target layer i: the output of layer i, what a DFlash drafter reads), computed
    for each sequence alone."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    batch = tokenizer(seeds, return_tensors="pt", padding=True).to(device)
    seqs = target.generate(**batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
    out = []
    for row, mask in zip(seqs, batch.attention_mask):
        seq = row[int((mask == 0).sum()):]  # the left padding dropped
        hidden = target(seq[None], output_hidden_states=True).hidden_states
        feats = torch.cat([hidden[i + 1] for i in layer_ids], dim=-1)[0].float()
        out.append(Example(seq, feats, int(mask.sum())))
    return out


# ------------------------------------------------------------------------------------------------ the recipe
def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Loss weight of each predicted slot k = 1 .. B-1: exp(-(k - 1) / gamma) (the nearer slots matter most: a
    block's tokens are accepted up to the first miss)."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)


def dflash_loss(drafter: DFlashDrafter, target: Any, ex: Example, anchors: int, weights: torch.Tensor,
                gen: torch.Generator) -> torch.Tensor:
    """The weighted block cross-entropy of one sequence: ``anchors`` random block starts a; each block is
    [token at a, MASK x (B-1)] at positions a .. a+B-1, sees the target's features of the positions before a
    (its own block bidirectionally), and slot k predicts the token at a + k. The target's embedding and lm_head
    (frozen) carry tokens in and out of the drafter."""
    b, t = drafter.block_size, ex.tokens.numel()
    dev = ex.tokens.device
    a = ex.start + (torch.rand(anchors, generator=gen) * (t - 1 - ex.start)).long().to(dev)  # [R], < t - 1
    context = drafter.project_context(ex.features[None])  # [1, T, H]
    blocks = torch.full((1, anchors, b), drafter.config.mask_token_id, dtype=torch.long, device=dev)
    blocks[0, :, 0] = ex.tokens[a]
    hidden = drafter(target.get_input_embeddings()(blocks), context, a[None])  # [1, R, B, H]
    logits = target.get_output_embeddings()(hidden[:, :, 1:]).float()  # [1, R, B-1, V]
    pos = a[:, None] + torch.arange(1, b, device=dev)  # [R, B-1]
    valid = pos < t
    labels = ex.tokens[pos.clamp(max=t - 1)]
    ce = F.cross_entropy(logits[0].reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    w = weights.to(dev)[None, :] * valid
    return (ce.view(anchors, b - 1) * w).sum() / w.sum().clamp(min=1e-6)


class Trainer:
    """The drafter, its optimiser and data: ``step()`` trains one step and returns the loss."""

    def __init__(self, target: Any, drafter: DFlashDrafter, examples: list[Example], *, lr: float, batch: int,
                 anchors: int, steps: int, seed: int) -> None:
        self.target, self.drafter, self.examples = target, drafter, examples
        self.batch, self.anchors, self.steps, self.lr = batch, anchors, steps, lr
        self.opt = torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
        self.weights = slot_weights(drafter.block_size, {16: 7.0, 8: 4.0}.get(drafter.block_size, 4.0))
        self.gen = torch.Generator().manual_seed(seed)
        self.done = 0

    def step(self) -> float:
        warmup = max(1, self.steps // 10)
        scale = min(1.0, (self.done + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * self.done / max(1, self.steps)))
        for g in self.opt.param_groups:
            g["lr"] = self.lr * max(scale, 0.1)
        picks = torch.randint(0, len(self.examples), (self.batch,), generator=self.gen).tolist()
        loss = sum(dflash_loss(self.drafter, self.target, self.examples[i], self.anchors, self.weights, self.gen)
                   for i in picks) / self.batch
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), 1.0)
        self.opt.step()
        self.done += 1
        return float(loss.detach())


# ------------------------------------------------------------------------------------------------ setup
def add_options(ap: argparse.ArgumentParser) -> None:
    """The options both examples take (this loop and specforge_callback.py)."""
    ap.add_argument("--target-model", required=True, help="the target model folder (transformers layout)")
    ap.add_argument("--prompts", required=True, help="evaluation prompts: a JSONL file or built-in sets "
                                                     "(dflash-eval sets lists them)")
    ap.add_argument("--num-prompts", type=int, default=None, help="evaluate on the first N prompts only")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="length of the evaluation's completions")
    ap.add_argument("--train-prompts", default=None,
                    help="a JSONL file whose 'text' fields seed the training data (default: a few built-in seeds)")
    ap.add_argument("--new-tokens", type=int, default=48, help="greedy continuation length of each training seed")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--anchors", type=int, default=16, help="random block starts per sequence")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--draft-layers", type=int, default=1, help="drafter layers")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--tau-floor", type=float, default=None,
                    help="a floor of the mean τ each evaluation is judged against (default: none; the verdicts "
                         "across steps still apply)")
    ap.add_argument("--report-dir", default="runs/drafter/eval",
                    help="history.jsonl, history.md and history.png go here (one folder per run)")
    ap.add_argument("--resume", action="store_true", help="append to the history already in --report-dir")
    ap.add_argument("--cache-dir", default=".dflash_cache", help="dflash-eval's cache of completions and features")
    ap.add_argument("--tensorboard", default=None, metavar="DIR", help="also log to TensorBoard event files in DIR")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)


def evaluator_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Evaluator's settings: dflash-eval's option names (docs/reference.md), the training's device and dtype
    (so the live module is evaluated as it is, no copy)."""
    report = Path(args.report_dir)
    if (report / "history.jsonl").exists() and not args.resume:
        raise SystemExit(f"{report / 'history.jsonl'} holds the history of an earlier run: pass --resume to continue "
                         "it, or another --report-dir (the records of one run are compared across steps)")
    settings = {"target_model": args.target_model, "prompts": args.prompts, "num_prompts": args.num_prompts,
                "max_new_tokens": args.max_new_tokens, "report_dir": str(report), "cache_dir": args.cache_dir,
                "device": args.device, "dtype": "fp32",
                "floors_file": str(report / "tau_floors.json")}  # no recorded floors: this drafter is new
    if args.tau_floor is not None:
        settings["tau_floor"] = args.tau_floor
    return settings


def setup(args: argparse.Namespace) -> tuple[Any, DFlashDrafter, list[Example]]:
    """The frozen target, a random drafter for it, the training data."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    target_dir = Path(args.target_model)
    tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    target = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True, dtype=torch.float32)
    target = target.to(device).eval().requires_grad_(False)
    mask = tokenizer.mask_token_id
    if mask is None:
        raise SystemExit(f"{target_dir}: its tokenizer has no mask token; DFlash drafters need one (add one to the "
                         "tokenizer, as SpecForge's trainer does, before training)")
    drafter = DFlashDrafter(drafter_config(target_dir, layers=args.draft_layers, block_size=args.block_size,
                                           mask_token_id=mask)).to(device).train()
    seeds = SEEDS if args.train_prompts is None else [
        json.loads(line)["text"] for line in Path(args.train_prompts).read_text().splitlines() if line.strip()]
    t0 = time.perf_counter()
    examples = training_examples(target, tokenizer, seeds, drafter.config.target_layer_ids, args.new_tokens, device)
    print(f"training data: {len(examples)} sequences in {time.perf_counter() - t0:.1f} s", flush=True)
    return target, drafter, examples


# ------------------------------------------------------------------------------------------------ the loop
def main(argv: list[str] | None = None) -> list[tuple[int, float]]:
    """Train, evaluating the live module every ``--every`` steps (and at the first and last); returns (step, mean
    chain τ) of each evaluation."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(ap)
    ap.add_argument("--every", type=int, default=50, help="evaluate every N steps")
    args = ap.parse_args(argv)
    target, drafter, examples = setup(args)
    trainer = Trainer(target, drafter, examples, lr=args.lr, batch=args.batch, anchors=args.anchors,
                      steps=args.steps, seed=args.seed)
    trackers = [TensorBoardTracker(args.tensorboard)] if args.tensorboard else []
    out, loss = [], math.nan
    with Evaluator(evaluator_settings(args), history=True, trackers=trackers) as evaluator:
        evaluator.check_inputs()  # the target's files and the prompts, before any training
        print(f"{'step':>5} {'loss':>7} {'mean τ':>7} {'95 % CI':>15} verdict", flush=True)
        for step in range(args.steps + 1):
            if step % args.every == 0 or step == args.steps:
                result = evaluator.evaluate(drafter, step=step)  # the live module, in training mode, no copy
                rec = evaluator.records[-1]  # the verdict: floors, regression across steps, plateau
                lo, hi = rec.mean_tau_ci95
                print(f"{step:>5} {loss:>7.3f} {result.tau.mean_tau:>7.3f} {f'[{lo:.2f}, {hi:.2f}]':>15} "
                      f"{rec.verdict}{': ' + rec.regression if rec.regression else ''}", flush=True)
                out.append((step, result.tau.mean_tau))
            if step < args.steps:
                loss = trainer.step()
    # leaving the block closed the evaluator: history.md and history.png are written beside history.jsonl
    print(trend_table(evaluator.records), end="")
    print("history: " + ", ".join(str(p) for p in evaluator.trend_files))
    return out


if __name__ == "__main__":
    main()
