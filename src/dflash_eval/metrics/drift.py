"""Hidden-state drift between two feature extractions (backends, dtypes or library versions): the metrics, and
which comparisons a run makes with their tolerances.

``rel_err = ||a - e|| / ||e||`` and ``cos = <a, e> / (||a|| ||e||)`` over a whole [T, H] layer, computed in
fp64 so the metric itself adds no error. ``fingerprint`` summarises a layer in a few statistics and a
random-projection sketch that a golden file can pin across library upgrades; ``sketch_rel_err`` estimates the
relative L2 change of the whole layer from two sketches (so a golden fingerprint can say how far the features moved,
not only that a statistic did).

On a GPU with fla a run compares the evaluation backend against the reference backend (the one the drafter was
trained on). Where the two are the same (a CPU, where fla cannot run): the chunked vs step-by-step torch paths and
bf16 vs fp32, plus a skipped fla comparison whose reason says what was not checked. The default tolerances
(5e-3 / 0.9999 in fp32, 5e-2 / 0.998 when bf16 or fp16 is involved) are derived in docs/gpu-drift.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dflash_eval.errors import DFlashEvalError
from dflash_eval.metrics.verdict.rules import sketch_changed, stat_moved
from dflash_eval.target.backends import check_backend_device, fla_installed, split_backend

__all__ = ["LayerDrift", "layer_drift", "fingerprint", "sketch", "sketch_rel_err", "SKETCH_DIM",
           "FingerprintChange", "fingerprint_change", "FINGERPRINT_TOL", "Side", "Comparison", "drift_stat",
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


SKETCH_DIM = 8  # projections per position: the estimate's relative spread is about 1 / sqrt(2 T SKETCH_DIM)


def _rademacher(hidden: int, k: int) -> Tensor:
    """A fixed [hidden, k] matrix of +-1 / sqrt(k), from an integer hash of the index (no RNG, so it is the same on
    every machine and torch version)."""
    x = torch.arange(hidden * k, dtype=torch.int64) + 0x9E3779B9
    for _ in range(2):
        x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    x = (x >> 16) ^ x
    return ((1 - 2 * (x & 1)).to(torch.float64) / k ** 0.5).reshape(hidden, k)


def sketch(features: Tensor, k: int = SKETCH_DIM) -> list[float]:
    """``features [T, H] @ R [H, k]`` (fp64, flattened), R a fixed Rademacher matrix: a Johnson-Lindenstrauss
    sketch. ``||sketch(a) - sketch(b)|| / ||sketch(b)||`` estimates ``||a - b|| / ||b||`` (:func:`sketch_rel_err`)."""
    x = features.detach().to(torch.float64).reshape(-1, features.shape[-1])
    return (x @ _rademacher(x.shape[-1], k)).flatten().tolist()


def sketch_rel_err(actual: list[float], expected: list[float]) -> float:
    """The relative L2 change of a layer's features estimated from two :func:`sketch` es of it."""
    if len(actual) != len(expected):
        raise ValueError(f"sketches of different sizes: {len(actual)} vs {len(expected)}")
    a, e = torch.tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    en = e.norm()
    return float((a - e).norm() / en) if en > 0 else float((a - e).norm())


def fingerprint(features: Tensor) -> dict[str, Any]:
    """Summary statistics of one layer's features [T, H] (fp64): mean, std, RMS, abs-max, mean row norm, and the
    layer's :func:`sketch`."""
    x = features.detach().to(torch.float64)
    return {
        "mean": float(x.mean()),
        "std": float(x.std()),
        "rms": float(x.pow(2).mean().sqrt()),
        "absmax": float(x.abs().max()),
        "row_norm_mean": float(x.norm(dim=-1).mean()),
        "sketch": sketch(x),
    }


FINGERPRINT_TOL = 1e-4  # relative: a statistic or the sketch estimate beyond this is a changed fingerprint


@dataclass(frozen=True)
class FingerprintChange:
    """One layer's fingerprint against its golden: the statistics that moved (golden, now) and the relative L2
    change of the features estimated from the sketches (``None`` when the golden has no sketch)."""

    moved: dict[str, tuple[float, float | None]]
    rel_change: float | None
    tol: float = FINGERPRINT_TOL

    @property
    def changed(self) -> bool:
        return bool(self.moved) or sketch_changed(self.rel_change, self.tol)

    def describe(self) -> str:
        parts = [f"{k}: golden {w:.6g}, now {g}" for k, (w, g) in self.moved.items()]
        if self.rel_change is not None:
            parts.insert(0, f"estimated relative change of the features {self.rel_change:.2e} (sketch; tol "
                            f"{self.tol:g})")
        return ", ".join(parts)


def fingerprint_change(want: dict[str, Any], got: dict[str, Any], tol: float = FINGERPRINT_TOL) -> FingerprintChange:
    """Compare one layer's :func:`fingerprint` with its golden: statistics beyond ``tol`` relative, and the sketch
    estimate of the relative feature change (where both have a sketch of one size)."""
    moved = {k: (w, got.get(k)) for k, w in want.items() if k != "sketch"
             if stat_moved(got.get(k), w, tol)}
    ws, gs = want.get("sketch"), got.get("sketch")
    est = sketch_rel_err(gs, ws) if ws and gs and len(ws) == len(gs) else None
    return FingerprintChange(moved, est, tol)


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
    ref: str | None = reference_backend if reference_backend != "auto" else split_backend(ev)[0]
    out: list[Comparison] = []

    def comp(name: str, a: Side, b: Side, skip: str | None = None) -> Comparison:
        rel, cos = default_tolerances(a, b, rel_tol, cos_tol)
        return Comparison(name, a, b, rel, cos, accept_tol, skip)

    if ref == "fla" and ev != "fla":
        try:
            check_backend_device("fla", dev, imports=False)
        except DFlashEvalError as exc:
            out.append(comp(f"{ev}-vs-fla", Side(ev, dt), Side("fla", dt),
                            f"fla not checked: the reference backend fla cannot run here ({exc})"))
            ref = None
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
        elif not fla_installed():
            why = "the fla package is not installed (pip install flash-linear-attention fla-core)"
        else:
            why = f"--hidden-state-backend {requested_backend} and --reference-backend {reference_backend}"
        out.append(comp(f"fla-vs-{ev}", Side("fla", dt), Side(ev, dt), f"fla not checked: {why}"))
    return out
