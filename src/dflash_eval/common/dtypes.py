"""Parsing dtype names given on the command line or in configs, and rounding a tensor through a lower precision
(torch is imported on the first call only).

:func:`round_through` is what the drift budget's rounding perturbations and the kernel-fault backend's
``round=<dtype>`` mode share: ``bf16`` and ``fp16`` are plain casts; ``fp8`` is float8-e4m3 with one scale per
tensor (absmax mapped to 448, as fp8 inference scales activations), so large activations saturate nowhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_eval.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["check_dtype_name", "parse_dtype", "ROUNDINGS", "rounding_available", "round_through"]

_DTYPES = {  # name -> attribute of torch
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}
ROUNDINGS = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}  # rounding name -> attribute of torch


def check_dtype_name(value: str, *, flag: str | None = None, allow_auto: bool = True) -> None:
    """ConfigError unless ``value`` names a dtype (``auto`` too where ``allow_auto``), listing every choice; needs
    no torch (the options' value checks run before it is imported)."""
    key = str(value).lower().removeprefix("torch.")
    if key in _DTYPES or (allow_auto and key == "auto"):
        return
    choices = (["auto"] if allow_auto else []) + ["bf16", "fp16", "fp32"]
    aliases = sorted(set(_DTYPES) - set(choices))
    where = f"{flag}: " if flag else ""
    raise ConfigError(f"{where}unknown dtype {value!r}; choose one of {', '.join(choices)} "
                      f"(also accepted: {', '.join(aliases)})")


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    import torch

    if isinstance(value, torch.dtype):
        return value
    check_dtype_name(str(value), allow_auto=False)
    return getattr(torch, _DTYPES[str(value).lower().removeprefix("torch.")])


def rounding_available(name: str) -> bool:
    """Whether this torch has the dtype of rounding ``name`` (fp8 needs ``torch.float8_e4m3fn``)."""
    import torch

    return name in ROUNDINGS and hasattr(torch, ROUNDINGS[name])


def round_through(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` rounded to ``name`` (bf16 | fp16 | fp8) and back to its own dtype (fp8: per-tensor absmax scale)."""
    import torch

    if not rounding_available(name):
        raise ConfigError(f"cannot round to {name!r}: choose one of {', '.join(ROUNDINGS)} (fp8 needs a torch with "
                          "float8_e4m3fn)")
    dt = getattr(torch, ROUNDINGS[name])
    if name != "fp8":
        return x.to(dt).to(x.dtype)
    scale = x.detach().abs().amax().float().clamp_min(torch.finfo(torch.float32).tiny) / torch.finfo(dt).max
    return ((x.float() / scale).to(dt).float() * scale).to(x.dtype)
