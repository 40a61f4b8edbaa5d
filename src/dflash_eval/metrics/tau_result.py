"""One response's τ as data: its per-round acceptance lengths and what follows from them (:class:`TauResult`), and
the macro mean over responses (:func:`macro_tau`). No torch: the reports, the golden writer and the sampled-τ
statistics read these without loading the simulation (:mod:`dflash_eval.metrics.tau`, which produces them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TauResult", "macro_tau"]


@dataclass
class TauResult:
    """Per-round acceptance lengths of one response and their summary."""

    accept_lengths: list[int]
    block_size: int
    method: str = "chain"

    @property
    def rounds(self) -> int:
        return len(self.accept_lengths)

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else float("nan")

    @property
    def histogram(self) -> list[int]:
        """Counts of acceptance lengths 1..B (index 0 is length 1). DDTree paths are capped at B too."""
        counts = [0] * self.block_size
        for a in self.accept_lengths:
            counts[min(a, self.block_size) - 1] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "tau": self.tau, "rounds": self.rounds,
                "accept_lengths": list(self.accept_lengths), "histogram": self.histogram}


def macro_tau(results: Sequence[TauResult]) -> float:
    """Mean over responses of each response's τ (z-lab's benchmark convention)."""
    vals = [r.tau for r in results if r.rounds]
    return sum(vals) / len(vals) if vals else float("nan")
