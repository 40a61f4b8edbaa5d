"""Parsing dtype names given on the command line or in configs."""

from __future__ import annotations

import torch

from dflash_eval.errors import ConfigError

__all__ = ["parse_dtype"]

_DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    key = str(value).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ConfigError(f"unknown dtype {value!r}; choose one of bf16, fp16, fp32")
    return _DTYPES[key]
