"""Reading drafter checkpoints (released layout and .pt) and the architecture checks against the target."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from dflash_eval.drafter import (
    DFlashDrafter,
    TargetSpec,
    build_drafter,
    compare_architectures,
    read_checkpoint,
    run_checks,
)
from dflash_eval.errors import ArchitectureMismatch, CheckpointError, ConfigError


def _status(checks, name):  # type: ignore[no-untyped-def]
    return next(c for c in checks if c.name == name)


def test_released_layout_round_trip(tiny_drafter_dir: Path, tiny_drafter: DFlashDrafter, tiny_target) -> None:  # type: ignore[no-untyped-def]
    ckpt = read_checkpoint(tiny_drafter_dir)
    spec = TargetSpec.from_target(tiny_target)
    checks = run_checks(ckpt, spec)  # the tiny target's spec has no tokenizer: the mask-token comparison skips
    assert all(c.status == ("skip" if c.name == "mask_token_match" else "pass") for c in checks), checks
    model = build_drafter(ckpt, dtype="fp32", spec=spec)
    for k, v in tiny_drafter.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


@pytest.mark.parametrize("layout", ["top", "model", "state_dict", "module_prefix", "embedded_config"])
def test_training_pt_layouts(layout: str, tiny_drafter: DFlashDrafter, tiny_drafter_dir: Path, tmp_path: Path) -> None:
    sd = tiny_drafter.state_dict()
    cfg_dict = tiny_drafter.config.to_dict()
    obj: dict = {
        "top": dict(sd),
        "model": {"model": sd, "step": 100},
        "state_dict": {"state_dict": sd, "optimizer_step": 3},
        "module_prefix": {"model": {f"module.{k}": v for k, v in sd.items()}},
        "embedded_config": {"model": sd, "config": cfg_dict},
    }[layout]
    pt = tmp_path / "ckpt.pt"
    torch.save(obj, pt)
    cfg_path = None if layout == "embedded_config" else tiny_drafter_dir / "config.json"
    ckpt = read_checkpoint(pt, config_path=cfg_path)
    assert set(ckpt.state_dict) == set(sd)
    assert ckpt.config.target_layer_ids == tiny_drafter.config.target_layer_ids


def test_pt_without_config_is_a_clear_error(tiny_drafter: DFlashDrafter, tmp_path: Path) -> None:
    pt = tmp_path / "bare.pt"
    torch.save(tiny_drafter.state_dict(), pt)
    with pytest.raises(ConfigError, match="--drafter-config"):
        read_checkpoint(pt)


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    pt = tmp_path / "evil.pt"

    with open(pt, "wb") as fh:  # a pickle that would construct an arbitrary object (collections.OrderedDict subclass)
        pickle.dump({"model": {"fc.weight": Path("/etc/passwd")}}, fh)
    with pytest.raises(CheckpointError, match="weights_only"):
        read_checkpoint(pt)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        read_checkpoint(tmp_path / "nope")


def test_truncated_safetensors(tiny_drafter_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(tiny_drafter_dir, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(bad)


def _mutated(tiny_drafter_dir: Path, tmp_path: Path, *, sd_edit=None, cfg_edit=None) -> Path:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    out = tmp_path / "mut"
    shutil.copytree(tiny_drafter_dir, out)
    sd = load_file(str(out / "model.safetensors"))
    if sd_edit:
        sd = sd_edit(sd)
        save_file(sd, str(out / "model.safetensors"))
    if cfg_edit:
        cfg = json.loads((out / "config.json").read_text())
        cfg_edit(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_fc_transposed_named(tiny_drafter_dir: Path, tmp_path: Path, tiny_target) -> None:  # type: ignore[no-untyped-def]
    def edit(sd):  # type: ignore[no-untyped-def]
        sd["fc.weight"] = sd["fc.weight"].t().contiguous()
        return sd

    ckpt = read_checkpoint(_mutated(tiny_drafter_dir, tmp_path, sd_edit=edit))
    c = _status(run_checks(ckpt, TargetSpec.from_target(tiny_target)), "fc_shape")
    assert c.status == "fail" and "transposed" in c.message and "fc.weight" in c.message
    with pytest.raises(ArchitectureMismatch, match="fc_shape"):
        build_drafter(ckpt, spec=TargetSpec.from_target(tiny_target))


def test_fc_sized_for_other_layer_count(tiny_drafter_dir: Path, tmp_path: Path, tiny_target) -> None:  # type: ignore[no-untyped-def]
    def edit(cfg):  # type: ignore[no-untyped-def]
        cfg["dflash_config"]["target_layer_ids"] = [0, 1]

    ckpt = read_checkpoint(_mutated(tiny_drafter_dir, tmp_path, cfg_edit=edit))
    c = _status(run_checks(ckpt, TargetSpec.from_target(tiny_target)), "fc_shape")
    assert c.status == "fail" and "sized for 3 target layers" in c.message


def test_layer_ids_out_of_range_and_last_layer(tiny_drafter_dir: Path, tmp_path: Path, tiny_target) -> None:  # type: ignore[no-untyped-def]
    n = tiny_target.num_layers

    def edit(cfg):  # type: ignore[no-untyped-def]
        cfg["dflash_config"]["target_layer_ids"] = [0, n - 1, n + 2]

    checks = run_checks(read_checkpoint(_mutated(tiny_drafter_dir, tmp_path, cfg_edit=edit)),
                        TargetSpec.from_target(tiny_target))
    assert _status(checks, "target_layer_ids_range").status == "fail"
    assert str(n + 2) in _status(checks, "target_layer_ids_range").message
    assert _status(checks, "target_layer_ids_last_layer").status == "warn"


def test_hidden_mask_block_and_keys(tiny_drafter_dir: Path, tmp_path: Path, tiny_target) -> None:  # type: ignore[no-untyped-def]
    def cfg_edit(cfg):  # type: ignore[no-untyped-def]
        cfg["dflash_config"]["mask_token_id"] = 10**6
        cfg["dflash_config"]["block_size"] = 1
        cfg["block_size"] = 1

    def sd_edit(sd):  # type: ignore[no-untyped-def]
        sd.pop("norm.weight")
        sd["extra.weight"] = torch.zeros(2)
        return sd

    with pytest.warns(UserWarning, match=r"'extra.weight' \[2\] \(no parameter of the drafter has this name\)"):
        ckpt = read_checkpoint(_mutated(tiny_drafter_dir, tmp_path, cfg_edit=cfg_edit, sd_edit=sd_edit))
    spec = TargetSpec.from_target(tiny_target)
    checks = run_checks(ckpt, spec)
    assert _status(checks, "mask_token_id").status == "fail"
    assert _status(checks, "block_size").status == "fail"
    keys = _status(checks, "state_dict_keys")
    assert keys.status == "fail" and "norm.weight" in keys.message and "extra.weight" in keys.message
    other = TargetSpec(spec.num_layers, spec.hidden_size * 2, spec.vocab_size)
    assert _status(run_checks(ckpt, other), "hidden_size").status == "fail"


def test_compare_architectures_lists_every_difference(tiny_drafter_dir: Path, tmp_path: Path) -> None:
    def edit(cfg):  # type: ignore[no-untyped-def]
        cfg["num_hidden_layers"] = 2

    ours = read_checkpoint(tiny_drafter_dir)
    ref = read_checkpoint(_mutated(tiny_drafter_dir, tmp_path, cfg_edit=edit))
    diffs = compare_architectures(ours, ref)
    assert any("num_hidden_layers" in d for d in diffs)
    assert compare_architectures(ours, ours) == []


def test_vocab_size_checked_in_config_and_vocab_sized_tensors(tiny_drafter_dir: Path, tmp_path: Path,
                                                              tiny_target) -> None:  # type: ignore[no-untyped-def]
    spec = TargetSpec.from_target(tiny_target)
    assert _status(run_checks(read_checkpoint(tiny_drafter_dir), spec), "vocab_size").status == "pass"

    def cfg_edit(cfg):  # type: ignore[no-untyped-def]
        cfg["vocab_size"] = 2 * spec.vocab_size

    c = _status(run_checks(read_checkpoint(_mutated(tiny_drafter_dir, tmp_path / "a", cfg_edit=cfg_edit)), spec),
                "vocab_size")
    assert c.status == "fail" and f"'vocab_size' {2 * spec.vocab_size} != target vocabulary size {spec.vocab_size}" \
        in c.message

    def sd_edit(sd):  # type: ignore[no-untyped-def]
        sd["embed_tokens.weight"] = torch.zeros(spec.vocab_size + 7, spec.hidden_size)
        return sd

    with pytest.warns(UserWarning, match="'embed_tokens.weight'"):  # skipped as SGLang skips it, still a vocabulary
        ckpt = read_checkpoint(_mutated(tiny_drafter_dir, tmp_path / "b", sd_edit=sd_edit))
    c = _status(run_checks(ckpt, spec), "vocab_size")
    assert c.status == "fail" and "'embed_tokens.weight'" in c.message and str(spec.vocab_size + 7) in c.message
    with pytest.raises(ArchitectureMismatch, match="vocab_size"):
        build_drafter(ckpt, spec=spec)


def test_unsupported_architecture_refused_when_read(tiny_drafter_dir: Path, tmp_path: Path) -> None:
    def edit(cfg):  # type: ignore[no-untyped-def]
        cfg["architectures"] = ["DFlash2DraftModel"]

    with pytest.raises(ConfigError, match="DFlash2DraftModel") as err:
        read_checkpoint(_mutated(tiny_drafter_dir, tmp_path, cfg_edit=edit))
    assert "config.json" in str(err.value)
