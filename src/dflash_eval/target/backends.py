"""Linear-attention (Gated DeltaNet) kernel backend control for hybrid transformers models.

transformers picks the delta-rule implementation once, at import of each hybrid modeling module: fla when
``fla.ops.gated_delta_rule`` imports, else the pure-torch fallback (transformers' ``modeling_qwen3_5.py``). The forward
looks ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` up in the module globals at call
time, so :func:`use_backend` swaps those globals in every hybrid modeling module and restores them on exit.

Backends:
- ``fla``: fla's ``chunk_gated_delta_rule`` (prefill) and ``fused_recurrent_gated_delta_rule`` (decode). CUDA only.
- ``torch``: transformers' chunked torch fallback for prefill, its recurrent torch function for decode.
- ``torch-recurrent``: the recurrent torch function for prefill too (a step-by-step reference).
- ``auto``: ``fla`` on CUDA when the fla package is installed, else ``torch``.

Choosing a backend imports nothing: planning a run only asks whether fla is installed. Its ops are imported, and a
broken installation reported, where its kernels are first used (:func:`use_backend`: feature extraction, and the
kernel probe of :mod:`dflash_eval.target.kernel_probe`, which runs them in every process that reads features, warm or
not).

Full attention: on CUDA every block of :func:`use_backend` (and so every forward of the target: features, the
kernel probe, teacher-forced checks, generation) runs torch's scaled-dot-product attention without its cuDNN backend
(:func:`attention_backends`). For bf16 torch may otherwise pick cuDNN, which builds an execution plan on the first
call of every new shape (every prompt length, every decode step's key length, every padded batch), some 0.04-0.05 s
each on an H100 (``benchmarks/first_cuda_use.py``), and a warm run's witness forwards meet dozens of new lengths.
Flash and memory-efficient attention need no plan. One choice for every forward also means the kernel probe hashes
the attention kernel the features are made with.

Fault injection (a test and diagnostic hook, never a default): ``<backend>+<fault>`` runs ``<backend>`` with its
delta-rule output perturbed, so a test can produce kernel drift of a chosen size on any machine:

- ``+noise=REL``: relative Gaussian noise added to the delta-rule output (RMS of the noise = REL x RMS of the
  output, per call; seeded, so the same forward gives the same features);
- ``+round=DTYPE``: the kernel's query/key/value inputs and its output rounded through bf16, fp16 or fp8
  (:func:`dflash_eval.common.dtypes.round_through`), as a reduced-precision kernel would see and return them.

The fault is part of the backend's name, so features extracted with it are cached apart from clean ones.

Example::

    with use_backend("torch-recurrent", device="cpu") as info:
        model(ids)
    print(info.name)
    with use_backend("torch+noise=0.01"):  # the torch kernels, output perturbed by 1 % relative noise
        model(ids)
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dflash_eval.common.dtypes import ROUNDINGS, round_through
from dflash_eval.errors import BackendError
from dflash_eval.target.kernel_cache import watch_compilation

if TYPE_CHECKING:  # torch is imported where a device is resolved: the option registration stays torch-free
    import torch

__all__ = [
    "BACKENDS",
    "KernelFault",
    "parse_fault",
    "split_backend",
    "with_fault",
    "HYBRID_MODULES",
    "BackendInfo",
    "fla_available",
    "fla_installed",
    "resolve_backend",
    "use_backend",
    "module_functions",
    "loaded_hybrid_modules",
    "check_backend_device",
    "attention_backends",
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
_active: list[BackendInfo] = []  # the backends in force, innermost last (held under _lock)


FAULT_SEP = "+"


@dataclass(frozen=True)
class KernelFault:
    """A diagnostic perturbation of the delta-rule kernels (see module docstring)."""

    mode: str  # "noise" | "round"
    size: float = 0.0  # noise: relative RMS of the added noise
    dtype: str = ""  # round: bf16 | fp16 | fp8
    seed: int = 0

    @property
    def label(self) -> str:
        return f"noise={self.size:g}" if self.mode == "noise" else f"round={self.dtype}"


def parse_fault(spec: str) -> KernelFault:
    """``noise:REL`` / ``noise=REL`` or ``round:DTYPE`` / ``round=DTYPE`` -> :class:`KernelFault`."""
    mode, sep, arg = str(spec).strip().replace("=", ":", 1).partition(":")
    mode, arg = mode.strip().lower(), arg.strip().lower()
    if mode == "noise" and sep:
        try:
            size = float(arg)
        except ValueError:
            size = -1.0
        if size > 0:
            return KernelFault("noise", size=size)
    if mode == "round" and arg in ROUNDINGS:
        return KernelFault("round", dtype=arg)
    raise BackendError(f"unknown kernel fault {spec!r}: use noise:REL (relative noise size > 0, e.g. noise:0.01) or "
                       f"round:DTYPE with DTYPE one of {', '.join(ROUNDINGS)}")


def split_backend(name: str) -> tuple[str, KernelFault | None]:
    """``"torch+noise=0.01"`` -> ``("torch", KernelFault("noise", 0.01))``; a plain name -> ``(name, None)``."""
    base, sep, fault = str(name).partition(FAULT_SEP)
    return base, (parse_fault(fault) if sep else None)


def with_fault(backend: str, fault: KernelFault | None) -> str:
    """The backend name that carries ``fault`` (``backend`` itself without one)."""
    return backend if fault is None else f"{backend}{FAULT_SEP}{fault.label}"


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
    """True when fla's gated delta rule ops import (they still need CUDA to run). Importing them imports all of
    fla, and with it transformers and much of torch (what that costs on a GPU machine: docs/gpu-drift.md)."""
    return _fla_functions() is not None


def fla_installed() -> bool:
    """True when the ``fla`` package is installed; imports nothing. What planning a run needs: whether fla can be
    chosen. Whether it imports is checked where its kernels are first used (:func:`check_backend_device` with
    ``imports=True``)."""
    try:
        return importlib.util.find_spec("fla") is not None
    except (ImportError, ValueError):
        return False


def resolve_backend(name: str, device: torch.device | str) -> str:
    """Map ``auto`` to a concrete backend and reject impossible choices with a clear error (a ``+<fault>`` suffix
    is kept, its base resolved)."""
    base, fault = split_backend(name)
    if fault is not None:
        return with_fault(resolve_backend(base, device), fault)
    if name not in BACKENDS:
        raise BackendError(f"unknown linear-attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    import torch

    dev = torch.device(device)
    if name == "auto":
        return "fla" if dev.type == "cuda" and fla_installed() else "torch"
    if name == "fla":
        check_backend_device("fla", dev, imports=False)
    return name


def check_backend_device(name: str, device: torch.device | str, *, imports: bool = True) -> None:
    """Raise BackendError if ``name`` cannot run on ``device``: fla needs CUDA and the fla package, and with
    ``imports`` its gated delta rule ops must import (without: installed is enough, for planning a run)."""
    import torch

    dev = torch.device(device)
    if split_backend(name)[0] == "fla":
        if dev.type != "cuda":
            raise BackendError(
                f"backend 'fla' needs a CUDA device, but the model is on {dev}: fla's Triton kernels cannot run on a "
                "CPU. Use --hidden-state-backend torch (or auto) on CPU-only machines."
            )
        if not fla_installed():
            raise BackendError("backend 'fla' requested but the fla package is not installed: "
                               "pip install flash-linear-attention fla-core (0.6.0 or newer)")
        if imports and not fla_available():
            raise BackendError(
                "backend 'fla' requested but fla.ops.gated_delta_rule does not import (fla is installed; a version "
                "that does not match torch or triton is the usual cause): "
                "pip install flash-linear-attention fla-core (0.6.0 or newer)"
            )


@contextmanager
def attention_backends(device: torch.device | str, cudnn: bool = False) -> Iterator[None]:
    """The target's scaled-dot-product attention for the duration of the block: on CUDA without the cuDNN backend
    unless ``cudnn`` (module docstring); flash, memory-efficient and math attention stay as they were. On other
    devices nothing changes. Torch's backend switches are process-wide: the block restores the one it set."""
    import torch

    if torch.device(device).type != "cuda":
        yield
        return
    cuda = torch.backends.cuda
    before = cuda.cudnn_sdp_enabled()
    cuda.enable_cudnn_sdp(cudnn)
    try:
        yield
    finally:
        cuda.enable_cudnn_sdp(before)


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

    return _named_like(call, fn)


def _named_like(call: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` (a wrapper) named as the function it calls, so the kernel in force is described by its own name;
    no ``__wrapped__``: :func:`use_backend` unwraps only transformers' own wrappers."""
    call.__name__ = getattr(fn, "__name__", "fla_fn")
    call.__qualname__ = getattr(fn, "__qualname__", call.__name__)
    call.__module__ = getattr(fn, "__module__", "?")
    return call


def _guard_cuda(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    def call(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if query.device.type != "cuda":
            raise BackendError(f"fla backend ({what}) called on a {query.device} tensor; fla runs on CUDA only")
        return fn(query, *args, **kwargs)

    return _named_like(call, fn)


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


def _faulty(fn: Callable[..., Any], fault: KernelFault, gen: torch.Generator) -> Callable[..., Any]:
    """``fn`` (a delta-rule function returning ``(output, state)``) with ``fault`` applied to its output."""
    import torch

    def call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if fault.mode == "round":
            query, key, value = (round_through(t, fault.dtype) for t in (query, key, value))
        out, state = fn(query, key, value, *args, **kwargs)
        if fault.mode == "round":
            return round_through(out, fault.dtype), state
        noise = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.device)
        rms = out.detach().float().pow(2).mean().sqrt()
        return (out.float() + fault.size * rms * noise).to(out.dtype), state

    call.__name__ = f"{getattr(fn, '__name__', 'delta_rule')}[{fault.label}]"
    call.__module__ = getattr(fn, "__module__", "?")
    return call


@contextmanager
def module_functions(replace: Callable[[ModuleType], Mapping[str, Callable[..., Any]]]) -> Iterator[None]:
    """Replace module-level functions of every loaded hybrid modeling module for the duration of the block:
    ``replace(mod)`` gives the new functions by name (it may capture the ones in force, e.g. the backend's, and
    call them). Held under the backends' lock, as :func:`use_backend` is; restored on exit."""
    with _lock:
        saved: list[tuple[ModuleType, str, Any]] = []
        try:
            for mod in loaded_hybrid_modules():
                for name, fn in replace(mod).items():
                    saved.append((mod, name, getattr(mod, name)))
                    setattr(mod, name, fn)
            yield
        finally:
            for mod, name, fn in reversed(saved):
                setattr(mod, name, fn)


def _describe(fn: Callable[..., Any]) -> str:
    inner = fn
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__name__', '?')}"


@contextmanager
def use_backend(name: str, device: torch.device | str = "cpu") -> Iterator[BackendInfo]:
    """Switch every hybrid modeling module to backend ``name`` for the duration of the block.

    Process-wide (module globals), guarded by a re-entrant lock so nested or threaded uses do not interleave.
    ``fla`` on a CPU device raises :class:`BackendError` before any kernel is reached. A ``+<fault>`` suffix wraps
    the backend's functions (module docstring); its noise generator is seeded anew on every entry. Entered again,
    nested, for the backend already in force (no fault), it changes nothing: what the outer block set up (the kernel
    probe's recorders around the functions it set) stays in force for the code it calls. On CUDA the block's
    attention runs without cuDNN (:func:`attention_backends`).
    """
    import torch

    concrete, fault = split_backend(resolve_backend(name, device))
    check_backend_device(concrete, device)  # planning only saw fla installed: it must import now
    gen = torch.Generator().manual_seed(fault.seed) if fault is not None else None
    with _lock, contextlib.ExitStack() as stack:
        if fault is None and _active and _active[-1].name == concrete:
            yield _active[-1]
            return
        stack.enter_context(attention_backends(device))
        mods = loaded_hybrid_modules()
        saved = [(m, getattr(m, _CHUNK), getattr(m, _RECUR)) for m in mods]
        depth = len(_active)
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
                    assert fns is not None  # checked above
                    watch_compilation()  # fla's Triton kernels compile on first use: timed apart from the work
                    new_chunk = _guard_cuda(_kwarg_filter(fns[0]), "chunk_gated_delta_rule")
                    new_recur = _guard_cuda(_kwarg_filter(fns[1]), "fused_recurrent_gated_delta_rule")
                    info = BackendInfo(concrete, _describe(fns[0]), _describe(fns[1]))
                if fault is not None:
                    assert gen is not None
                    new_chunk, new_recur = _faulty(new_chunk, fault, gen), _faulty(new_recur, fault, gen)
                setattr(mod, _CHUNK, new_chunk)
                setattr(mod, _RECUR, new_recur)
                if info is None or (fault is not None and FAULT_SEP not in info.name):
                    info = BackendInfo(with_fault(concrete, fault), _describe(new_chunk), _describe(new_recur))
            _active.append(info or BackendInfo(with_fault(concrete, fault), "n/a (no hybrid modeling module)", "n/a"))
            yield _active[-1]
        finally:
            if len(_active) > depth:
                _active.pop()
            for mod, chunk, recur in saved:
                setattr(mod, _CHUNK, chunk)
                setattr(mod, _RECUR, recur)
