"""Drafter config parsing: layouts of released checkpoints and the default target_layer_ids rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_eval.drafter import DrafterConfig, default_target_layer_ids
from dflash_eval.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
}


def test_default_layer_ids_match_released_qwen3_8b() -> None:
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(8, 1) == [4]
    assert default_target_layer_ids(8, 3) == [1, 3, 5]


def test_block_size_top_level_or_nested() -> None:
    top = DrafterConfig.from_dict({**BASE, "block_size": 16,
                                   "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]}})
    nested = DrafterConfig.from_dict({**BASE,
                                      "dflash_config": {"block_size": 8, "mask_token_id": 5, "target_layer_ids": [1]}})
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
    cfg = DrafterConfig.from_dict({**BASE, "block_size": 8,
                                   "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 2]}})
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


def _nested(**dflash) -> dict:
    return {**BASE, "block_size": 8, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1], **dflash}}


@pytest.mark.parametrize("key, value, sglang", [
    ("attention_value_scale", 0.707, "scales the attention values V"),
    ("attention_sink_bias", True, "sink logit"),
    ("conv_kernel_size", 2, "grouped convolution"),
    ("selector_rank", 8, "low-rank selector"),
    ("projector_type", "domino", "replaces the fc + hidden_norm projection"),
])
def test_dflash_config_key_sglang_implements_is_refused(key: str, value: object, sglang: str) -> None:
    """A key SGLang's DFlash parser implements and this evaluator does not: one error naming the key, the file and
    what SGLang does with it."""
    with pytest.raises(ConfigError) as err:
        DrafterConfig.from_dict(_nested(**{key: value}), source="d/config.json")
    msg = str(err.value)
    assert f"'dflash_config.{key}'" in msg and "d/config.json" in msg and sglang in msg and "dflash_utils.py" in msg


def test_unknown_dflash_config_key_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"d/config.json: 'dflash_config' key\(s\) \['frobnicate'\]"):
        DrafterConfig.from_dict(_nested(frobnicate=3), source="d/config.json")


def test_dflash_config_keys_at_their_neutral_value_are_accepted() -> None:
    """Keys that change nothing at these values (SGLang's defaults) are accepted, and read keys are used."""
    cfg = DrafterConfig.from_dict(_nested(conv_kernel_size=0, conv_group_size=0, selector_rank=0, selector_top_k=0,
                                          attention_sink_bias=False, attention_value_scale=None, output_multiplier=1.0,
                                          final_logit_softcapping=0, projector_type=None, num_target_layers=12,
                                          mask_token="<|mask|>"))
    assert cfg.num_target_layers == 12 and cfg.mask_token == "<|mask|>"
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg  # mask_token survives the round trip


def _vocabulary():  # type: ignore[no-untyped-def]
    from dflash_eval.drafter import TargetVocabulary

    return TargetVocabulary(ROOT / "fixtures" / "target", 4096)


def test_missing_mask_token_id_falls_back_to_the_tokenizer_as_sglang_does() -> None:
    """dflash_config.mask_token names the bundled tokenizer's own mask token ``<|mask|>`` (id 1): the id comes from the
    tokenizer, with a warning that says so."""
    data = {**BASE, "vocab_size": 4096, "block_size": 8,
            "dflash_config": {"mask_token": "<|mask|>", "target_layer_ids": [1]}}
    with pytest.warns(UserWarning, match=r"no 'dflash_config.mask_token_id': using id 1, the target tokenizer's mask "
                                         r"token '<\|mask\|>'.*dflash_worker.py"):
        cfg = DrafterConfig.from_dict(data, source="d/config.json", vocabulary=_vocabulary())
    assert cfg.mask_token_id == 1


def test_missing_mask_token_id_sglang_cannot_resolve_is_one_error() -> None:
    """No mask_token: SGLang looks up ``<|MASK|>``, which the bundled tokenizer lacks (its mask token is ``<|mask|>``),
    and it cannot append a token: the embedding has no free row. One error naming both tokens and what to set."""
    data = {**BASE, "vocab_size": 4096, "block_size": 8, "dflash_config": {"target_layer_ids": [1]}}
    with pytest.raises(ConfigError) as err:
        DrafterConfig.from_dict(data, source="d/config.json", vocabulary=_vocabulary())
    msg = str(err.value)
    assert "d/config.json" in msg and "'<|MASK|>'" in msg and "'<|mask|>' (id 1)" in msg
    assert "4096 rows" in msg and "set dflash_config.mask_token_id" in msg


def test_missing_mask_token_id_appends_where_the_embedding_has_a_free_row() -> None:
    """As SGLang: a token the tokenizer lacks is appended as its next id when the embedding has a row for it (the
    layout of Qwen3 targets, whose embedding has padding rows past the tokenizer)."""
    from dflash_eval.drafter import TargetVocabulary, resolve_mask_token_id

    wider = TargetVocabulary(ROOT / "fixtures" / "target", 4160)
    assert resolve_mask_token_id(wider, None, source="d/config.json")[0] == 4096
