"""The checkpoint layouts SGLang's DFlash loader accepts load here by its rules (dflash_eval.drafter.weight_names),
one test per rule, each on a copy of the bundled drafter rewritten with safetensors:

- accepted, with the bundled drafter's weights and fingerprint (so τ is unchanged): an extra ``embed_tokens.weight``,
  ``lm_head.weight``, unknown key, RoPE cache, layer past ``num_hidden_layers`` or attention bias the config does not
  have (skipped, named in one warning and in the ``state_dict_keys`` check's message); ``model.`` on some or all
  keys (removed key by key); fused ``qkv_proj`` / ``gate_up_proj`` tensors (split in SGLang's order); a training
  wrapper's ``module.`` on every key beside ``model.`` on some;
- refused by the ``state_dict_keys`` or ``fc_shape`` check, naming the keys: two keys loading one parameter, a
  missing weight (which SGLang would load silently without it), a fused tensor that does not split, a wrong
  ``fc.weight`` shape (SGLang refuses it too);
- a config without ``mask_token_id``: resolved from the target tokenizer as SGLang's worker does, with a warning
  naming the id; without tokenizer files, one error saying what to set.

Run: ``pytest tests/test_checkpoint_layouts.py -n 0``
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_eval.drafter import (
    CHECKS,
    Checkpoint,
    TargetSpec,
    TargetVocabulary,
    build_drafter,
    checkpoint_from_state_dict,
    read_checkpoint,
    run_checks,
)
from dflash_eval.errors import ConfigError, DrafterRefused

ROOT = Path(__file__).resolve().parents[1]
DRAFTER, TARGET = ROOT / "fixtures" / "drafter", ROOT / "fixtures" / "target"
SPEC = TargetSpec(num_layers=8, hidden_size=256, vocab_size=4096)  # the bundled target (no tokenizer: that check skips)
SD = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def bundled() -> Checkpoint:
    return read_checkpoint(DRAFTER)


@pytest.fixture(scope="module")
def bundled_built(bundled: Checkpoint) -> SD:
    """The bundled drafter's weights as built for the target."""
    return build_drafter(bundled, spec=SPEC).state_dict()


def _variant(tmp_path: Path, edit: Callable[[SD], SD] | None = None, cfg_edit=None) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the bundled drafter with its tensors (and config) rewritten."""
    out = tmp_path / "variant"
    shutil.copytree(DRAFTER, out)
    if edit is not None:
        save_file(edit(load_file(str(out / "model.safetensors"))), str(out / "model.safetensors"),
                  metadata={"format": "pt"})
    if cfg_edit is not None:
        cfg = json.loads((out / "config.json").read_text())
        cfg_edit(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def _read(path: Path, **kwargs) -> tuple[Checkpoint, list[str]]:  # type: ignore[no-untyped-def]
    """The checkpoint and the messages of the warnings reading it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = read_checkpoint(path, **kwargs)
    return ckpt, [str(w.message) for w in caught]


def _check(ckpt: Checkpoint, name: str):  # type: ignore[no-untyped-def]
    return CHECKS[name](ckpt, SPEC)


def _fused(sd: SD) -> SD:
    """q/k/v and gate/up stacked into one tensor each, in SGLang's order (as a converter for SGLang writes them)."""
    out = {k: v for k, v in sd.items() if not any(f".{p}." in k for p in ("q_proj", "k_proj", "v_proj", "gate_proj",
                                                                          "up_proj"))}
    for k in [k for k in sd if ".q_proj." in k]:
        out[k.replace("q_proj", "qkv_proj")] = torch.cat([sd[k], sd[k.replace("q_proj", "k_proj")],
                                                          sd[k.replace("q_proj", "v_proj")]])
    for k in [k for k in sd if ".gate_proj." in k]:
        out[k.replace("gate_proj", "gate_up_proj")] = torch.cat([sd[k], sd[k.replace("gate_proj", "up_proj")]])
    return out


def _row(n: int) -> torch.Tensor:
    return torch.zeros(n, 256, dtype=torch.bfloat16)


#: (id, edit, {key skipped: why}, a phrase of the state_dict_keys message); every case loads the bundled weights.
ACCEPTED = [
    ("embed_tokens", lambda sd: {**sd, "embed_tokens.weight": _row(4096)},
     {"embed_tokens.weight": "an input embedding: the drafter embeds its block with the target's"},
     "1 key skipped as SGLang skips it (no drafter weight): 'embed_tokens.weight' [4096, 256]"),
    ("lm_head", lambda sd: {**sd, "lm_head.weight": _row(4096)},
     {"lm_head.weight": "an output head: the drafter's logits come from the target's lm_head"}, "'lm_head.weight'"),
    ("unknown_key", lambda sd: {**sd, "medusa_heads.0.weight": _row(4)},
     {"medusa_heads.0.weight": "no parameter of the drafter has this name"}, "'medusa_heads.0.weight' [4, 256]"),
    ("rotary_cache", lambda sd: {**sd, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(32)},
     {"model.layers.0.self_attn.rotary_emb.inv_freq": "a RoPE cache: the rotary tables are computed from the config"},
     "'model.layers.0.self_attn.rotary_emb.inv_freq' [32]"),
    ("layer_past_config", lambda sd: {**sd, "layers.2.input_layernorm.weight": torch.ones(256)},
     {"layers.2.input_layernorm.weight": "layer 2: the config has num_hidden_layers 2"},
     "'layers.2.input_layernorm.weight' [256]"),
    ("bias_without_attention_bias", lambda sd: {**sd, "layers.0.self_attn.q_proj.bias": torch.zeros(256)},
     {"layers.0.self_attn.q_proj.bias": "a bias: the config has attention_bias false"},
     "'layers.0.self_attn.q_proj.bias' [256]"),
    ("model_prefix_on_some_keys", lambda sd: {(f"model.{k}" if k.startswith(("layers.1.", "fc.")) else k): v
                                              for k, v in sd.items()},
     {}, "'model.' removed from 12 keys, key by key as SGLang does ('model.fc.weight'"),
    ("model_prefix_on_all_keys", lambda sd: {f"model.{k}": v for k, v in sd.items()}, {},
     "'model.' removed from 25 keys"),
    ("fused_qkv_and_gate_up", _fused, {},
     "4 fused tensors split into their parts as SGLang loads them ('layers.0.mlp.gate_up_proj.weight' into "
     "gate_proj/up_proj; 'layers.0.self_attn.qkv_proj.weight' into q_proj/k_proj/v_proj"),
    ("model_prefix_and_fused_and_embedding", lambda sd: {"model.embed_tokens.weight": _row(4096),
                                                         **{f"model.{k}": v for k, v in _fused(sd).items()}},
     {"model.embed_tokens.weight": "an input embedding"},
     "'model.' removed from 15 keys, key by key as SGLang does ('model.fc.weight', 'model.hidden_norm.weight', "
     "'model.layers.0.input_layernorm.weight' and 12 more); 4 fused tensors split into their parts as SGLang loads "
     "them ('model.layers.0.mlp.gate_up_proj.weight' into gate_proj/up_proj;"),
]


@pytest.mark.parametrize("edit, skipped, note", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_layout_sglang_accepts_loads_the_bundled_weights(edit, skipped, note, bundled: Checkpoint,  # type: ignore[no-untyped-def]
                                                         bundled_built: SD, tmp_path: Path) -> None:
    ckpt, caught = _read(_variant(tmp_path, edit))
    assert [s.key for s in ckpt.names.skipped] == sorted(skipped)
    if skipped:  # one warning, naming every skipped key and why
        assert len(caught) == 1 and "skipped, as SGLang's DFlash loader" in caught[0], caught
        assert all(f"'{k}' " in caught[0] and why in caught[0] for k, why in skipped.items()), caught
    else:
        assert caught == []
    checks = run_checks(ckpt, SPEC)
    assert all(c.status == ("skip" if c.name == "mask_token_match" else "pass") for c in checks), checks
    keys = _check(ckpt, "state_dict_keys")
    assert note in keys.message and all(why in keys.message for why in skipped.values()), keys.message
    # the same drafter weights as the bundled drafter: the same τ, the same cached results
    assert ckpt.fingerprint == bundled.fingerprint
    assert ckpt.state_dict.keys() == bundled.state_dict.keys()
    assert all(torch.equal(ckpt.state_dict[k], v) for k, v in bundled.state_dict.items())
    built = build_drafter(ckpt, spec=SPEC).state_dict()
    assert all(torch.equal(built[k], v) for k, v in bundled_built.items())


def test_bundled_drafter_reads_as_written(bundled: Checkpoint) -> None:
    """Nothing renamed, split or skipped; the message is the plain one."""
    assert bundled.names.notes() == [] and bundled.names.skipped == ()
    assert _check(bundled, "state_dict_keys").message == "all 25 keys present with the expected shapes"


def test_training_wrapper_prefix_beside_model_prefix(bundled: Checkpoint) -> None:
    """A state dict held in memory is read by the same rules: ``module.`` on every key (a DDP wrapper, removed as
    before), ``model.`` on some keys below it (removed key by key), an extra embedding skipped with the warning."""
    sd = load_file(str(DRAFTER / "model.safetensors"))
    wrapped = {f"module.{'model.' if k.startswith('layers.0.') else ''}{k}": v for k, v in sd.items()}
    wrapped["module.embed_tokens.weight"] = _row(4096)
    with pytest.warns(UserWarning, match=r"'module.embed_tokens.weight' \[4096, 256\] \(an input embedding"):
        ckpt = checkpoint_from_state_dict(wrapped, bundled.config, source="step-100")
    assert ckpt.fingerprint == bundled.fingerprint
    keys = _check(ckpt, "state_dict_keys")
    assert keys.status == "pass" and "prefix 'module.' removed from every key" in keys.message
    assert "'model.' removed from 11 keys" in keys.message and "'module.model.fc.weight'" not in keys.message


def test_two_keys_loading_one_parameter_are_refused_naming_both(tmp_path: Path) -> None:
    """``fc.weight`` and ``model.fc.weight`` both load fc.weight: SGLang keeps whichever it reads last; refused."""
    ckpt, caught = _read(_variant(tmp_path, lambda sd: {**sd, "model.fc.weight": sd["fc.weight"] * 2}))
    assert caught == []
    keys = _check(ckpt, "state_dict_keys")
    assert keys.status == "fail", keys
    assert "keys 'fc.weight' and 'model.fc.weight' both load fc.weight" in keys.message
    assert "keep the one it reads last" in keys.message
    with pytest.raises(DrafterRefused, match="state_dict_keys"):
        build_drafter(ckpt, spec=SPEC)


def test_fused_tensor_beside_its_split_part_is_refused(tmp_path: Path) -> None:
    def edit(sd: SD) -> SD:
        fused = _fused(sd)
        fused["layers.0.self_attn.q_proj.weight"] = sd["layers.0.self_attn.q_proj.weight"]
        return fused

    keys = _check(_read(_variant(tmp_path, edit))[0], "state_dict_keys")
    assert keys.status == "fail"
    assert ("keys 'layers.0.self_attn.q_proj.weight' and 'layers.0.self_attn.qkv_proj.weight' both load "
            "layers.0.self_attn.q_proj.weight") in keys.message


def test_missing_weight_is_refused_saying_sglang_would_serve_without_it(tmp_path: Path) -> None:
    ckpt, _ = _read(_variant(tmp_path, lambda sd: {k: v for k, v in sd.items() if k != "layers.1.mlp.up_proj.weight"}))
    keys = _check(ckpt, "state_dict_keys")
    assert keys.status == "fail"
    assert "missing keys ['layers.1.mlp.up_proj.weight']: SGLang would load this checkpoint without them" \
        in keys.message
    with pytest.raises(DrafterRefused, match=r"layers\.1\.mlp\.up_proj\.weight"):
        build_drafter(ckpt, spec=SPEC)


def test_fused_tensor_that_does_not_split_is_refused(tmp_path: Path) -> None:
    def edit(sd: SD) -> SD:
        fused = _fused(sd)
        fused["layers.1.mlp.gate_up_proj.weight"] = fused["layers.1.mlp.gate_up_proj.weight"][:-8]
        return fused

    keys = _check(_read(_variant(tmp_path, edit))[0], "state_dict_keys")
    assert keys.status == "fail"
    assert ("key 'layers.1.mlp.gate_up_proj.weight': [1528, 256] does not split into gate_proj/up_proj of 768/768 "
            "rows: expected [1536, 256]") in keys.message
    assert "missing keys" not in keys.message  # its parts are named once, by the tensor meant to load them


def test_wrong_fc_shape_is_refused_as_sglang_refuses_it(tmp_path: Path) -> None:
    ckpt, _ = _read(_variant(tmp_path, lambda sd: {**{k: v for k, v in sd.items() if k != "fc.weight"},
                                                   "model.fc.weight": sd["fc.weight"][:, :512].contiguous()}))
    fc = _check(ckpt, "fc_shape")
    assert fc.status == "fail" and "key 'model.fc.weight': expected [256, 768], got [256, 512]" in fc.message
    assert "sized for 2 target layers" in fc.message and "SGLang refuses to load it too" in fc.message
    with pytest.raises(DrafterRefused, match="fc_shape"):
        build_drafter(ckpt, spec=SPEC)


def _without_mask_id(cfg: dict) -> None:
    del cfg["dflash_config"]["mask_token_id"]
    cfg["dflash_config"]["mask_token"] = "<|mask|>"


def test_missing_mask_token_id_is_resolved_from_the_tokenizer(bundled: Checkpoint, tmp_path: Path) -> None:
    """``dflash_config.mask_token`` names the bundled tokenizer's mask token: SGLang's rule gives its id, 1 (the
    bundled drafter's), with one warning naming it."""
    ckpt, caught = _read(_variant(tmp_path, cfg_edit=_without_mask_id),
                         vocabulary=TargetVocabulary(TARGET, SPEC.vocab_size))
    assert ckpt.config.mask_token_id == bundled.config.mask_token_id == 1
    assert len(caught) == 1 and "no 'dflash_config.mask_token_id': using id 1" in caught[0], caught


@pytest.mark.parametrize("tokenizer", ["none_given", "no_tokenizer_files"])
def test_missing_mask_token_id_without_a_tokenizer_is_one_error(tokenizer: str, tmp_path: Path) -> None:
    """No tokenizer to resolve it from (none given, or a target directory without tokenizer files): one error that
    says what to set, and no warning before it."""
    bare = tmp_path / "target"
    bare.mkdir()
    shutil.copy(TARGET / "config.json", bare / "config.json")
    vocabulary = None if tokenizer == "none_given" else TargetVocabulary(bare, SPEC.vocab_size)
    d = _variant(tmp_path, cfg_edit=_without_mask_id)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ConfigError) as err:
        warnings.simplefilter("always")
        read_checkpoint(d, vocabulary=vocabulary)
    assert caught == []
    msg = str(err.value)
    assert msg.startswith(str(d / "config.json")) and "no 'dflash_config.mask_token_id'" in msg
    assert "set dflash_config.mask_token_id" in msg and msg.count("mask_token_id'") == 1
