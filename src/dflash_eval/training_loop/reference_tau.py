"""The reference drafter as a yardstick: its τ on the same prompts, and the paired difference of a drafter's τ.

``--reference-drafter DIR`` (a released drafter of the same target, e.g. the one a training run reproduces) is
evaluated once per process on the shared completions and features (:meth:`ReferenceTau.measure`); every drafter's
result then carries ``drafter.reference`` (eval.json, gate.json, the history): the reference's mean chain and DDTree
τ and, paired over the prompts both have, the mean difference drafter - reference with its percentile-bootstrap
95 % CI (the statistics of :mod:`dflash_eval.metrics.baseline`). The architecture comparison against the reference
stays its own test (``tests_eval/test_checkpoint.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.metrics.baseline import Baseline, compare
from dflash_eval.metrics.tau import macro_tau

if TYPE_CHECKING:
    from dflash_eval.session.eval_session import EvalSession

__all__ = ["ReferenceTau", "reference_session"]


def reference_session(base: EvalSession) -> EvalSession | None:
    """A session of ``--reference-drafter`` sharing ``base``'s inputs, completions and features (None without it)."""
    from dflash_eval.session.eval_session import EvalSession

    ref = base.settings.reference_drafter
    if ref is None:
        return None
    return EvalSession(replace(base.settings, drafter=Path(ref), drafter_config=None), shared=base)


@dataclass(frozen=True)
class ReferenceTau:
    """τ of the reference drafter: chain τ per prompt, the macro means (chain and each DDTree budget)."""

    path: str
    fingerprint: str
    prompts: dict[str, float]
    mean_tau: float
    mean_ddtree: dict[str, float]

    @classmethod
    def measure(cls, session: EvalSession) -> ReferenceTau:
        """From the reference's session (:func:`reference_session`): its τ on the shared features."""
        res = session.tau_results
        budgets = sorted({b for r in res.values() for b in r.ddtree})
        return cls(path=str(session.settings.drafter), fingerprint=session.evaluation.checkpoint.fingerprint,
                   prompts={p: r.chain.tau for p, r in res.items()},
                   mean_tau=macro_tau([r.chain for r in res.values()]),
                   mean_ddtree={str(b): macro_tau([r.ddtree[b] for r in res.values()]) for b in budgets})

    def block(self, tau: dict[str, float]) -> dict[str, Any]:
        """eval.json's ``drafter.reference`` for a drafter whose chain τ per prompt is ``tau``."""
        paired = compare(tau, Baseline(Path(self.path), self.prompts, {}, self.fingerprint), drop_tol=0.0,
                         rise_tol=0.0)
        d = paired.diff
        return {"path": self.path, "fingerprint": self.fingerprint, "mean_tau": self.mean_tau,
                "mean_ddtree": dict(self.mean_ddtree), "prompts": dict(self.prompts),
                "paired": {"n": paired.n, "mean_reference": paired.mean_baseline, "mean_drafter": paired.mean_run,
                           "mean_diff": d.mean, "ci95": [d.ci_low, d.ci_high], "rel_change": paired.rel_change}}
