"""What makes a DFlash drafter config.json unusable here, refused with an error naming the field and the file: another
drafter family (``architectures``), drafter layers this implementation does not compute (causal, sliding-window)
and ``dflash_config`` keys outside the allow-list (:data:`DFLASH_READ`, :data:`DFLASH_NEUTRAL`,
:data:`DFLASH_IGNORED`). :meth:`dflash_eval.drafter.config.DrafterConfig.from_dict` runs these checks first.
"""

from __future__ import annotations

import json
from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["DFLASH_IGNORED", "DFLASH_NEUTRAL", "DFLASH_READ", "SUPPORTED_ARCHITECTURES", "check_architectures",
           "check_dflash_keys", "check_unsupported"]

SUPPORTED_ARCHITECTURES = ("DFlashDraftModel",)
#: ``dflash_config`` keys this implementation reads.
DFLASH_READ = ("mask_token_id", "mask_token", "target_layer_ids", "block_size", "num_target_layers")
#: ``dflash_config`` keys of drafter variants: (the value that leaves the computation unchanged, what is done with
#: another value and by whom). Accepted only at that value (for softcapping also 0, which SGLang reads as off).
DFLASH_NEUTRAL: dict[str, tuple[Any, str]] = {
    "output_multiplier": (1.0, "SGLang multiplies the draft logits by it"),
    "final_logit_softcapping": (None, "SGLang soft-caps the draft logits at it (tanh)"),
    "conv_kernel_size": (0, "SGLang adds a grouped convolution of DFlash2-style drafters (with conv_group_size)"),
    "conv_group_size": (0, "SGLang adds a grouped convolution of DFlash2-style drafters (with conv_kernel_size)"),
    "selector_rank": (0, "SGLang re-scores each slot's top-k candidates with a low-rank selector (with "
                         "selector_top_k)"),
    "selector_top_k": (0, "SGLang re-scores each slot's top-k candidates with a low-rank selector (with "
                          "selector_rank)"),
    "attention_sink_bias": (False, "SGLang adds a learned per-head sink logit to every attention softmax (MiMo "
                                   "drafters)"),
    "attention_value_scale": (None, "SGLang scales the attention values V by it before attention (MiMo drafters)"),
    "projector_type": (None, "SGLang replaces the fc + hidden_norm projection of the target features by another "
                             "('domino': a GRU projector)"),
    "sample_from_anchor": (True, "with false SGLang takes the Nemotron 3.5 draft layout (another query layout and "
                                 "the checkpoint's own vocabulary modules)"),
    "input_embedding_scale": (1.0, "DFlash2 drafters scale the block tokens' input embeddings by it (SGLang's "
                                   "DFlash parser does not read it)"),
}
#: ``dflash_config`` keys SGLang reads only together with a refused feature (a Domino projector, sliding-window
#: drafter layers): without it they change nothing, with it the config is refused for that feature.
DFLASH_IGNORED = ("shift_label", "pure_draft_prefix_len", "gru_hidden_dim", "emb_dim", "swa_window_size")
_SGLANG_PARSER = "SGLang's DFlash config parser (python/sglang/srt/speculative/dflash_utils.py)"
_SGLANG_FILES = "SGLang: python/sglang/srt/speculative/dflash_utils.py, parse_dflash_draft_config"
_NOT_SGLANG = ("input_embedding_scale",)  # a key of DFLASH_NEUTRAL that SGLang's parser does not read


def check_architectures(data: dict[str, Any], source: str) -> None:
    """Refuse a config whose ``architectures`` names no DFlash drafter this implementation computes."""
    archs = data.get("architectures")
    if archs is None:
        return
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ConfigError(
            f"{source}: 'architectures' is {data['architectures']!r}, but this evaluator implements only "
            f"{list(SUPPORTED_ARCHITECTURES)} (a drafter of another family, e.g. DFlash2 or EAGLE-3, has other "
            "modules and another drafting rule)")


def check_unsupported(data: dict[str, Any], dcfg: dict[str, Any], source: str) -> None:
    """Refuse fields that ask for computations this implementation does not do (naming the field)."""
    if data.get("is_causal"):
        raise ConfigError(f"{source}: 'is_causal' is {data['is_causal']!r}: only non-causal DFlash blocks are "
                          "supported")
    window = data.get("sliding_window") if data.get("use_sliding_window") else None
    types = data.get("layer_types")
    if types is None and window is not None:
        first = int(data.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(int(data["num_hidden_layers"]))]
    bad = sorted({t for t in types or [] if t != "full_attention"})
    if bad:
        raise ConfigError(f"{source}: drafter layer types {bad} ('layer_types' / 'use_sliding_window'): only "
                          "full-attention drafter layers are supported")
    check_dflash_keys(data, dcfg, source)


def check_dflash_keys(data: dict[str, Any], dcfg: dict[str, Any], source: str) -> None:
    """``dflash_config`` as an allow-list: a key of a drafter variant at a value that changes the computation, or a
    key nobody reads, is refused naming the key, the file and what SGLang does with it."""
    for key, (neutral, sglang) in DFLASH_NEUTRAL.items():
        where = f"dflash_config.{key}" if key in dcfg else key
        value = dcfg.get(key, data.get(key, neutral))
        if value != neutral and not (neutral is None and value == 0) and not (neutral == 0 and value is None):
            raise ConfigError(
                f"{source}: '{where}' is {value!r}: {sglang}{'' if key in _NOT_SGLANG else f' ({_SGLANG_FILES})'}; "
                "this evaluator implements only the "
                "plain DFlash drafter, so the τ it measured would not be the τ of that drafter as it is served "
                f"(leave '{key}' out, or set it to {json.dumps(neutral)}, only if the drafter was trained without it)")
    unknown = sorted(k for k in dcfg if k not in DFLASH_READ and k not in DFLASH_NEUTRAL and k not in DFLASH_IGNORED)
    if unknown:
        raise ConfigError(
            f"{source}: 'dflash_config' key(s) {unknown}: not read by this evaluator, and {_SGLANG_PARSER} ignores "
            f"them too (known keys: {sorted([*DFLASH_READ, *DFLASH_NEUTRAL, *DFLASH_IGNORED])}); a drafter trained "
            "with what they ask for would be served and evaluated without it: remove them only if the drafter was "
            "trained without them")
