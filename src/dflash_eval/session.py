"""One evaluation run in one process: the stages of :mod:`dflash_eval.suite` composed in order.

options -> :class:`~dflash_eval.suite.inputs.Inputs` (drafter-independent) -> :class:`~dflash_eval.suite.references.
References` (completions) -> :class:`~dflash_eval.suite.feature_store.FeatureStore` (features) ->
:class:`~dflash_eval.suite.evaluation.DrafterEvaluation` (τ, drift) -> :class:`~dflash_eval.suite.results.EvalResult`.

The pytest plugin makes one session per process (per xdist worker); ``dflash-eval gate`` makes one per checkpoint,
each after the first sharing the first one's inputs, completions and features (``shared=``).

Example (outside pytest)::

    settings = EvalSettings.from_mapping({"target_model": "fixtures/target", "drafter": "fixtures/drafter",
                                          "prompts": "fixtures/prompts.jsonl"})
    session = EvalSession(settings)
    for pid, r in session.tau_results.items():
        print(pid, r.chain.tau, {b: t.tau for b, t in r.ddtree.items()})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dflash_eval.options import EvalSettings
from dflash_eval.suite.evaluation import DrafterEvaluation, Drift, PromptTau
from dflash_eval.suite.feature_store import FeatureStore
from dflash_eval.suite.inputs import Inputs
from dflash_eval.suite.references import CompletionRecord, References
from dflash_eval.suite.results import EvalResult, TauSummary, build_result, tau_summary

__all__ = ["EvalSession", "EvalSettings", "CompletionRecord", "PromptTau", "Drift", "EvalResult", "TauSummary"]


class EvalSession:
    """The stages of one run (see module docstring); each attribute is one stage."""

    def __init__(self, settings: EvalSettings, *, worker: tuple[str, int, int] | None = None,
                 log: Callable[[str], None] | None = None, shared: EvalSession | None = None) -> None:
        if shared is not None:
            shared.inputs.check_shareable(settings)
            self.inputs, self.references, self.store = shared.inputs, shared.references, shared.store
        else:
            self.inputs = Inputs(settings, worker=worker, log=log)
            self.references = References(self.inputs)
            self.store = FeatureStore(self.inputs)
        self.settings = settings
        self.evaluation = DrafterEvaluation(self.inputs, self.references, self.store, settings)
        self.sglang_info: dict[str, Any] | None = None  # the SGLang service's description (eval.json "sglang")
        self._tau_summary: TauSummary | None = None

    # The questions the suite's tests and the CLI ask, each answered by one stage.
    @property
    def tau_results(self) -> dict[str, PromptTau]:
        return self.evaluation.tau_results

    def completions(self) -> dict[str, CompletionRecord]:
        return self.evaluation.completions()

    def drift(self, name: str) -> Drift:
        return self.evaluation.drift(name)

    def tau_summary(self) -> TauSummary:
        """τ of every prompt judged against the floors, the means and the per-category table."""
        if self._tau_summary is None:
            self._tau_summary = tau_summary(self.evaluation)
        return self._tau_summary

    def result(self) -> EvalResult:
        """What this process measured, judged (never computes anything new)."""
        fp = self.store.fingerprint() if self.store.fingerprint_computed else None
        tau = self.tau_summary() if self.evaluation.tau_computed else None
        return build_result(self.evaluation, tau=tau, sglang=self.sglang_info, fingerprint=fp)
