"""The reference drafter as a yardstick: its τ on the same prompts, and the paired difference of a drafter's τ.

``--reference-drafter DIR`` (a released drafter of the same target, e.g. the one a training run reproduces) is
evaluated once per process on the shared completions and features (:meth:`ReferenceTau.measure`, asked for by
:meth:`dflash_eval.session.eval_session.EvalSession.reference_tau`, which owns it); every drafter's
result then carries ``drafter.reference`` (eval.json, gate.json, the history): the reference's mean chain and DDTree
τ and, paired over the prompts both have, the mean difference drafter - reference with its paired 95 % CI
(:func:`dflash_eval.metrics.stats.paired_difference`, as :mod:`dflash_eval.metrics.baseline` pairs a run with its
baseline). The architecture comparison against the reference
stays its own test (``tests_eval/test_checkpoint.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dflash_eval.features.feature_store import FeatureStore
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.measurements.drafter_evaluation import DrafterEvaluation
from dflash_eval.metrics.baseline import Baseline, compare
from dflash_eval.metrics.sampled_tau import sample_taus
from dflash_eval.metrics.tau_result import macro_tau
from dflash_eval.options.settings import EvalSettings
from dflash_eval.references.greedy import References

__all__ = ["ReferenceDrafter", "ReferenceTau"]


@dataclass(frozen=True)
class ReferenceTau:
    """τ of the reference drafter: chain τ per prompt, the macro means (chain and each DDTree budget); at
    temperature > 0 each prompt's per-sample chain τ (``samples``)."""

    path: str
    fingerprint: str
    prompts: dict[str, float]
    mean_tau: float
    mean_ddtree: dict[str, float]
    samples: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def measure(cls, evaluation: DrafterEvaluation) -> ReferenceTau:
        """From the reference drafter's evaluation on the shared stages: its τ on the shared features."""
        res = evaluation.tau_results
        budgets = sorted({b for r in res.values() for b in r.ddtree})
        return cls(path=str(evaluation.settings.drafter), fingerprint=evaluation.checkpoint.fingerprint,
                   prompts={p: r.chain.tau for p, r in res.items()},
                   mean_tau=macro_tau([r.chain for r in res.values()]),
                   mean_ddtree={str(b): macro_tau([r.ddtree[b] for r in res.values()]) for b in budgets},
                   samples=sample_taus({p: r.chain for p, r in res.items()}))

    def block(self, tau: dict[str, float], samples: dict[str, list[float]] | None = None) -> dict[str, Any]:
        """eval.json's ``drafter.reference`` for a drafter whose chain τ per prompt is ``tau`` (``samples``: at
        temperature > 0 its per-sample chain τ, paired with the reference's for the CI)."""
        paired = compare(tau, Baseline(Path(self.path), self.prompts, {}, self.fingerprint, self.samples),
                         drop_tol=0.0, rise_tol=0.0, run_samples=samples)
        d = paired.diff
        return {"path": self.path, "fingerprint": self.fingerprint, "mean_tau": self.mean_tau,
                "mean_ddtree": dict(self.mean_ddtree), "prompts": dict(self.prompts),
                "paired": {"n": paired.n, "mean_reference": paired.mean_baseline, "mean_drafter": paired.mean_run,
                           "mean_diff": d.mean, "ci95": [d.ci_low, d.ci_high], "ci_method": d.ci_method,
                           "rel_change": paired.rel_change}}


class ReferenceDrafter:
    """``--reference-drafter`` evaluated once on the shared stages of a run (the sessions sharing one first session
    share this object): :meth:`tau` measures it on first use."""

    def __init__(self, inputs: Inputs, references: References, store: FeatureStore, settings: EvalSettings) -> None:
        self.inputs, self.references, self.store, self.settings = inputs, references, store, settings
        self._tau: ReferenceTau | None = None

    @property
    def measured(self) -> bool:
        """Whether :meth:`tau` measured the reference drafter already."""
        return self._tau is not None

    def tau(self) -> ReferenceTau | None:
        """τ of ``--reference-drafter`` on the shared prompts, measured once (None without one)."""
        ref = self.settings.reference_drafter
        if self._tau is None and ref is not None:
            settings = replace(self.settings, drafter=Path(ref), drafter_config=None)
            self._tau = ReferenceTau.measure(DrafterEvaluation(self.inputs, self.references, self.store, settings))
        return self._tau
