"""Linear-attention (Gated DeltaNet) kernel backend control for hybrid transformers models.

transformers picks the delta-rule implementation once, at import of each hybrid modeling module: fla when
``fla.ops.gated_delta_rule`` imports, else the pure-torch fallback (transformers' ``modeling_qwen3_5.py``). The forward
looks ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` up in the module globals at call
time, so :func:`use_backend` swaps those globals in every hybrid modeling module and restores them on exit.

Backends:
- ``fla``: fla's ``chunk_gated_delta_rule`` (prefill) and ``fused_recurrent_gated_delta_rule`` (decode). CUDA only.
- ``torch``: transformers' chunked torch fallback for prefill, its recurrent torch function for decode.
- ``torch-recurrent``: the recurrent torch function for prefill too (a step-by-step reference).
- ``auto``: ``fla`` on CUDA when importable, else ``torch``.

Example::

    with use_backend("torch-recurrent", device="cpu") as info:
        model(ids)
    print(info.name)
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dflash_eval.errors import BackendError

if TYPE_CHECKING:  # torch is imported where a device is resolved: the option registration stays torch-free
    import torch

__all__ = [
    "BACKENDS",
    "HYBRID_MODULES",
    "BackendInfo",
    "fla_available",
    "resolve_backend",
    "use_backend",
    "check_backend_device",
]

BACKENDS = ("auto", "fla", "torch", "torch-recurrent")
# Modeling modules of hybrid (Gated DeltaNet) architectures that carry the two module-level functions.
HYBRID_MODULES = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.qwen3_next.modeling_qwen3_next",
)
_CHUNK = "torch_chunk_gated_delta_rule"
_RECUR = "torch_recurrent_gated_delta_rule"
_lock = threading.RLock()


@dataclass(frozen=True)
class BackendInfo:
    """The backend actually in force and where its functions came from."""

    name: str
    chunk_impl: str
    recurrent_impl: str


def _fla_functions() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    try:
        mod = importlib.import_module("fla.ops.gated_delta_rule")
        return mod.chunk_gated_delta_rule, mod.fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001 - any import failure means fla is unusable here
        return None


def fla_available() -> bool:
    """True when fla's gated delta rule ops import (they still need CUDA to run)."""
    return _fla_functions() is not None


def resolve_backend(name: str, device: torch.device | str) -> str:
    """Map ``auto`` to a concrete backend and reject impossible choices with a clear error."""
    if name not in BACKENDS:
        raise BackendError(f"unknown linear-attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    import torch

    dev = torch.device(device)
    if name == "auto":
        return "fla" if dev.type == "cuda" and fla_available() else "torch"
    if name == "fla":
        check_backend_device("fla", dev)
    return name


def check_backend_device(name: str, device: torch.device | str) -> None:
    """Raise BackendError if ``name`` cannot run on ``device`` (fla needs CUDA and the fla package)."""
    import torch

    dev = torch.device(device)
    if name == "fla":
        if dev.type != "cuda":
            raise BackendError(
                f"backend 'fla' needs a CUDA device, but the model is on {dev}: fla's Triton kernels cannot run on a "
                "CPU. Use --hidden-state-backend torch (or auto) on CPU-only machines."
            )
        if not fla_available():
            raise BackendError(
                "backend 'fla' requested but fla.ops.gated_delta_rule does not import: "
                "pip install flash-linear-attention fla-core (0.6.0 or newer)"
            )


def _torch_impl(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The pure-torch function under transformers' hub/fla wrapper (``__wrapped__``)."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _kwarg_filter(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Call ``fn`` with only the keyword arguments it accepts (fla and torch signatures differ)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn
    names = set(params)

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: v for k, v in kwargs.items() if k in names})

    call.__name__ = getattr(fn, "__name__", "fla_fn")
    return call


def _guard_cuda(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    def call(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if query.device.type != "cuda":
            raise BackendError(f"fla backend ({what}) called on a {query.device} tensor; fla runs on CUDA only")
        return fn(query, *args, **kwargs)

    return call


def loaded_hybrid_modules() -> list[ModuleType]:
    """Import (if installed) and return every hybrid modeling module that has the two delta-rule functions."""
    mods = []
    for name in HYBRID_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, _CHUNK) and hasattr(mod, _RECUR):
            mods.append(mod)
    return mods


def _describe(fn: Callable[..., Any]) -> str:
    inner = fn
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__name__', '?')}"


@contextmanager
def use_backend(name: str, device: torch.device | str = "cpu") -> Iterator[BackendInfo]:
    """Switch every hybrid modeling module to backend ``name`` for the duration of the block.

    Process-wide (module globals), guarded by a re-entrant lock so nested or threaded uses do not interleave.
    ``fla`` on a CPU device raises :class:`BackendError` before any kernel is reached.
    """
    concrete = resolve_backend(name, device)
    with _lock:
        mods = loaded_hybrid_modules()
        saved = [(m, getattr(m, _CHUNK), getattr(m, _RECUR)) for m in mods]
        try:
            info: BackendInfo | None = None
            for mod, chunk, recur in saved:
                t_chunk, t_recur = _torch_impl(chunk), _torch_impl(recur)
                if concrete == "torch":
                    new_chunk, new_recur = t_chunk, t_recur
                elif concrete == "torch-recurrent":
                    new_chunk, new_recur = t_recur, t_recur
                else:
                    fns = _fla_functions()
                    assert fns is not None  # checked by resolve_backend
                    new_chunk = _guard_cuda(_kwarg_filter(fns[0]), "chunk_gated_delta_rule")
                    new_recur = _guard_cuda(_kwarg_filter(fns[1]), "fused_recurrent_gated_delta_rule")
                    info = BackendInfo(concrete, _describe(fns[0]), _describe(fns[1]))
                setattr(mod, _CHUNK, new_chunk)
                setattr(mod, _RECUR, new_recur)
                if info is None:
                    info = BackendInfo(concrete, _describe(new_chunk), _describe(new_recur))
            yield info or BackendInfo(concrete, "n/a (no hybrid modeling module)", "n/a")
        finally:
            for mod, chunk, recur in saved:
                setattr(mod, _CHUNK, chunk)
                setattr(mod, _RECUR, recur)
