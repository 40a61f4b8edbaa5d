"""Hidden-state drift between two feature extractions (backends, dtypes or library versions): the metrics, and
which comparisons a run makes with their tolerances.

``rel_err = ||a - e|| / ||e||`` and ``cos = <a, e> / (||a|| ||e||)`` over a whole [T, H] layer, computed in
fp64 so the metric itself adds no error. ``fingerprint`` summarises a layer in a few statistics that a golden
file can pin across library upgrades.

On a GPU with fla a run compares the evaluation backend against the reference backend (the one the drafter was
trained on). Where the two are the same (a CPU, where fla cannot run): the chunked vs step-by-step torch paths and
bf16 vs fp32, plus a skipped fla comparison whose reason says what was not checked. The default tolerances
(5e-3 / 0.9999 in fp32, 5e-2 / 0.998 when bf16 or fp16 is involved) are derived in docs/gpu-drift.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from dflash_eval.backends import check_backend_device, fla_available, split_backend
from dflash_eval.errors import DFlashEvalError

__all__ = ["LayerDrift", "layer_drift", "fingerprint", "Side", "Comparison", "DriftStat", "drift_stat",
           "drift_comparisons"]


@dataclass(frozen=True)
class LayerDrift:
    rel_err: float
    cos: float
    max_abs: float

    def to_dict(self) -> dict[str, float]:
        return {"rel_err": self.rel_err, "cos": self.cos, "max_abs": self.max_abs}


def layer_drift(actual: Tensor, expected: Tensor) -> LayerDrift:
    """Relative L2 error, cosine and max abs difference of ``actual`` against ``expected`` (same shape)."""
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    a = actual.detach().to(torch.float64).flatten()
    e = expected.detach().to(torch.float64).flatten()
    diff = a - e
    en = e.norm()
    rel = float(diff.norm() / en) if en > 0 else float(diff.norm())
    denom = a.norm() * en
    cos = float(a.dot(e) / denom) if denom > 0 else 1.0
    return LayerDrift(rel_err=rel, cos=cos, max_abs=float(diff.abs().max()) if diff.numel() else 0.0)


def fingerprint(features: Tensor) -> dict[str, float]:
    """A few summary statistics of one layer's features [T, H] (fp64): mean, std, RMS, abs-max, mean row norm."""
    x = features.detach().to(torch.float64)
    return {
        "mean": float(x.mean()),
        "std": float(x.std()),
        "rms": float(x.pow(2).mean().sqrt()),
        "absmax": float(x.abs().max()),
        "row_norm_mean": float(x.norm(dim=-1).mean()),
    }


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
    """(relative L2 error ||a-b||/||b||, cosine similarity, max |a-b|): :func:`layer_drift`."""
    d = layer_drift(a, b)
    return d.rel_err, d.cos, d.max_abs


def default_tolerances(a: Side, b: Side, rel_tol: float | None = None,
                       cos_tol: float | None = None) -> tuple[float, float]:
    """(relative L2 error, cosine) tolerances of a comparison: the given ones, else the fp32 or low-precision
    defaults."""
    low = any(d in (torch.bfloat16, torch.float16) for d in (a.dtype, b.dtype))
    rel = rel_tol if rel_tol is not None else (5e-2 if low else 5e-3)
    cos = cos_tol if cos_tol is not None else (0.998 if low else 0.9999)
    return rel, cos


def drift_comparisons(*, eval_backend: str, reference_backend: str, requested_backend: str, device: torch.device,
                      dtype: torch.dtype, rel_tol: float | None = None, cos_tol: float | None = None,
                      accept_tol: float = 0.5) -> list[Comparison]:
    """The drift comparisons this machine can run (a skipped one says what was not checked).

    ``eval_backend`` is the resolved backend of the evaluation's features (with a ``+<fault>`` suffix under
    ``--kernel-fault``), ``requested_backend`` what was asked for (``auto`` ...).

    - eval backend != reference backend: ``<eval>-vs-<ref>`` in the eval dtype;
    - otherwise (typically CPU, where fla cannot run): ``torch-vs-torch-recurrent`` (the chunked and the
      step-by-step torch paths) and ``bf16-vs-fp32``, plus a skipped ``fla-vs-<ref>`` naming why fla was not checked.
    """
    dt, ev, dev = dtype, eval_backend, device
    ref = reference_backend if reference_backend != "auto" else split_backend(ev)[0]
    out: list[Comparison] = []

    def comp(name: str, a: Side, b: Side, skip: str | None = None) -> Comparison:
        rel, cos = default_tolerances(a, b, rel_tol, cos_tol)
        return Comparison(name, a, b, rel, cos, accept_tol, skip)

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
            why = f"--hidden-state-backend {requested_backend} and --reference-backend {reference_backend}"
        out.append(comp(f"fla-vs-{ev}", Side("fla", dt), Side(ev, dt), f"fla not checked: {why}"))
    return out
