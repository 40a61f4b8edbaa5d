"""Drafter config parsing: layouts of released checkpoints and the default target_layer_ids rule."""

from __future__ import annotations

import pytest

from dflash_eval.drafter import DrafterConfig, default_target_layer_ids
from dflash_eval.errors import ConfigError

BASE = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
}


def test_default_layer_ids_match_released_qwen3_8b() -> None:
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(8, 1) == [4]
    assert default_target_layer_ids(8, 3) == [1, 3, 5]


def test_block_size_top_level_or_nested() -> None:
    top = DrafterConfig.from_dict({**BASE, "block_size": 16, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]}})
    nested = DrafterConfig.from_dict({**BASE, "dflash_config": {"block_size": 8, "mask_token_id": 5, "target_layer_ids": [1]}})
    assert (top.block_size, nested.block_size) == (16, 8)


def test_default_rule_used_when_layer_ids_absent() -> None:
    """As the reference: the number of features is the drafter's num_hidden_layers."""
    cfg = DrafterConfig.from_dict({**BASE, "num_hidden_layers": 5, "block_size": 16, "num_target_layers": 36,
                                   "dflash_config": {"mask_token_id": 5}})
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33)
    cfg = DrafterConfig.from_dict({**BASE, "block_size": 16, "dflash_config": {"mask_token_id": 5}},
                                  num_target_layers=8)
    assert cfg.target_layer_ids == (4,)


def test_round_trip_through_released_layout() -> None:
    cfg = DrafterConfig.from_dict({**BASE, "block_size": 8, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 2]}})
    d = cfg.to_dict()
    assert d["architectures"] == ["DFlashDraftModel"] and d["dflash_config"]["target_layer_ids"] == [1, 2]
    assert DrafterConfig.from_dict(d) == cfg


@pytest.mark.parametrize("drop", ["hidden_size", "vocab_size"])
def test_missing_field_is_named(drop: str) -> None:
    data = {**BASE, "block_size": 8, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]}}
    del data[drop]
    with pytest.raises(ConfigError, match=drop):
        DrafterConfig.from_dict(data, source="x/config.json")


def test_missing_block_size_and_mask() -> None:
    with pytest.raises(ConfigError, match="block_size"):
        DrafterConfig.from_dict({**BASE, "dflash_config": {"mask_token_id": 1, "target_layer_ids": [1]}})
    with pytest.raises(ConfigError, match="mask_token_id"):
        DrafterConfig.from_dict({**BASE, "block_size": 8, "dflash_config": {"target_layer_ids": [1]}})
