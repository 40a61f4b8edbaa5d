"""The pieces of the target that a DFlash drafter borrows: the input embedding and the lm_head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["TargetHead"]


@dataclass
class TargetHead:
    """Target input embedding (for block tokens) and lm_head (for draft logits)."""

    embed_tokens: nn.Embedding
    lm_head: nn.Linear

    @classmethod
    def from_model(cls, model: nn.Module) -> TargetHead:
        """Take the embedding and head of a loaded transformers causal LM (no copy)."""
        emb = model.get_input_embeddings()
        head = model.get_output_embeddings()
        if emb is None or head is None:
            raise ValueError(f"{type(model).__name__} has no input embedding or no output head")
        return cls(embed_tokens=emb, lm_head=head)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.embed_tokens.weight.shape[1])

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def embed(self, ids: Tensor) -> Tensor:
        return self.embed_tokens(ids.to(self.embed_tokens.weight.device))

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))
