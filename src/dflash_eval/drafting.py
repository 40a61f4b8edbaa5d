"""Running the drafter over blocks of a sequence: block construction, context projection, draft logits.

Used by offline τ (all starts of a reference at once), the online loop and training. A block at ``start`` is
``[token at start, MASK x (B-1)]`` at positions ``start .. start+B-1`` and sees context features strictly before
``start`` (dflash.md, "The speculative loop").
"""

from __future__ import annotations

import torch
from torch import Tensor

from dflash_eval.drafter import DFlashDrafter
from dflash_eval.head import TargetHead

__all__ = ["block_ids", "draft_logits"]


def block_ids(first_tokens: Tensor, block_size: int, mask_token_id: int) -> Tensor:
    """[..., ] first tokens -> [..., B] blocks ``[first, MASK x (B-1)]``."""
    out = torch.full((*first_tokens.shape, block_size), mask_token_id, dtype=torch.long, device=first_tokens.device)
    out[..., 0] = first_tokens
    return out


@torch.no_grad()
def draft_logits(
    drafter: DFlashDrafter,
    head: TargetHead,
    features: Tensor,
    first_tokens: Tensor,
    starts: Tensor,
    *,
    chunk: int = 256,
) -> Tensor:
    """Draft logits for blocks of ONE sequence.

    Args:
        drafter: the drafter.
        head: the target's borrowed embedding and lm_head.
        features: [T, L*H] target features of the sequence (position j = token j).
        first_tokens: [R] token at each block's slot 0 (the bonus token).
        starts: [R] absolute position of each block's slot 0; the block sees context positions < start.
        chunk: blocks per drafter forward (bounds memory; the result does not depend on it).

    Returns:
        [R, B-1, V] float32 logits for slots 1..B-1 (slot k predicts the token at start + k).
    """
    cfg = drafter.config
    dev = drafter.fc.weight.device
    ctx = drafter.project_context(features.to(dev))[None]  # [1,T,H]
    outs = []
    for i in range(0, starts.shape[0], chunk):
        st = starts[i:i + chunk].to(dev)
        ids = block_ids(first_tokens[i:i + chunk].to(dev), cfg.block_size, cfg.mask_token_id)
        emb = head.embed(ids)[None]
        hidden = drafter(emb, ctx, st[None])[0]  # [r,B,H]
        outs.append(head.logits(hidden[:, 1:]).float())
    if not outs:
        return torch.empty(0, cfg.block_size - 1, head.vocab_size)
    return torch.cat(outs, dim=0)
