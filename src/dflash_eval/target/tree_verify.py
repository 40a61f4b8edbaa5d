"""Verifying a drafted block or tree in ONE target forward against the target's caches, keeping what a serving engine
keeps: the target side of the server-style speculative loop (:mod:`dflash_eval.metrics.server_loop`).

A round verifies ``k`` tokens: a chain block (``k = B``, each token after the one before) or a DDTree (``k = N + 1``,
the root and N nodes, each after its parent). :class:`VerifyTree` holds either as parent links. In one forward:

- **attention layers** see the context and each node's ancestors (the tree's additive mask, :meth:`VerifyTree.mask`)
  at depth-based positions (``start + depth``); their KV cache receives all ``k`` entries and :meth:`TreeCache.keep`
  cuts it back to the context plus the accepted path, laid out in order (what SGLang's tree verify does);
- **Gated DeltaNet (linear-attention) layers** have no single sequence in a tree: every node's conv window and
  recurrent state follow its own root path. Each node's states after the verify are kept (:class:`Verified`), the
  request's states are left as they were, and :meth:`TreeCache.keep` copies the accepted node's states into the
  request's. Nothing committed is run again.

How the states after every verified token are kept:

- SGLang (``python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py``) verifies through its own copy of
  fla's fused recurrent kernel (``layers/attention/fla/fused_recurrent.py``, the ``..._update`` variant): one
  sequential pass over the ``k`` tokens that writes the state after every step into an intermediate buffer and, for a
  tree, starts each step from its parent's buffered state (``retrieve_parent_token``); after acceptance the accepted
  step's state is scattered into the request's slot. Its conv update keeps the windows the same way.
- fla 0.6.0's public kernels (``fla.ops.gated_delta_rule``: ``chunk_gated_delta_rule``,
  ``fused_recurrent_gated_delta_rule``) return only the final state of each sequence: no per-token states, no
  parent links. So here every node's root path is a sequence of its own. The ``k`` paths, left-padded to the
  deepest, go through the backend's recurrent kernel (fla's fused recurrent on a GPU, transformers' recurrent torch
  function on a CPU) in ONE call from the request's state; a padding step has ``q = k = v = 0``, decay ``g = 0`` and
  ``beta = 0``, which leaves the state exactly as it was (``S * exp(0) + 0``). Each sequence's final state is its
  node's state and its last output the node's output: exact, checked against verifying each root path on its own
  (``tests/test_server_loop.py``). The cost: ``k x (depth + 1)`` recurrent steps of work instead of ``k``, in
  ``depth + 1`` sequential steps (SGLang's pass: ``k`` sequential steps), plus the gathers; it is part of the timed
  verify (:mod:`dflash_eval.measurements.round_costs`).
- The causal conv: each node's window (the ``S`` inputs before it on its path, reaching into the request's conv
  state near the root) is gathered and the backend's own single-step update (``causal_conv1d_update``, the function
  plain decoding calls) runs on all ``k`` windows at once; it leaves each window as the node's new conv state.

Both replacements are installed, for the forward alone, in place of the module-level ``causal_conv1d_fn`` and
``torch_chunk_gated_delta_rule`` of the hybrid modeling modules (:func:`dflash_eval.target.backends.module_functions`;
Qwen3.5, Qwen3.5-MoE and Qwen3-Next call them the same way), and :class:`TreeCache` (a transformers
``DynamicCache``) receives the states instead of overwriting the request's. A tree of a single token is never
verified (the forward would take the one-token decode path).

Example::

    cache = tree_cache(target.model.config)
    target.model(prompt[None], cache=cache, use_cache=True)                  # prefill
    tree = VerifyTree.chain([bonus, *drafts])
    with cache.verifying(tree) as ver:
        ids, pos, mask = tree.inputs(ver.start, target.dtype, target.device)
        logits = target.model(ids, cache=cache, use_cache=True, position_ids=pos,
                              attention_mask={"full_attention": mask, "linear_attention": None}).logits[0]
    path = tree.walk(logits.argmax(-1).tolist(), limit=len(tree.tokens) - 1)
    cache.keep(ver, path)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from dflash_eval.errors import ArchitectureMismatch
from dflash_eval.target.backends import module_functions

__all__ = ["VerifyTree", "Verified", "TreeCache", "tree_cache"]


@dataclass(frozen=True)
class VerifyTree:
    """The tokens one verify forward runs: node 0 is the root (the round's bonus token), node ``i`` follows
    ``parents[i]``. A chain block is a tree whose nodes form one path."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # -1 for the root, else an earlier node's index
    #: The depth every node's path is padded to in the recurrent kernel (at least the tree's own): the deepest tree
    #: of its kind (DDTree-N: min(N, B - 1)), so that a verify costs what its size costs, whatever its shape (as
    #: SGLang's sequential verify does), and the timed cost of a tree of that size is the cost of every one.
    pad_depth: int = 0

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents) or not self.tokens or self.parents[0] != -1:
            raise ValueError(f"a verify tree needs a root and one parent per node: {self.parents}")
        if any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError(f"every node's parent must come before it: {self.parents}")

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> VerifyTree:
        """A block verified as a chain: each token after the one before it."""
        return cls(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)), len(tokens) - 1)

    @property
    def size(self) -> int:
        return len(self.tokens)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        return tuple(len(p) - 1 for p in self.paths)

    @cached_property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        """Every node's root path (root first, the node last): a parent's path and the node."""
        out: list[tuple[int, ...]] = []
        for i, p in enumerate(self.parents):
            out.append((i,) if p < 0 else (*out[p], i))
        return tuple(out)

    def path(self, node: int) -> list[int]:
        """The nodes from the root to ``node``, both included."""
        return list(self.paths[node])

    @cached_property
    def children(self) -> dict[int, dict[int, int]]:
        """Each node's children by token (the first child of a token, as the DDTree walk takes it)."""
        out: dict[int, dict[int, int]] = {}
        for i, p in enumerate(self.parents):
            if p >= 0:
                out.setdefault(p, {}).setdefault(self.tokens[i], i)
        return out

    def walk(self, targets: Sequence[int], *, limit: int, eos: int | None = None) -> list[int]:
        """The accepted path, root first: from the root, descend to the child whose token is the target's token
        after the current node (``targets[node]``), at most ``limit`` times; a child whose token is ``eos`` is not
        descended into (a drafted EOS is not accepted: the target's EOS becomes the bonus and ends the text)."""
        path = [0]
        while len(path) <= limit:
            nxt = self.children.get(path[-1], {}).get(int(targets[path[-1]]))
            if nxt is None or (eos is not None and self.tokens[nxt] == eos):
                break
            path.append(nxt)
        return path

    def inputs(self, start: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """The forward's token ids [1, k], positions [1, k] (``start + depth``) and the attention layers' additive
        mask [1, 1, k, start + k]: every node sees the ``start`` context positions, its ancestors and itself."""
        k = self.size
        rows = [i for i, p in enumerate(self.paths) for _ in p]
        cols = [j for p in self.paths for j in p]
        visible = torch.zeros(k, k, dtype=torch.bool)
        visible[rows, cols] = True
        mask = torch.zeros(1, 1, k, start + k, dtype=dtype)
        mask[0, 0, :, start:] = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)
        ids = torch.tensor([self.tokens], dtype=torch.long)
        pos = torch.tensor([[start + d for d in self.depths]], dtype=torch.long)
        return ids.to(device), pos.to(device), mask.to(device)

    def path_index(self) -> Tensor:
        """[k, D] (D = the deepest depth or ``pad_depth``, whichever is more, + 1): row i holds node i's root path,
        left-padded with ``k`` (a padding row of zeros the recurrent kernel passes through without changing the
        state)."""
        d = max(max(map(len, self.paths)), self.pad_depth + 1)
        return torch.tensor([[self.size] * (d - len(p)) + list(p) for p in self.paths], dtype=torch.long)

    def window_index(self, width: int) -> Tensor:
        """[k, width]: the inputs before each node on its path, oldest first, as columns of ``[conv state (width
        columns, oldest first); node inputs]`` (node i is column ``width + i``)."""
        state = list(range(width))
        return torch.tensor([(state + [width + j for j in p[:-1]])[-width:] for p in self.paths], dtype=torch.long)


@dataclass
class Verified:
    """One verify forward's per-node linear-attention states, by layer: ``conv[layer]`` [k, C, S] (each node's conv
    window after it) and ``recurrent[layer]`` [k, heads, dk, dv] (each node's recurrent state after it). ``start``:
    the cache's length before the verify (the root's position)."""

    tree: VerifyTree
    start: int
    device: torch.device
    conv: dict[int, Tensor] = field(default_factory=dict)
    recurrent: dict[int, Tensor] = field(default_factory=dict)
    _conv_layer: int = -1
    _index: dict[str, Tensor] = field(default_factory=dict)

    def _indices(self, name: str, make: Callable[[], Tensor]) -> Tensor:
        if name not in self._index:
            self._index[name] = make().to(self.device)
        return self._index[name]

    def conv_fn(self, mod: ModuleType) -> Callable[..., Tensor]:
        """The tree's causal conv, in place of ``mod.causal_conv1d_fn``: every node's window gathered and stepped
        by ``mod``'s own single-token update, the windows after each node kept for the layer whose conv state the
        cache handed out just before."""
        update = mod.causal_conv1d_update

        def conv(full: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None,
                 **_: Any) -> Tensor:
            k = self.tree.size
            width = full.shape[-1] - k  # the request's conv state, then the k node inputs: [1, C, width + k]
            idx = self._indices(f"window{width}", lambda: self.tree.window_index(width))
            windows = full[0][:, idx].permute(1, 0, 2).contiguous()  # [k, C, width]
            x = full[0, :, width:].t()[:, :, None]  # [k, C, 1]
            out = update(x, windows, weight, bias, activation)  # [k, C, 1]; each window stepped past its node
            self.conv[self._conv_layer] = windows
            return out[:, :, 0].t()[None]  # [1, C, k]

        return conv

    def delta_fn(self, mod: ModuleType) -> Callable[..., tuple[Tensor, Tensor]]:
        """The tree's gated delta rule, in place of ``mod.torch_chunk_gated_delta_rule``: every node's root path as
        a sequence of its own through ``mod``'s recurrent function in force (the backend's), from the request's
        state; returns the nodes' outputs [1, k, heads, dv] and their states [k, heads, dk, dv]."""

        def delta(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor, chunk_size: int = 64,
                  initial_state: Tensor | None = None, output_final_state: bool = False,
                  use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> tuple[Tensor, Tensor]:
            idx = self._indices("path", self.tree.path_index)  # [k, D]

            def paths(t: Tensor) -> Tensor:  # [1, k, ...] -> [k, D, ...], a zero row for the padding
                return torch.cat([t[0], t.new_zeros((1, *t.shape[2:]))])[idx]

            k = self.tree.size
            init = None if initial_state is None else initial_state.expand(k, *initial_state.shape[1:]).contiguous()
            out, states = mod.torch_recurrent_gated_delta_rule(
                paths(query), paths(key), paths(value), g=paths(g), beta=paths(beta), initial_state=init,
                output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
            return out[:, -1][None], states

        return delta


class TreeCache:
    """Mixed into a transformers ``DynamicCache`` by :func:`tree_cache`: the cache of one request, which can verify a
    tree (:meth:`verifying`) and keep its accepted path (:meth:`keep`)."""

    _verifying: Verified | None = None

    def update_conv_state(self, conv_states: Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any) -> Tensor:
        v = self._verifying
        if v is None:
            return super().update_conv_state(conv_states, layer_idx, state_idx=state_idx, **kwargs)  # type: ignore[misc]  # DynamicCache's
        state = self.get_conv_state(layer_idx, state_idx)  # type: ignore[attr-defined]  # DynamicCache's
        if state is None:
            raise ArchitectureMismatch(f"linear-attention layer {layer_idx} has no conv state: verify after a prefill")
        v._conv_layer = layer_idx
        return torch.cat([state, conv_states.to(state.dtype)], dim=-1)

    def update_recurrent_state(self, recurrent_states: Tensor, layer_idx: int, state_idx: int = 0,
                               **kwargs: Any) -> Tensor:
        v = self._verifying
        if v is None:
            return super().update_recurrent_state(recurrent_states, layer_idx, state_idx=state_idx, **kwargs)  # type: ignore[misc]  # DynamicCache's
        v.recurrent[layer_idx] = recurrent_states
        return recurrent_states

    @contextmanager
    def verifying(self, tree: VerifyTree) -> Iterator[Verified]:
        """Within the block, a forward over ``tree``'s tokens keeps every node's linear-attention states in the
        :class:`Verified` it yields and leaves the request's states as they were (module docstring)."""
        if tree.size < 2:
            raise ValueError("a verify tree needs at least 2 tokens (one token takes the decode path)")
        start = int(self.get_seq_length())  # type: ignore[attr-defined]  # DynamicCache's
        dev = self._device()
        ver = Verified(tree, start, dev)
        with module_functions(lambda mod: {"causal_conv1d_fn": ver.conv_fn(mod),
                                           "torch_chunk_gated_delta_rule": ver.delta_fn(mod)}):
            self._verifying = ver
            try:
                yield ver
            finally:
                self._verifying = None

    def _device(self) -> torch.device:
        for layer in self.layers:  # type: ignore[attr-defined]  # DynamicCache's
            for t in (getattr(layer, "keys", None), *getattr(layer, "recurrent_states", {}).values()):
                if isinstance(t, Tensor):
                    return t.device
        raise ArchitectureMismatch("the cache holds no state yet: verify after a prefill")

    def keep(self, ver: Verified, path: Sequence[int]) -> None:
        """Make the cache what running ``path``'s tokens (root first) alone would have made it: every linear-attention
        layer takes the last path node's conv window and recurrent state, every attention layer keeps the context
        and the path's keys and values in order (the rest of the tree is dropped)."""
        last = int(path[-1])
        for idx, states in ver.recurrent.items():
            self.layers[idx].recurrent_states[0].copy_(states[last:last + 1])  # type: ignore[attr-defined]
        for idx, windows in ver.conv.items():
            self.layers[idx].conv_states[0].copy_(windows[last:last + 1])  # type: ignore[attr-defined]
        n, start = len(path), ver.start
        rows = ver._indices(f"keep{tuple(path)}", lambda: torch.tensor(list(path), dtype=torch.long) + start)
        for layer in self.layers:  # type: ignore[attr-defined]
            keys = getattr(layer, "keys", None)
            if not isinstance(keys, Tensor) or keys.numel() == 0:
                continue
            if getattr(layer, "is_sliding", False):
                raise ArchitectureMismatch("a sliding-window attention layer cannot keep a verified path here")
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t[..., start:start + n, :] = t.index_select(-2, rows)
                setattr(layer, name, t[..., :start + n, :])


def tree_cache(config: Any) -> Any:
    """A transformers ``DynamicCache`` for ``config`` with :class:`TreeCache`'s verify and keep."""
    from transformers import DynamicCache  # imported with the target's modeling code, when a model runs

    cls = _TREE_CACHES.get(DynamicCache)
    if cls is None:
        cls = _TREE_CACHES[DynamicCache] = type("TreeDynamicCache", (TreeCache, DynamicCache), {})
    return cls(config=config)


_TREE_CACHES: dict[type, type] = {}
