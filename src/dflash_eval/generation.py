"""Greedy reference generation with the target itself (for machines without an SGLang server)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dflash_eval.backends import use_backend

__all__ = ["greedy_generate"]


@torch.no_grad()
def greedy_generate(
    target: Any,
    prompt_ids: list[int] | Tensor,
    max_new_tokens: int,
    *,
    backend: str = "auto",
    stop_at_eos: bool = True,
) -> list[int]:
    """Greedy (argmax) continuation of ``prompt_ids``: the generated ids only, at most ``max_new_tokens``.

    Runs ``model.generate`` with the target's cache (chunked prefill, recurrent decode for hybrid layers) under
    the chosen linear-attention backend. Stops after EOS (included) when ``stop_at_eos``.
    """
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=target.device)[None]
    eos = target.eos_token_id if stop_at_eos else None
    with use_backend(backend, target.device):
        out = target.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=1,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
        )
    return out[0, ids.shape[1]:].tolist()
