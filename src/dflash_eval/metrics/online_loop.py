"""Online speculative decoding: the target verifies each drafted block (greedy or sampled), no reference needed.

The DFlash speculative loop with a real target cache. A hybrid target's linear-attention state
(conv + recurrent) cannot be cropped after a rejection, so each round snapshots the cache, verifies the block
on top of it, restores the snapshot and re-runs only the committed tokens (which also yields their features
for the drafter's context). Correct for any mix of attention and linear-attention layers; costs one extra
forward of ``acc + 1`` tokens per round.

Statistics follow :mod:`dflash_eval.metrics.tau`: the prefill token belongs to no round, each round's acceptance length
is ``acc + 1`` and generation never goes past ``max_new_tokens`` (nor past EOS when ``stop_at_eos``), so on the
same greedy completion the online and offline acceptance lengths agree up to numerical near-ties.

Example::

    res = online_generate(target, drafter, head, prompt_ids, max_new_tokens=128, backend="torch")
    print(res.tau.tau, len(res.tokens))
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from dflash_eval.drafter.model import DFlashDrafter, block_ids, draft_logits
from dflash_eval.metrics.tau_result import TauResult
from dflash_eval.target.backends import use_backend
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import LayerCapture

if TYPE_CHECKING:
    from dflash_eval.target.loader import Target

__all__ = ["OnlineResult", "online_generate", "cache_keyword", "Pick", "argmax_pick", "no_eos"]


def cache_keyword(model: nn.Module) -> str:
    """The keyword a transformers model's forward takes its KV / recurrent-state cache by: ``cache`` where the
    forward has it (transformers 5.24 does, and warns that ``past_key_values`` will be removed in 5.40), else
    ``past_key_values`` (older 5.x releases)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


Pick = Callable[[Tensor, Tensor], Tensor]  # (logits [n, V], absolute positions [n]) -> the target's tokens [n]


def argmax_pick(logits: Tensor, positions: Tensor) -> Tensor:
    """The greedy target: the argmax at every position."""
    return logits.argmax(-1)


@dataclass
class OnlineResult:
    tokens: list[int]  # generated tokens (the completion)
    tau: TauResult
    target_forwards: int


def no_eos(logits: Tensor, eos: int | list[int] | None) -> Tensor:
    """The first token's logits as the reference generation sees them: it generates at least one token
    (``min_new_tokens=1``), so EOS is never the first token there, at any temperature."""
    if eos is None:
        return logits
    out = logits.clone()
    out[..., eos if isinstance(eos, list) else [eos]] = float("-inf")
    return out


def _context(drafter: DFlashDrafter, cap: LayerCapture) -> Tensor:
    """[1, T, H] the drafter's projected context (fc + hidden_norm) of the positions the last target forward saw."""
    return drafter.project_context(cap.features()[0].to(drafter.fc.weight.device))[None]


def _draft_block(drafter: DFlashDrafter, head: TargetHead, ctx: Tensor, bonus: int, start: int,
                 dev: torch.device) -> Tensor:
    """[B] the block the target verifies (on ``dev``, the target's device): the bonus token at position ``start``
    and the drafter's argmax guesses for the B-1 positions after it."""
    ids = block_ids(torch.tensor([bonus], device=dev), drafter.config.block_size, drafter.config.mask_token_id)
    logits = draft_logits(drafter, head, ctx, ids[None], torch.tensor([[start]], device=dev))
    block = ids[0].clone()
    block[1:] = logits[0, 0].argmax(-1)  # [B-1]
    return block


def _accepted(draft: Tensor, post: Tensor, limit: int, eos: int | None) -> int:
    """How many drafted tokens equal the target's token at their position (at most ``limit``); a drafted EOS is not
    accepted: it becomes the new bonus token and ends the generation."""
    acc = 0
    while acc < limit and int(draft[acc]) == int(post[acc]):
        if eos is not None and int(draft[acc]) == eos:
            break
        acc += 1
    return acc


@torch.no_grad()
def online_generate(
    target: Target,
    drafter: DFlashDrafter,
    head: TargetHead,
    prompt_ids: list[int] | Tensor,
    *,
    max_new_tokens: int,
    backend: str = "auto",
    stop_at_eos: bool = False,
    max_blocks: int | None = None,
    pick: Pick | None = None,
) -> OnlineResult:
    """Run DFlash speculative decoding and return the completion and per-round acceptance lengths.

    ``pick(logits [n, V], positions [n])`` is the target's token at each verified position (absolute positions in
    prompt + completion); default argmax (greedy). At temperature > 0 it samples
    (:func:`dflash_eval.target.sampling.sample_tokens` with a stream seed): the drafts stay argmax, a draft is
    accepted while it equals the target's token there, and the first token that differs is the bonus (z-lab's
    loop)."""
    pick = pick or argmax_pick
    model = target.model
    dev = target.device
    b = drafter.config.block_size
    eos = target.eos_token_id if stop_at_eos else None
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=dev)
    forwards = 0
    # Features of every target forward (prefill, verify, commit) are captured; the context takes the commits'.
    with LayerCapture(model, tuple(drafter.config.target_layer_ids)) as cap, use_backend(backend, dev):
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)  # type: ignore[arg-type]  # transformers' config, seen through nn.Module.__getattr__
        kw = cache_keyword(model)
        out = model(prompt[None], **{kw: cache}, use_cache=True)
        forwards += 1
        # Projected context (fc + hidden_norm act per position): grown by the committed positions each round.
        ctx = _context(drafter, cap)  # positions 0..P-1
        bonus = int(pick(no_eos(out.logits[0, -1:], target.eos_token_id), torch.tensor([prompt.shape[0]]))[0])
        generated = [bonus]
        lens: list[int] = []
        done = (eos is not None and bonus == eos) or max_new_tokens <= 1
        while not done and (max_blocks is None or len(lens) < max_blocks):
            start = prompt.shape[0] + len(generated) - 1  # position of the bonus token
            block = _draft_block(drafter, head, ctx, bonus, start, dev)
            snapshot = copy.deepcopy(cache)
            ver = model(block[None], **{kw: cache}, use_cache=True)
            forwards += 1
            post = pick(ver.logits[0], torch.arange(start + 1, start + 1 + b))  # target's token after block[:k+1]
            acc = _accepted(block[1:], post, min(b - 1, max_new_tokens - 1 - len(generated)), eos)
            new_bonus = int(post[acc])
            # Restore the pre-verify state and commit block[:acc+1] for real (features for the context).
            cache = snapshot
            model(block[None, : acc + 1], **{kw: cache}, use_cache=True)
            forwards += 1
            ctx = torch.cat([ctx, _context(drafter, cap)], dim=1)
            generated.extend(int(t) for t in block[1: acc + 1])
            generated.append(new_bonus)
            lens.append(acc + 1)
            bonus = new_bonus
            done = len(generated) >= max_new_tokens or (eos is not None and new_bonus == eos)
    return OnlineResult(tokens=generated, tau=TauResult(lens, b, "online-chain"), target_forwards=forwards)
