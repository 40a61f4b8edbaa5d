"""The fourth stage: one drafter checkpoint evaluated on the references and features of the earlier stages.

The checkpoint is read once and validated against the target before anything is produced for it; τ of every
prompt (chain and each DDTree budget) is memoised in the cache (:mod:`dflash_eval.measurements.tau_greedy`), so a warm run
does not even run the drafter; drift compares the features of two sides of a
:class:`~dflash_eval.metrics.drift.Comparison` and the τ each gives; the drift budget is measured per ladder level
(:mod:`dflash_eval.measurements.budget_ladder`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dflash_eval.metrics.drift import Comparison, DriftStat, Side, drift_stat
from dflash_eval.metrics.drift_budget import DriftBudget, GateCheck, gate_check
from dflash_eval.options.settings import EvalSettings
from dflash_eval.features.feature_store import Features, FeatureStore
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.references.greedy import CompletionRecord, References
from dflash_eval.measurements.tau_greedy import PromptTau, memoised_tau

__all__ = ["DrafterEvaluation", "PromptTau", "Drift"]


@dataclass
class Drift:
    """Per-prompt, per-layer feature drift of one comparison and the chain τ each side gives (``accept`` empty when
    the drafter was refused)."""

    comparison: Comparison
    stats: dict[str, dict[int, DriftStat]]
    accept: dict[str, tuple[float, float]]


class DrafterEvaluation:
    """One drafter (``settings.drafter``) against the shared earlier stages. ``drafter_of``: an evaluation of the
    same drafter whose checkpoint, check results and built drafter this one takes instead of reading them again
    (the drift budget's evaluation on more prompts)."""

    def __init__(self, inputs: Inputs, references: References, store: FeatureStore,
                 settings: EvalSettings | None = None, *, checkpoint: Any = None, live: Any = None,
                 drafter_of: DrafterEvaluation | None = None) -> None:
        """``checkpoint``: the drafter's :class:`~dflash_eval.drafter.Checkpoint` when it is not read from
        ``settings.drafter`` (an in-memory state dict); ``live``: a drafter module to evaluate as it is (its own
        weights, device and dtype) instead of one built from the checkpoint, after the same architecture checks."""
        self.inputs, self.references, self.store = inputs, references, store
        self.settings = settings or inputs.settings  # differs from the inputs' only in the drafter options
        self._tau: dict[tuple[Side, tuple[int, ...]], dict[str, PromptTau]] = {}
        self._drift: dict[str, Drift] = {}
        self._budget: DriftBudget | None = None
        self._checkpoint: Any = checkpoint
        self._live = live
        self._drafter: Any = None
        if drafter_of is not None:
            self._checkpoint, self._drafter = drafter_of.checkpoint, drafter_of.drafter
            for name in ("checks", "refusal", "layer_ids"):
                if name in drafter_of.__dict__:
                    self.__dict__[name] = drafter_of.__dict__[name]

    # ------------------------------------------------------------------------------------------------ drafter
    @property
    def checkpoint(self) -> Any:
        """The checkpoint as read from disk (weights, config, fingerprint), before validation."""
        if self._checkpoint is None:
            from dflash_eval.drafter import read_checkpoint

            with self.inputs.meter.timed("drafter_load"):
                self._checkpoint = read_checkpoint(self.settings.drafter, config_path=self.settings.drafter_config,
                                                   num_target_layers=self.inputs.num_layers,
                                                   vocabulary=self.inputs.vocabulary)
        return self._checkpoint

    def check_config(self) -> None:
        """Parse the drafter's config file, when it is a file of its own (``--drafter-config``, or the config.json
        beside the weights), without reading the weights: a config this evaluator refuses (e.g. a dflash_config key
        it does not implement) is one error naming the file and the key, before any test."""
        from dflash_eval.drafter import load_config_file

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

    @cached_property
    def reference_checkpoint(self) -> Any:
        from dflash_eval.drafter import read_checkpoint

        if self.settings.reference_drafter is None:
            return None
        return read_checkpoint(self.settings.reference_drafter, num_target_layers=self.inputs.num_layers,
                               vocabulary=self.inputs.vocabulary)

    @property
    def checkpoint_read(self) -> bool:
        return self._checkpoint is not None

    @cached_property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self.checkpoint.config.target_layer_ids)

    @cached_property
    def checks(self) -> list[Any]:
        """Every architecture check of the drafter against the target (:data:`dflash_eval.drafter.CHECKS`), run once."""
        from dflash_eval.drafter import run_checks

        return run_checks(self.checkpoint, self.inputs.spec)

    @cached_property
    def refusal(self) -> Any:
        """Why the drafter does not fit the target: a DrafterRefused naming every failed architecture check, or None.
        What needs the drafter raises it; the target-only stages (completions, features, drift statistics) do not."""
        from dflash_eval.drafter import fit_refusal

        return fit_refusal(self.checkpoint, self.inputs.spec, self.checks)

    @property
    def refusal_known(self) -> bool:
        return "refusal" in self.__dict__

    def check_drafter(self) -> None:
        """Validate the drafter against the target and build it (:attr:`refusal` raised when it does not fit):
        called before anything is produced for it."""
        if self._drafter is None:
            from dflash_eval.drafter import build_drafter

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
    def drafter(self) -> Any:
        """The drafter, validated against the target (:meth:`check_drafter`)."""
        self.check_drafter()
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

    # ------------------------------------------------------------------------------------------------ τ
    @property
    def sampled(self) -> bool:
        """τ at ``--temperature`` > 0: on sampled references (:mod:`dflash_eval.measurements.tau_sampled`)."""
        return self.settings.temperature > 0 and not self.settings.sampling.greedy

    @property
    def tau_computed(self) -> bool:
        if self.sampled:
            return "_sampled_tau" in self.__dict__
        return (self.inputs.eval_side, tuple(self.settings.ddtree_budget)) in self._tau

    @property
    def tau_results(self) -> dict[str, PromptTau]:
        """τ of every prompt on the evaluation backend's features (chain and every DDTree budget): on the greedy
        references, or at ``--temperature`` > 0 the mean over each prompt's sampled references."""
        if self.sampled:
            if "_sampled_tau" not in self.__dict__:
                from dflash_eval.measurements.tau_sampled import sampled_tau

                self.check_drafter()
                self.__dict__["_sampled_tau"] = sampled_tau(self, tuple(self.settings.ddtree_budget))
            return self.__dict__["_sampled_tau"]
        return self.greedy_tau_results

    @property
    def greedy_tau_results(self) -> dict[str, PromptTau]:
        """τ of every prompt on the greedy references (the drift comparisons' τ at any temperature)."""
        return self.tau_for(self.inputs.eval_side, tuple(self.settings.ddtree_budget))

    def tau_for(self, side: Side, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
        if (side, budgets) not in self._tau:
            self.check_drafter()  # fail fast (before producing anything) when the drafter does not fit
            self._tau[(side, budgets)] = memoised_tau(self, side, budgets)
        return self._tau[(side, budgets)]

    # ------------------------------------------------------------------------------------------------ drift
    def drift(self, name: str) -> Drift:
        """Per-prompt per-layer feature drift and per-prompt τ on each side for comparison ``name``."""
        if name not in self._drift:
            c = self.inputs.comparison(name)
            fa, fb = self.features(c.a), self.features(c.b)
            stats = {p.id: {i: DriftStat(name, p.id, i, *drift_stat(fa[p.id][i], fb[p.id][i]), c.rel_tol, c.cos_tol)
                            for i in self.layer_ids} for p in self.inputs.prompts}
            accept: dict[str, tuple[float, float]] = {}
            if self.refusal is None:  # a refused drafter: the statistics of the target's features only
                ev = self.inputs.eval_side
                ta = self.greedy_tau_results if c.a == ev else self.tau_for(c.a, ())
                tb = self.greedy_tau_results if c.b == ev else self.tau_for(c.b, ())
                accept = {p.id: (ta[p.id].chain.tau, tb[p.id].chain.tau) for p in self.inputs.prompts}
            self._drift[name] = Drift(c, stats, accept)
        return self._drift[name]

    @property
    def drifts(self) -> dict[str, Drift]:
        """The comparisons computed so far."""
        return dict(self._drift)

    # ------------------------------------------------------------------------------------------------ drift budget
    @property
    def budget_computed(self) -> bool:
        return self._budget is not None

    def drift_budget(self) -> DriftBudget:
        """The drafter's drift budget (:mod:`dflash_eval.measurements.budget_ladder`), measured on at least
        ``--drift-budget-min-prompts`` prompts where ``--prompts`` holds them."""
        if self._budget is None:
            from dflash_eval.measurements.budget_ladder import budget_evaluation, memoised_budget

            self._budget = memoised_budget(budget_evaluation(self), selected=len(self.inputs.prompts))
        return self._budget

    def drift_gate(self, name: str) -> dict[int, GateCheck]:
        """The gate of comparison ``name`` per target layer: its worst prompt's drift x safety <= the budget."""
        d, budget = self.drift(name), self.drift_budget()
        return {i: gate_check(name, i, {p: st[i].rel_err for p, st in d.stats.items()}, budget)
                for i in self.layer_ids}
