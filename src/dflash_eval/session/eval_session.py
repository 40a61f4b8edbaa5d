"""One evaluation run in one process: the stages composed in order.

options -> :class:`~dflash_eval.inputs.run_inputs.Inputs` (drafter-independent) ->
:class:`~dflash_eval.references.greedy.References` (completions) ->
:class:`~dflash_eval.features.feature_store.FeatureStore` (features) ->
:class:`~dflash_eval.measurements.drafter_evaluation.DrafterEvaluation` (its measurements, drift) ->
:class:`~dflash_eval.session.eval_result.EvalResult`.

The pytest plugin makes one session per process (per xdist worker); the training-loop
:class:`~dflash_eval.training_loop.evaluator.Evaluator` (and so ``dflash-eval gate``) makes one per checkpoint, each
after the first sharing the first one's inputs, completions, features and reference drafter (``shared=``). Both are
clients of the session: it never calls back into them.

Example (outside pytest)::

    settings = EvalSettings.from_mapping({"target_model": "fixtures/target", "drafter": "fixtures/drafter",
                                          "prompts": "fixtures/prompts.jsonl"})
    session = EvalSession(settings)
    for pid, r in session.tau_results.items():
        print(pid, r.chain.tau, {b: t.tau for b, t in r.ddtree.items()})
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_eval.common.progress import Sink
from dflash_eval.drafter.checkpoint import Checkpoint
from dflash_eval.drafter.model import DFlashDrafter
from dflash_eval.errors import ConfigError
from dflash_eval.features.feature_store import FeatureStore
from dflash_eval.inputs.run_inputs import DEFAULT_PROGRESS, Inputs
from dflash_eval.measurements.drafter_evaluation import DrafterEvaluation, Drift, PromptTau
from dflash_eval.metrics.baseline import Baseline, BaselineComparison, compare
from dflash_eval.metrics.drift_budget import DriftBudget
from dflash_eval.metrics.drift_checks import GateCheck
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.sampled_tau import sample_taus
from dflash_eval.metrics.tau_context import describe, mismatches, sampling_context
from dflash_eval.metrics.verdict import no_acceptance_fails
from dflash_eval.options.settings import EvalSettings
from dflash_eval.references.greedy import CompletionRecord, References
from dflash_eval.references.sampled import SampledReferences
from dflash_eval.references.server_link import ServerLink
from dflash_eval.session.baseline_file import baseline_problem, read_baseline
from dflash_eval.session.eval_result import EvalResult, TauSummary, build_result, tau_summary
from dflash_eval.session.reference_drafter import ReferenceDrafter, ReferenceTau

__all__ = ["EvalSession", "EvalSettings", "CompletionRecord", "PromptTau", "Drift", "EvalResult", "TauSummary"]


class EvalSession:
    """The stages of one run (see module docstring); each attribute is one stage."""

    def __init__(self, settings: EvalSettings, *, worker: tuple[str, int, int] | None = None,
                 log: Callable[[str], None] | None = None, shared: EvalSession | None = None,
                 checkpoint: Checkpoint | None = None, live: DFlashDrafter | None = None,
                 progress: Sink | None | str = DEFAULT_PROGRESS, server: ServerLink | None = None) -> None:
        """``checkpoint`` / ``live``: a drafter given in memory (:class:`~dflash_eval.measurements.drafter_evaluation.
        DrafterEvaluation`); :class:`dflash_eval.Evaluator` makes them. ``progress``: where long productions
        report (:class:`~dflash_eval.inputs.run_inputs.Inputs`); ``server``: how the completions stage reaches a ready
        SGLang server (:class:`~dflash_eval.references.server_link.ServerLink`; ``--completions sglang`` on a cold
        cache). A ``shared`` session's stages come with its progress sink and server link, and its reference drafter
        (``--reference-drafter``, measured once for all the sessions that share it)."""
        self.inputs: Inputs
        self.references: References
        self.store: FeatureStore
        self.sampled_references: SampledReferences
        self.reference_drafter: ReferenceDrafter
        if shared is not None:
            shared.inputs.check_shareable(settings)
            self.inputs, self.references, self.store = shared.inputs, shared.references, shared.store
            self.sampled_references, self.reference_drafter = shared.sampled_references, shared.reference_drafter
        else:
            self.inputs = Inputs(settings, worker=worker, log=log, progress=progress)
            self.references = References(self.inputs, server)
            self.store = FeatureStore(self.inputs, self.references)
            self.sampled_references = SampledReferences(self.inputs, self.references)
            self.reference_drafter = ReferenceDrafter(self.inputs, self.references, self.store, settings)
        self.settings = settings
        self.evaluation = DrafterEvaluation(self.inputs, self.references, self.store, settings,
                                            checkpoint=checkpoint, live=live,
                                            sampled_references=self.sampled_references)
        self._tau_summary: TauSummary | None = None
        self._accepts_nothing: bool | None = None
        self._floors: Floors | None = None
        self._baseline: Baseline | None = None

    # The questions the suite's tests and the CLI ask, each answered by one stage.
    @property
    def tau_results(self) -> dict[str, PromptTau]:
        return self.evaluation.tau_results

    def completions(self) -> dict[str, CompletionRecord]:
        return self.evaluation.completions()

    def references_cached(self) -> bool:
        """Whether every reference the run needs is cached: the greedy completions and, at ``--temperature`` > 0,
        the sampled ones."""
        return self.references.cached() and self.sampled_references.cached()

    def fetch_references(self) -> None:
        """Produce (or read) every reference the run needs: the greedy completions and, at ``--temperature`` > 0,
        the sampled ones (what the SGLang fixture does while it holds the server)."""
        self.completions()
        if self.sampled_references.wanted:
            self.sampled_references.completions()

    def drift(self, name: str) -> Drift:
        return self.evaluation.drift(name)

    def drift_budget(self) -> DriftBudget:
        return self.evaluation.drift_budget()

    def drift_gate(self, name: str) -> dict[int, GateCheck]:
        return self.evaluation.drift_gate(name)

    # ------------------------------------------------------------------------------------------------ goldens
    def run_context(self) -> dict[str, Any]:
        """The settings that change τ (:mod:`dflash_eval.metrics.tau_context`), recorded with floors and reports."""
        s, inp = self.settings, self.inputs
        ctx = {"target": inp.target_identity, "max_new_tokens": s.max_new_tokens, "max_blocks": s.max_blocks,
               "block_size": self.evaluation.checkpoint.config.block_size,
               "chat_template": inp.prompt_format["chat_template"], "thinking": inp.prompt_format["enable_thinking"],
               "dtype": str(s.torch_dtype).removeprefix("torch."), "backend": s.feature_backend}
        if any(p.extra.get("set") == "humaneval" for p in inp.prompts):  # the wrapper changes HumanEval's text
            ctx["humaneval_wrapper"] = s.humaneval_wrapper
        ctx.update(sampling_context(s))  # nothing at temperature 0
        return ctx

    def _refuse_or_warn(self, what: str, path: Path | None, recorded: dict[str, Any], *, explicit: bool) -> bool:
        """Check a recorded context against this run: True when it matches (or mismatches are allowed, with a
        warning); False when explicit thresholds make the file unnecessary (warning); ConfigError otherwise."""
        diffs = mismatches(recorded, self.run_context())
        if not diffs:
            return True
        lines = "\n  ".join(diffs)
        if self.settings.allow_settings_mismatch:
            warnings.warn(f"{what} {path} was recorded with other τ-relevant settings (used anyway: "
                          f"--allow-settings-mismatch):\n  {lines}", UserWarning, stacklevel=2)
            return True
        if explicit:
            warnings.warn(f"{what} {path} ignored: it was recorded with other τ-relevant settings and explicit "
                          f"thresholds were given:\n  {lines}", UserWarning, stacklevel=2)
            return False
        raise ConfigError(f"{what} {path} was recorded with other τ-relevant settings than this run:\n  {lines}\n"
                          f"(this run: {describe(self.run_context())}). Record floors for these settings "
                          "(`dflash-eval record` with this run's options, or --update-tau-floors in its pytest "
                          "command; a --floors-file and --golden-dir of their own keep another target's records "
                          "apart), pass --floors-file / --baseline files recorded with them, give explicit "
                          "thresholds (--tau-floor, --tau-floor-prompt), or --allow-settings-mismatch")

    @property
    def floors(self) -> Floors:
        """The run's floors (:meth:`check_floors`, once)."""
        return self.check_floors()

    def check_floors(self) -> Floors:
        """The floors file when it was recorded with this run's settings, and the explicit thresholds; ConfigError
        naming the file when it was recorded with other τ-relevant settings (unless allowed or explicit). Checked
        once: later calls return the first answer."""
        if self._floors is not None:
            return self._floors
        fl = self.inputs.floors
        if fl.raw and fl.context and not self.settings.update_tau_floors and not self._refuse_or_warn(
                "floors file", fl.path, fl.context, explicit=fl.explicit):
            fl = fl.without_file()
        self._floors = fl
        return fl

    @property
    def baseline(self) -> Baseline | None:
        """The --baseline eval.json (:meth:`check_baseline`; None without --baseline)."""
        return self.check_baseline()

    def check_baseline(self) -> Baseline | None:
        """The --baseline eval.json, checked against this run's settings (ConfigError naming it when it was
        recorded with other τ-relevant settings); None without --baseline. Checked once."""
        if self._baseline is not None or self.settings.baseline is None:
            return self._baseline
        b = read_baseline(self.settings.baseline)  # through the run's typed result: a bad key names the file
        self._refuse_or_warn("--baseline", b.path, b.context, explicit=False)
        self._baseline = b
        return b

    def check_inputs(self) -> None:
        """Everything that can be wrong with the inputs, checked before any work: paths, prompts, the target's
        config.json, the drafter's config.json, the floors file and the baseline against this run's settings
        (ConfigError naming the file)."""
        self.inputs.preflight(baseline_check=baseline_problem)
        self.inputs.check_target_config()
        self.evaluation.check_config()
        self.check_floors()
        self.check_baseline()

    def baseline_comparison(self) -> BaselineComparison | None:
        b = self.baseline
        if b is None:
            return None
        return compare({p: r.chain.tau for p, r in self.tau_results.items()}, b,
                       drop_tol=self.settings.baseline_drop_tol, rise_tol=self.settings.baseline_rise_tol,
                       run_samples=sample_taus({p: r.chain for p, r in self.tau_results.items()}))

    def tau_summary(self) -> TauSummary:
        """τ of every prompt judged against the floors, the means and the per-category table."""
        if self._tau_summary is None:
            online = self.evaluation.online_tau() if self.settings.online_tau else None
            self._tau_summary = tau_summary(self.evaluation, self.floors, self.baseline_comparison(), online)
        return self._tau_summary

    def accepts_nothing(self) -> bool:
        """τ 1.00 on every prompt, and the floors fail because of it
        (:func:`~dflash_eval.metrics.verdict.no_acceptance_fails` of :meth:`tau_summary`): judged once, for every τ
        test that asks."""
        if self._accepts_nothing is None:
            summary = self.tau_summary()
            self._accepts_nothing = no_acceptance_fails(summary.prompts, summary)
        return self._accepts_nothing

    def reference_tau(self) -> ReferenceTau | None:
        """``--reference-drafter``'s τ on these prompts, measured once for every session sharing this one's stages
        (None without a reference drafter)."""
        return self.reference_drafter.tau()

    def reference_comparison(self) -> dict[str, Any] | None:
        """eval.json's ``drafter.reference``: ``--reference-drafter``'s τ on these prompts (measured on first use)
        and the paired difference of this drafter's chain τ against it (None without a reference drafter)."""
        ref = self.reference_tau()
        if ref is None:
            return None
        return ref.block({p: r.tau for p, r in self.tau_summary().prompts.items()},
                         sample_taus({p: r.chain for p, r in self.tau_results.items()}))

    def measure_registered(self) -> list[str]:
        """Run the registered measurements that apply to this run (:mod:`dflash_eval.measurements.builtin`); their
        names. Their reports join :meth:`result`'s ``measurements``."""
        return self.evaluation.measure_registered()

    def result(self) -> EvalResult:
        """What this process measured, judged (never computes anything new)."""
        fp = self.store.fingerprint() if self.store.fingerprint_computed else None
        tau = self.tau_summary() if self.evaluation.tau_computed else None
        context = self.run_context() if self.evaluation.checkpoint_read and self.inputs.identity_known else None
        result = build_result(self.evaluation, tau=tau, sglang=self.references.server.info, fingerprint=fp,
                              context=context)
        if tau is not None and result.drafter is not None and self.reference_drafter.measured:
            result.drafter.reference = self.reference_comparison()
        result.measurements = self.evaluation.runner.reports()
        return result
