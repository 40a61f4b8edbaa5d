"""Kernel probe: the digest of what the target's kernels compute, so that cached features follow kernel behaviour.

Cache keys name the backend and the library versions, which say nothing about a kernel patched or rebuilt in place,
a new Triton or driver under the same fla version, or a wheel installed by hand. The probe runs, in this process,
the very functions a target forward would call, on fixed seeded inputs at the target's head shapes (read from
config.json: no model is built), in the run's dtype and on its device, and hashes the exact bytes of their outputs:

- ``linear_attention_chunk``: the prefill delta rule, i.e. the hybrid modeling module's
  ``torch_chunk_gated_delta_rule`` global as :func:`dflash_eval.target.backends.use_backend` sets it for the backend
  (transformers' chunked torch function, its recurrent one for ``torch-recurrent``, or fla's
  ``chunk_gated_delta_rule``), at ``linear_num_key_heads`` x ``linear_key_head_dim`` queries/keys and
  ``linear_num_value_heads`` x ``linear_value_head_dim`` values, over more than one 64-token chunk;
- ``linear_attention_recurrent``: the decode delta rule (``torch_recurrent_gated_delta_rule``: transformers' torch
  function or fla's ``fused_recurrent_gated_delta_rule``) from a non-zero state;
- ``attention``: the attention function of the full-attention layers (transformers' attention interface for the
  implementation the model loads with: ``sdpa`` where the model class supports it, else the module's eager
  function), at ``num_attention_heads`` / ``num_key_value_heads`` x ``head_dim``, causal.

Hybrid (Gated DeltaNet) targets get all three, dense ones the attention probe alone. An unchanged kernel gives the
same digest bit for bit in every process (CPU probes run with one thread, so the digest does not depend on
``--torch-threads`` or the xdist worker count). :class:`dflash_eval.target.kernel_registry.KernelProbes` keeps one
:class:`ProbeResult` per (backend, dtype) of a run and the registry of the digests cached features were extracted
with.

Example::

    from dflash_eval.target.loader import TargetDir
    r = probe(TargetDir("fixtures/target"), "torch", torch.float32, "cpu")
    print(r.digest[:12], {k: v.digest[:12] for k, v in r.kernels.items()}, f"{r.seconds * 1e3:.1f} ms")
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from dflash_eval.errors import ConfigError
from dflash_eval.target.backends import split_backend, use_backend
from dflash_eval.target.loader import TargetDir

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["KernelDigest", "ProbeResult", "ProbeShapes", "KERNEL_KINDS", "probe", "modeling_module",
           "attention_implementation", "tensor_digest", "PROBE_SEED"]

PROBE_SEED = 20240611
CHUNK_T = 80  # more than one 64-token chunk of the chunked delta rule, the last one padded
RECURRENT_T = 4  # decode steps from a non-zero state
ATTENTION_T = 24
#: kernel name -> which kind of kernel it is, as messages say it
KERNEL_KINDS = {"linear_attention_chunk": "linear-attention", "linear_attention_recurrent": "linear-attention",
                "attention": "attention"}
_CHUNK, _RECUR = "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"


def tensor_digest(tensors: dict[str, torch.Tensor | None]) -> str:
    """sha256 over each tensor's name, dtype, shape and exact bytes (in name order; None is hashed as absent)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode() + b"\0")
        if t is None:
            h.update(b"none\0")
            continue
        t = t.detach().contiguous().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ shapes
def _int_field(cfg: dict[str, Any], key: str, where: Path, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: no {key!r}, which the kernel probe needs for the head shapes")
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n <= 0:
        raise ConfigError(f"{where}: {key!r} is {value!r}; the kernel probe needs a positive integer")
    return n


@dataclass(frozen=True)
class ProbeShapes:
    """The head shapes the target's kernels run at (config.json, text part)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    linear: tuple[int, int, int, int] | None  # key heads, value heads, key head dim, value head dim

    @classmethod
    def from_target(cls, target_dir: TargetDir) -> ProbeShapes:
        """Read from ``target_dir``'s config.json; a missing or non-positive field is a ConfigError naming it."""
        cfg, where = target_dir.text, target_dir.config_file
        heads = _int_field(cfg, "num_attention_heads", where)
        kv = _int_field(cfg, "num_key_value_heads", where, heads)
        hidden = _int_field(cfg, "hidden_size", where)
        head_dim = _int_field(cfg, "head_dim", where, hidden // heads if hidden >= heads else None)
        if heads % kv:
            raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        linear = None
        if "linear_attention" in target_dir.layer_types:
            hk, hv = (_int_field(cfg, k, where) for k in ("linear_num_key_heads", "linear_num_value_heads"))
            dk, dv = (_int_field(cfg, k, where) for k in ("linear_key_head_dim", "linear_value_head_dim"))
            if hv % hk:
                raise ConfigError(f"{where}: linear_num_value_heads {hv} is not a multiple of linear_num_key_heads "
                                  f"{hk}")
            linear = (hk, hv, dk, dv)
        return cls(heads, kv, head_dim, linear)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                               "head_dim": self.head_dim}
        if self.linear is not None:
            out["linear"] = dict(zip(("key_heads", "value_heads", "key_head_dim", "value_head_dim"), self.linear))
        return out


# ------------------------------------------------------------------------------------------------ what to call
def _model_class(target_dir: TargetDir) -> type[PreTrainedModel]:
    """The transformers class ``AutoModelForCausalLM`` builds for the target (else the config's architecture)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    raw = target_dir.raw
    names = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(raw.get("model_type"))),
             MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(target_dir.text.get("model_type"))),
             *(raw.get("architectures") or [])]
    for name in names:
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if cls is not None:
            return cls
    raise ConfigError(f"{target_dir.config_file}: model_type {raw.get('model_type')!r} / architectures "
                      f"{raw.get('architectures')!r} name no causal LM class of this transformers "
                      f"({transformers.__version__}): the kernel probe cannot tell which kernels the target calls")


def modeling_module(target_dir: TargetDir) -> ModuleType:
    """The transformers modeling module of the target's causal LM class (imported; no model is built)."""
    return importlib.import_module(_model_class(target_dir).__module__)


def attention_implementation(target_dir: TargetDir) -> str:
    """The attention implementation :func:`dflash_eval.target.loader.load_target` ends up with: the config's own
    ``attn_implementation`` if it names one, else transformers' default (``sdpa`` where the class supports it,
    else ``eager``)."""
    named = target_dir.raw.get("attn_implementation") or target_dir.raw.get("_attn_implementation")
    if isinstance(named, str) and named:
        return named
    return "sdpa" if getattr(_model_class(target_dir), "_supports_sdpa", False) else "eager"


def _describe(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"


class _AttentionCarrier(torch.nn.Module):
    """What transformers' attention functions read from the attention module that calls them."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.training = False


# ------------------------------------------------------------------------------------------------ the probe
@dataclass(frozen=True)
class KernelDigest:
    """One kernel's probe: the function called, the input shapes, the digest of its outputs' exact bytes."""

    function: str
    shapes: dict[str, list[int]]
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "shapes": self.shapes, "digest": self.digest}


@dataclass(frozen=True)
class ProbeResult:
    """The probe of one (backend, dtype, device): a digest per kernel, their combined digest, the time the kernel
    calls took (``seconds``) and the time to import the modeling module they live in (``import_seconds``, paid by
    the first probe of a process; with fla, importing fla's ops is paid by the backend switch, in ``seconds``)."""

    backend: str
    dtype: str
    device: str
    shapes: ProbeShapes
    kernels: dict[str, KernelDigest]
    seconds: float
    import_seconds: float = 0.0

    @cached_property
    def digest(self) -> str:
        """sha256 over the kernels' digests: what cache keys carry."""
        return hashlib.sha256(json.dumps({k: v.digest for k, v in sorted(self.kernels.items())}).encode()
                              ).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.dtype}"

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "dtype": self.dtype, "device": self.device, "digest": self.digest,
                "seconds": round(self.seconds, 6), "import_seconds": round(self.import_seconds, 6),
                "shapes": self.shapes.to_json(), "kernels": {k: v.to_json() for k, v in sorted(self.kernels.items())}}


def _inputs(gen: torch.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    return {name: torch.randn(shape, generator=gen, dtype=torch.float32) for name, shape in shapes.items()}


def _delta_rule_inputs(gen: torch.Generator, t: int, linear: tuple[int, int, int, int], dtype: torch.dtype,
                       dev: torch.device) -> dict[str, torch.Tensor]:
    """q, k, v in the run's dtype; beta in (0, 1) in the run's dtype and the log decay g <= 0 in fp32, as the
    Gated DeltaNet layer makes them."""
    hk, hv, dk, dv = linear
    x = _inputs(gen, {"q": (1, t, hk, dk), "k": (1, t, hk, dk), "v": (1, t, hv, dv), "b": (1, t, hv),
                      "a": (1, t, hv)})
    return {"query": x["q"].to(dev, dtype), "key": x["k"].to(dev, dtype), "value": x["v"].to(dev, dtype),
            "beta": x["b"].sigmoid().to(dev, dtype), "g": (-torch.nn.functional.softplus(x["a"]) * 0.5).to(dev)}


def _probe_delta_rule(fn: Callable[..., Any], gen: torch.Generator, t: int, linear: tuple[int, int, int, int],
                      dtype: torch.dtype, dev: torch.device, *, with_state: bool) -> KernelDigest:
    x = _delta_rule_inputs(gen, t, linear, dtype, dev)
    _, hv, dk, dv = linear
    state = (torch.randn((1, hv, dk, dv), generator=gen, dtype=torch.float32) * 0.1).to(dev) if with_state else None
    out, final = fn(x["query"], x["key"], x["value"], g=x["g"], beta=x["beta"], initial_state=state,
                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    shapes = {k: list(v.shape) for k, v in x.items()}
    if state is not None:
        shapes["initial_state"] = list(state.shape)
    return KernelDigest(_describe(fn), shapes, tensor_digest({"output": out, "final_state": final}))


def _probe_attention(mod: ModuleType, impl: str, gen: torch.Generator, shapes: ProbeShapes, dtype: torch.dtype,
                     dev: torch.device) -> KernelDigest:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    default = getattr(mod, "eager_attention_forward", None)
    if impl == "eager" and default is None:
        raise ConfigError(f"{mod.__name__} has no eager_attention_forward for the kernel probe's attention")
    fn = ALL_ATTENTION_FUNCTIONS.get_interface(impl, default)  # type: ignore[arg-type]  # None only for a registered impl (eager checked above)
    h, kv, d = shapes.num_heads, shapes.num_kv_heads, shapes.head_dim
    x = _inputs(gen, {"query": (1, h, ATTENTION_T, d), "key": (1, kv, ATTENTION_T, d),
                      "value": (1, kv, ATTENTION_T, d)})
    q, k, v = (x[n].to(dev, dtype) for n in ("query", "key", "value"))
    out, _ = fn(_AttentionCarrier(h // kv).to(dev), q, k, v, None, dropout=0.0, scaling=d ** -0.5)
    return KernelDigest(f"{impl}: {_describe(fn)}", {k: list(t.shape) for k, t in x.items()},
                        tensor_digest({"output": out}))


_THREADS_LOCK = threading.Lock()


def probe(target_dir: TargetDir, backend: str, dtype: torch.dtype, device: torch.device | str) -> ProbeResult:
    """Run the target's kernels for ``backend`` (a ``+<fault>`` suffix is dropped: the fault is named in the cache
    key already) in ``dtype`` on ``device`` on fixed seeded inputs; see the module docstring."""
    t0 = time.perf_counter()
    shapes = ProbeShapes.from_target(target_dir)
    mod = modeling_module(target_dir)
    impl = attention_implementation(target_dir)
    base = split_backend(backend)[0]
    dev = torch.device(device)
    kernels: dict[str, KernelDigest] = {}
    t1 = time.perf_counter()
    with _THREADS_LOCK:
        threads = torch.get_num_threads()
        if dev.type == "cpu":
            torch.set_num_threads(1)  # CPU reductions may split differently with another thread count
        try:
            gen = torch.Generator().manual_seed(PROBE_SEED)
            with torch.no_grad():
                if shapes.linear is not None and hasattr(mod, _CHUNK):
                    with use_backend(base, dev):
                        kernels["linear_attention_chunk"] = _probe_delta_rule(
                            getattr(mod, _CHUNK), gen, CHUNK_T, shapes.linear, dtype, dev, with_state=False)
                        kernels["linear_attention_recurrent"] = _probe_delta_rule(
                            getattr(mod, _RECUR), gen, RECURRENT_T, shapes.linear, dtype, dev, with_state=True)
                kernels["attention"] = _probe_attention(mod, impl, gen, shapes, dtype, dev)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        finally:
            torch.set_num_threads(threads)
    return ProbeResult(base, str(dtype).removeprefix("torch."), str(dev), shapes, kernels,
                       seconds=time.perf_counter() - t1, import_seconds=t1 - t0)
