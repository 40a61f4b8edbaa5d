"""DFlash drafter configuration: parsing the released HF ``config.json`` layout and writing it back.

A released drafter's config.json looks like::

    {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
     "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
     "num_target_layers": 36, "num_hidden_layers": 5, "hidden_size": 4096, ...}

``block_size`` may sit at the top level or inside ``dflash_config``. When ``target_layer_ids`` is absent
the upstream default rule is applied (:func:`default_target_layer_ids`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["DrafterConfig", "default_target_layer_ids", "load_config_file"]


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


@dataclass(frozen=True)
class DrafterConfig:
    """Architecture of a DFlash drafter (Qwen3-style layers + fc/hidden_norm over target features)."""

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
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    dtype: str = "bfloat16"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        source: str = "<config>",
        num_target_layers: int | None = None,
        num_features: int | None = None,
    ) -> DrafterConfig:
        """Parse a released-checkpoint config dict.

        Args:
            data: the parsed config.json.
            source: where it came from, for error messages.
            num_target_layers: the target's layer count, used for the default target_layer_ids rule when the
                config has neither ``dflash_config.target_layer_ids`` nor ``num_target_layers``.
            num_features: number of target features (from ``fc.weight``'s input width / H) for the default rule.

        Raises:
            ConfigError: a required field is missing or has the wrong type.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ConfigError(f"{source}: missing required field(s) {missing} (a Qwen3-style drafter config needs them)")
        dcfg = data.get("dflash_config") or {}
        if not isinstance(dcfg, dict):
            raise ConfigError(f"{source}: 'dflash_config' must be an object, got {type(dcfg).__name__}")
        block_size = dcfg.get("block_size", data.get("block_size"))
        if block_size is None:
            raise ConfigError(f"{source}: no 'block_size' at the top level or inside 'dflash_config'")
        mask_token_id = dcfg.get("mask_token_id", data.get("mask_token_id"))
        if mask_token_id is None:
            raise ConfigError(f"{source}: no 'dflash_config.mask_token_id'")
        n_target = data.get("num_target_layers", num_target_layers)
        layer_ids = dcfg.get("target_layer_ids", data.get("target_layer_ids"))
        if layer_ids is None:
            if n_target is None or num_features is None:
                raise ConfigError(
                    f"{source}: no 'dflash_config.target_layer_ids' and not enough information for the default rule "
                    "(needs num_target_layers and the number of features)"
                )
            layer_ids = default_target_layer_ids(int(n_target), int(num_features))
        if not isinstance(layer_ids, (list, tuple)) or not all(isinstance(i, int) for i in layer_ids):
            raise ConfigError(f"{source}: 'dflash_config.target_layer_ids' must be a list of ints, got {layer_ids!r}")
        heads = int(data["num_attention_heads"])
        head_dim = data.get("head_dim") or int(data["hidden_size"]) // heads
        rope_theta = data.get("rope_theta")
        if rope_theta is None:
            rope_theta = (data.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
        known = set(_REQUIRED) | {
            "head_dim", "rope_theta", "rms_norm_eps", "hidden_act", "attention_bias", "block_size",
            "dflash_config", "num_target_layers", "dtype", "torch_dtype",
        }
        return cls(
            hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(data["num_key_value_heads"]),
            head_dim=int(head_dim),
            vocab_size=int(data["vocab_size"]),
            block_size=int(block_size),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            mask_token_id=int(mask_token_id),
            num_target_layers=None if n_target is None else int(n_target),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            hidden_act=str(data.get("hidden_act", "silu")),
            attention_bias=bool(data.get("attention_bias", False)),
            dtype=str(data.get("dtype", data.get("torch_dtype", "bfloat16"))),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The released HF layout (block_size inside dflash_config and, for old readers, at the top level)."""
        d = asdict(self)
        d.pop("extra")
        layer_ids = list(d.pop("target_layer_ids"))
        mask = d.pop("mask_token_id")
        out: dict[str, Any] = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3"}
        out.update(self.extra)
        out.update(d)
        out["dflash_config"] = {"mask_token_id": mask, "target_layer_ids": layer_ids, "block_size": self.block_size}
        return out

    def save(self, path: Path) -> None:
        """Write config.json atomically."""
        from dflash_eval.atomic import atomic_write_text

        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


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
