"""The server-style speculative loop: DFlash decoding as a serving engine runs it, chain or DDTree, greedy or sampled.

Each round, for one request (batch size 1):

1. ``draft``: the drafter's block pass ``[bonus, MASK x (B-1)]`` against the keys and values of its context, which it
   keeps (:class:`~dflash_eval.drafter.model.ContextCache`), and the target's lm_head: logits of slots 1..B-1.
2. ``build``: the tokens to verify, a :class:`~dflash_eval.target.tree_verify.VerifyTree`: the chain (the bonus and
   the argmax of every slot, B tokens) or DDTree-N (the bonus as root and N nodes, built best-first from each slot's
   top-N log-probs exactly as the offline τ builds it: :func:`dflash_eval.metrics.ddtree.build_ddtree`).
3. ``verify``: ONE target forward over those tokens against the target's caches: the tree's mask on the attention
   layers, positions by depth, every node's conv and recurrent state kept in the Gated DeltaNet layers
   (:mod:`dflash_eval.target.tree_verify`), the drafter's target layers captured.
4. ``accept``: the target's token after every node (argmax, or the sampled token: ``pick``), then the walk from the
   root along it (the chain's leading matches); the target's token after the last accepted node is the new bonus.
5. ``commit``: the accepted node's linear-attention states become the request's, the attention layers' KV cache is
   cut back to the accepted path, and the drafter's context grows by the committed positions' keys and values.

Nothing committed is run twice: the target runs the prompt once and then ``k`` tokens per round (``B``, or ``N + 1``),
one forward a round (:attr:`ServerResult.target_tokens` counts them). The round's acceptance length is the accepted
path's length including the root (1..B), as in :mod:`dflash_eval.metrics.tau`; generation never goes past
``max_new_tokens`` (nor past EOS with ``stop_at_eos``: a drafted EOS is not accepted, the target's EOS ends the text).

At temperature 0 the tokens are plain greedy decoding's and every round's acceptance the offline simulation's on the
greedy reference (numerics aside: near ties). At T > 0 (``pick`` draws the target's tokens with a stream seed,
indexed by absolute position: :func:`dflash_eval.target.sampling.sample_tokens`) the drafts stay the drafter's
argmax and a node is accepted while it equals the target's drawn token there: the suite's sampling rule, whose
offline simulation is :mod:`dflash_eval.metrics.sampled_tau`.

The stages are methods of :class:`ServerLoop`, and :mod:`dflash_eval.measurements.round_costs` times these very
methods: the speed-up the reports predict (:mod:`dflash_eval.metrics.speedup`, the ``server`` model) is the sum of
this loop's timed stages, and ``benchmarks/bench_speedup.py`` checks it against this loop measured end to end.

Example::

    res = server_generate(target, drafter, head, prompt_ids, max_new_tokens=128, budget=8, backend="torch")
    print(res.tau.tau, res.tokens[:10], res.target_forwards)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from dflash_eval.drafter.model import ContextCache, DFlashDrafter, block_ids, draft_logits
from dflash_eval.metrics.ddtree import build_ddtree
from dflash_eval.metrics.online_loop import Pick, argmax_pick, cache_keyword, no_eos
from dflash_eval.metrics.speedup import strategy_name
from dflash_eval.metrics.tau_result import TauResult
from dflash_eval.target.backends import use_backend
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import LayerCapture
from dflash_eval.target.tree_verify import Verified, VerifyTree, tree_cache

if TYPE_CHECKING:
    from dflash_eval.target.loader import Target

__all__ = ["ServerLoop", "Decoding", "Verification", "ServerResult", "server_generate"]


@dataclass
class Decoding:
    """One request being decoded: the target's cache, the drafter's context, the current bonus token at position
    ``start``, what was generated and every round's acceptance length."""

    cache: object  # a transformers cache with TreeCache's verify and keep (tree_cache)
    context: ContextCache
    start: int
    bonus: int
    generated: list[int]
    lens: list[int] = field(default_factory=list)
    target_forwards: int = 1
    target_tokens: int = 0
    done: bool = False


@dataclass
class Verification:
    """One verify forward: the per-node linear-attention states, the target's logits [k, V] and the drafter's
    target-layer features [k, L*H] at every node."""

    states: Verified
    logits: Tensor
    features: Tensor


@dataclass
class ServerResult:
    tokens: list[int]  # the completion
    tau: TauResult
    target_forwards: int  # the prefill, then one verify a round
    target_tokens: int  # tokens the target ran: the prompt, then k a round


class ServerLoop:
    """The server-style loop's stages (module docstring) for one target and drafter; the strategy (``budget``: None
    for the chain, N for DDTree-N) is chosen where the tokens to verify are built. Use inside :meth:`running` (the
    backend and the capture of the drafter's target layers in force).

    Args:
        target: the target model.
        drafter: the DFlash drafter (on the target's device).
        head: the target's embedding and lm_head, borrowed by the drafter.
        backend: the linear-attention backend (:func:`dflash_eval.target.backends.use_backend`).
        max_new_tokens: the most tokens a request generates.
        stop_at_eos: stop at the target's EOS (a drafted EOS is not accepted).
        pick: ``pick(logits [n, V], positions [n])`` -> the target's tokens (default argmax: greedy).
    """

    def __init__(self, target: Target, drafter: DFlashDrafter, head: TargetHead, *, backend: str = "auto",
                 max_new_tokens: int, stop_at_eos: bool = False, pick: Pick | None = None) -> None:
        self.target, self.drafter, self.head = target, drafter, head
        self.model = target.model
        self.device = target.device
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.eos = target.eos_token_id if stop_at_eos else None
        self.pick = pick or argmax_pick
        self.block_size = drafter.config.block_size
        self._kw = cache_keyword(self.model)
        self._capture: LayerCapture | None = None

    @contextmanager
    def running(self) -> Iterator[ServerLoop]:
        """The backend, the capture of the drafter's target layers and ``torch.no_grad`` in force."""
        layers = tuple(self.drafter.config.target_layer_ids)
        with torch.no_grad(), use_backend(self.backend, self.device), LayerCapture(self.model, layers) as cap:
            self._capture = cap
            try:
                yield self
            finally:
                self._capture = None

    def features(self) -> Tensor:
        """The drafter's target-layer features [T, L*H] of the last target forward, on the drafter's device."""
        if self._capture is None:
            raise RuntimeError("ServerLoop stages run inside `with loop.running():`")
        return self._capture.features()[0].to(self.drafter.fc.weight.device)

    def prefill(self, prompt_ids: Sequence[int] | Tensor) -> Decoding:
        """Run the prompt once: the target's caches, the drafter's context of its positions, the first token."""
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.device)
        cache = tree_cache(self.model.config)
        out = self.model(prompt[None], **{self._kw: cache}, use_cache=True)
        n = int(prompt.shape[0])
        context = ContextCache(self.drafter, n + self.max_new_tokens + self.block_size)
        context.append(self.features())
        bonus = int(self.pick(no_eos(out.logits[0, -1:], self.target.eos_token_id), torch.tensor([n]))[0])
        d = Decoding(cache, context, n, bonus, [bonus], target_tokens=n)
        d.done = (self.eos is not None and bonus == self.eos) or self.max_new_tokens <= 1
        return d

    def draft(self, d: Decoding) -> Tensor:
        """The drafter's logits [B-1, V] of slots 1..B-1 of the block at ``d.start``, against its kept context."""
        dev = self.drafter.fc.weight.device
        ids = block_ids(torch.tensor([d.bonus], device=dev), self.block_size, self.drafter.config.mask_token_id)
        start = torch.tensor([[d.start]], device=dev)
        return draft_logits(self.drafter, self.head, d.context.kv, ids[None], start)[0, 0]

    def build(self, d: Decoding, logits: Tensor, budget: int | None) -> VerifyTree:
        """The tokens to verify: the chain of the slots' argmax (``budget`` None), or the DDTree-``budget`` of their
        top-N log-probs."""
        if budget is None:
            return VerifyTree.chain([d.bonus, *logits.argmax(-1).tolist()])
        top = max(1, min(budget, int(logits.shape[-1])))
        logp, ids = logits.float().log_softmax(-1).topk(top, dim=-1)
        nodes = build_ddtree(ids.cpu(), logp.cpu(), budget)
        return VerifyTree((d.bonus, *(n.token for n in nodes)), (-1, *(n.parent + 1 for n in nodes)),
                          min(budget, self.block_size - 1))

    def verify(self, d: Decoding, tree: VerifyTree) -> Verification:
        """ONE target forward over ``tree`` against the request's caches (module docstring)."""
        cache = d.cache
        with cache.verifying(tree) as states:  # type: ignore[attr-defined]  # tree_cache's
            ids, pos, mask = tree.inputs(states.start, self.target.dtype, self.device)
            out = self.model(ids, **{self._kw: cache}, use_cache=True, position_ids=pos,
                             attention_mask={"full_attention": mask, "linear_attention": None})
        d.target_forwards += 1
        d.target_tokens += tree.size
        return Verification(states, out.logits[0], self.features())

    def accept(self, d: Decoding, tree: VerifyTree, v: Verification) -> tuple[list[int], int]:
        """The accepted path (node indices, root first) and the new bonus token (the target's after its last node)."""
        positions = torch.tensor([d.start + 1 + depth for depth in tree.depths])
        targets = self.pick(v.logits, positions).tolist()
        limit = min(self.block_size - 1, self.max_new_tokens - len(d.generated) - 1)
        path = tree.walk(targets, limit=limit, eos=self.eos)
        return path, int(targets[path[-1]])

    def commit(self, d: Decoding, tree: VerifyTree, v: Verification, path: list[int], bonus: int) -> None:
        """The accepted path becomes the request's: its last node's states, its keys and values, the drafter's
        context of its positions; the bonus token follows it."""
        d.cache.keep(v.states, path)  # type: ignore[attr-defined]  # tree_cache's
        rows = torch.tensor(path, device=v.features.device)
        d.context.append(v.features.index_select(0, rows))
        d.generated.extend(tree.tokens[i] for i in path[1:])
        d.generated.append(bonus)
        d.lens.append(len(path))
        d.start += len(path)
        d.bonus = bonus
        d.done = len(d.generated) >= self.max_new_tokens or (self.eos is not None and bonus == self.eos)

    def round(self, d: Decoding, budget: int | None) -> None:
        """One round of the chain (``budget`` None) or DDTree-``budget``: draft, build, verify, accept, commit."""
        tree = self.build(d, self.draft(d), budget)
        v = self.verify(d, tree)
        path, bonus = self.accept(d, tree, v)
        self.commit(d, tree, v, path, bonus)

    def generate(self, prompt_ids: Sequence[int] | Tensor, *, budget: int | None = None,
                 max_blocks: int | None = None) -> ServerResult:
        """Decode one request to the end (or ``max_blocks`` rounds) with the chain (``budget`` None) or
        DDTree-``budget``; inside :meth:`running`."""
        if budget is not None and budget < 1:
            raise ValueError(f"DDTree budget must be >= 1, got {budget}")
        d = self.prefill(prompt_ids)
        while not d.done and (max_blocks is None or len(d.lens) < max_blocks):
            self.round(d, budget)
        return ServerResult(d.generated, TauResult(d.lens, self.block_size, f"server-{strategy_name(budget)}"),
                            d.target_forwards, d.target_tokens)


def server_generate(target: Target, drafter: DFlashDrafter, head: TargetHead, prompt_ids: Sequence[int] | Tensor, *,
                    max_new_tokens: int, budget: int | None = None, backend: str = "auto", stop_at_eos: bool = False,
                    max_blocks: int | None = None, pick: Pick | None = None) -> ServerResult:
    """Decode ``prompt_ids`` with the server-style loop (module docstring): the chain (``budget`` None) or
    DDTree-``budget``; greedy unless ``pick`` draws the target's tokens."""
    loop = ServerLoop(target, drafter, head, backend=backend, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos,
                      pick=pick)
    with loop.running():
        return loop.generate(prompt_ids, budget=budget, max_blocks=max_blocks)
