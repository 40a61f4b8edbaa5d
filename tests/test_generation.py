"""Batched greedy generation: left-padded batches give one-at-a-time greedy ids on a hybrid target.

Run: ``pytest tests/test_generation.py -p no:cacheprovider``
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dflash_eval.target.generation import generation_groups, greedy_generate, greedy_generate_batch
from dflash_eval.target.loader import Target

# Lengths differ by up to 37 tokens: every batch below left-pads most rows, by more than the conv kernel.
PROMPTS = [list(range(5, 45)), list(range(60, 67)), [7, 3, 9, 11, 200, 14, 15, 3, 99, 41, 42, 43, 44],
           list(range(100, 130))]


def test_left_padded_batch_equals_one_at_a_time(tiny_target: Target) -> None:
    assert "linear_attention" in tiny_target.layer_types and "full_attention" in tiny_target.layer_types
    one = [greedy_generate(tiny_target, p, 12, backend="torch", stop_at_eos=False) for p in PROMPTS]
    batched = greedy_generate_batch(tiny_target, PROMPTS, 12, backend="torch", stop_at_eos=False)
    assert batched == one
    assert all(len(x) == 12 for x in batched)


def test_pad_tokens_do_not_reach_the_recurrent_state(tiny_target: Target) -> None:
    """Without the padding mask the linear-attention state would absorb the pad tokens: the same batch run with
    an all-ones mask (pads treated as text) must generate something else for the padded row."""
    short, long_ = PROMPTS[1], PROMPTS[0]
    want = greedy_generate(tiny_target, short, 8, backend="torch", stop_at_eos=False)
    got = greedy_generate_batch(tiny_target, [long_, short], 8, backend="torch", stop_at_eos=False)[1]
    assert got == want
    pad = 0
    ids = torch.tensor([[pad] * (len(long_) - len(short)) + short])
    with torch.no_grad():
        unmasked = tiny_target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                              do_sample=False, pad_token_id=pad)[0, ids.shape[1]:].tolist()
    assert unmasked != want  # the test can tell padding that leaks into the state from padding that does not


def test_rows_stop_after_their_own_eos(tiny_target: Target) -> None:
    free = [greedy_generate(tiny_target, p, 10, backend="torch", stop_at_eos=False) for p in PROMPTS]
    eos = free[0][3]  # a token the first row generates: that row must stop there, EOS included
    target = SimpleNamespace(model=tiny_target.model, device=tiny_target.device, eos_token_id=eos)
    one = [greedy_generate(target, p, 10, backend="torch") for p in PROMPTS]
    batched = greedy_generate_batch(target, PROMPTS, 10, backend="torch")
    assert batched == one
    assert batched[0] == free[0][:free[0].index(eos) + 1] and len(batched[0]) <= 4
    for row, full in zip(batched, free):
        if full[0] != eos:  # (EOS as the very first token is suppressed: min_new_tokens=1)
            assert row == (full[:full.index(eos) + 1] if eos in full else full)


def test_empty_input() -> None:
    assert greedy_generate_batch(SimpleNamespace(), [], 4) == []


def test_generation_groups_balance_padded_size_not_count() -> None:
    lengths = {f"long{i}": 600 for i in range(4)} | {f"short{i}": 100 for i in range(28)}
    a, b = generation_groups(lengths, 32, min_groups=2)
    assert a == [f"long{i}" for i in range(4)]  # the long prompts alone, the short ones together
    # by count it would be 16 + 16 (600 x 16 = 9600 padded tokens against 1600); balanced: 2400 + 2800
    assert (len(a) * 600, len(b) * 100) == (2400, 2800)


def test_generation_groups_are_balanced_sorted_and_deterministic() -> None:
    lengths = {f"p{i}": n for i, n in enumerate([5, 40, 12, 40, 7, 33, 21])}
    groups = generation_groups(lengths, 3)
    assert [len(g) for g in groups] == [2, 2, 3]  # ceil(7 / 3) = 3 batches, balanced by padded size
    padded = [len(g) * max(lengths[p] for p in g) for g in groups]
    assert max(padded) == 80  # [40, 40] | [33, 21] | [12, 7, 5]: no split into 3 batches of <= 3 does better
    assert sorted(p for g in groups for p in g) == sorted(lengths)
    flat = [lengths[p] for g in groups for p in g]
    assert flat == sorted(flat, reverse=True)  # longest first: similar lengths share a batch
    assert groups == generation_groups(dict(reversed(list(lengths.items()))), 3)
    assert generation_groups(lengths, 1) == [[p] for g in groups for p in g]
    assert generation_groups(lengths, 100) == [[p for g in groups for p in g]]
    assert generation_groups({}, 4) == []
    order = [p for g in groups for p in g]
    assert generation_groups(lengths, 100, min_groups=2) == [order[:3], order[3:]]  # one batch per xdist worker
    assert generation_groups(lengths, 1, min_groups=2) == generation_groups(lengths, 1)
    assert len(generation_groups({"a": 3}, 100, min_groups=2)) == 1  # never an empty batch
    with pytest.raises(ValueError, match="generation batch must be >= 1"):
        generation_groups(lengths, 0)
