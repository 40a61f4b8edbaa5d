"""Randomly initialised Qwen3.5 targets and DFlash drafters, built locally (no hub), for tests and benchmarks.

``build_random_target`` writes a standard transformers directory (config.json, model.safetensors, a byte-level
BPE tokenizer trained on a few lines of text with a ``<|mask|>`` token), loadable with local files only.
``random_drafter_config`` gives a matching drafter config. Widths are parameters so the same code builds a
tiny CPU model or one at Qwen3.6-27B widths for the GPU lane.

Example::

    python -c "from dflash_eval.testing.tiny import build_random_target; build_random_target('/tmp/t', hidden_size=64)"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dflash_eval.drafter.config import DrafterConfig, default_target_layer_ids
from dflash_eval.target.loader import TargetDir

__all__ = ["build_tokenizer", "build_random_target", "random_drafter_config", "qwen35_text_config"]

MASK_TOKEN = "<|mask|>"
EOS_TOKEN = "<|endoftext|>"
_TEXT = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens.",
]


def build_tokenizer(out_dir: Path, vocab_size: int = 300, texts: list[str] | None = None, *,
                    min_frequency: int = 0, model_max_length: int | None = None) -> Any:
    """Train a byte-level BPE tokenizer with ``<|endoftext|>`` (eos, pad) and ``<|mask|>`` (mask) and save it as a
    standard HF fast tokenizer in ``out_dir``; returns it.

    ``texts``: the training text (default: a few lines of code and prose); ``min_frequency``: the fewest
    occurrences of a merge (the trainer's default 0 when not given); ``model_max_length``: recorded in
    tokenizer_config.json when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, MASK_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts or _TEXT * 4, trainer)
    limits = {} if model_max_length is None else {"model_max_length": model_max_length}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, mask_token=MASK_TOKEN,
                                   pad_token=EOS_TOKEN, **limits)
    fast.save_pretrained(str(out_dir))
    return fast


def qwen35_text_config(
    *,
    vocab_size: int,
    hidden_size: int = 64,
    num_hidden_layers: int = 4,
    intermediate_size: int | None = None,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 16,
    linear_num_key_heads: int = 2,
    linear_num_value_heads: int = 4,
    linear_key_head_dim: int = 16,
    linear_value_head_dim: int = 16,
    full_attention_interval: int = 4,
    **extra: Any,
) -> Any:
    """A Qwen3_5TextConfig with the 3 linear : 1 full layer pattern."""
    from transformers import Qwen3_5TextConfig

    layer_types = [
        "full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
        for i in range(num_hidden_layers)
    ]
    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        linear_num_key_heads=linear_num_key_heads,
        linear_num_value_heads=linear_num_value_heads,
        linear_key_head_dim=linear_key_head_dim,
        linear_value_head_dim=linear_value_head_dim,
        layer_types=layer_types,
        **extra,
    )


def build_random_target(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 300,
                        dtype: torch.dtype = torch.float32, max_shard_size: str | int | None = None,
                        **config_kwargs: Any) -> Path:
    """Save a randomly initialised Qwen3_5ForCausalLM + tokenizer to ``out_dir``; returns the path.

    ``max_shard_size`` (e.g. ``"200KB"``): save sharded, with ``model.safetensors.index.json``."""
    from transformers import Qwen3_5ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, vocab_size=vocab_size)
    cfg = qwen35_text_config(vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                             **config_kwargs)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).to(dtype)  # type: ignore[arg-type]  # transformers types PreTrainedModel.to through a decorator that loses self
    if max_shard_size is None:
        model.save_pretrained(str(out))
    else:
        model.save_pretrained(str(out), max_shard_size=max_shard_size)
    return out


def random_drafter_config(target_dir: str | Path, *, num_features: int = 3, num_hidden_layers: int = 1,
                          block_size: int = 8, **overrides: Any) -> DrafterConfig:
    """A drafter config matching the target saved in ``target_dir`` (Qwen3 fields copied from the target)."""
    tdir = Path(target_dir)
    tcfg = TargetDir(tdir).text
    tok = json.loads((tdir / "tokenizer.json").read_text())
    mask_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == MASK_TOKEN)
    n = int(tcfg["num_hidden_layers"])
    fields: dict[str, Any] = dict(
        hidden_size=tcfg["hidden_size"],
        intermediate_size=tcfg["intermediate_size"],
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=tcfg["num_attention_heads"],
        num_key_value_heads=tcfg["num_key_value_heads"],
        head_dim=tcfg["head_dim"],
        vocab_size=tcfg["vocab_size"],
        block_size=block_size,
        target_layer_ids=(tuple(default_target_layer_ids(n, num_features)) if n > 4
                          else tuple(range(min(num_features, n - 1)))),
        mask_token_id=mask_id,
        num_target_layers=n,
    )
    fields.update(overrides)
    return DrafterConfig(**fields)
