"""The drafter's attention pattern: context strictly before the block, non-causal block, absolute RoPE; context
keys and values computed once serve any later forward."""

from __future__ import annotations

import torch

from dflash_eval.drafter import DFlashDrafter

H = 64


def _inputs(d: DFlashDrafter, t: int = 20, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, t, d.config.num_features * H, generator=g)
    block = torch.randn(1, 1, d.block_size, H, generator=g)
    return feats, block


def test_context_strictly_before_start(tiny_drafter: DFlashDrafter) -> None:
    feats, block = _inputs(tiny_drafter)
    start = torch.tensor([[12]])
    base = tiny_drafter(block, tiny_drafter.project_context(feats), start)
    later = feats.clone()
    later[:, 12:] += 5.0  # positions >= start must be invisible
    assert torch.allclose(base, tiny_drafter(block, tiny_drafter.project_context(later), start), atol=1e-6)
    earlier = feats.clone()
    earlier[:, 11] += 5.0  # position start - 1 is visible
    assert not torch.allclose(base, tiny_drafter(block, tiny_drafter.project_context(earlier), start), atol=1e-4)


def test_block_is_not_causal(tiny_drafter: DFlashDrafter) -> None:
    feats, block = _inputs(tiny_drafter)
    ctx = tiny_drafter.project_context(feats)
    start = torch.tensor([[10]])
    base = tiny_drafter(block, ctx, start)
    changed = block.clone()
    changed[0, 0, -1] += 3.0  # the last slot influences the first ones
    assert not torch.allclose(base[0, 0, 0], tiny_drafter(changed, ctx, start)[0, 0, 0], atol=1e-4)


def test_absolute_positions_matter(tiny_drafter: DFlashDrafter) -> None:
    feats, block = _inputs(tiny_drafter)
    ctx = tiny_drafter.project_context(feats)
    a = tiny_drafter(block, ctx, torch.tensor([[10]]), context_len=torch.tensor([[10]]))
    b = tiny_drafter(block, ctx, torch.tensor([[15]]), context_len=torch.tensor([[10]]))
    assert not torch.allclose(a, b, atol=1e-4)


def test_batched_rounds_equal_single_rounds(tiny_drafter: DFlashDrafter) -> None:
    feats, _ = _inputs(tiny_drafter, t=30)
    ctx = tiny_drafter.project_context(feats)
    blocks = torch.randn(1, 4, tiny_drafter.block_size, H)
    starts = torch.tensor([[3, 9, 17, 29]])
    together = tiny_drafter(blocks, ctx, starts)
    for r in range(4):
        alone = tiny_drafter(blocks[:, r:r + 1], ctx[:, : int(starts[0, r])], starts[:, r:r + 1])
        torch.testing.assert_close(together[:, r:r + 1], alone, atol=1e-5, rtol=1e-5)


def test_precomputed_context_keys_and_values_are_the_context(tiny_drafter: DFlashDrafter) -> None:
    feats = torch.randn(3, 25, tiny_drafter.config.num_features * H, generator=torch.Generator().manual_seed(4))
    ctx = tiny_drafter.project_context(feats)
    blocks = torch.randn(2, 3, tiny_drafter.block_size, H)
    starts = torch.tensor([[4, 11, 24], [7, 8, 20]])
    kv = tiny_drafter.context_kv(ctx)
    assert kv.length == 25 and len(kv.layers) == tiny_drafter.config.num_hidden_layers
    pick = torch.tensor([2, 0])  # contexts 2 and 0, in that order
    want = tiny_drafter(blocks, ctx[pick], starts)
    torch.testing.assert_close(tiny_drafter(blocks, kv.select(pick), starts), want, atol=1e-6, rtol=1e-6)
    other = tiny_drafter(blocks, kv.select(torch.tensor([1, 0])), starts)
    assert not torch.allclose(other[0], want[0], atol=1e-4)  # select really picks the contexts


def test_key_names_match_released_layout(tiny_drafter: DFlashDrafter) -> None:
    keys = set(tiny_drafter.state_dict())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= keys
    for suffix in ("self_attn.q_proj.weight", "self_attn.k_norm.weight", "mlp.down_proj.weight",
                   "input_layernorm.weight"):
        assert f"layers.0.{suffix}" in keys
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in keys)
