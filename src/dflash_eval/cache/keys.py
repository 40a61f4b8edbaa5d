"""Cache keys: the sha256 of an entry's kind and the canonical JSON of its key fields, and the digest of token ids."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

__all__ = ["cache_key", "canonical_json", "ids_digest"]


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cache_key(kind: str, fields: dict[str, Any]) -> str:
    """sha256 of ``kind`` + canonical JSON of the key fields."""
    return hashlib.sha256(f"{kind}\n{canonical_json(fields)}".encode()).hexdigest()


def ids_digest(ids: list[int] | torch.Tensor) -> str:
    """sha256 of a token-id sequence (as little-endian int64)."""
    t = torch.as_tensor(ids, dtype=torch.int64).contiguous().cpu()
    return hashlib.sha256(t.numpy().astype("<i8").tobytes()).hexdigest()
