"""Build a tiny RANDOM Qwen3.5 target + tokenizer, a random DFlash drafter and a prompts file, for development and
unit tests of the evaluation suite (the real bundled fixtures live in fixtures/ and are trained).

Run::

    python scripts/make_tiny_models.py /tmp/dflash_tiny          # -> target/, drafter/, prompts.jsonl

Everything is deterministic (seeded) and takes about a second on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    "Write a short poem about the sea and the sky and the wind over the water.",
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "for i in range(10):\n    print(i * i)\n",
    "Explain why the sky is blue in one paragraph for a curious child.",
]

PROMPTS = [
    {"id": "humaneval-0", "category": "humaneval", "text": "def add(a, b):\n"},
    {"id": "humaneval-1", "category": "humaneval", "text": "def fibonacci(n):\n"},
    {"id": "gsm8k-0", "category": "gsm8k", "text": "Natalia sold clips to 48 of her friends."},
    {"id": "gsm8k-1", "category": "gsm8k", "text": "How many clips did Natalia sell?"},
    {"id": "chat-0", "category": "chat", "text": "Write a short poem about the sea."},
    {"id": "chat-1", "category": "chat", "text": "Explain why the sky is blue."},
]


def make_tokenizer(out: Path, vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|mask|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|mask|>"])
    fast.save_pretrained(out)
    return fast


def make_target(out: Path, *, seed: int = 0, hidden: int = 64, layers: int = 4, vocab: int | None = None):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out)
    vocab = vocab or len(tok)
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=1024, initializer_range=0.1,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    model.save_pretrained(out)
    return model, tok


def make_drafter(out: Path, target_cfg, mask_token_id: int, *, seed: int = 1, block_size: int = 8,
                 target_layer_ids=(0, 2)):
    from dflash_eval.drafter import DFlashDrafter, DrafterConfig, save_drafter

    cfg = DrafterConfig(
        hidden_size=target_cfg.hidden_size, intermediate_size=2 * target_cfg.hidden_size, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=target_cfg.vocab_size,
        block_size=block_size, target_layer_ids=tuple(target_layer_ids), mask_token_id=mask_token_id,
        num_target_layers=target_cfg.num_hidden_layers, dtype="float32",
    )
    torch.manual_seed(seed)
    model = DFlashDrafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    save_drafter(model, out)
    return model


def make_prompts(path: Path, prompts=PROMPTS) -> None:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))


def build(root: Path, *, layers: int = 4, target_layer_ids=(0, 2), block_size: int = 8) -> dict[str, Path]:
    root = Path(root)
    model, tok = make_target(root / "target", layers=layers)
    make_drafter(root / "drafter", model.config, tok.convert_tokens_to_ids("<|mask|>"), block_size=block_size,
                 target_layer_ids=target_layer_ids)
    make_prompts(root / "prompts.jsonl")
    return {"target": root / "target", "drafter": root / "drafter", "prompts": root / "prompts.jsonl"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    paths = build(args.out)
    for k, v in paths.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
