"""Loading the target causal LM and its tokenizer from a local directory (transformers, local files only).

The model goes to CUDA when available (else CPU), in bf16 by default. Nothing is ever fetched from a hub:
``local_files_only=True`` everywhere, and a missing directory is a clear error naming the path.

Example::

    from dflash_eval.target import load_target
    target = load_target("fixtures/target", dtype="fp32")
    print(target.num_layers, target.hidden_size, target.identity()[:12])
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash_eval.dtypes import parse_dtype
from dflash_eval.errors import ConfigError

__all__ = ["Target", "load_target", "default_device", "target_fingerprint", "text_config"]

_FULL_HASH_LIMIT = 512 * 1024 * 1024  # files above this are fingerprinted by header + sampled chunks


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def text_config(config: Any) -> Any:
    """The text part of a (possibly multimodal) transformers config."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as fh:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        else:  # header (tensor names, shapes, offsets) + 16 chunks spread over the file
            h.update(fh.read(1 << 20))
            for i in range(16):
                fh.seek(size * i // 16)
                h.update(fh.read(1 << 16))
    return h.hexdigest()


def target_fingerprint(path: Path) -> str:
    """sha256 over config.json and the weight files (full hash up to 512 MiB per file, sampled beyond)."""
    path = Path(path)
    h = hashlib.sha256()
    cfg = path / "config.json"
    h.update(json.dumps(json.loads(cfg.read_text()), sort_keys=True).encode())
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    for w in weights:
        h.update(w.name.encode())
        h.update(_file_digest(w).encode())
    return h.hexdigest()


@dataclass
class Target:
    """A loaded target model with its tokenizer and where it came from."""

    model: nn.Module
    tokenizer: Any
    path: Path
    device: torch.device
    dtype: torch.dtype
    _identity: str | None = field(default=None, repr=False)

    @property
    def config(self) -> Any:
        return text_config(self.model.config)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def layer_types(self) -> list[str]:
        types = getattr(self.config, "layer_types", None)
        return list(types) if types else ["full_attention"] * self.num_layers

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return eos

    def identity(self) -> str:
        """Content hash of config + weights (cached on the object)."""
        if self._identity is None:
            self._identity = target_fingerprint(self.path)
        return self._identity


def load_target(
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "bf16",
    device_map: str | dict[str, Any] | None = None,
) -> Target:
    """Load a causal LM and its tokenizer from a local directory.

    ``device_map`` (e.g. ``"auto"``, needs accelerate) spreads a target too large for one GPU over all GPUs;
    inputs then go to the device of its first parameters.

    Raises:
        ConfigError: the directory or its config.json is missing, or transformers cannot load it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"target model directory not found: {path} (pass --target-model DIR)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} has no config.json: not a transformers model directory")
    dev = torch.device(device) if device is not None else default_device()
    dt = parse_dtype(dtype)
    try:
        if device_map is not None:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dt, device_map=device_map)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dt)
    except Exception as exc:  # noqa: BLE001 - re-raised with the path and the cause
        raise ConfigError(f"cannot load target model from {path}: {type(exc).__name__}: {exc}") from exc
    if device_map is None:
        model.to(dev)
    else:
        dev = next(model.parameters()).device
    model.eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"cannot load tokenizer from {path}: {type(exc).__name__}: {exc}") from exc
    return Target(model=model, tokenizer=tokenizer, path=path, device=dev, dtype=dt)
