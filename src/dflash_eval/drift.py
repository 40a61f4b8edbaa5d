"""Hidden-state drift metrics between two feature extractions (backends, dtypes or library versions).

``rel_err = ||a - e|| / ||e||`` and ``cos = <a, e> / (||a|| ||e||)`` over a whole [T, H] layer, computed in
fp64 so the metric itself adds no error. ``fingerprint`` summarises a layer in a few statistics that a golden
file can pin across library upgrades.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LayerDrift", "layer_drift", "fingerprint"]


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
