"""The fixture build script runs end to end (miniature settings) and never touches the bundled fixtures/."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"


def _snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative path -> digest)."""
    out: dict[str, str] = {}
    if not folder.is_dir():
        return out
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.slow
def test_mini_build_runs_and_loads(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_eval.drafter import DFlashDrafter, load_config_file

    before = _snapshot(FIXTURES)
    out = tmp_path / "fx"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, str(FIXTURES / "build.py"), "--mini", "--out", str(out), "--seed", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800,  # a hang guard, not a speed check
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # fixtures/ untouched
    assert _snapshot(FIXTURES) == before

    # nothing but the artifacts left behind (the temporary build folder is gone)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "drafter", "prompts.jsonl", "target"]

    tok = AutoTokenizer.from_pretrained(str(out / "target"), local_files_only=True)
    assert tok.eos_token == "<|endoftext|>"
    mask_id = tok.convert_tokens_to_ids("<|mask|>")
    model = AutoModelForCausalLM.from_pretrained(str(out / "target"), local_files_only=True)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert model.config.model_type == "qwen3_5_text"
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]

    raw = json.loads((out / "drafter" / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"]
    assert raw["model_type"] == "qwen3"
    assert raw["dflash_config"]["mask_token_id"] == mask_id
    assert raw["dflash_config"]["block_size"] == 8
    cfg = load_config_file(out / "drafter" / "config.json")
    assert cfg.num_target_layers == 8 and len(cfg.target_layer_ids) >= 3
    sd = load_file(str(out / "drafter" / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= set(sd)
    assert all(k.split(".")[0] in {"fc", "hidden_norm", "norm", "layers"} for k in sd)
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)

    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert prompts and all({"id", "category", "text"} <= set(p) for p in prompts)
    readme = (out / "README.md").read_text()
    assert "sha256" in readme and "τ" in readme

    # one draft pass through the borrowed head works end to end
    from dflash_eval.drafter import block_ids, draft_logits
    from dflash_eval.target.head import TargetHead

    ids = torch.tensor(tok.encode(prompts[0]["text"]))
    with torch.no_grad():
        hs = model(input_ids=ids[None], output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1][0] for i in cfg.target_layer_ids], dim=-1)
        blocks = block_ids(ids[-2:], cfg.block_size, cfg.mask_token_id)[None]
        starts = torch.tensor([[ids.numel() - 2, ids.numel() - 1]])
        logits = draft_logits(drafter, TargetHead.from_model(model), drafter.project_context(feats)[None], blocks,
                              starts)[0]
    assert logits.shape == (2, 7, model.config.vocab_size)


def test_training_pieces() -> None:
    """Fast checks of the recipe's building blocks (no build)."""
    torch = pytest.importorskip("torch")
    from dflash_eval.testing.training import cosine_lr, default_gamma, sample_anchors, slot_weights

    w = slot_weights(8, default_gamma(8))
    assert w[0] == 0 and abs(float(w[1]) - 1.0) < 1e-6
    assert abs(float(w[5]) - float(torch.exp(torch.tensor(-1.0)))) < 1e-6
    assert default_gamma(16) == 7.0
    g = torch.Generator().manual_seed(0)
    a = sample_anchors(torch.tensor([3, 10]), torch.tensor([5, 10]), 50, g)
    assert a.shape == (2, 50) and int(a[0].min()) >= 3 and int(a[0].max()) <= 5 and bool((a[1] == 10).all())
    assert cosine_lr(0, 100, 10, 1.0) == pytest.approx(0.1) and cosine_lr(100, 100, 10, 1.0) == pytest.approx(0.1)
