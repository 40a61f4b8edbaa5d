"""The drift budget's perturbation ladder: parsing ``--drift-budget-ladder`` and applying one level to a prompt's
features (torch is imported on use only, so the option declarations stay torch-free).

``xA`` (e.g. ``x10``) amplifies the run's measured drift direction: ``f + A * (g - f)`` per prompt and layer, where
``f`` are the features the budget perturbs (the reference side) and ``g`` the same prompt's features from the other
side of the run's drift comparison (e.g. bf16 against fp32, or fla against torch): the main axis of the budget, with
no randomness (the seed does not enter). A number ``e`` is relative Gaussian noise, ``f + e * rms(f) * N(0, 1)`` per
prompt and layer, seeded from the seed, the level, the prompt id and the layer (a prompt's noise does not depend on
which other prompts are selected); ``bf16`` / ``fp16`` / ``fp8`` round the features through that dtype
(:func:`dflash_eval.common.dtypes.round_through`). Noise and rounding form the isotropic (secondary) axis.
:mod:`dflash_eval.metrics.drift_budget` measures τ under each level and applies the rule.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash_eval.common.dtypes import ROUNDINGS, round_through, rounding_available
from dflash_eval.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_LADDER", "DRIFT", "DRIFT_AXIS", "ISOTROPIC_AXIS", "Perturbation", "parse_ladder", "perturb_layers"]

DEFAULT_LADDER = "x1,x3,x10,x30,x100,x300,0.1,0.5,1,bf16,fp8"

#: The perturbation kind of the amplified drift direction (the budget's main axis).
DRIFT = "drift"
#: The axes of the ladder: the amplified drift direction, and isotropic noise with dtype rounding.
DRIFT_AXIS, ISOTROPIC_AXIS = "drift", "isotropic"


@dataclass(frozen=True)
class Perturbation:
    """One level of the ladder: the measured drift direction amplified by ``size`` (``drift``), relative Gaussian
    noise of ``size`` (``noise``), or rounding through ``dtype`` (``round``)."""

    kind: str  # "drift" | "noise" | "round"
    size: float = 0.0
    dtype: str = ""

    @property
    def label(self) -> str:
        if self.kind == DRIFT:
            return f"drift x{self.size:g}"
        return f"noise {self.size:g}" if self.kind == "noise" else f"round {self.dtype}"

    @property
    def axis(self) -> str:
        """:data:`DRIFT_AXIS` for the amplified drift direction, :data:`ISOTROPIC_AXIS` for noise and rounding."""
        return DRIFT_AXIS if self.kind == DRIFT else ISOTROPIC_AXIS

    @property
    def seeded(self) -> bool:
        """The level depends on ``--drift-budget-seed`` (noise only: the drift direction and roundings do not)."""
        return self.kind == "noise"

    @property
    def available(self) -> bool:
        """False for a rounding this torch has no dtype for (the level is skipped and listed as such)."""
        return self.kind != "round" or rounding_available(self.dtype)

    def apply(self, x: torch.Tensor, seed: int, other: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` perturbed (noise drawn from a generator seeded with ``seed``; the drift direction ``other - x``
        amplified, ``other`` being the same prompt's and layer's features from the other side)."""
        import torch

        if self.kind == "round":
            return round_through(x, self.dtype)
        if self.kind == DRIFT:
            if other is None:
                raise ValueError(f"{self.label}: the amplified drift needs the other side's features")
            if tuple(other.shape) != tuple(x.shape):
                raise ValueError(f"{self.label}: the other side's features have shape {tuple(other.shape)}, the "
                                 f"perturbed ones {tuple(x.shape)}: not the same tokens")
            xf = x.float()
            return (xf + self.size * (other.to(xf.device).float() - xf)).to(x.dtype)
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(x.shape, generator=gen, dtype=torch.float32).to(x.device)
        xf = x.float()
        return (xf + self.size * xf.pow(2).mean().sqrt() * noise).to(x.dtype)


def parse_ladder(spec: str) -> tuple[Perturbation, ...]:
    """``"x1,x10,1e-3,1e-2,bf16,fp8"`` -> perturbations (ConfigError naming ``--drift-budget-ladder`` and the item on
    bad items)."""
    out: list[Perturbation] = []
    for item in (s.strip().lower() for s in str(spec).split(",")):
        if not item:
            continue
        if item in ROUNDINGS:
            p = Perturbation("round", dtype=item)
        elif item.startswith("x"):
            try:
                alpha = float(item[1:])
            except ValueError:
                alpha = -1.0
            if not (alpha > 0 and math.isfinite(alpha)):
                raise ConfigError(f"--drift-budget-ladder: {item!r} is not an amplification of the measured drift "
                                  f"direction ('x' and a factor > 0, e.g. x10); got {spec!r}")
            p = Perturbation(DRIFT, size=alpha)
        else:
            try:
                p = Perturbation("noise", size=float(item))
            except ValueError:
                p = Perturbation("noise", size=-1.0)
            if not (p.size > 0 and math.isfinite(p.size)):
                raise ConfigError(f"--drift-budget-ladder: {item!r} is neither a relative noise size > 0 (e.g. "
                                  f"1e-3) nor a rounding dtype ({', '.join(ROUNDINGS)}) nor an amplified drift (e.g. "
                                  f"x10); got {spec!r}")
        if p not in out:
            out.append(p)
    if not out:
        raise ConfigError(f"--drift-budget-ladder: no perturbation given ({spec!r}); e.g. {DEFAULT_LADDER}")
    return tuple(out)


def _seed(seed: int, p: Perturbation, prompt_id: str, layer: int) -> int:
    h = hashlib.sha256(f"{seed}/{p.label}/{prompt_id}/{layer}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.double() - b.double()).norm()
    n = b.double().norm()
    return float(d / n) if n > 0 else float(d)


def perturb_layers(feats: dict[int, torch.Tensor], p: Perturbation, *, seed: int, prompt_id: str,
                   dtype: torch.dtype,
                   other: dict[int, torch.Tensor] | None = None) -> tuple[torch.Tensor, list[float]]:
    """One prompt's features of every layer perturbed, concatenated in layer order and cast to ``dtype`` (what the
    drafter sees), with each layer's injected relative error (against the unperturbed features in ``dtype``).
    ``other``: the prompt's features of the other side by layer (needed by a ``drift`` level only)."""
    import torch

    if p.kind == DRIFT and (other is None or any(layer not in other for layer in feats)):
        missing = sorted(feats) if other is None else sorted(set(feats) - set(other))
        raise ValueError(f"{p.label} of prompt {prompt_id!r}: no features of the other side for layers {missing}")
    parts, errs = [], []
    for layer, f in feats.items():
        base = f.to(dtype)
        toward = other[layer] if p.kind == DRIFT and other is not None else None
        pert = p.apply(f, _seed(seed, p, prompt_id, layer), toward).to(dtype)
        parts.append(pert)
        errs.append(_rel(pert, base))
    return torch.cat(parts, dim=-1), errs
