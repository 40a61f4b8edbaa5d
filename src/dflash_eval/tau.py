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
- τ = mean of the acceptance lengths of one response; a set of responses is macro-averaged (mean of τ).

DDTree-N: from the same per-slot distributions, a best-first tree of N non-root nodes; a round accepts the
longest root path whose tokens match the reference.

The drafter runs once for every possible start of a sequence (exact: each start's block depends only on the
reference), batched over starts and over prompts; the loop then only looks the drafts up.

Example::

    table = draft_table(drafter, head, [(features, token_ids, prompt_len)], top_k=8)[0]
    print(chain_tau(table).tau, ddtree_tau(table, budget=8).tau)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dflash_eval.drafter.model import DFlashDrafter, block_ids, draft_logits
from dflash_eval.head import TargetHead

__all__ = ["TauResult", "DraftTable", "draft_table", "chain_tau", "ddtree_tau", "build_ddtree", "macro_tau"]


@dataclass
class TauResult:
    """Per-round acceptance lengths of one response and their summary."""

    accept_lengths: list[int]
    block_size: int
    method: str = "chain"

    @property
    def rounds(self) -> int:
        return len(self.accept_lengths)

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else float("nan")

    @property
    def histogram(self) -> list[int]:
        """Counts of acceptance lengths 1..B (index 0 is length 1). DDTree paths are capped at B too."""
        counts = [0] * self.block_size
        for a in self.accept_lengths:
            counts[min(a, self.block_size) - 1] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "tau": self.tau, "rounds": self.rounds,
                "accept_lengths": list(self.accept_lengths), "histogram": self.histogram}


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


@torch.no_grad()
def draft_table(
    drafter: DFlashDrafter,
    head: TargetHead,
    items: Sequence[tuple[Tensor, Tensor, int]],
    *,
    top_k: int = 1,
    chunk: int = 256,
    on_chunk: Callable[[int], None] | None = None,
) -> list[DraftTable]:
    """Draft every start of every item in batched drafter forwards.

    Args:
        items: (features [T, L*H], token ids [T], prompt_len) per response; features at position j belong to
            token j. Responses of different lengths are right-padded: a block only sees context ``< start``, so
            padding is never visible and batching is exact.
        top_k: how many candidates per slot to keep (1 for chain τ; the largest DDTree budget for DDTree).
        chunk: starts per drafter forward across all items (bounds memory only).
        on_chunk: called with the number of starts drafted after each forward (progress reporting).
    """
    cfg = drafter.config
    dev = drafter.fc.weight.device
    b = cfg.block_size
    if not items:
        return []
    t_max = max(int(f.shape[0]) for f, _, _ in items)
    ctxs = []
    for feats, _, _ in items:
        c = drafter.project_context(feats.to(dev))
        if c.shape[0] < t_max:
            c = torch.cat([c, c.new_zeros(t_max - c.shape[0], c.shape[1])])
        ctxs.append(c)
    ctx = torch.stack(ctxs)  # [I, T, H]
    # (item, start) pairs for every start with at least one token after it.
    pairs = [(i, s) for i, (_, toks, p) in enumerate(items) for s in range(p, int(toks.shape[0]) - 1)]
    per_item_ids: list[list[Tensor]] = [[] for _ in items]
    per_item_logp: list[list[Tensor]] = [[] for _ in items]
    k_eff = max(1, min(top_k, head.vocab_size))
    for c0 in range(0, len(pairs), chunk):
        sub = pairs[c0:c0 + chunk]
        # Group by item so each forward shares one context tensor per item: use N=items, R=max per item.
        by_item: dict[int, list[int]] = {}
        for i, s in sub:
            by_item.setdefault(i, []).append(s)
        order = sorted(by_item)
        r_max = max(len(v) for v in by_item.values())
        starts = torch.zeros(len(order), r_max, dtype=torch.long)
        firsts = torch.zeros(len(order), r_max, dtype=torch.long)
        for n, i in enumerate(order):
            ss = by_item[i]
            starts[n, :len(ss)] = torch.tensor(ss)
            starts[n, len(ss):] = ss[-1]  # padding rows: duplicates, discarded below
            firsts[n] = items[i][1].to(torch.long)[starts[n]]
        blocks = block_ids(firsts.to(dev), b, cfg.mask_token_id)
        logp = torch.log_softmax(draft_logits(drafter, head, ctx[order], blocks, starts.to(dev)), dim=-1)
        top_lp, top_ids = logp.topk(k_eff, dim=-1)
        for n, i in enumerate(order):
            m = len(by_item[i])
            per_item_ids[i].append(top_ids[n, :m].cpu())
            per_item_logp[i].append(top_lp[n, :m].cpu())
        if on_chunk is not None:
            on_chunk(len(sub))
    tables = []
    for i, (_, toks, p) in enumerate(items):
        if per_item_ids[i]:
            ids_t, lp_t = torch.cat(per_item_ids[i]), torch.cat(per_item_logp[i])
        else:
            ids_t = torch.empty(0, b - 1, k_eff, dtype=torch.long)
            lp_t = torch.empty(0, b - 1, k_eff)
        tables.append(DraftTable(tokens=toks.cpu().to(torch.long), prompt_len=p, ids=ids_t, logp=lp_t, block_size=b))
    return tables


def _max_acc(table: DraftTable, s: int) -> int:
    return min(table.block_size - 1, table.seq_len - 2 - s)


def chain_tau(table: DraftTable, *, max_blocks: int | None = None) -> TauResult:
    """Simulate the greedy DFlash chain loop on the reference (see module docstring)."""
    toks = table.tokens.tolist()
    drafts = table.ids[:, :, 0].tolist()
    s, lens = table.prompt_len, []
    while s < table.seq_len - 1 and (max_blocks is None or len(lens) < max_blocks):
        d = drafts[table.row(s)]
        limit = _max_acc(table, s)
        acc = 0
        while acc < limit and d[acc] == toks[s + acc + 1]:
            acc += 1
        lens.append(acc + 1)
        s += acc + 1
    return TauResult(lens, table.block_size, "chain")


@dataclass(frozen=True)
class TreeNode:
    depth: int  # 1..B-1
    rank: int  # index into the top-k list of this depth
    parent: int  # index of the parent node, -1 for the root
    token: int
    score: float


def build_ddtree(ids: Tensor, logp: Tensor, budget: int) -> list[TreeNode]:
    """Best-first DDTree over one block's per-slot top-k lists ([B-1, K] each); ``budget`` non-root nodes.

    Start from (depth 1, rank 0); each pop adds a node and pushes its next sibling (same depth, rank + 1) and its
    first child (depth + 1, rank 0). Scores are sums of per-depth log-probs. Ties break by insertion order.
    """
    depths, k = int(ids.shape[0]), int(ids.shape[1])
    lp = logp.tolist()
    tok = ids.tolist()
    nodes: list[TreeNode] = []
    counter = 0
    heap: list[tuple[float, int, int, int, int, float]] = [(-lp[0][0], counter, 1, 0, -1, 0.0)]
    while heap and len(nodes) < budget:
        neg, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        score = -neg
        nodes.append(TreeNode(depth, rank, parent, tok[depth - 1][rank], score))
        me = len(nodes) - 1
        if rank + 1 < k:
            counter += 1
            heapq.heappush(heap, (-(parent_score + lp[depth - 1][rank + 1]), counter, depth, rank + 1, parent, parent_score))
        if depth < depths:
            counter += 1
            heapq.heappush(heap, (-(score + lp[depth][0]), counter, depth + 1, 0, me, score))
    return nodes


def ddtree_tau(table: DraftTable, budget: int, *, max_blocks: int | None = None) -> TauResult:
    """Offline DDTree-``budget`` τ: descend while the reference token at the next depth is a child."""
    if budget < 1:
        raise ValueError(f"DDTree budget must be >= 1, got {budget}")
    if table.ids.shape[-1] < min(budget, table.ids.shape[-1]):
        raise ValueError("draft table has fewer candidates than needed")
    toks = table.tokens.tolist()
    s, lens = table.prompt_len, []
    while s < table.seq_len - 1 and (max_blocks is None or len(lens) < max_blocks):
        r = table.row(s)
        nodes = build_ddtree(table.ids[r], table.logp[r], budget)
        children: dict[int, dict[int, int]] = {}
        for idx, nd in enumerate(nodes):
            children.setdefault(nd.parent, {}).setdefault(nd.token, idx)
        limit = _max_acc(table, s)
        cur, acc = -1, 0
        while acc < limit:
            nxt = children.get(cur, {}).get(toks[s + acc + 1])
            if nxt is None:
                break
            cur, acc = nxt, acc + 1
        lens.append(acc + 1)
        s += acc + 1
    return TauResult(lens, table.block_size, f"ddtree-{budget}")


def macro_tau(results: Sequence[TauResult]) -> float:
    """Mean over responses of each response's τ (z-lab's benchmark convention)."""
    vals = [r.tau for r in results if r.rounds]
    return sum(vals) / len(vals) if vals else float("nan")
