"""Parsing dtype names given on the command line or in configs (torch is imported on the first call only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_eval.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["parse_dtype"]

_DTYPES = {  # name -> attribute of torch
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    import torch

    if isinstance(value, torch.dtype):
        return value
    key = str(value).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ConfigError(f"unknown dtype {value!r}; choose one of bf16, fp16, fp32")
    return getattr(torch, _DTYPES[key])
