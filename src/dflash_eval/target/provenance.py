"""Provenance of an extraction: backend actually used, dtype, device name and library versions; the same facts as
the fields of a cache key (:func:`platform_fields`)."""

from __future__ import annotations

import functools
import platform
from importlib import metadata
from typing import Any

import torch

__all__ = ["library_versions", "kernel_versions", "device_name", "device_kind", "platform_fields", "provenance"]


@functools.cache
def _version(dist: str) -> str | None:
    """The installed version of ``dist`` (looked up once per process: every cache key asks for it, and a metadata
    lookup costs milliseconds)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries whose numerics the features depend on."""
    return {
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "fla": _version("flash-linear-attention") or _version("fla-core"),
        "python": platform.python_version(),
    }


def kernel_versions() -> dict[str, str | None]:
    """:func:`library_versions` plus triton (the compiler of fla's kernels; None where it is not installed)."""
    return {**library_versions(), "triton": _version("triton")}


def device_name(device: torch.device | str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def device_kind(device: torch.device | str) -> str:
    """A coarse device class for cache keys: 'cpu' or the CUDA device name."""
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def platform_fields(dtype: torch.dtype, device: torch.device | str, witness: str = "") -> dict[str, Any]:
    """The key fields every cache entry computed on this machine carries, whatever else it is keyed by: the dtype it
    was computed in, the device class (:func:`device_kind`), the library versions its numerics depend on
    (:func:`library_versions`) and, where not empty, the run's ``witness`` token of the dtype's kernels (the verdict
    of the run's evidence on them: :mod:`dflash_eval.inputs.kernel_verdict`; a run gives it through
    :meth:`dflash_eval.inputs.run_inputs.Inputs.platform_fields`). One function, so no entry can miss one of them."""
    out: dict[str, Any] = {"dtype": str(dtype), "device_kind": device_kind(device), "versions": library_versions()}
    if witness:
        out["witness"] = witness
    return out


def provenance(*, backend: str, dtype: torch.dtype, device: torch.device | str, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "backend": backend,
        "dtype": str(dtype).removeprefix("torch."),
        "device": device_name(device),
        "device_kind": device_kind(device),
        "versions": library_versions(),
    }
    out.update(extra)
    return out
