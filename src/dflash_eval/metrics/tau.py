"""Offline τ (mean acceptance length): the DFlash chain loop and DDTree, simulated on a greedy reference.

Conventions (pinned by tests/test_tau.py):

- The sequence is ``prompt (P tokens) + greedy reference completion (N tokens)``; features come from one causal
  target forward over all of it, feature of position j = target ``hidden_states[i + 1]`` at j.
- The prefill produces the first completion token (the first bonus); it belongs to no round.
- A round starts at ``s``, the position of the current bonus token: block ``[S[s], MASK x (B-1)]`` at
  positions ``s..s+B-1``, context features at positions ``< s``. Draft slot k (1..B-1) predicts ``S[s+k]``.
  ``acc`` = leading slots whose argmax equals the reference; the verify adds ``acc`` drafts plus one new bonus,
  so the round's acceptance length is ``acc + 1`` (range 1..B) and the next round starts at ``s + acc + 1``.
- Truncation: a round never commits past the end of the completion (``acc <= T - 2 - s``); rounds run while a
  new token remains (``s < T - 1``). So ``1 + sum(accept_lengths) == N`` when ``max_blocks`` does not stop early.
- τ = mean of the acceptance lengths of one response; a set of responses is macro-averaged (mean of τ). The
  result of one response, :class:`~dflash_eval.metrics.tau_result.TauResult`, is plain data in a torch-free module.

DDTree-N: from the same per-slot distributions, a best-first tree of N non-root nodes; a round accepts the
longest root path whose tokens match the reference.

A block's drafts depend only on the reference (its first token, its position, the context before it), never
on the simulation that visits it. So there are two exact ways to drive the loops, with the same τ:

- :func:`simulate_tau` (the suite's): every prompt's chain and each DDTree budget's path advance in lock-step; each
  round drafts, in one batched drafter forward, only the distinct (prompt, start) pairs that some path is at and no
  path drafted before. The drafter runs for about rounds x prompts blocks instead of tokens x prompts, and the
  context's keys and values are computed once per prompt (:meth:`~dflash_eval.drafter.DFlashDrafter.context_kv`).
- :func:`draft_table` drafts every possible start at once; :func:`chain_tau` / :func:`ddtree_tau` look rows up.

Both drive the same per-path loops (:func:`chain_path`, :func:`ddtree_path`): generators that yield the start
they need and receive that block's top-k drafts.

Example::

    res = simulate_tau(drafter, head, [(features, token_ids, prompt_len)], budgets=(8,))[0]
    print(res.chain.tau, res.ddtree[8].tau)
    table = draft_table(drafter, head, [(features, token_ids, prompt_len)], top_k=8)[0]
    print(chain_tau(table).tau, ddtree_tau(table, budget=8).tau)  # the same numbers
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dflash_eval.drafter.model import ContextKV, DFlashDrafter, block_ids, draft_logits
from dflash_eval.metrics.ddtree import build_ddtree
from dflash_eval.metrics.tau_chunks import LazyItems, bytes_per_token, lengths_of, plan_chunks
from dflash_eval.metrics.tau_result import TauResult
from dflash_eval.target.head import TargetHead

__all__ = ["DraftTable", "SimulatedTau", "draft_table", "simulate_tau", "chain_path", "ddtree_path", "chain_tau",
           "ddtree_tau", "build_ddtree"]

Items = Sequence[tuple[Tensor, Tensor, int]]  # (features [T, L*H], token ids [T], prompt_len) per response
Drafts = tuple[Tensor, Tensor]  # one block's top-k draft ids and log-probs, [B-1, K] each
Path = Generator[int, Drafts, "TauResult"]  # yields the start it needs, receives its drafts, returns its τ


@dataclass
class DraftTable:
    """Top-k draft tokens and log-probs for every possible round start of one reference sequence.

    ``ids[r, k-1, j]`` is the j-th most likely token for slot k of the block starting at ``prompt_len + r``.
    """

    tokens: Tensor  # [T] the full reference sequence (prompt + completion)
    prompt_len: int
    ids: Tensor  # [N, B-1, K] long
    logp: Tensor  # [N, B-1, K] float32
    block_size: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[0])

    def row(self, start: int) -> int:
        return start - self.prompt_len

    def drafts(self, start: int) -> Drafts:
        """The top-k draft ids and log-probs of the block at ``start``."""
        r = self.row(start)
        return self.ids[r], self.logp[r]


@dataclass
class SimulatedTau:
    """τ of one response from :func:`simulate_tau`: the chain, each DDTree budget, how many blocks were drafted."""

    chain: TauResult
    ddtree: dict[int, TauResult]
    drafted: int


def _contexts(drafter: DFlashDrafter, items: Items) -> ContextKV:
    """Every item's projected context, right-padded to the longest (a block sees only positions before its start,
    so padding is never visible and batching is exact), as per-layer keys and values."""
    dev = drafter.fc.weight.device
    t_max = max(int(f.shape[0]) for f, _, _ in items)
    ctxs = []
    for feats, _, _ in items:
        c = drafter.project_context(feats.to(dev))
        if c.shape[0] < t_max:
            c = torch.cat([c, c.new_zeros(t_max - c.shape[0], c.shape[1])])
        ctxs.append(c)
    return drafter.context_kv(torch.stack(ctxs))  # [I, T, ...]


def _draft_blocks(drafter: DFlashDrafter, head: TargetHead, kv: ContextKV, tokens: Sequence[Tensor],
                  pairs: Sequence[tuple[int, int]], top_k: int, chunk: int) -> list[Drafts]:
    """Top-k drafts of the block at each (item, start) pair, in the order of ``pairs``, at most ``chunk`` blocks
    per drafter forward. A forward drafts N items x R starts, sharing each item's context keys and values; items
    with different numbers of starts go to separate forwards, so no block is drafted twice."""
    out: dict[tuple[int, int], Drafts] = {}
    for c0 in range(0, len(pairs), chunk):
        by_item: dict[int, list[int]] = {}
        for i, s in pairs[c0:c0 + chunk]:
            by_item.setdefault(i, []).append(s)
        by_count: dict[int, list[int]] = {}
        for i in sorted(by_item):
            by_count.setdefault(len(by_item[i]), []).append(i)
        for order in by_count.values():
            out.update(_draft_group(drafter, head, kv, tokens, {i: by_item[i] for i in order}, top_k))
    return [out[p] for p in pairs]


def _draft_group(drafter: DFlashDrafter, head: TargetHead, kv: ContextKV, tokens: Sequence[Tensor],
                 starts_of: dict[int, list[int]], top_k: int) -> dict[tuple[int, int], Drafts]:
    """One drafter forward: the blocks at ``starts_of[i]`` (the same number for every item ``i``)."""
    cfg = drafter.config
    dev = drafter.fc.weight.device
    order = list(starts_of)
    starts = torch.tensor([starts_of[i] for i in order], dtype=torch.long)  # [N, R]
    firsts = torch.stack([tokens[i][starts[n]] for n, i in enumerate(order)])
    blocks = block_ids(firsts.to(dev), cfg.block_size, cfg.mask_token_id)
    ctx = kv.select(torch.tensor(order, device=dev))
    logp = torch.log_softmax(draft_logits(drafter, head, ctx, blocks, starts.to(dev)), dim=-1)
    top_lp, top_ids = (x.cpu() for x in logp.topk(top_k, dim=-1))
    return {(i, s): (top_ids[n, j], top_lp[n, j]) for n, i in enumerate(order) for j, s in enumerate(starts_of[i])}


def _top_k(head: TargetHead, top_k: int) -> int:
    return max(1, min(top_k, head.vocab_size))


@torch.no_grad()
def draft_table(
    drafter: DFlashDrafter,
    head: TargetHead,
    items: Items,
    *,
    top_k: int = 1,
    chunk: int = 256,
) -> list[DraftTable]:
    """Draft every start of every item in batched drafter forwards.

    Args:
        items: (features [T, L*H], token ids [T], prompt_len) per response; features at position j belong to
            token j. Responses of different lengths are right-padded: a block only sees context ``< start``, so
            padding is never visible and batching is exact.
        top_k: how many candidates per slot to keep (1 for chain τ; the largest DDTree budget for DDTree).
        chunk: starts per drafter forward across all items (bounds memory only).
    """
    if not items:
        return []
    b, k = drafter.config.block_size, _top_k(head, top_k)
    toks = [t.cpu().to(torch.long) for _, t, _ in items]
    # (item, start) pairs for every start with at least one token after it.
    pairs = [(i, s) for i, (_, t, p) in enumerate(items) for s in range(p, int(t.shape[0]) - 1)]
    rows: list[list[Drafts]] = [[] for _ in items]
    for (i, _), d in zip(pairs, _draft_blocks(drafter, head, _contexts(drafter, items), toks, pairs, k, chunk)):
        rows[i].append(d)
    tables = []
    for i, (_, _, p) in enumerate(items):
        ids = torch.stack([r[0] for r in rows[i]]) if rows[i] else torch.empty(0, b - 1, k, dtype=torch.long)
        logp = torch.stack([r[1] for r in rows[i]]) if rows[i] else torch.empty(0, b - 1, k)
        tables.append(DraftTable(tokens=toks[i], prompt_len=p, ids=ids, logp=logp, block_size=b))
    return tables


@torch.no_grad()
def simulate_tau(
    drafter: DFlashDrafter,
    head: TargetHead,
    items: Items,
    budgets: Sequence[int] = (),
    *,
    max_blocks: int | None = None,
    chunk: int = 256,
    memory: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[SimulatedTau]:
    """Chain and DDTree-``b`` τ (each budget) of every item, drafting only the starts the simulations visit.

    All paths (every item's chain and each budget's DDTree) advance in lock-step. Each round collects the
    distinct (item, start) pairs the waiting paths need and that no path drafted before, drafts them in one
    batched forward (``chunk`` blocks at most) with the top ``max(budgets)`` candidates (as :func:`draft_table`
    with that ``top_k``), and hands each path its block. Same τ as :func:`draft_table` + :func:`chain_tau` /
    :func:`ddtree_tau`: a block's drafts do not depend on which other blocks share its forward.

    ``memory`` (bytes): simulate the items in chunks of about that much memory
    (:func:`dflash_eval.metrics.tau_chunks.plan_chunks`; exact: τ of an item does not depend on the others); an
    item of ``items`` (e.g. a :class:`~dflash_eval.metrics.tau_chunks.LazyItems`) is taken only for its chunk and
    let go after it. ``None``: every item in one simulation. ``progress``: called after every round with the
    positions covered so far (over all items: a finished item counts all of its ``T - 1 - prompt_len``).
    """
    if not items:
        return []
    for bud in budgets:
        if bud < 1:
            raise ValueError(f"DDTree budget must be >= 1, got {bud}")
    lengths = lengths_of(items, lambda it: int(it[1].shape[0]))
    plan = plan_chunks(lengths, bytes_per_token(drafter), memory)
    out: dict[int, SimulatedTau] = {}
    done = 0
    for order in plan:
        chunk_items = [items[i] for i in order] if len(plan) > 1 or isinstance(items, LazyItems) else list(items)
        base = done

        def report(covered: int, base: int = base) -> None:
            if progress is not None:
                progress(base + covered)

        out.update(zip(order, _simulate_chunk(drafter, head, chunk_items, budgets, max_blocks, chunk, report)))
        done += sum(max(0, lengths[i] - 1 - int(chunk_items[n][2])) for n, i in enumerate(order))
        del chunk_items
    return [out[i] for i in range(len(items))]


def _simulate_chunk(drafter: DFlashDrafter, head: TargetHead, items: Items, budgets: Sequence[int],
                    max_blocks: int | None, chunk: int, report: Callable[[int], None]) -> list[SimulatedTau]:
    """:func:`simulate_tau` of one chunk of items (every path in lock-step); ``report(positions covered)`` after
    every round."""
    b, k = drafter.config.block_size, _top_k(head, max(budgets, default=1))
    toks = [t.cpu().to(torch.long) for _, t, _ in items]
    kv = _contexts(drafter, items)
    done: list[dict[str | int, TauResult]] = [{} for _ in items]
    waiting: list[tuple[int, str | int, Path, int]] = []  # (item, path key, path, the start it waits for)

    def step(i: int, key: str | int, path: Path, drafts: Drafts | None) -> None:
        try:
            waiting.append((i, key, path, next(path) if drafts is None else path.send(drafts)))
        except StopIteration as stop:
            done[i][key] = stop.value

    for i, (_, _, p) in enumerate(items):
        seq = toks[i].tolist()
        step(i, "chain", chain_path(seq, p, b, max_blocks=max_blocks), None)
        for bud in budgets:
            step(i, bud, ddtree_path(seq, p, b, bud, max_blocks=max_blocks), None)
    drafted: dict[tuple[int, int], Drafts] = {}
    while waiting:
        need = sorted({(i, s) for i, _, _, s in waiting} - drafted.keys())
        drafted.update(zip(need, _draft_blocks(drafter, head, kv, toks, need, k, chunk)))
        current = list(waiting)
        waiting.clear()
        for i, key, path, s in current:
            step(i, key, path, drafted[(i, s)])
        report(_covered(items, toks, waiting))
    counts = [0] * len(items)
    for i, _ in drafted:
        counts[i] += 1
    return [SimulatedTau(d["chain"], {bud: d[bud] for bud in budgets}, n) for d, n in zip(done, counts)]


def _covered(items: Items, toks: Sequence[Tensor], waiting: Sequence[tuple[int, Any, Any, int]]) -> int:
    """Positions the item's slowest waiting path has passed, summed over the items (a finished item: all of its)."""
    low: dict[int, int] = {}
    for i, _, _, s in waiting:
        low[i] = min(low.get(i, s), s)
    return sum((low[i] if i in low else int(toks[i].shape[0]) - 1) - int(p) for i, (_, _, p) in enumerate(items))


def _follow(path: Path, lookup: Callable[[int], Drafts]) -> TauResult:
    """Run one path to the end, looking each block's drafts up."""
    try:
        start = next(path)
        while True:
            start = path.send(lookup(start))
    except StopIteration as stop:
        return stop.value


def _max_acc(block_size: int, seq_len: int, s: int) -> int:
    return min(block_size - 1, seq_len - 2 - s)


def chain_path(tokens: list[int], prompt_len: int, block_size: int, *, max_blocks: int | None = None) -> Path:
    """The greedy DFlash chain loop on the reference ``tokens`` (see module docstring), as a path."""
    lens: list[int] = []
    s, n = prompt_len, len(tokens)
    while s < n - 1 and (max_blocks is None or len(lens) < max_blocks):
        ids, _ = yield s
        d = ids[:, 0].tolist()
        limit = _max_acc(block_size, n, s)
        acc = 0
        while acc < limit and d[acc] == tokens[s + acc + 1]:
            acc += 1
        lens.append(acc + 1)
        s += acc + 1
    return TauResult(lens, block_size, "chain")


def chain_tau(table: DraftTable, *, max_blocks: int | None = None) -> TauResult:
    """Simulate the greedy DFlash chain loop on the reference (see module docstring)."""
    return _follow(chain_path(table.tokens.tolist(), table.prompt_len, table.block_size, max_blocks=max_blocks),
                   table.drafts)


def ddtree_path(tokens: list[int], prompt_len: int, block_size: int, budget: int, *,
                max_blocks: int | None = None) -> Path:
    """DDTree-``budget`` on the reference ``tokens``, as a path: descend while the next reference token is a
    child (the budget is checked here, before the path starts)."""
    if budget < 1:
        raise ValueError(f"DDTree budget must be >= 1, got {budget}")
    return _ddtree_path(tokens, prompt_len, block_size, budget, max_blocks)


def _ddtree_path(tokens: list[int], prompt_len: int, block_size: int, budget: int, max_blocks: int | None) -> Path:
    lens: list[int] = []
    s, n = prompt_len, len(tokens)
    while s < n - 1 and (max_blocks is None or len(lens) < max_blocks):
        ids, logp = yield s
        nodes = build_ddtree(ids, logp, budget)
        children: dict[int, dict[int, int]] = {}
        for idx, nd in enumerate(nodes):
            children.setdefault(nd.parent, {}).setdefault(nd.token, idx)
        limit = _max_acc(block_size, n, s)
        cur, acc = -1, 0
        while acc < limit:
            nxt = children.get(cur, {}).get(tokens[s + acc + 1])
            if nxt is None:
                break
            cur, acc = nxt, acc + 1
        lens.append(acc + 1)
        s += acc + 1
    return TauResult(lens, block_size, f"ddtree-{budget}")


def ddtree_tau(table: DraftTable, budget: int, *, max_blocks: int | None = None) -> TauResult:
    """Offline DDTree-``budget`` τ: descend while the reference token at the next depth is a child."""
    return _follow(ddtree_path(table.tokens.tolist(), table.prompt_len, table.block_size, budget,
                               max_blocks=max_blocks), table.drafts)

