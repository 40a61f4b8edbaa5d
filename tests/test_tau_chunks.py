"""Prompt chunks of bounded memory: τ, DDTree τ and the drift budget's ladder identical to one unchunked run, each
prompt's features loaded only for its chunk, sizes parsed and chunks planned as documented."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch

from dflash_eval.drafter import TargetSpec, build_drafter, read_checkpoint
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.drift_budget import measure_ladder, parse_ladder
from dflash_eval.metrics.tau import simulate_tau
from dflash_eval.metrics.tau_chunks import LazyItems, bytes_per_token, format_memory, parse_memory, plan_chunks
from dflash_eval.target.generation import greedy_generate_batch
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.loader import load_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def bundled() -> tuple:  # type: ignore[type-arg]
    """The bundled trained target and drafter, and 6 prompts with their greedy completions and per-layer features
    (a trained drafter: τ well above 1, so a difference would show)."""
    target = load_target(FIXTURES / "target", device="cpu", dtype="fp32")
    head = TargetHead.from_model(target.model)
    drafter = build_drafter(read_checkpoint(FIXTURES / "drafter"), dtype="fp32", spec=TargetSpec.from_target(target))
    texts = [json.loads(x)["text"] for x in (FIXTURES / "prompts.jsonl").read_text().splitlines() if x.strip()][:6]
    ids = [target.tokenizer(t, add_special_tokens=False)["input_ids"][:40 + 7 * n] for n, t in enumerate(texts)]
    outs = greedy_generate_batch(target, ids, 24, backend="torch")
    prompts = []
    for n, (p, o) in enumerate(zip(ids, outs)):
        seq = torch.tensor(p + list(o), dtype=torch.long)
        feats = layer_features(target.model, seq, list(drafter.config.target_layer_ids))
        prompts.append((f"p{n}", feats, seq, len(p)))
    return drafter, head, prompts


def _items(drafter, prompts):  # type: ignore[no-untyped-def]
    layers = drafter.config.target_layer_ids
    return [(torch.cat([f[i] for i in layers], -1), seq, plen) for _, f, seq, plen in prompts]


def test_memory_sizes_parse_with_units_and_refuse_anything_else() -> None:
    assert parse_memory("1GiB") == parse_memory("1g") == parse_memory("1024 MiB") == 1 << 30
    assert parse_memory("1.5GB") == 1_500_000_000 and parse_memory("512") == 512 and parse_memory(64) == 64
    for bad in ("lots", "1 XB", "-1G", "0"):
        with pytest.raises(ConfigError, match="--chunk-memory"):
            parse_memory(bad)
    assert format_memory(1 << 30) == "1 GiB" and format_memory(3 << 19) == "1.5 MiB" and format_memory(7) == "7 B"


def test_chunks_fit_the_budget_longest_first_and_hold_at_least_one_prompt() -> None:
    lengths = [10, 40, 30, 40, 5]
    assert plan_chunks(lengths, 1, None) == [[0, 1, 2, 3, 4]]
    assert plan_chunks(lengths, 1, 80) == [[1, 3], [2, 0], [4]]  # 2 x 40 <= 80; 30 then 2 x 30 <= 80, 3 x 30 not
    assert plan_chunks(lengths, 10, 1) == [[1], [3], [2], [0], [4]]  # over budget alone: one prompt a chunk
    assert plan_chunks([], 1, 80) == []


def test_chunked_tau_equals_one_simulation_and_loads_one_chunk_at_a_time(bundled) -> None:  # type: ignore[no-untyped-def]
    drafter, head, prompts = bundled
    items = _items(drafter, prompts)
    whole = simulate_tau(drafter, head, items, (4, 8))
    assert max(s.chain.tau for s in whole) > 1.5  # the trained drafter accepts drafts: the comparison means something
    alive: weakref.WeakSet = weakref.WeakSet()  # type: ignore[type-arg]
    peak, positions = [0], []
    per_token = bytes_per_token(drafter)
    budget = 2 * max(int(t.shape[0]) for _, t, _ in items) * per_token  # two prompts a chunk

    def load(i: int):  # type: ignore[no-untyped-def]
        gc.collect()
        peak[0] = max(peak[0], len(alive) + 1)
        f = items[i][0].clone()
        alive.add(f)
        return f, items[i][1], items[i][2]

    lazy = LazyItems([int(t.shape[0]) for _, t, _ in items], load)
    chunked = simulate_tau(drafter, head, lazy, (4, 8), memory=budget, progress=positions.append)
    for a, b in zip(whole, chunked):
        assert a.chain.accept_lengths == b.chain.accept_lengths
        assert {k: v.accept_lengths for k, v in a.ddtree.items()} == {k: v.accept_lengths for k, v in b.ddtree.items()}
        assert a.drafted == b.drafted
    assert peak[0] <= 2  # the features of one chunk (two prompts) at a time, the others let go
    total = sum(int(t.shape[0]) - 1 - p for _, t, p in items)
    assert positions == sorted(positions) and positions[-1] == total and len(positions) > len(items)


def test_chunked_drift_ladder_equals_the_unchunked_one(bundled) -> None:  # type: ignore[no-untyped-def]
    drafter, head, prompts = bundled
    ladder = parse_ladder("1e-3,3e-2,0.3,fp16")
    base = [s.chain.tau for s in simulate_tau(drafter, head, _items(drafter, prompts))]
    whole = measure_ladder(drafter, head, prompts, ladder, base_tau=base, seed=1, memory=None)
    seen: list[int] = []
    one = measure_ladder(drafter, head, prompts, ladder, base_tau=base, seed=1, memory=1, progress=seen.append)
    assert one == whole
    assert any(abs(t - b) > 0 for t, b in zip(whole[0][2], base))  # the largest noise moved τ: not trivial
    lazy = LazyItems([int(p[2].shape[0]) for p in prompts], lambda i: prompts[i])
    assert measure_ladder(drafter, head, lazy, ladder, base_tau=base, seed=1, memory=3 << 20) == whole
    total = len(ladder) * sum(int(t.shape[0]) - 1 - p for _, _, t, p in prompts)
    assert seen == sorted(seen) and seen[-1] == total


def test_a_second_feature_side_is_counted_per_token(bundled) -> None:  # type: ignore[no-untyped-def]
    drafter, _, _ = bundled
    cfg = drafter.config
    read = len(cfg.target_layer_ids) * int(cfg.hidden_size) * 4  # one side's fp32 features of a token
    assert bytes_per_token(drafter, sides=2) - bytes_per_token(drafter) == read
