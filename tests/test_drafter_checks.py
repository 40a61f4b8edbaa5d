"""The architecture checks that name a cause without failing: the mask token against the target's (tokenizer,
SGLang's lookup, embedding row) and an activation SGLang refuses; and a drafter config key SGLang implements but
this evaluator does not, refused when the checkpoint is read. All on copies of the bundled target and drafter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dflash_eval.drafter import CHECKS, TargetSpec, TargetVocabulary, read_checkpoint
from dflash_eval.drafter.vocabulary import OUTLIER_Z, read_tokenizer_facts, row_stat
from dflash_eval.errors import ConfigError
from dflash_eval.target.head import TargetHead

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"


@pytest.fixture(scope="module")
def spec() -> TargetSpec:
    head = TargetHead.from_pretrained(TARGET, dtype="fp32")
    return TargetSpec(num_layers=8, hidden_size=head.hidden_size, vocab_size=head.vocab_size,
                      vocabulary=TargetVocabulary(TARGET, head.vocab_size), embedding=head.embed_tokens.weight)


def _drafter(tmp_path: Path, **dflash: object) -> Path:
    """A copy of the bundled drafter with ``dflash_config`` entries replaced (None: removed)."""
    out = tmp_path / "drafter"
    shutil.copytree(DRAFTER, out)
    cfg = json.loads((out / "config.json").read_text())
    for k, v in dflash.items():
        cfg["dflash_config"].pop(k, None) if v is None else cfg["dflash_config"].__setitem__(k, v)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_tokenizer_facts_of_the_bundled_target() -> None:
    facts = read_tokenizer_facts(TARGET)
    assert (facts["size"], facts["mask_token"], facts["mask_token_id"]) == (4096, "<|mask|>", 1)
    assert facts["special_ids"] == [0, 1] and facts["lookups"] == {"<|MASK|>": None}


def test_bundled_mask_token_is_the_targets(spec: TargetSpec) -> None:
    c = CHECKS["mask_token_match"](read_checkpoint(DRAFTER), spec)
    assert c.status == "pass" and "mask token '<|mask|>'" in c.message and "looks untrained" in c.message


def test_mask_token_other_than_the_tokenizers_warns_naming_both_ids(spec: TargetSpec, tmp_path: Path) -> None:
    """mask_token_id 2 is a valid id (so mask_token_id passes) but not the tokenizer's mask token (id 1), and its row
    is an ordinary trained token's."""
    ckpt = read_checkpoint(_drafter(tmp_path, mask_token_id=2))
    assert CHECKS["mask_token_id"](ckpt, spec).status == "pass"
    c = CHECKS["mask_token_match"](ckpt, spec)
    assert c.status == "warn", c
    assert "mask_token_id' 2" in c.message and "'<|mask|>' is id 1" in c.message
    assert "looks like a trained token's" in c.message


def test_mask_token_conflicting_with_sglangs_lookup_warns(spec: TargetSpec, tmp_path: Path) -> None:
    """dflash_config.mask_token names the tokenizer's '<|mask|>' (id 1) but mask_token_id says 2: SGLang refuses to
    start with that config."""
    c = CHECKS["mask_token_match"](read_checkpoint(_drafter(tmp_path, mask_token_id=2, mask_token="<|mask|>")), spec)
    assert c.status == "warn" and "is id 1" in c.message and "refuses to start" in c.message


def test_embedding_row_of_the_mask_token_is_an_outlier(spec: TargetSpec) -> None:
    """The measure behind the row evidence, on the bundled target: the never-read mask row is far out of the ordinary
    tokens' cluster, an ordinary token's row inside it."""
    mask, ordinary = row_stat(spec.vocabulary, spec.embedding, 1), row_stat(spec.vocabulary, spec.embedding, 2)
    assert mask.z > OUTLIER_Z and not mask.looks_trained
    assert abs(ordinary.z) < 1 and ordinary.looks_trained
    assert mask.n == 4094  # the two special tokens are not part of the reference


def test_hidden_act_other_than_silu_warns_that_sglang_refuses_it(spec: TargetSpec, tmp_path: Path) -> None:
    d = _drafter(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_act"] = "gelu"
    (d / "config.json").write_text(json.dumps(cfg))
    ckpt = read_checkpoint(d)
    assert ckpt.config.hidden_act == "gelu"  # evaluated with it
    c = CHECKS["hidden_act"](ckpt, spec)
    assert c.status == "warn" and "'gelu'" in c.message and "models/dflash.py" in c.message
    assert CHECKS["hidden_act"](read_checkpoint(DRAFTER), spec).status == "pass"


def test_unknown_dflash_config_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    d = _drafter(tmp_path, attention_value_scale=0.707)
    with pytest.raises(ConfigError) as err:
        read_checkpoint(d)
    msg = str(err.value)
    assert str(d / "config.json") in msg and "'dflash_config.attention_value_scale' is 0.707" in msg
    assert "SGLang scales the attention values V" in msg


def test_missing_mask_token_id_falls_back_through_read_checkpoint(spec: TargetSpec, tmp_path: Path) -> None:
    d = _drafter(tmp_path, mask_token_id=None, mask_token="<|mask|>")
    with pytest.warns(UserWarning, match="using id 1"):
        ckpt = read_checkpoint(d, vocabulary=spec.vocabulary)
    assert ckpt.config.mask_token_id == 1
    with pytest.raises(ConfigError, match="no 'dflash_config.mask_token_id'"):
        read_checkpoint(d)  # no tokenizer to resolve it from
