"""Prompts in chunks of bounded memory for the τ simulations (:mod:`dflash_eval.metrics.tau`) and the drift budget.

τ of one prompt depends on that prompt's features alone, so simulating the prompts chunk by chunk gives the same τ
as one simulation of all of them (as the drafter's block chunking does: a block's drafts do not depend on what shares
its forward). A chunk is a run of prompts whose memory fits a byte budget (``--chunk-memory``):
:func:`bytes_per_token` counts, per token of a prompt, its features as read and as the drafter sees them, the
projected context and every drafter layer's context keys and values (twice: a forward's selection of contexts may
copy them), each at the chunk's longest prompt (contexts are right-padded to it). :func:`plan_chunks` groups the
prompts, longest first, so prompts of similar lengths share a chunk and padding stays small.

The prompts themselves can be a :class:`LazyItems`: their lengths known up front, each prompt's features loaded
when its chunk is simulated and released with the chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from dflash_eval.common.sizes import format_memory, parse_memory

if TYPE_CHECKING:
    from dflash_eval.drafter.model import DFlashDrafter

__all__ = ["DEFAULT_CHUNK_MEMORY", "LazyItems", "bytes_per_token", "format_memory", "lengths_of", "parse_memory",
           "plan_chunks"]

DEFAULT_CHUNK_MEMORY = 2 << 30  # --chunk-memory's default (docs/benchmarks.md: what it holds at 27B widths)
T = TypeVar("T")


def bytes_per_token(drafter: DFlashDrafter, *, source_itemsize: int = 4, sides: int = 1) -> int:
    """Memory one token of a prompt takes while its chunk is simulated: its feature values (hidden size x the
    drafter's target layers) as read (``source_itemsize`` bytes each, for each of ``sides`` feature sides read:
    2 where a level reads the other side of a drift comparison too) and in the drafter's dtype, the projected
    context and each drafter layer's context keys and values, counted twice (a forward's selection of contexts may
    copy them)."""
    cfg = drafter.config
    feature_width = len(cfg.target_layer_ids) * int(cfg.hidden_size)
    item = torch.finfo(next(drafter.parameters()).dtype).bits // 8
    kv = 2 * int(cfg.num_hidden_layers) * 2 * int(cfg.num_key_value_heads) * int(cfg.head_dim) * item
    return feature_width * (sides * source_itemsize + item) + int(cfg.hidden_size) * item + kv


def plan_chunks(lengths: Sequence[int], per_token: int, budget: int | None) -> list[list[int]]:
    """Index lists of the prompts of ``lengths`` (tokens each), longest first, each list as many prompts as fit
    ``budget`` bytes at ``per_token`` bytes per token of its longest prompt (at least one prompt per chunk). ``None``:
    one chunk of every prompt, in order."""
    if budget is None:
        return [list(range(len(lengths)))] if lengths else []
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-int(lengths[j]), j)):
        longest = int(lengths[current[0]]) if current else int(lengths[i])
        if current and (len(current) + 1) * longest * per_token > budget:
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


class LazyItems(Sequence[T], Generic[T]):
    """A sequence whose items are made on access by ``load(index)`` (e.g. a prompt's features read from the cache),
    with each item's length in tokens known without loading it (``lengths``). Nothing is kept: an item lives as long
    as its caller holds it."""

    def __init__(self, lengths: Sequence[int], load: Callable[[int], T]) -> None:
        self.lengths = [int(n) for n in lengths]
        self._load = load

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> T:  # type: ignore[override]  # int indices only: no slices
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return self._load(index % len(self))

    def __iter__(self) -> Iterator[T]:
        return (self._load(i) for i in range(len(self)))


def lengths_of(items: Sequence[Any], length: Callable[[Any], int]) -> list[int]:
    """Each item's length in tokens: a :class:`LazyItems`' own (nothing loaded), else ``length(item)``."""
    if isinstance(items, LazyItems):
        return list(items.lengths)
    return [int(length(it)) for it in items]
