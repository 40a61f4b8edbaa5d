"""TargetDir: the one reader of a target directory's config.json (text_config aware) and tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.target.loader import Target, TargetDir

TEXT = {"num_hidden_layers": 6, "hidden_size": 128, "vocab_size": 1000, "eos_token_id": [7, 8],
        "layer_types": ["linear_attention", "full_attention"] * 3, "tie_word_embeddings": True}


def _dir(tmp_path: Path, config: object | str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (tmp_path / "config.json").write_text(text)
    return tmp_path


def test_multimodal_config_reads_the_text_config(tmp_path: Path) -> None:
    d = TargetDir(_dir(tmp_path, {"architectures": ["Qwen3_5ForConditionalGeneration"], "eos_token_id": 9,
                                  "text_config": TEXT, "vision_config": {"hidden_size": 32, "depth": 2}}))
    assert (d.num_layers, d.hidden_size, d.vocab_size) == (6, 128, 1000)
    assert d.layer_types == TEXT["layer_types"]
    assert d.eos_token_id == 7  # the text config's, the first of a list
    assert d.tie_word_embeddings is True
    assert d.raw["vision_config"]["depth"] == 2 and d.text is d.raw["text_config"]


def test_flat_config_and_defaults(tmp_path: Path) -> None:
    d = TargetDir(_dir(tmp_path, {"num_hidden_layers": 2, "hidden_size": 8, "vocab_size": 50, "eos_token_id": 3}))
    assert (d.num_layers, d.hidden_size, d.vocab_size, d.eos_token_id) == (2, 8, 50, 3)
    assert d.layer_types == ["full_attention", "full_attention"]
    assert d.tie_word_embeddings is False


def test_config_json_is_read_once(tmp_path: Path) -> None:
    d = TargetDir(_dir(tmp_path, TEXT))
    assert d.num_layers == 6
    (tmp_path / "config.json").write_text("{not json")
    assert d.hidden_size == 128 and d.fingerprint() == TargetDir(_dir(tmp_path / "b", TEXT)).fingerprint()


def test_invalid_config_json_names_the_file(tmp_path: Path) -> None:
    d = TargetDir(_dir(tmp_path, '{"num_hidden_layers": 2,'))
    with pytest.raises(ConfigError, match="not valid JSON") as exc:
        d.num_layers  # noqa: B018
    assert str(tmp_path / "config.json") in str(exc.value)
    with pytest.raises(ConfigError, match="expected a JSON object") as exc:
        TargetDir(_dir(tmp_path / "list", "[1, 2]")).raw  # noqa: B018
    assert str(tmp_path / "list" / "config.json") in str(exc.value)


def test_missing_config_or_field_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no config.json") as exc:
        TargetDir(tmp_path).num_layers  # noqa: B018
    assert str(tmp_path) in str(exc.value)
    with pytest.raises(ConfigError, match="not found"):
        TargetDir(tmp_path / "nope").raw  # noqa: B018
    with pytest.raises(ConfigError, match="'hidden_size' in 'text_config'") as exc:
        TargetDir(_dir(tmp_path / "mm", {"text_config": {"num_hidden_layers": 2}})).hidden_size  # noqa: B018
    assert str(tmp_path / "mm" / "config.json") in str(exc.value)


def test_tokenizer_files_and_chat_template(tmp_path: Path) -> None:
    d = _dir(tmp_path, TEXT)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (d / "model.safetensors").write_bytes(b"weights")
    before = TargetDir(d).tokenizer_digest()
    assert TargetDir(d).chat_template_text() == "{{ messages }}"
    (d / "chat_template.jinja").write_text("jinja wins")
    assert TargetDir(d).chat_template_text() == "jinja wins"
    with_jinja = TargetDir(d).tokenizer_digest()
    assert with_jinja != before  # chat_template.* is a tokenizer file
    (d / "model.safetensors").write_bytes(b"other weights")
    assert TargetDir(d).tokenizer_digest() == with_jinja  # the weights are not
    assert [p.name for p in TargetDir(d).weight_files()] == ["model.safetensors"]
    assert TargetDir(_dir(tmp_path / "none", TEXT)).chat_template_text() is None


def test_loaded_target_agrees_with_its_directory(tiny_target: Target, tiny_target_dir: Path) -> None:
    d = TargetDir(tiny_target_dir)
    cfg = tiny_target.config
    assert tiny_target.num_layers == d.num_layers == cfg.num_hidden_layers
    assert tiny_target.hidden_size == d.hidden_size == cfg.hidden_size
    assert tiny_target.layer_types == d.layer_types
    assert tiny_target.identity() == d.fingerprint()
