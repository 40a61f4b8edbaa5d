"""Which hidden-state drift comparisons a run makes, with their tolerances, and the per-layer result record.

On a GPU with fla: the evaluation backend against the reference backend. Where the two are the same (a CPU, where
fla cannot run): the chunked vs step-by-step torch paths and bf16 vs fp32, plus a skipped fla comparison whose
reason says what was not checked. Default tolerances are derived in docs/gpu-drift.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from dflash_eval.backends import check_backend_device, fla_available
from dflash_eval.drift import layer_drift
from dflash_eval.errors import DFlashEvalError
from dflash_eval.options import EvalSettings

__all__ = ["Side", "Comparison", "DriftStat", "drift_stat", "drift_comparisons"]


@dataclass(frozen=True)
class Side:
    """One side of a drift comparison: a backend and a dtype."""

    backend: str
    dtype: torch.dtype

    @property
    def label(self) -> str:
        return f"{self.backend}/{str(self.dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class Comparison:
    """Evaluation-side features ``a`` against reference-side features ``b``."""

    name: str
    a: Side
    b: Side
    rel_tol: float
    cos_tol: float
    accept_tol: float
    skip_reason: str | None = None


@dataclass
class DriftStat:
    comparison: str
    prompt_id: str
    layer: int
    rel_err: float
    cos: float
    max_abs: float
    rel_tol: float
    cos_tol: float

    @property
    def passed(self) -> bool:
        return self.rel_err <= self.rel_tol and self.cos >= self.cos_tol

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def drift_stat(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """(relative L2 error ||a-b||/||b||, cosine similarity, max |a-b|): :func:`dflash_eval.drift.layer_drift`."""
    d = layer_drift(a, b)
    return d.rel_err, d.cos, d.max_abs


def _default_tols(a: Side, b: Side, s: EvalSettings) -> tuple[float, float]:
    low = any(d in (torch.bfloat16, torch.float16) for d in (a.dtype, b.dtype))
    rel = s.drift_rel_tol if s.drift_rel_tol is not None else (5e-2 if low else 5e-3)
    cos = s.drift_cos_tol if s.drift_cos_tol is not None else (0.998 if low else 0.9999)
    return rel, cos


def drift_comparisons(s: EvalSettings) -> list[Comparison]:
    """The drift comparisons this machine can run (a skipped one says what was not checked).

    - eval backend != reference backend: ``<eval>-vs-<ref>`` in the eval dtype;
    - otherwise (typically CPU, where fla cannot run): ``torch-vs-torch-recurrent`` (the chunked and the
      step-by-step torch paths) and ``bf16-vs-fp32``, plus a skipped ``fla-vs-<ref>`` naming why fla was not checked.
    """
    dt = s.torch_dtype
    ev = s.eval_backend
    dev = s.torch_device
    ref = s.reference_backend if s.reference_backend != "auto" else ev
    out: list[Comparison] = []

    def comp(name: str, a: Side, b: Side, skip: str | None = None) -> Comparison:
        rel, cos = _default_tols(a, b, s)
        return Comparison(name, a, b, rel, cos, s.drift_accept_tol, skip)

    if ref == "fla" and ev != "fla":
        try:
            check_backend_device("fla", dev)
        except DFlashEvalError as exc:
            out.append(comp(f"{ev}-vs-fla", Side(ev, dt), Side("fla", dt),
                            f"fla not checked: the reference backend fla cannot run here ({exc})"))
            ref = None  # type: ignore[assignment]
    if ref is not None and ref != ev:
        out.append(comp(f"{ev}-vs-{ref}", Side(ev, dt), Side(ref, dt)))
        return out
    # Same backend on both sides: compare what this machine can.
    other = "torch-recurrent" if ev != "torch-recurrent" else "torch"
    out.append(comp(f"{ev}-vs-{other}", Side(ev, dt), Side(other, dt)))
    out.append(comp("bf16-vs-fp32", Side(ev, torch.bfloat16), Side(ev, torch.float32),
                    None if dev.type == "cpu" else "bf16 vs fp32 not checked on a GPU: it needs a second copy of "
                    "the target in the other dtype (run it on a CPU with a small target)"))
    if ev != "fla" and not any("fla" in c.name for c in out):
        if dev.type != "cuda":
            why = f"no CUDA device (running on {dev}); fla's Triton kernels cannot run on a CPU"
        elif not fla_available():
            why = "fla.ops.gated_delta_rule does not import (pip install flash-linear-attention fla-core)"
        else:
            why = f"--hidden-state-backend {s.hidden_state_backend} and --reference-backend {s.reference_backend}"
        out.append(comp(f"fla-vs-{ev}", Side("fla", dt), Side(ev, dt), f"fla not checked: {why}"))
    return out
