"""The DDTree of one drafted block: a best-first tree over the block's per-slot top-k candidates.

DDTree-N keeps the N most likely non-root nodes of the tree whose depth-d nodes are the top-k candidates of draft
slot d, a node's score the sum of log-probs along its root path (:func:`build_ddtree`). The offline DDTree τ
(:func:`dflash_eval.metrics.tau.ddtree_path`) accepts the longest root path whose tokens match the reference.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from torch import Tensor

__all__ = ["TreeNode", "build_ddtree"]


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
            heapq.heappush(heap, (-(parent_score + lp[depth - 1][rank + 1]), counter, depth, rank + 1, parent,
                                  parent_score))
        if depth < depths:
            counter += 1
            heapq.heappush(heap, (-(score + lp[depth][0]), counter, depth + 1, 0, me, score))
    return nodes
