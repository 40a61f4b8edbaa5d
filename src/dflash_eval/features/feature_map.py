"""Target features of a prompt set, read from the cache when a prompt is asked for and let go after its consumer.

:meth:`dflash_eval.features.feature_store.FeatureStore.features` makes sure every entry exists (extracting the
missing ones) and returns a :class:`FeatureMap`: ``features[prompt_id][layer]`` as before, but nothing is held for
the session; a prompt's layers are read (and verified) from the cache on access, and only the prompt asked for last
stays referenced (a consumer reading several layers of one prompt reads it once). A τ simulation takes the map as
prompt chunks (:func:`lazy_items`): the features of one chunk are in memory at a time, whatever the prompt count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from dflash_eval.metrics.tau_chunks import LazyItems

__all__ = ["FeatureMap", "lazy_items"]


class FeatureMap(Mapping[str, dict[int, torch.Tensor]]):
    """``{prompt id: {layer: features [T, H]}}`` whose values are read by ``read(prompt id)`` on access (see module
    docstring); ``lengths[prompt id]``: each prompt's tokens, known without reading."""

    def __init__(self, ids: Sequence[str], lengths: Mapping[str, int],
                 read: Callable[[str], dict[int, torch.Tensor]]) -> None:
        self._ids = list(ids)
        self._known = set(self._ids)
        self.lengths = {pid: int(lengths[pid]) for pid in self._ids}
        self._read = read
        self._last: tuple[str, dict[int, torch.Tensor]] | None = None

    def __getitem__(self, pid: str) -> dict[int, torch.Tensor]:
        if pid not in self._known:
            raise KeyError(pid)
        if self._last is not None and self._last[0] == pid:
            return self._last[1]
        self._last = None  # the previous prompt's tensors can go before this one's are read
        value = self._read(pid)
        self._last = (pid, value)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def release(self) -> None:
        """Let go of the prompt read last."""
        self._last = None


def lazy_items(features: Mapping[str, dict[int, torch.Tensor]], ids: Sequence[str], layers: Sequence[int],
               tokens: Mapping[str, list[int]], prompt_lens: Mapping[str, int],
               dtype: torch.dtype) -> LazyItems[tuple[torch.Tensor, torch.Tensor, int]]:
    """The τ simulation's items ``(features [T, L*H] in ``dtype``, token ids [T], prompt_len)`` of ``ids``, each made
    from ``features`` when its chunk is simulated (:class:`~dflash_eval.metrics.tau_chunks.LazyItems`)."""
    def load(i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        pid = ids[i]
        feats = features[pid]
        item = (torch.cat([feats[j] for j in layers], dim=-1).to(dtype),
                torch.tensor(tokens[pid], dtype=torch.long), int(prompt_lens[pid]))
        if isinstance(features, FeatureMap):
            features.release()
        return item

    return LazyItems([len(tokens[pid]) for pid in ids], load)
