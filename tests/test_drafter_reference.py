"""Drafter config fields read as the reference DFlash implementation reads them, checked on logits.

The reference (z-lab's ``DFlashDraftModel``) builds transformers' ``Qwen3Config`` from config.json and its layers
from transformers' Qwen3 modules. :func:`reference_hidden` rebuilds that forward here from those same modules
(``Qwen3Config``, ``Qwen3Attention`` projections and norms, ``Qwen3MLP``, ``Qwen3RMSNorm``,
``Qwen3RotaryEmbedding``, ``apply_rotary_pos_emb``, ``eager_attention_forward``) with the drafter's weights, and
each test compares the project's drafter with it for one config field, after checking that the field changes the
reference's output (so a drafter that ignored the field would fail).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from dflash_eval.drafter import DFlashDrafter, DrafterConfig
from dflash_eval.errors import ConfigError

H, HEADS, KV, HD, T, B = 64, 4, 2, 16, 40, 8

BASE: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
    "vocab_size": 50, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": False,
    "max_position_embeddings": 64, "num_target_layers": 8, "block_size": B,
    "dflash_config": {"mask_token_id": 1, "target_layer_ids": [1, 4]},
}


class _Layer(nn.Module):
    def __init__(self, cfg: Qwen3Config, i: int) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg, i)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class ReferenceDrafter(nn.Module):
    """The reference drafter's modules, named as its checkpoint keys, built from transformers' Qwen3 classes."""

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__()
        cfg = Qwen3Config(**copy.deepcopy(raw))
        self.cfg = cfg
        n_feat = len(raw["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n_feat * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(_Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(cfg)

    def forward(self, features: torch.Tensor, block: torch.Tensor, start: int) -> torch.Tensor:
        """features [1, T, L*H] (all positions), block [1, B, H] at positions start..start+B-1 -> [1, B, H]."""
        ctx = self.hidden_norm(self.fc(features[:, :start]))
        b = block.shape[1]
        x = block
        cos, sin = self.rotary_emb(x, torch.arange(start + b)[None])
        for layer in self.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x)
            hd = a.head_dim
            q = a.q_norm(a.q_proj(h).view(1, b, -1, hd)).transpose(1, 2)
            k = a.k_norm(torch.cat([a.k_proj(ctx), a.k_proj(h)], 1).view(1, start + b, -1, hd)).transpose(1, 2)
            v = torch.cat([a.v_proj(ctx), a.v_proj(h)], 1).view(1, start + b, -1, hd).transpose(1, 2)
            q, _ = apply_rotary_pos_emb(q, q, cos[:, -b:], sin[:, -b:])
            k, _ = apply_rotary_pos_emb(k, k, cos, sin)
            out, _ = eager_attention_forward(a, q, k, v, None, scaling=a.scaling)  # no mask: non-causal block
            x = x + a.o_proj(out.reshape(1, b, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def random_state(raw: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights (norms around 1, biases where the config asks for them) in the reference's key layout."""
    torch.manual_seed(seed)
    ref = ReferenceDrafter(raw)
    sd = {}
    for k, v in ref.state_dict().items():
        sd[k] = 1 + 0.2 * torch.randn_like(v) if k.endswith("norm.weight") else 0.2 * torch.randn_like(v)
    return sd


def inputs(raw: dict[str, Any], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    n_feat = len(raw["dflash_config"]["target_layer_ids"])
    return torch.randn(1, T, n_feat * H), torch.randn(1, raw.get("block_size", B), H)


def reference_out(raw: dict[str, Any], sd: dict[str, torch.Tensor], start: int) -> torch.Tensor:
    ref = ReferenceDrafter(raw)
    ref.load_state_dict(sd, strict=True)
    feats, block = inputs(raw)
    with torch.no_grad():
        return ref(feats, block, start)[0]


def ours_out(raw: dict[str, Any], sd: dict[str, torch.Tensor], start: int) -> torch.Tensor:
    model = DFlashDrafter(DrafterConfig.from_dict(copy.deepcopy(raw))).eval()
    model.load_state_dict(sd, strict=True)
    feats, block = inputs(raw)
    with torch.no_grad():
        return model(block[:, None], model.project_context(feats), torch.tensor([[start]]))[0, 0]


def _without(raw: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in keys}


# field -> (config as released, the same config as a reader ignoring the field would see it)
FIELDS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "rope_theta_missing": (_without(BASE, "rope_theta"), {**BASE, "rope_theta": 1_000_000.0}),
    "rope_scaling_yarn": ({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 16}}, BASE),
    "rope_parameters_linear": ({**_without(BASE, "rope_theta"),
                                "rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 500.0}},
                               {**BASE, "rope_theta": 500.0}),
    "rope_scaling_llama3": ({**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16}}, BASE),
    "hidden_act_gelu": ({**BASE, "hidden_act": "gelu"}, BASE),
    "hidden_act_gelu_pytorch_tanh": ({**BASE, "hidden_act": "gelu_pytorch_tanh"}, BASE),
    "attention_bias": ({**BASE, "attention_bias": True}, None),  # ignored: o_proj's bias dropped (see below)
    "head_dim_missing": (_without({**BASE, "num_attention_heads": 2, "num_key_value_heads": 1}, "head_dim"), None),
}


@pytest.mark.parametrize("field", list(FIELDS))
def test_config_field_read_as_the_reference(field: str) -> None:
    raw, ignored = FIELDS[field]
    sd = random_state(raw)
    start = 29
    ref = reference_out(raw, sd, start)
    if field == "attention_bias":
        sd_no_o_bias = {**sd, **{k: torch.zeros_like(v) for k, v in sd.items() if k.endswith("o_proj.bias")}}
        other = reference_out(raw, sd_no_o_bias, start)
    elif field == "head_dim_missing":  # Qwen3Config's default head_dim (128), not hidden_size // heads (32)
        assert DrafterConfig.from_dict(raw).head_dim == Qwen3Config().head_dim == 128
        other = None
    else:
        other = reference_out(ignored, sd, start)
    if other is not None:  # the field matters: ignoring it changes the reference's output
        assert (ref - other).abs().max() > 1e-2, f"{field}: test inputs do not exercise the field"
    ours = ours_out(raw, sd, start)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    head = torch.randn(50, H, generator=torch.Generator().manual_seed(3))
    assert torch.equal((ours @ head.T).argmax(-1), (ref @ head.T).argmax(-1))


def test_released_fixture_config_matches_the_reference() -> None:
    """The bundled drafter's own config layout (top-level and nested block_size, explicit fields)."""
    import json
    from pathlib import Path

    raw = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "drafter" / "config.json").read_text())
    raw = {**raw, "hidden_size": H, "intermediate_size": 96, "num_attention_heads": HEADS, "num_key_value_heads": KV,
           "head_dim": HD, "dflash_config": {**raw["dflash_config"], "target_layer_ids": [1, 4]}}
    sd = random_state(raw)
    torch.testing.assert_close(ours_out(raw, sd, 17), reference_out(raw, sd, 17), rtol=1e-4, atol=1e-4)


def test_block_size_top_level_nested_and_conflict() -> None:
    nested = {**_without(BASE, "block_size"), "dflash_config": {**BASE["dflash_config"], "block_size": 4}}
    assert DrafterConfig.from_dict(nested).block_size == 4
    assert DrafterConfig.from_dict({**BASE, "block_size": 16}).block_size == 16
    same = {**BASE, "block_size": 4, "dflash_config": {**BASE["dflash_config"], "block_size": 4}}
    assert DrafterConfig.from_dict(same).block_size == 4
    with pytest.raises(ConfigError, match=r"'block_size' is 16 but 'dflash_config.block_size' is 4") as err:
        DrafterConfig.from_dict({**nested, "block_size": 16}, source="d/config.json")
    assert "d/config.json" in str(err.value)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "RoPE type 'longrope'"),
    ({"rope_scaling": {"rope_type": "wavy"}}, "unknown RoPE type"),
    ({"hidden_act": "no_such_act"}, "'hidden_act' 'no_such_act'"),
    ({"attention_bias": "yes"}, "'attention_bias' must be true or false"),
    ({"is_causal": True}, "'is_causal'"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "['sliding_attention']"),
    ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, "['sliding_attention']"),
    ({"dflash_config": {**BASE["dflash_config"], "final_logit_softcapping": 20.0}}, "final_logit_softcapping"),
    ({"dflash_config": {**BASE["dflash_config"], "output_multiplier": 0.2}}, "output_multiplier"),
])
def test_fields_the_implementation_does_not_compute_are_refused(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        DrafterConfig.from_dict({**BASE, **extra}, source="d/config.json")
    assert needle in str(err.value) and "d/config.json" in str(err.value)


def test_neutral_variant_fields_are_accepted() -> None:
    cfg = DrafterConfig.from_dict({**BASE, "use_sliding_window": False, "sliding_window": 4096,
                                   "max_window_layers": 28, "is_causal": False,
                                   "dflash_config": {**BASE["dflash_config"], "output_multiplier": 1.0}})
    assert cfg.block_size == B


@pytest.mark.parametrize("archs", [["DFlash2DraftModel"], ["LlamaForCausalLMEagle3"], "Eagle3DraftModel", []])
def test_unsupported_architectures_are_refused_naming_them(archs: Any) -> None:
    with pytest.raises(ConfigError, match="architectures") as err:
        DrafterConfig.from_dict({**BASE, "architectures": archs}, source="d/config.json")
    assert repr(archs) in str(err.value) and "DFlashDraftModel" in str(err.value)


def test_round_trip_keeps_rope_scaling() -> None:
    raw = FIELDS["rope_scaling_yarn"][0]
    cfg = DrafterConfig.from_dict(raw)
    assert cfg.rope_type == "yarn" and dict(cfg.rope_params)["factor"] == 4.0
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
