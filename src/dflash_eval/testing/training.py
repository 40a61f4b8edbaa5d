"""Training recipes for the bundled fixtures: a tiny causal-LM target and a DFlash drafter.

The drafter recipe follows SpecForge's public DFlash trainer:

- random anchors per sequence; an anchor ``a`` gives the block ``[token at a, MASK x (B-1)]`` at positions
  ``a .. a+B-1``;
- each block sees the target features of the context positions strictly before ``a`` and every slot of its own
  block (bidirectional inside the block), never another block: R anchors of one sequence are batched as R
  blocks of one :class:`~dflash_eval.drafter.model.DFlashDrafter` forward with ``context_len = start = a``;
- slot ``k`` (1 <= k < B) predicts the token at ``a + k``; slot 0 has no loss; the cross-entropy of slot ``k`` is
  weighted by ``exp(-(k - 1) / gamma)`` (gamma = 4 for B = 8, 7 for B = 16);
- the drafter borrows the target's (frozen) input embedding and lm_head (:class:`~dflash_eval.target.head.TargetHead`).

Everything here is deterministic given a seed and ``torch.set_num_threads`` (CPU, fp32).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash_eval.drafter.model import DFlashDrafter, block_ids, draft_logits
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import layer_features

__all__ = [
    "LMTrainConfig",
    "DrafterTrainConfig",
    "DrafterExample",
    "TrainResult",
    "cosine_lr",
    "default_gamma",
    "slot_weights",
    "sample_anchors",
    "dflash_loss",
    "train_target",
    "greedy_continuations",
    "build_drafter_examples",
    "train_drafter",
]

Log = Callable[[str], None]


def _no_log(_msg: str) -> None:
    return None


# --------------------------------------------------------------------------------------------------- schedules


def cosine_lr(step: int, total: int, warmup: int, peak: float, min_ratio: float = 0.1) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then cosine decay to ``peak * min_ratio`` at ``total``."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass
class TrainResult:
    """What a training run did: step count, wall time, loss history (step, loss) and the final loss."""

    steps: int
    seconds: float
    losses: list[tuple[int, float]] = field(default_factory=list)
    final_loss: float = float("nan")
    extra: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------- target LM


@dataclass(frozen=True)
class LMTrainConfig:
    """Causal-LM pre-training of the target on a token stream (random windows)."""

    steps: int = 400
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 20


def train_target(model: nn.Module, tokens: Tensor, cfg: LMTrainConfig, log: Log = _no_log) -> TrainResult:
    """Train ``model`` (a transformers causal LM) on random ``seq_len`` windows of the 1-D ``tokens`` stream.

    The reported ``final_loss`` is the mean training loss over the last 10% of steps (at least one step).
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    n = tokens.numel() - cfg.seq_len - 1
    if n <= 0:
        raise ValueError(f"token stream of {tokens.numel()} tokens is shorter than seq_len={cfg.seq_len}")
    model.train()
    t0 = time.time()
    losses: list[tuple[int, float]] = []
    for step in range(cfg.steps):
        lr = cosine_lr(step, cfg.steps, cfg.warmup, cfg.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n, (cfg.batch_size,), generator=gen)
        batch = torch.stack([tokens[s:s + cfg.seq_len] for s in starts.tolist()])
        out = model(input_ids=batch, labels=batch)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append((step, float(out.loss.item())))
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            log(f"target step {step}/{cfg.steps} loss {losses[-1][1]:.4f} lr {lr:.2e} {time.time() - t0:.0f}s")
    model.eval()
    tail = [v for _, v in losses[-max(1, cfg.steps // 10):]]
    return TrainResult(steps=cfg.steps, seconds=time.time() - t0, losses=losses,
                       final_loss=sum(tail) / max(1, len(tail)))


@torch.no_grad()
def greedy_continuations(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    batch_size: int = 32,
    log: Log = _no_log,
) -> list[list[int]]:
    """Greedy continuations (exactly ``max_new_tokens`` ids each, EOS not special) of token-id prompts.

    Prompts are grouped by length so that a batch never needs padding: every batch is exact and equals what an
    unbatched ``generate`` gives up to floating-point reduction order.
    """
    model.eval()
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    out: list[list[int] | None] = [None] * len(prompts)
    t0 = time.time()
    done = 0
    for length in sorted(by_len):
        idx = by_len[length]
        for j in range(0, len(idx), batch_size):
            chunk = idx[j:j + batch_size]
            ids = torch.tensor([list(prompts[i]) for i in chunk], dtype=torch.long)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,  # type: ignore[operator]  # transformers' method, seen through nn.Module.__getattr__
                                 min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
            for row, i in enumerate(chunk):
                out[i] = gen[row, length:].tolist()
            done += len(chunk)
        log(f"greedy: {done}/{len(prompts)} prompts, {time.time() - t0:.0f}s")
    return [o if o is not None else [] for o in out]


# --------------------------------------------------------------------------------------------------- drafter


def default_gamma(block_size: int) -> float:
    """Loss-decay gamma of the recipe: 7 for B=16, 4 for B=8; otherwise B/2 (rounded)."""
    return {16: 7.0, 8: 4.0}.get(block_size, float(max(1, round(block_size / 2))))


def slot_weights(block_size: int, gamma: float) -> Tensor:
    """[B] loss weights: 0 for slot 0, ``exp(-(k - 1) / gamma)`` for slot k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def sample_anchors(lo: Tensor, hi: Tensor, num: int, generator: torch.Generator) -> Tensor:
    """[N, num] anchors drawn uniformly (with replacement) from ``[lo[n], hi[n]]`` for each sequence n."""
    span = (hi - lo + 1).clamp(min=1).to(torch.float64)
    u = torch.rand(lo.shape[0], num, generator=generator, dtype=torch.float64)
    return lo[:, None] + (u * span[:, None]).floor().long().clamp(max=(hi - lo).clamp(min=0)[:, None])


def dflash_loss(
    drafter: DFlashDrafter,
    head: TargetHead,
    features: Tensor,
    tokens: Tensor,
    lengths: Tensor,
    anchors: Tensor,
    weights: Tensor,
) -> tuple[Tensor, Tensor]:
    """Weighted block cross-entropy of the DFlash recipe.

    Args:
        features: [N, T, L*H] target features (positions >= lengths[n] are padding, never visible).
        tokens: [N, T] token ids (the labels come from here).
        lengths: [N] valid length of each sequence.
        anchors: [N, R] block starts; block r of sequence n sees context positions < anchors[n, r].
        weights: [B] per-slot weights (:func:`slot_weights`).

    Returns:
        (loss, per-slot top-1 accuracy [B-1]) where the loss is sum(w * ce) / sum(w) over valid labels.
    """
    b = drafter.block_size
    n, r = anchors.shape
    ctx = drafter.project_context(features)
    first = torch.gather(tokens, 1, anchors)
    blocks = block_ids(first, b, drafter.config.mask_token_id)  # [N,R,B]
    logits = draft_logits(drafter, head, ctx, blocks, anchors)  # [N,R,B-1,V]
    pos = anchors[..., None] + torch.arange(1, b, device=anchors.device)  # [N,R,B-1]
    valid = pos < lengths[:, None, None]
    labels = torch.gather(tokens, 1, pos.clamp(max=tokens.shape[1] - 1).reshape(n, -1)).reshape(n, r, b - 1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(n, r, b - 1)
    w = weights[1:].to(ce.device)[None, None, :] * valid
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & valid
        acc = hit.sum((0, 1)).float() / valid.sum((0, 1)).clamp(min=1).float()
    return loss, acc


@dataclass
class DrafterExample:
    """One training sequence: tokens [T], features [T, L*H], anchor range [anchor_lo, anchor_hi]."""

    tokens: Tensor
    features: Tensor
    anchor_lo: int
    anchor_hi: int


def build_drafter_examples(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    layer_ids: Sequence[int],
    *,
    batch_size: int = 16,
    corpus_anchor_share: bool = False,
) -> list[DrafterExample]:
    """Target features for each sequence (one causal forward over the whole sequence, as offline τ does).

    Anchors go over the continuation (``prompt_len .. T-2``), the same starts the speculative loop drafts from;
    with ``corpus_anchor_share`` they may also fall in the prompt (``1 .. T-2``).
    """
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(sequences):
        by_len.setdefault(len(s), []).append(i)
    result: list[DrafterExample | None] = [None] * len(sequences)
    for length, idx in sorted(by_len.items()):
        for j in range(0, len(idx), batch_size):
            chunk = idx[j:j + batch_size]
            ids = torch.tensor([list(sequences[i]) for i in chunk], dtype=torch.long)
            per_layer = layer_features(model, ids, list(layer_ids))  # HF hidden_states[i + 1], requested layers only
            feats = torch.cat([per_layer[i] for i in layer_ids], dim=-1).float()
            for row, i in enumerate(chunk):
                lo = 1 if corpus_anchor_share else max(1, int(prompt_lengths[i]))
                result[i] = DrafterExample(tokens=ids[row].clone(), features=feats[row].clone(),
                                           anchor_lo=lo, anchor_hi=length - 2)
    return [e for e in result if e is not None]


@dataclass(frozen=True)
class DrafterTrainConfig:
    """DFlash drafter training: N sequences x R random anchors per step."""

    steps: int = 600
    seqs_per_step: int = 8
    anchors_per_seq: int = 48
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    gamma: float | None = None
    seed: int = 0
    log_every: int = 50


def _collate(examples: Sequence[DrafterExample]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    t = max(e.tokens.numel() for e in examples)
    d = examples[0].features.shape[-1]
    tok = torch.zeros(len(examples), t, dtype=torch.long)
    feat = torch.zeros(len(examples), t, d)
    for i, e in enumerate(examples):
        tok[i, :e.tokens.numel()] = e.tokens
        feat[i, :e.tokens.numel()] = e.features
    lengths = torch.tensor([e.tokens.numel() for e in examples])
    lo = torch.tensor([e.anchor_lo for e in examples])
    hi = torch.tensor([e.anchor_hi for e in examples])
    return tok, feat, lengths, lo, hi


def train_drafter(
    drafter: DFlashDrafter,
    head: TargetHead,
    examples: Sequence[DrafterExample],
    cfg: DrafterTrainConfig,
    log: Log = _no_log,
) -> TrainResult:
    """Train ``drafter`` with the DFlash recipe; the target's embedding and lm_head stay frozen.

    ``final_loss`` is the mean weighted loss over the last 10% of steps; ``extra`` holds the per-slot top-1
    accuracy of those steps (``acc_slot{k}``).
    """
    if not examples:
        raise ValueError("no drafter training examples")
    gen = torch.Generator().manual_seed(cfg.seed)
    for p in list(head.embed_tokens.parameters()) + list(head.lm_head.parameters()):
        p.requires_grad_(False)
    params = list(drafter.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    b = drafter.block_size
    weights = slot_weights(b, cfg.gamma if cfg.gamma is not None else default_gamma(b))
    drafter.train()
    t0 = time.time()
    losses: list[tuple[int, float]] = []
    accs: list[Tensor] = []
    for step in range(cfg.steps):
        lr = cosine_lr(step, cfg.steps, cfg.warmup, cfg.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        pick = torch.randint(0, len(examples), (cfg.seqs_per_step,), generator=gen).tolist()
        tok, feat, lengths, lo, hi = _collate([examples[i] for i in pick])
        anchors = sample_anchors(lo, hi, cfg.anchors_per_seq, gen)
        dev = drafter.fc.weight.device
        loss, acc = dflash_loss(drafter, head, feat.to(dev), tok.to(dev), lengths.to(dev), anchors.to(dev), weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        losses.append((step, float(loss.item())))
        accs.append(acc)
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            log(f"drafter step {step}/{cfg.steps} loss {losses[-1][1]:.4f} "
                f"acc1 {acc[0]:.3f} acc4 {acc[min(3, b - 2)]:.3f} lr {lr:.2e} {time.time() - t0:.0f}s")
    drafter.eval()
    k = max(1, cfg.steps // 10)
    tail = [v for _, v in losses[-k:]]
    mean_acc = torch.stack(accs[-k:]).mean(0)
    return TrainResult(steps=cfg.steps, seconds=time.time() - t0, losses=losses, final_loss=sum(tail) / len(tail),
                       extra={f"acc_slot{i + 1}": float(a) for i, a in enumerate(mean_acc)})


STDLIB_CORPUS = ("argparse.py", "dataclasses.py", "functools.py", "pathlib.py", "shutil.py", "typing.py")


def corpus_windows(tokenizer: Any, n: int, seed: int, corpus: tuple[str, ...] = STDLIB_CORPUS) -> list[list[int]]:
    """``n`` token windows of 48, 64 or 96 tokens (in turn) starting at random line starts of the standard library
    modules ``corpus``, each module followed by EOS: the training sequences of the example and the second drafter."""
    stdlib = Path(os.__file__).resolve().parent
    stream: list[int] = []
    for name in corpus:
        stream += tokenizer.encode((stdlib / name).read_text(encoding="utf-8")) + [tokenizer.eos_token_id]
    nl = {i for t, i in tokenizer.get_vocab().items() if t.endswith("Ċ")}
    starts = [i + 1 for i, t in enumerate(stream[:-200]) if t in nl]
    rng = random.Random(seed)
    return [stream[s:s + (48, 64, 96)[j % 3]] for j, s in enumerate(rng.choice(starts) for _ in range(n))]
