"""The target's sampling settings (temperature, top-k, top-p, min-p) with their checks; imports no torch, so the
suite's option checks can use it before torch is imported. The sampling itself: :mod:`dflash_eval.target.sampling`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GREEDY_EPS", "SamplingParams"]

GREEDY_EPS = 1e-6  # below this temperature sampling is greedy (SGLang's sampling epsilon)


@dataclass(frozen=True)
class SamplingParams:
    """How the target samples: ``temperature`` (0: greedy), ``top_k`` (-1 or 0: all), ``top_p`` (1: all),
    ``min_p`` (0: off)."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ValueError naming the parameter for a value no engine accepts."""
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all), 0 (all) or >= 1, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sglang(self) -> dict[str, Any]:
        """The ``sampling_params`` fields an SGLang ``/generate`` request takes for these settings."""
        return {"temperature": float(self.temperature), "top_k": int(self.top_k) if self.top_k > 0 else -1,
                "top_p": float(self.top_p), "min_p": float(self.min_p)}
