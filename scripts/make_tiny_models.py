"""Build a tiny RANDOM Qwen3.5 target + tokenizer, a random DFlash drafter and a prompts file, for development and
unit tests of the evaluation suite (the real bundled fixtures live in fixtures/ and are trained). The models come
from :mod:`dflash_eval.testing.tiny`, as the unit tests' own.

Run::

    python scripts/make_tiny_models.py /tmp/dflash_tiny          # -> target/, drafter/, prompts.jsonl

Everything is deterministic (seeded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

PROMPTS = [
    {"id": "humaneval-0", "category": "humaneval", "text": "def add(a, b):\n"},
    {"id": "humaneval-1", "category": "humaneval", "text": "def fibonacci(n):\n"},
    {"id": "gsm8k-0", "category": "gsm8k", "text": "Natalia sold clips to 48 of her friends."},
    {"id": "gsm8k-1", "category": "gsm8k", "text": "How many clips did Natalia sell?"},
    {"id": "chat-0", "category": "chat", "text": "Write a short poem about the sea."},
    {"id": "chat-1", "category": "chat", "text": "Explain why the sky is blue."},
]


def make_target(out: Path, *, seed: int = 0, layers: int = 4) -> Path:
    """A random Qwen3.5 target + tokenizer (:func:`dflash_eval.testing.tiny.build_random_target`) in ``out``."""
    from dflash_eval.testing.tiny import build_random_target

    return build_random_target(out, seed=seed, num_hidden_layers=layers)


def make_drafter(out: Path, target_dir: Path, *, seed: int = 1, block_size: int = 8,
                 target_layer_ids: tuple[int, ...] = (0, 2)) -> Path:
    """A random drafter matching ``target_dir`` (:func:`dflash_eval.testing.tiny.random_drafter_config`), saved in the
    released layout (:func:`dflash_eval.drafter.save_drafter`) in ``out``."""
    from dflash_eval.drafter import DFlashDrafter, save_drafter
    from dflash_eval.testing.tiny import random_drafter_config

    cfg = random_drafter_config(target_dir, block_size=block_size, target_layer_ids=tuple(target_layer_ids),
                                dtype="float32")
    torch.manual_seed(seed)
    save_drafter(DFlashDrafter(cfg), out)
    return out


def make_prompts(path: Path, prompts=PROMPTS) -> None:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))


def build(root: Path, *, layers: int = 4, target_layer_ids=(0, 2), block_size: int = 8) -> dict[str, Path]:
    root = Path(root)
    target = make_target(root / "target", layers=layers)
    make_drafter(root / "drafter", target, block_size=block_size, target_layer_ids=target_layer_ids)
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
