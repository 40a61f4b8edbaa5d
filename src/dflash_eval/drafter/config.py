"""DFlash drafter configuration: parsing the released HF ``config.json`` layout and writing it back.

A released drafter's config.json looks like::

    {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
     "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
     "num_target_layers": 36, "num_hidden_layers": 5, "hidden_size": 4096, ...}

Fields are read as the reference implementation reads them (z-lab's ``DFlashDraftModel``, built on transformers'
``Qwen3Config``), or refused with an error naming the field:

- ``architectures``: only ``DFlashDraftModel`` (a DFlash2, EAGLE-3 or other drafter family is refused, naming it);
- missing ``rope_theta``, ``head_dim``, ``hidden_act``, ``attention_bias``, ``rms_norm_eps``,
  ``max_position_embeddings`` take ``Qwen3Config``'s defaults (10000, 128, silu, false, 1e-6, 32768);
- RoPE scaling (``rope_scaling``, or ``rope_parameters`` in the transformers 5 layout; ``rope_scaling`` wins, as
  in transformers): ``default``, ``linear``, ``yarn`` and ``llama3`` are applied exactly as transformers computes
  them; ``dynamic`` and ``longrope`` (which change with the sequence length) and unknown types are refused;
- ``hidden_act``: any activation of transformers' ``ACT2FN``; ``attention_bias``: biases on q/k/v/o_proj;
- ``block_size`` at the top level or inside ``dflash_config``; both present with different values is refused
  (reference releases disagree on which one wins);
- features of newer drafter variants that this implementation does not compute (sliding-window or causal drafter
  layers) are refused;
- ``dflash_config`` is an allow-list (:data:`DFLASH_READ`, :data:`DFLASH_NEUTRAL`, :data:`DFLASH_IGNORED`, with
  the other refusals at the end of this module): keys read here are used, keys of drafter variants that SGLang's
  DFlash parser implements (``python/sglang/srt/speculative/dflash_utils.py``, ``parse_dflash_draft_config``) are
  accepted only at the value
  that leaves the computation unchanged, and any other key is refused naming it, the file and what SGLang does
  with it (τ measured without it would not be the τ SGLang serves);
- ``num_target_layers`` inside ``dflash_config`` (SGLang reads it there first) or at the top level;
- no ``mask_token_id``: given the target tokenizer (:class:`~dflash_eval.drafter.vocabulary.TargetVocabulary`),
  the id SGLang's DFlash worker would use (:func:`~dflash_eval.drafter.vocabulary.resolve_mask_token_id`), with
  a warning that says so; without one, or when SGLang could not resolve it either, one error.

When ``target_layer_ids`` is absent the reference's default rule is applied to the target's layer count and the
drafter's ``num_hidden_layers`` (:func:`default_target_layer_ids`).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.drafter.vocabulary import TargetVocabulary, resolve_mask_token_id
from dflash_eval.errors import ConfigError

__all__ = ["DrafterConfig", "default_target_layer_ids", "load_config_file", "SUPPORTED_ARCHITECTURES", "ROPE_TYPES",
           "QWEN3_DEFAULTS", "DFLASH_READ", "DFLASH_NEUTRAL", "DFLASH_IGNORED", "check_architectures",
           "check_dflash_keys", "check_unsupported"]


#: RoPE types applied exactly as transformers computes them (static frequencies); others are refused.
ROPE_TYPES = ("default", "linear", "yarn", "llama3")
#: transformers' ``Qwen3Config`` defaults for the fields a drafter config may leave out (transformers 4.57-5.x).
QWEN3_DEFAULTS: dict[str, Any] = {"rope_theta": 10_000.0, "head_dim": 128, "hidden_act": "silu",
                                  "attention_bias": False, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768}


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """The upstream default: one feature -> [N // 2]; else round(1 + i * (N - 4) / (L - 1)).

    >>> default_target_layer_ids(36, 5)
    [1, 9, 17, 25, 33]
    """
    if num_features < 1:
        raise ConfigError(f"number of target features must be >= 1, got {num_features}")
    if num_features == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (num_features - 1)) for i in range(num_features)]


_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
#: Top-level fields read into :class:`DrafterConfig`; the others are kept in ``extra`` (written back by ``to_dict``).
_KNOWN = frozenset(_REQUIRED) | {
    "head_dim", "rope_theta", "rms_norm_eps", "hidden_act", "attention_bias", "block_size", "dflash_config",
    "num_target_layers", "dtype", "torch_dtype", "rope_scaling", "rope_parameters", "max_position_embeddings",
}


@dataclass(frozen=True)
class DrafterConfig:
    """Architecture of a DFlash drafter (Qwen3-style layers + fc/hidden_norm over target features).

    ``rope_type`` / ``rope_params`` describe RoPE scaling (``default``: none; the params as sorted
    ``(name, value)`` pairs, without ``rope_type`` and ``rope_theta``).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int | None = None
    rope_theta: float = QWEN3_DEFAULTS["rope_theta"]
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    dtype: str = "bfloat16"
    rope_type: str = "default"
    rope_params: tuple[tuple[str, Any], ...] = ()
    max_position_embeddings: int = QWEN3_DEFAULTS["max_position_embeddings"]
    mask_token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """The RoPE settings in transformers 5's ``rope_parameters`` layout."""
        return {"rope_type": self.rope_type, "rope_theta": self.rope_theta, **dict(self.rope_params)}

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        source: str = "<config>",
        num_target_layers: int | None = None,
        vocabulary: TargetVocabulary | None = None,
    ) -> DrafterConfig:
        """Parse a released-checkpoint config dict (see the module docstring for how each field is read).

        Args:
            data: the parsed config.json.
            source: where it came from, for error messages.
            num_target_layers: the target's layer count, used for the default target_layer_ids rule when the
                config has neither ``dflash_config.target_layer_ids`` nor ``num_target_layers``.
            vocabulary: the target tokenizer, to resolve a missing ``mask_token_id`` as SGLang does (a warning
                says so); read only then.

        Raises:
            ConfigError: a required field is missing or has the wrong type, or a field asks for something this
                implementation does not compute.
        """
        dcfg = _dflash_section(data, source)
        block_size = _block_size(data, dcfg, source)
        mask_token = _mask_token(data, dcfg, source)
        mask_token_id = _mask_token_id(dcfg.get("mask_token_id", data.get("mask_token_id")), mask_token, vocabulary,
                                       source)
        n_target = dcfg.get("num_target_layers", data.get("num_target_layers", num_target_layers))
        layer_ids = _layer_ids(data, dcfg, n_target, source)
        rope_type, rope_theta, rope_params = _rope(data, source)
        return cls(
            hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=int(data["num_attention_heads"]),
            num_key_value_heads=int(data["num_key_value_heads"]),
            head_dim=_head_dim(data),
            vocab_size=int(data["vocab_size"]),
            block_size=block_size,
            target_layer_ids=layer_ids,
            mask_token_id=mask_token_id,
            mask_token=mask_token,
            num_target_layers=None if n_target is None else int(n_target),
            rope_theta=rope_theta,
            rms_norm_eps=float(_get(data, "rms_norm_eps")),
            hidden_act=_hidden_act(data, source),
            attention_bias=_attention_bias(data, source),
            dtype=str(data.get("dtype", data.get("torch_dtype", "bfloat16"))),
            rope_type=rope_type,
            rope_params=rope_params,
            max_position_embeddings=int(_get(data, "max_position_embeddings")),
            extra={k: v for k, v in data.items() if k not in _KNOWN},
        )

    def to_dict(self) -> dict[str, Any]:
        """The released HF layout (block_size inside dflash_config and, for old readers, at the top level)."""
        d = asdict(self)
        d.pop("extra")
        layer_ids = list(d.pop("target_layer_ids"))
        mask = d.pop("mask_token_id")
        mask_token = d.pop("mask_token")
        d.pop("rope_type")
        d.pop("rope_params")
        out: dict[str, Any] = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3"}
        out.update(self.extra)
        out.update(d)
        if self.rope_type != "default":
            out["rope_parameters"] = self.rope_parameters
        out["dflash_config"] = {"mask_token_id": mask, "target_layer_ids": layer_ids, "block_size": self.block_size}
        if mask_token is not None:
            out["dflash_config"]["mask_token"] = mask_token
        return out

    def save(self, path: Path) -> None:
        """Write config.json atomically."""

        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def _get(data: dict[str, Any], key: str) -> Any:
    """``data[key]``, the Qwen3Config default when absent or null."""
    value = data.get(key)
    return QWEN3_DEFAULTS[key] if value is None else value


def _dflash_section(data: Any, source: str) -> dict[str, Any]:
    """The config's ``dflash_config`` object ({} when absent), after the checks that refuse a config outright: not
    an object, another architecture, a missing required field, a feature this implementation does not compute."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
    check_architectures(data, source)
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"{source}: missing required field(s) {missing} (a Qwen3-style drafter config needs them)")
    dcfg = data.get("dflash_config") or {}
    if not isinstance(dcfg, dict):
        raise ConfigError(f"{source}: 'dflash_config' must be an object, got {type(dcfg).__name__}")
    check_unsupported(data, dcfg, source)
    return dcfg


def _mask_token(data: dict[str, Any], dcfg: dict[str, Any], source: str) -> str | None:
    """``dflash_config.mask_token`` (or top-level ``mask_token``): None or a non-empty string."""
    mask_token = dcfg.get("mask_token", data.get("mask_token"))
    if mask_token is not None and (not isinstance(mask_token, str) or not mask_token):
        raise ConfigError(f"{source}: 'dflash_config.mask_token' must be a non-empty string, got {mask_token!r}")
    return mask_token


def _layer_ids(data: dict[str, Any], dcfg: dict[str, Any], n_target: Any, source: str) -> tuple[int, ...]:
    """``dflash_config.target_layer_ids`` (or top level), else the default rule for ``n_target`` target layers."""
    layer_ids = dcfg.get("target_layer_ids", data.get("target_layer_ids"))
    if layer_ids is None:
        if n_target is None:
            raise ConfigError(
                f"{source}: no 'dflash_config.target_layer_ids' and no 'num_target_layers' for the default rule")
        layer_ids = default_target_layer_ids(int(n_target), int(data["num_hidden_layers"]))
    if not isinstance(layer_ids, (list, tuple)) or not all(isinstance(i, int) for i in layer_ids):
        raise ConfigError(f"{source}: 'dflash_config.target_layer_ids' must be a list of ints, got {layer_ids!r}")
    return tuple(int(i) for i in layer_ids)


def _head_dim(data: dict[str, Any]) -> int:
    """``head_dim``: Qwen3Config's default when absent; an explicit null falls back to hidden_size // heads (as the
    attention does)."""
    head_dim = data["head_dim"] if "head_dim" in data else QWEN3_DEFAULTS["head_dim"]
    if head_dim is None:
        head_dim = int(data["hidden_size"]) // int(data["num_attention_heads"])
    return int(head_dim)


def _mask_token_id(value: Any, mask_token: str | None, vocabulary: TargetVocabulary | None, source: str) -> int:
    """``mask_token_id`` as given (an int >= 0), else the id SGLang would use, with a warning that says so."""
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{source}: 'dflash_config.mask_token_id' must be an integer >= 0, got {value!r}")
        return value
    if vocabulary is None:
        raise ConfigError(f"{source}: no 'dflash_config.mask_token_id', and no target tokenizer given to resolve "
                          "the mask token from as SGLang does: set dflash_config.mask_token_id to the id the drafter "
                          "was trained with (or give the target, whose tokenizer SGLang resolves it from)")
    mask_id, how = resolve_mask_token_id(vocabulary, mask_token, source=source)
    warnings.warn(f"{source}: no 'dflash_config.mask_token_id': using id {mask_id}, {how}, as SGLang's DFlash worker "
                  "(python/sglang/srt/speculative/dflash_worker.py) does; write the id into dflash_config if the "
                  "drafter was trained with another one", UserWarning, stacklevel=2)
    return mask_id


def _block_size(data: dict[str, Any], dcfg: dict[str, Any], source: str) -> int:
    top, nested = data.get("block_size"), dcfg.get("block_size")
    if top is None and nested is None:
        raise ConfigError(f"{source}: no 'block_size' at the top level or inside 'dflash_config'")
    if top is not None and nested is not None and int(top) != int(nested):
        raise ConfigError(
            f"{source}: 'block_size' is {top} but 'dflash_config.block_size' is {nested}; reference releases "
            "disagree on which one wins (older ones read the top level, newer ones dflash_config): make them equal")
    return int(top) if top is not None else int(nested)  # type: ignore[arg-type]  # one of the two is set (checked above)


def _rope(data: dict[str, Any], source: str) -> tuple[str, float, tuple[tuple[str, Any], ...]]:
    """(rope_type, rope_theta, other params) as transformers' Qwen3Config resolves them: ``rope_scaling`` (legacy)
    wins over ``rope_parameters``; ``rope_theta`` from that dict, else the top level, else 10000."""
    raw = data.get("rope_scaling") or data.get("rope_parameters") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: 'rope_scaling' / 'rope_parameters' must be an object, got {raw!r}")
    params = dict(raw)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = _get(data, "rope_theta")
    if rope_type not in ROPE_TYPES:
        why = ("its frequencies change with the sequence length" if rope_type in ("dynamic", "longrope")
               else "unknown RoPE type")
        raise ConfigError(f"{source}: RoPE type {rope_type!r} ('rope_scaling' / 'rope_parameters') is not supported "
                          f"({why}); supported: {list(ROPE_TYPES)}")
    for k, v in params.items():
        if not isinstance(v, (int, float, bool, str)) and v is not None:
            raise ConfigError(f"{source}: RoPE parameter {k!r} = {v!r}: expected a number")
    if rope_type == "default":
        params = {}
    return rope_type, float(theta), tuple(sorted(params.items()))


def _hidden_act(data: dict[str, Any], source: str) -> str:
    act = str(_get(data, "hidden_act"))
    if act != "silu":
        from transformers.activations import ACT2FN

        if act not in ACT2FN:
            raise ConfigError(f"{source}: 'hidden_act' {act!r} is not an activation transformers knows "
                              f"(ACT2FN: {sorted(ACT2FN)})")
    return act


def _attention_bias(data: dict[str, Any], source: str) -> bool:
    value = _get(data, "attention_bias")
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: 'attention_bias' must be true or false, got {value!r}")
    return value


def load_config_file(path: Path, **kwargs: Any) -> DrafterConfig:
    """Read and parse a config.json, with errors naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"drafter config not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    return DrafterConfig.from_dict(data, source=str(path), **kwargs)


# --------------------------------------------------------------------------------------------------------------
# What makes a DFlash drafter config.json unusable here, refused with an error naming the field and the file: another
# drafter family (``architectures``), drafter layers this implementation does not compute (causal, sliding-window)
# and ``dflash_config`` keys outside the allow-list (:data:`DFLASH_READ`, :data:`DFLASH_NEUTRAL`,
# :data:`DFLASH_IGNORED`). :meth:`DrafterConfig.from_dict` runs these checks first.


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
