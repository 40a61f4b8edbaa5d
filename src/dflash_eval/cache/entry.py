"""A cache entry as read or produced: what :class:`~dflash_eval.cache.store.Cache` returns and
:mod:`dflash_eval.cache.requests` serves (both import it from here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CacheEntry"]


@dataclass
class CacheEntry:
    """A verified entry: its tensors, meta and manifest."""

    kind: str
    key: str
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    manifest: dict[str, Any]
    produced: bool = False  # True when this process produced it (a miss), False for a hit
