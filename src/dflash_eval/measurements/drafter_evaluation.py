"""The fourth stage: one drafter checkpoint evaluated on the references and features of the earlier stages.

The checkpoint is read once and validated against the target before anything is produced for it; its measurements
(τ of every prompt, chain and each DDTree budget, on greedy or sampled references; the drift budget; the online loop)
are served by one :class:`~dflash_eval.measurements.registry.Runner` over the specs of
:mod:`dflash_eval.measurements.builtin`, each memoised in the cache, so a warm run does not even run the drafter;
drift compares the features of two sides of a :class:`~dflash_eval.metrics.drift.Comparison` and the τ each gives.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast, overload

from dflash_eval.drafter import Checkpoint, build_drafter, fit_refusal, load_config_file, read_checkpoint, run_checks
from dflash_eval.drafter.checks import Check
from dflash_eval.drafter.model import DFlashDrafter
from dflash_eval.errors import DrafterRefused
from dflash_eval.features.feature_store import Features, FeatureStore
from dflash_eval.inputs.prompt_view import PromptView
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.measurements.builtin import (
    DRIFT_BUDGET,
    LAYER_DRIFT,
    ONLINE,
    ONLINE_SAMPLED,
    TAU,
    TAU_SAMPLED,
    registered,
    spec,
)
from dflash_eval.measurements.online_greedy import OnlineTau
from dflash_eval.measurements.registry import Measurement, Runner, SpecRef
from dflash_eval.measurements.tau_greedy import PromptTau
from dflash_eval.metrics.drift import Comparison, LayerDrift, Side
from dflash_eval.metrics.drift_budget import DriftBudget, gate_check
from dflash_eval.metrics.drift_checks import DriftStat, GateCheck
from dflash_eval.options.settings import EvalSettings
from dflash_eval.prompts import Prompt
from dflash_eval.references.greedy import CompletionRecord, References
from dflash_eval.references.sampled import SampledReferences

__all__ = ["DrafterEvaluation", "PromptTau", "Drift"]

V = TypeVar("V")  # a measurement's value


@dataclass
class Drift:
    """Per-prompt, per-layer feature drift of one comparison and the chain τ each side gives (``accept`` empty when
    the drafter was refused)."""

    comparison: Comparison
    stats: dict[str, dict[int, DriftStat]]
    accept: dict[str, tuple[float, float]]


class DrafterEvaluation:
    """One drafter (``settings.drafter``) against the shared earlier stages; its measurements are served by one
    :class:`~dflash_eval.measurements.registry.Runner` (``lookup``: the measurement catalog's ``spec``)."""

    def __init__(self, inputs: Inputs, references: References, store: FeatureStore,
                 settings: EvalSettings | None = None, *, checkpoint: Checkpoint | None = None,
                 live: DFlashDrafter | None = None,
                 sampled_references: SampledReferences | None = None,
                 lookup: Callable[[str], Measurement] = spec) -> None:
        """``checkpoint``: the drafter's :class:`~dflash_eval.drafter.Checkpoint` when it is not read from
        ``settings.drafter`` (an in-memory state dict); ``live``: a drafter module to evaluate as it is (its own
        weights, device and dtype) instead of one built from the checkpoint, after the same architecture checks."""
        self.inputs, self.references, self.store = inputs, references, store
        self.settings = settings or inputs.settings  # differs from the inputs' only in the drafter options
        self.sampled_references = sampled_references or SampledReferences(inputs, references)
        self.runner = Runner(self, lookup)
        self._drift: dict[str, Drift] = {}
        self._checkpoint: Checkpoint | None = checkpoint
        self._live = live
        self._drafter: DFlashDrafter | None = None
        self._checks: list[Check] | None = None
        self._refusal: DrafterRefused | None = None
        self._refusal_known = False
        self._reference_checkpoint: Checkpoint | None = None

    def on_prompts(self, prompts: Sequence[Prompt]) -> DrafterEvaluation:
        """The same drafter (its checkpoint, check results and built drafter, not read again) on other prompts of
        the same run (the drift budget's evaluation on more prompts): their completions and features are produced
        and cached like the selection's; the kernel probes are shared (probed once per process)."""
        # a stand-in for the run's Inputs: every attribute but the prompt-derived ones is the run's own
        view = cast(Inputs, PromptView(self.inputs, list(prompts)))
        refs = References(view, self.references.server)
        store = FeatureStore(view, refs, probes=self.store.probes, witness=self.store.witness)
        other = DrafterEvaluation(view, refs, store, self.settings,
                                  checkpoint=self.checkpoint, live=self._live, lookup=self.runner.lookup)
        other._drafter, other._checks = self._drafter, self._checks
        other._refusal, other._refusal_known = self._refusal, self._refusal_known
        return other

    # ------------------------------------------------------------------------------------------------ drafter
    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint as read from disk (weights, config, fingerprint), before validation."""
        if self._checkpoint is None:
            with self.inputs.meter.timed("drafter_load"):
                self._checkpoint = read_checkpoint(self.settings.drafter, config_path=self.settings.drafter_config,
                                                   num_target_layers=self.inputs.num_layers,
                                                   vocabulary=self.inputs.vocabulary)
        return self._checkpoint

    def check_config(self) -> None:
        """Parse the drafter's config file, when it is a file of its own (``--drafter-config``, or the config.json
        beside the weights), without reading the weights: a config this evaluator refuses (e.g. a dflash_config key
        it does not implement) is one error naming the file and the key, before any test."""
        if self._checkpoint is not None:  # given in memory: its config was parsed when it was made
            return
        d, path = self.settings.drafter, self.settings.drafter_config
        if path is None and (d.is_dir() or d.suffix == ".safetensors"):
            path = d / "config.json" if d.is_dir() else d.parent / "config.json"
        if path is None or not Path(path).is_file():
            return  # a .pt with its config embedded, or no config: reading the checkpoint reports it
        with warnings.catch_warnings():  # a fallback's warning is given when the checkpoint is read
            warnings.simplefilter("ignore")
            load_config_file(Path(path), num_target_layers=self.inputs.num_layers, vocabulary=self.inputs.vocabulary)

    @property
    def reference_checkpoint(self) -> Checkpoint | None:
        """``--reference-drafter``'s checkpoint (read once; None without one)."""
        if self._reference_checkpoint is None and self.settings.reference_drafter is not None:
            self._reference_checkpoint = read_checkpoint(self.settings.reference_drafter,
                                                         num_target_layers=self.inputs.num_layers,
                                                         vocabulary=self.inputs.vocabulary)
        return self._reference_checkpoint

    @property
    def checkpoint_read(self) -> bool:
        return self._checkpoint is not None

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self.checkpoint.config.target_layer_ids)

    @property
    def checks(self) -> list[Check]:
        """Every architecture check of the drafter against the target (:data:`dflash_eval.drafter.CHECKS`), run once."""
        if self._checks is None:
            self._checks = run_checks(self.checkpoint, self.inputs.spec)
        return self._checks

    @property
    def refusal(self) -> DrafterRefused | None:
        """Why the drafter does not fit the target: a DrafterRefused naming every failed architecture check, or None.
        What needs the drafter raises it; the target-only stages (completions, features, drift statistics) do not."""
        if not self._refusal_known:
            self._refusal = fit_refusal(self.checkpoint, self.inputs.spec, self.checks)
            self._refusal_known = True
        return self._refusal

    @property
    def refusal_known(self) -> bool:
        return self._refusal_known

    def check_drafter(self) -> None:
        """Validate the drafter against the target and build it (:attr:`refusal` raised when it does not fit):
        called before anything is produced for it."""
        if self._drafter is None:
            if self.refusal is not None:
                raise self.refusal.with_traceback(None)
            if self._live is not None:
                self._drafter = self._live
                return
            with self.inputs.meter.timed("drafter_load"):
                self._drafter = build_drafter(self.checkpoint, device=self.settings.torch_device,
                                              dtype=self.settings.torch_dtype, spec=self.inputs.spec,
                                              checks=self.checks)

    @property
    def drafter(self) -> DFlashDrafter:
        """The drafter, validated against the target (:meth:`check_drafter`)."""
        self.check_drafter()
        assert self._drafter is not None  # check_drafter built it or raised
        return self._drafter

    # ------------------------------------------------------------------------------------------------ inputs
    def completions(self) -> dict[str, CompletionRecord]:
        """The reference completions (the target's alone: produced also for a drafter that does not fit the target,
        whose τ stages stop before anything is produced for it)."""
        return self.references.completions()

    def _check_layers(self) -> None:
        """The target layers the drafter reads are refused (outside the target): nothing target-only is left to
        compute on them either."""
        if self.refusal is not None and "target_layer_ids_range" in dict(self.refusal.checks):
            raise self.refusal.with_traceback(None)

    def features(self, side: Side, layers: tuple[int, ...] | None = None) -> Features:
        if layers is None:
            self._check_layers()
        comps = self.completions()
        return self.store.features(comps, side, tuple(layers if layers is not None else self.layer_ids))

    # ------------------------------------------------------------------------------------------------ measurements
    @overload
    def measure(self, spec: Measurement[Any, V], **params: Any) -> V: ...

    @overload
    def measure(self, spec: str, **params: Any) -> Any: ...

    def measure(self, spec: SpecRef, **params: Any) -> Any:
        """The value of measurement ``spec`` (a built-in one by reference, or the name of a registered one) with
        ``params`` (:class:`~dflash_eval.measurements.registry.Runner`)."""
        return self.runner.measure(spec, **params)

    @property
    def sampled(self) -> bool:
        """τ at ``--temperature`` > 0: on sampled references (:mod:`dflash_eval.references.sampled`)."""
        return self.sampled_references.wanted

    def _tau_request(self) -> tuple[Measurement[Any, dict[str, PromptTau]], dict[str, Any]]:
        budgets = tuple(self.settings.ddtree_budget)
        if self.sampled:
            return TAU_SAMPLED, {"budgets": budgets}
        return TAU, {"side": self.inputs.eval_side, "budgets": budgets}

    @property
    def tau_computed(self) -> bool:
        spec, params = self._tau_request()
        return self.runner.computed(spec, **params)

    @property
    def tau_results(self) -> dict[str, PromptTau]:
        """τ of every prompt on the evaluation backend's features (chain and every DDTree budget): on the greedy
        references, or at ``--temperature`` > 0 the mean over each prompt's sampled references."""
        spec, params = self._tau_request()
        return self.measure(spec, **params)

    @property
    def greedy_tau_results(self) -> dict[str, PromptTau]:
        """τ of every prompt on the greedy references (the drift comparisons' τ at any temperature)."""
        return self.tau_for(self.inputs.eval_side, tuple(self.settings.ddtree_budget))

    def tau_for(self, side: Side, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
        return self.measure(TAU, side=side, budgets=budgets)

    def online_tau(self) -> dict[str, OnlineTau]:
        """Every prompt's online τ (``--online-tau``): on the greedy references, or per sampled reference."""
        return self.measure(ONLINE_SAMPLED) if self.sampled else self.measure(ONLINE)

    def measure_registered(self) -> list[str]:
        """Run every registered measurement that applies to this run's settings (those registered from outside;
        the built-in ones are asked for by the stages that need them); their names."""
        names = [n for n, m in registered().items() if m.applies(self.settings)]
        for name in names:
            self.measure(name)
        return names

    # ------------------------------------------------------------------------------------------------ drift
    def drift(self, name: str) -> Drift:
        """Per-prompt per-layer feature drift and per-prompt τ on each side for comparison ``name``."""
        if name not in self._drift:
            c = self.inputs.comparison(name)
            stats = {pid: {i: DriftStat(name, pid, i, d.rel_err, d.cos, d.max_abs, c.rel_tol, c.cos_tol)
                           for i, d in per.items()} for pid, per in self.layer_drifts(c.a, c.b).items()}
            accept: dict[str, tuple[float, float]] = {}
            if self.refusal is None:  # a refused drafter: the statistics of the target's features only
                ev = self.inputs.eval_side
                ta = self.greedy_tau_results if c.a == ev else self.tau_for(c.a, ())
                tb = self.greedy_tau_results if c.b == ev else self.tau_for(c.b, ())
                accept = {p.id: (ta[p.id].chain.tau, tb[p.id].chain.tau) for p in self.inputs.prompts}
            self._drift[name] = Drift(c, stats, accept)
        return self._drift[name]

    def layer_drifts(self, a: Side, b: Side) -> dict[str, dict[int, LayerDrift]]:
        """:func:`~dflash_eval.metrics.drift.layer_drift` of side ``a``'s features against side ``b``'s, by prompt
        and target layer (the ``layer_drift`` measurement: cached, keyed by both sides' feature entries); one value
        per pair of sides (a comparison's statistics and the drift budget's direction read the same pair)."""
        self._check_layers()
        return self.measure(LAYER_DRIFT, a=a, b=b)

    @property
    def drifts(self) -> dict[str, Drift]:
        """The comparisons computed so far."""
        return dict(self._drift)

    # ------------------------------------------------------------------------------------------------ drift budget
    @property
    def budget_computed(self) -> bool:
        return self.runner.computed(DRIFT_BUDGET)

    def drift_budget(self) -> DriftBudget:
        """The drafter's drift budget (:mod:`dflash_eval.measurements.budget_ladder`), measured on at least
        ``--drift-budget-min-prompts`` prompts where ``--prompts`` holds them."""
        return self.measure(DRIFT_BUDGET)

    def drift_gate(self, name: str) -> dict[int, GateCheck]:
        """The gate of comparison ``name`` per target layer: its worst prompt's drift x safety <= the budget."""
        d, budget = self.drift(name), self.drift_budget()
        return {i: gate_check(name, i, {p: st[i].rel_err for p, st in d.stats.items()}, budget)
                for i in self.layer_ids}
