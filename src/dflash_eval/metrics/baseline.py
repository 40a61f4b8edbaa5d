"""Comparing a run's τ with a baseline: an earlier reports/eval.json (the last good checkpoint), prompt by prompt.

The comparison is paired over the prompts both runs have: the mean of the per-prompt differences (this run minus
the baseline), its paired 95 % confidence interval (skew-corrected t,
:func:`dflash_eval.metrics.stats.paired_difference`) and the change relative to the baseline's mean over the same
prompts. Two rules, each its own test (decided by :mod:`dflash_eval.metrics.verdict`, the baseline part of the
verdict):

- drop: the run fails when mean chain τ fell by more than ``--baseline-drop-tol`` (relative);
- ceiling: the run fails when mean chain τ rose by more than ``--baseline-rise-tol`` (relative): τ that jumps up is
  more often a bug than a breakthrough (a drafter that sees future tokens scores near the block size).

The defaults come from measured noise (docs/manual.md, "Baseline tolerances"). A baseline recorded with other
τ-relevant settings (:mod:`dflash_eval.metrics.tau_context`) is refused before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.metrics.stats import Summary, paired_difference
from dflash_eval.metrics.verdict import drop_holds, rise_holds

__all__ = ["Baseline", "BaselineComparison", "compare"]


@dataclass(frozen=True)
class Baseline:
    """The per-prompt τ and run context of an earlier eval.json (``samples``: each prompt's per-sample τ of a run
    at temperature > 0), as :func:`dflash_eval.session.baseline_file.read_baseline` reads it from the file's typed
    result (this layer reads no eval.json)."""

    path: Path
    tau: dict[str, float]
    context: dict[str, Any]
    drafter: str | None
    samples: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class BaselineComparison:
    """This run against a baseline (see module docstring)."""

    path: str
    deltas: dict[str, tuple[float, float]]  # prompt id -> (baseline τ, this run's τ)
    missing: list[str]  # selected prompts the baseline does not have
    drop_tol: float
    rise_tol: float
    samples: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # T > 0: (baseline, run)

    @property
    def n(self) -> int:
        return len(self.deltas)

    @property
    def mean_baseline(self) -> float:
        return _mean([b for b, _ in self.deltas.values()])

    @property
    def mean_run(self) -> float:
        return _mean([a for _, a in self.deltas.values()])

    @property
    def diff(self) -> Summary:
        """Summary (mean, median, paired skew-corrected t 95 % CI) of the paired differences this run - baseline (at
        temperature > 0 with both runs' samples)."""
        return paired_difference({p: a for p, (_, a) in self.deltas.items()},
                                 {p: b for p, (b, _) in self.deltas.items()},
                                 after_samples={p: a for p, (_, a) in self.samples.items()} if self.samples else None,
                                 before_samples={p: b for p, (b, _) in self.samples.items()} if self.samples else None)

    @property
    def rel_change(self) -> float:
        base = self.mean_baseline
        return self.diff.mean / base if base and not math.isnan(base) else float("nan")

    @property
    def drop_passed(self) -> bool:
        """τ did not drop beyond ``drop_tol`` (:func:`dflash_eval.metrics.verdict.drop_holds`)."""
        return drop_holds(self.n, self.rel_change, self.drop_tol)

    @property
    def rise_passed(self) -> bool:
        """τ did not rise beyond ``rise_tol`` (:func:`dflash_eval.metrics.verdict.rise_holds`)."""
        return rise_holds(self.n, self.rel_change, self.rise_tol)

    def describe(self) -> str:
        d = self.diff
        return (f"mean chain τ {self.mean_baseline:.3f} (baseline {self.path}) -> {self.mean_run:.3f} over {self.n} "
                f"paired prompts: Δ {d.mean:+.3f} (95 % CI ({d.ci_method}) [{d.ci_low:+.3f}, {d.ci_high:+.3f}]), "
                f"{100 * self.rel_change:+.2f} % (allowed -{100 * self.drop_tol:g} % .. +{100 * self.rise_tol:g} %)")

    def to_json(self) -> dict[str, Any]:
        d = self.diff
        return {"path": self.path, "n": self.n, "missing": list(self.missing), "mean_baseline": self.mean_baseline,
                "mean_run": self.mean_run, "mean_diff": d.mean, "ci95": [d.ci_low, d.ci_high],
                "ci_method": d.ci_method, "rel_change": self.rel_change, "drop_tol": self.drop_tol,
                "rise_tol": self.rise_tol,
                "drop_passed": self.drop_passed, "rise_passed": self.rise_passed,
                "prompts": {p: {"baseline": b, "run": a, "delta": a - b} for p, (b, a) in self.deltas.items()}}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def compare(run_tau: dict[str, float], baseline: Baseline, *, drop_tol: float, rise_tol: float,
            run_samples: Mapping[str, Sequence[float]] | None = None) -> BaselineComparison:
    """Pair ``run_tau`` (prompt id -> chain τ) with the baseline's τ of the same prompts (``run_samples``: at
    temperature > 0 each prompt's per-sample τ, paired with the baseline's for the CI)."""
    deltas = {p: (baseline.tau[p], t) for p, t in run_tau.items()
              if p in baseline.tau and not math.isnan(t) and not math.isnan(baseline.tau[p])}
    run_samples = run_samples or {}
    samples = {p: (list(baseline.samples[p]), [float(v) for v in run_samples[p]]) for p in deltas
               if p in baseline.samples and p in run_samples}
    return BaselineComparison(str(baseline.path), deltas, [p for p in run_tau if p not in baseline.tau],
                              drop_tol, rise_tol, samples if len(samples) == len(deltas) else {})
