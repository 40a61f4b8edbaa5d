"""The drift budget's perturbation ladder: parsing ``--drift-budget-ladder`` and applying one level to a prompt's
features (torch is imported on use only, so the option declarations stay torch-free).

A number ``e`` is relative Gaussian noise, ``f + e * rms(f) * N(0, 1)`` per prompt and layer, seeded from the seed,
the level, the prompt id and the layer (a prompt's noise does not depend on which other prompts are selected);
``bf16`` / ``fp16`` / ``fp8`` round the features through that dtype (:func:`dflash_eval.common.dtypes.round_through`).
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

__all__ = ["DEFAULT_LADDER", "Perturbation", "parse_ladder", "perturb_layers"]

DEFAULT_LADDER = "1e-3,1e-2,3e-2,1e-1,3e-1,0.5,1,2,bf16,fp16,fp8"


@dataclass(frozen=True)
class Perturbation:
    """One level of the ladder: relative Gaussian noise of ``size``, or rounding through ``dtype``."""

    kind: str  # "noise" | "round"
    size: float = 0.0
    dtype: str = ""

    @property
    def label(self) -> str:
        return f"noise {self.size:g}" if self.kind == "noise" else f"round {self.dtype}"

    @property
    def available(self) -> bool:
        """False for a rounding this torch has no dtype for (the level is skipped and listed as such)."""
        return self.kind == "noise" or rounding_available(self.dtype)

    def apply(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        """``x`` perturbed (noise drawn from a generator seeded with ``seed``)."""
        import torch

        if self.kind == "round":
            return round_through(x, self.dtype)
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(x.shape, generator=gen, dtype=torch.float32).to(x.device)
        xf = x.float()
        return (xf + self.size * xf.pow(2).mean().sqrt() * noise).to(x.dtype)


def parse_ladder(spec: str) -> tuple[Perturbation, ...]:
    """``"1e-3,1e-2,bf16,fp8"`` -> perturbations (ConfigError naming ``--drift-budget-ladder`` on bad items)."""
    out: list[Perturbation] = []
    for item in (s.strip().lower() for s in str(spec).split(",")):
        if not item:
            continue
        if item in ROUNDINGS:
            p = Perturbation("round", dtype=item)
        else:
            try:
                p = Perturbation("noise", size=float(item))
            except ValueError:
                p = Perturbation("noise", size=-1.0)
            if not (p.size > 0 and math.isfinite(p.size)):
                raise ConfigError(f"--drift-budget-ladder: {item!r} is neither a relative noise size > 0 (e.g. 1e-3) "
                                  f"nor a rounding dtype ({', '.join(ROUNDINGS)}); got {spec!r}")
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
                   dtype: torch.dtype) -> tuple[torch.Tensor, list[float]]:
    """One prompt's features of every layer perturbed, concatenated in layer order and cast to ``dtype`` (what the
    drafter sees), with each layer's injected relative error (against the unperturbed features in ``dtype``)."""
    import torch

    parts, errs = [], []
    for layer, f in feats.items():
        base = f.to(dtype)
        pert = p.apply(f, _seed(seed, p, prompt_id, layer)).to(dtype)
        parts.append(pert)
        errs.append(_rel(pert, base))
    return torch.cat(parts, dim=-1), errs
