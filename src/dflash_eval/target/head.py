"""The pieces of the target that a DFlash drafter borrows: the input embedding and the lm_head.

:meth:`TargetHead.from_model` takes them from a loaded model; :meth:`TargetHead.from_pretrained` reads ONLY those
two tensors from the target's safetensors files (single file or sharded with ``model.safetensors.index.json``),
so a warm-cache evaluation of a 54 GB target reads about 5 GB instead of all of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from dflash_eval.common.dtypes import parse_dtype
from dflash_eval.errors import CheckpointError
from dflash_eval.target.loader import TargetDir

__all__ = ["TargetHead", "EMBED_KEYS", "HEAD_KEYS"]

# Key names used by causal LMs and by multimodal checkpoints whose text model sits under language_model.
EMBED_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight",
              "language_model.model.embed_tokens.weight")
HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight")


def _key_to_file(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    single = path / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from exc
        return {k: path / f for k, f in weight_map.items()}
    if single.is_file():
        with safe_open(str(single), framework="pt") as fh:
            return {k: single for k in fh.keys()}
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json (target weights)")


def _read_tensor(key: str, file: Path) -> Tensor:
    try:
        with safe_open(str(file), framework="pt") as fh:
            return fh.get_tensor(key)
    except Exception as exc:
        raise CheckpointError(f"{file}: cannot read tensor {key!r} ({type(exc).__name__}: {exc})") from exc


@dataclass
class TargetHead:
    """Target input embedding (for block tokens) and lm_head (for draft logits)."""

    embed_tokens: nn.Embedding
    lm_head: nn.Linear

    @classmethod
    def from_model(cls, model: nn.Module) -> TargetHead:
        """Take the embedding and head of a loaded transformers causal LM (no copy)."""
        emb = model.get_input_embeddings()  # type: ignore[operator]  # transformers' method, seen through nn.Module.__getattr__
        head = model.get_output_embeddings()  # type: ignore[operator]  # likewise
        if emb is None or head is None:
            raise ValueError(f"{type(model).__name__} has no input embedding or no output head")
        return cls(embed_tokens=emb, lm_head=head)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str | torch.device = "cpu",
                        dtype: str | torch.dtype = "bf16") -> TargetHead:
        """Read only the input embedding and lm_head of the target saved in ``path`` (tied heads supported)."""
        path = Path(path)
        tied = TargetDir(path).tie_word_embeddings
        files = _key_to_file(path)
        emb_key = next((k for k in EMBED_KEYS if k in files), None)
        if emb_key is None:
            raise CheckpointError(f"{path}: no input embedding among {list(EMBED_KEYS)}")
        dt, dev = parse_dtype(dtype), torch.device(device)
        emb_w = _read_tensor(emb_key, files[emb_key]).to(device=dev, dtype=dt)
        head_key = next((k for k in HEAD_KEYS if k in files), None)
        if head_key is None and not tied:
            raise CheckpointError(f"{path}: no lm_head among {list(HEAD_KEYS)} and tie_word_embeddings is false")
        head_w = emb_w if head_key is None else _read_tensor(head_key, files[head_key]).to(device=dev, dtype=dt)
        # from_pretrained skips the random init (costly in a fresh process: docs/benchmarks.md, "The target head
        # without a random init")
        embed = nn.Embedding.from_pretrained(emb_w, freeze=True)
        lm_head = nn.Linear(head_w.shape[1], head_w.shape[0], bias=False, device="meta")
        lm_head.weight = nn.Parameter(head_w, requires_grad=False)
        return cls(embed_tokens=embed, lm_head=lm_head)

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
