"""Hand-built cases pinning the τ conventions: bonus counted (1..B), truncation, DDTree budget and descent; the
lock-step simulation (only visited starts drafted) against the every-start table."""

from __future__ import annotations

import pytest
import torch

from dflash_eval.drafter import block_ids, draft_logits
from dflash_eval.metrics.tau import (
    DraftTable,
    build_ddtree,
    chain_tau,
    ddtree_tau,
    draft_table,
    simulate_tau,
)
from dflash_eval.metrics.tau_result import macro_tau

B = 4  # block size: slots 1..3 are drafted


def _table(tokens: list[int], prompt_len: int, drafts: dict[int, list[list[int]]], k: int = 1) -> DraftTable:
    """drafts[start] = per slot list of top-k tokens (best first); unspecified starts draft token -1."""
    n = len(tokens) - 1 - prompt_len
    ids = torch.full((n, B - 1, k), -1, dtype=torch.long)
    logp = torch.zeros(n, B - 1, k)
    for s, slots in drafts.items():
        for j, cands in enumerate(slots):
            ids[s - prompt_len, j, : len(cands)] = torch.tensor(cands)
            logp[s - prompt_len, j] = torch.log(torch.tensor([0.9 ** (r + 1) for r in range(k)]))
    return DraftTable(torch.tensor(tokens), prompt_len, ids, logp, B)


SEQ = [100, 101, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # prompt = [100, 101]; completion = 1..9


def test_all_rejected_gives_tau_one_and_covers_completion() -> None:
    t = _table(SEQ, 2, {})
    r = chain_tau(t)
    assert r.accept_lengths == [1] * 8  # 9 completion tokens: 1 from prefill + 8 rounds of 1
    assert 1 + sum(r.accept_lengths) == 9
    assert r.tau == 1.0 and r.histogram == [8, 0, 0, 0]


def test_bonus_counted_full_accept_is_block_size() -> None:
    # start 2 (token 1): drafts 2,3,4 all right -> acc 3, length 4 = B; next start 6 (token 5)
    t = _table(SEQ, 2, {2: [[2], [3], [4]], 6: [[6], [99], [8]]})
    r = chain_tau(t)
    assert r.accept_lengths[:2] == [4, 2]  # at start 6: slot1 ok, slot2 wrong -> acc 1
    assert max(r.accept_lengths) <= B and min(r.accept_lengths) >= 1
    assert 1 + sum(r.accept_lengths) == 9


def test_leading_matches_only() -> None:
    t = _table(SEQ, 2, {2: [[99], [3], [4]]})  # slot 1 wrong: later matches do not count
    assert chain_tau(t).accept_lengths[0] == 1


def test_truncation_at_end_of_completion() -> None:
    # start 8 (token 7): only tokens 8, 9 remain -> at most 2 new tokens (acc <= 1 + new bonus)
    t = _table(SEQ, 2, {s: [[SEQ[s + 1]], [SEQ[s + 2] if s + 2 < len(SEQ) else 0], [0]] for s in range(2, 10)})
    r = chain_tau(t)
    assert 1 + sum(r.accept_lengths) == 9
    assert r.accept_lengths[-1] <= len(SEQ) - 1 - 8


def test_max_blocks() -> None:
    assert chain_tau(_table(SEQ, 2, {}), max_blocks=3).rounds == 3


def test_ddtree_budget_counts_non_root_nodes() -> None:
    ids = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    logp = torch.log(torch.tensor([[0.6, 0.25, 0.15], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]))
    for budget in (1, 3, 8):
        assert len(build_ddtree(ids, logp, budget)) == budget
    nodes = build_ddtree(ids, logp, 5)
    # best-first by path probability: 10 (.6), 10-20 (.30), 10-20-30 (.27), 11 (.25), 10-21 (.24)
    assert [(n.depth, n.token) for n in nodes] == [(1, 10), (2, 20), (3, 30), (1, 11), (2, 21)]
    assert [n.parent for n in nodes] == [-1, 0, 1, -1, 0]


def test_ddtree_descends_through_second_candidates() -> None:
    # chain drafts 2,99,.. ; tree has 3 as the second candidate at depth 2 -> DDTree accepts deeper
    t = _table(SEQ, 2, {2: [[2, 50], [99, 3], [4, 51]]}, k=2)
    chain = chain_tau(t).accept_lengths[0]
    tree = ddtree_tau(t, budget=12).accept_lengths[0]
    assert (chain, tree) == (2, 4)


def test_ddtree_budget_one_equals_single_draft() -> None:
    t = _table(SEQ, 2, {2: [[2], [3], [4]]})
    assert ddtree_tau(t, budget=1).accept_lengths[0] == 2


def test_macro_average() -> None:
    a = chain_tau(_table(SEQ, 2, {}))
    b = chain_tau(_table(SEQ, 2, {2: [[2], [3], [4]]}))
    assert macro_tau([a, b]) == pytest.approx((a.tau + b.tau) / 2)


def test_draft_table_batching_is_exact(tiny_drafter, tiny_head, tiny_target) -> None:  # type: ignore[no-untyped-def]
    from dflash_eval.target.hidden_states import extract_features

    ids = torch.arange(5, 60)
    feats, _ = extract_features(tiny_target, ids, tiny_drafter.config.target_layer_ids, backend="torch")
    together = draft_table(tiny_drafter, tiny_head, [(feats, ids, 20), (feats[:40], ids[:40], 10)], top_k=4)
    alone = draft_table(tiny_drafter, tiny_head, [(feats[:40], ids[:40], 10)], top_k=4, chunk=5)
    assert together[1].ids.shape == (40 - 1 - 10, tiny_drafter.block_size - 1, 4)
    assert torch.equal(together[1].ids, alone[0].ids)
    torch.testing.assert_close(together[1].logp, alone[0].logp, atol=1e-5, rtol=1e-5)


def _planned_sequence(drafter, head, feats, prompt, plan):  # type: ignore[no-untyped-def]
    """A reference on which the chain accepts ``plan[r]`` drafts in round r (cycling): each round copies that many
    drafts of the block, then puts the slot's SECOND candidate as the bonus (so DDTree can go deeper). Features are
    fixed (not from the tokens), so a block's drafts depend only on its first token and position."""
    cfg = drafter.config
    b, total = cfg.block_size, int(feats.shape[0])
    ctx = drafter.project_context(feats)[None]
    toks, s, r = list(prompt) + [prompt[-1] + 1], len(prompt), 0
    with torch.no_grad():
        while len(toks) < total:
            blocks = block_ids(torch.tensor([toks[s]]), b, cfg.mask_token_id)[None]
            top = draft_logits(drafter, head, ctx, blocks, torch.tensor([[s]]))[0, 0].topk(2, dim=-1).indices
            acc = plan[r % len(plan)]
            toks += top[:acc, 0].tolist() + [int(top[min(acc, b - 2), 1])]
            s, r = s + acc + 1, r + 1
    return toks[:total]


def test_lockstep_equals_table_and_drafts_only_visited_starts(tiny_drafter, tiny_head):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    b = tiny_drafter.block_size
    width = tiny_drafter.fc.weight.shape[1]
    items = []
    for n, (plen, total, plan) in enumerate([(9, 60, [b - 1, 2, 0, 5]), (4, 41, [3, b - 1]), (15, 33, [0, 1])]):
        feats = torch.randn(total, width)
        prompt = [10 + n + j for j in range(plen)]
        items.append((feats, torch.tensor(_planned_sequence(tiny_drafter, tiny_head, feats, prompt, plan)), plen))
    budgets = (1, 3, 8)
    tables = draft_table(tiny_drafter, tiny_head, items, top_k=max(budgets))
    assert chain_tau(tables[0]).accept_lengths[:4] == [b, 3, 1, 6]  # the plan worked: the test is not trivial
    for max_blocks in (None, 3):
        sims = simulate_tau(tiny_drafter, tiny_head, items, budgets, max_blocks=max_blocks)
        for sim, table in zip(sims, tables):
            assert sim.chain.accept_lengths == chain_tau(table, max_blocks=max_blocks).accept_lengths
            for budget in budgets:
                assert sim.ddtree[budget].accept_lengths == ddtree_tau(table, budget,
                                                                      max_blocks=max_blocks).accept_lengths
            visited = {table.prompt_len + sum(r.accept_lengths[:k])
                       for r in (sim.chain, *sim.ddtree.values()) for k in range(r.rounds)}
            assert sim.drafted == len(visited) <= table.ids.shape[0]  # each visited start once, nothing else
    assert sum(s.drafted for s in simulate_tau(tiny_drafter, tiny_head, items, budgets)) < \
        sum(t.ids.shape[0] for t in tables)
    assert simulate_tau(tiny_drafter, tiny_head, [], budgets) == []
    with pytest.raises(ValueError, match="budget must be >= 1"):
        simulate_tau(tiny_drafter, tiny_head, items, (0,))
