"""The fourth stage: one drafter checkpoint evaluated on the references and features of the earlier stages.

The checkpoint is read once and validated against the target before anything is produced for it; τ of every
prompt (chain and each DDTree budget) comes from one lock-step simulation that drafts, batched over prompts, only
the block starts the simulated loops visit (:func:`dflash_eval.metrics.tau.simulate_tau`), and is memoised in the cache
under a key that covers every input (drafter weights and config, the code that drafts and simulates, the exact
feature entries, budgets, max_blocks), so a warm run does not even run the drafter; drift compares the features
of two sides of a :class:`~dflash_eval.metrics.drift.Comparison` and the τ each gives.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.store import Expected, Job, cache_key
from dflash_eval.metrics.drift import Comparison, DriftStat, Side, drift_stat
from dflash_eval.metrics.drift_budget import (
    DriftBudget,
    GateCheck,
    Perturbation,
    gate_check,
    measure_ladder,
    parse_ladder,
)
from dflash_eval.metrics.tau import TauResult, simulate_tau
from dflash_eval.options.settings import EvalSettings
from dflash_eval.suite.feature_store import Features, FeatureStore
from dflash_eval.suite.inputs import Inputs
from dflash_eval.suite.progress import Progress
from dflash_eval.suite.references import CompletionRecord, References
from dflash_eval.target.provenance import device_kind, library_versions

__all__ = ["DrafterEvaluation", "PromptTau", "Drift"]



@dataclass
class PromptTau:
    """τ of one prompt: the chain loop and DDTree for each budget."""

    prompt_id: str
    category: str
    chain: TauResult
    ddtree: dict[int, TauResult]
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Drift:
    """Per-prompt, per-layer feature drift of one comparison and the chain τ each side gives (``accept`` empty when
    the drafter was refused)."""

    comparison: Comparison
    stats: dict[str, dict[int, DriftStat]]
    accept: dict[str, tuple[float, float]]


class DrafterEvaluation:
    """One drafter (``settings.drafter``) against the shared earlier stages."""

    def __init__(self, inputs: Inputs, references: References, store: FeatureStore,
                 settings: EvalSettings | None = None, *, checkpoint: Any = None, live: Any = None) -> None:
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

    @cached_property
    def drafter(self) -> Any:
        """The drafter, validated against the target (:attr:`refusal` raised when it does not fit)."""
        from dflash_eval.drafter import build_drafter

        if self.refusal is not None:
            raise self.refusal.with_traceback(None)
        if self._live is not None:
            return self._live
        spec = self.inputs.spec
        with self.inputs.meter.timed("drafter_load"):
            return build_drafter(self.checkpoint, device=self.settings.torch_device, dtype=self.settings.torch_dtype,
                                 spec=spec, checks=self.checks)

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
    def tau_computed(self) -> bool:
        return (self.inputs.eval_side, tuple(self.settings.ddtree_budget)) in self._tau

    @property
    def tau_results(self) -> dict[str, PromptTau]:
        """τ of every prompt on the evaluation backend's features (chain and every DDTree budget)."""
        return self.tau_for(self.inputs.eval_side, tuple(self.settings.ddtree_budget))

    def tau_for(self, side: Side, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
        if (side, budgets) not in self._tau:
            self.drafter  # noqa: B018 - fail fast (before producing anything) when the drafter does not fit
            self._tau[(side, budgets)] = self._memo_tau(side, budgets)
        return self._tau[(side, budgets)]

    def _tau_fields(self, side: Side, budgets: tuple[int, ...]) -> dict[str, Any]:
        comps = self.completions()
        return {
            "drafter": self.checkpoint.fingerprint, "drafter_config": self.checkpoint.config.to_dict(),
            "code": CODE_VERSION, "budgets": list(budgets), "max_blocks": self.settings.max_blocks,
            "dtype": str(self.settings.torch_dtype), "device_kind": device_kind(self.settings.torch_device),
            "versions": library_versions(),
            "items": [{"prompt_len": len(comps[p.id].prompt_ids),
                       "features": [self.store.key(comps[p.id].sequence, i, side) for i in self.layer_ids]}
                      for p in self.inputs.prompts],
        }

    def _memo_tau(self, side: Side, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
        prompts = self.inputs.prompts

        def produce() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
            res = self._simulate(self.features(side), budgets)
            tensors = {}
            for n, p in enumerate(prompts):
                tensors[f"chain/{n}"] = torch.tensor(res[p.id].chain.accept_lengths, dtype=torch.int32)
                for b in budgets:
                    tensors[f"ddtree{b}/{n}"] = torch.tensor(res[p.id].ddtree[b].accept_lengths, dtype=torch.int32)
            return tensors, {"prompt_ids": [p.id for p in prompts], "side": side.label}

        fields = self._tau_fields(side, budgets)
        if not self.inputs.cache.exists("tau", cache_key("tau", fields)):
            # Every xdist worker extracts its share of the features (Cache.produce_many) before one of them takes
            # the τ lock and drafts: otherwise that one worker would extract every prompt's features alone.
            self.features(side)
        entry = self.inputs.cache.get_or_produce("tau", fields, produce, derived=True)
        comps = self.completions()
        bs = self.checkpoint.config.block_size
        return {p.id: PromptTau(
            p.id, p.category, TauResult(entry.tensors[f"chain/{n}"].tolist(), bs, "chain"),
            {b: TauResult(entry.tensors[f"ddtree{b}/{n}"].tolist(), bs, f"ddtree-{b}") for b in budgets},
            len(comps[p.id].prompt_ids), len(comps[p.id].output_ids)) for n, p in enumerate(prompts)}

    def _simulate(self, feats: Features, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
        comps = self.completions()
        drafter = self.drafter
        dt = next(drafter.parameters()).dtype
        items = []
        for p in self.inputs.prompts:
            f = torch.cat([feats[p.id][i] for i in self.layer_ids], dim=-1).to(dt)
            items.append((f, torch.tensor(comps[p.id].sequence, dtype=torch.long), len(comps[p.id].prompt_ids)))
        prog = Progress("τ drafting", sum(max(0, int(t.shape[0]) - 1 - n) for _, t, n in items), self.inputs.progress,
                        unit="positions")
        with self.inputs.meter.timed("drafting"):
            sims = simulate_tau(drafter, self.inputs.head, items, budgets, max_blocks=self.settings.max_blocks)
        self.inputs.meter.counts["drafted_blocks"] += sum(r.drafted for r in sims)
        prog.step(tokens=prog.total, n=prog.total)
        return {p.id: PromptTau(p.id, p.category, r.chain, r.ddtree, len(comps[p.id].prompt_ids),
                                len(comps[p.id].output_ids))
                for p, r in zip(self.inputs.prompts, sims)}

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
                ta = self.tau_results if c.a == ev else self.tau_for(c.a, ())
                tb = self.tau_results if c.b == ev else self.tau_for(c.b, ())
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
        """The drafter's drift budget (:mod:`dflash_eval.metrics.drift_budget`) on the reference side's features, memoised in
        the cache under every input (drafter, code, feature entries, prompts, ladder, seed); the tolerance and the
        safety factor are applied when it is read, so changing them recomputes nothing."""
        if self._budget is None:
            self._budget = self._budget_evaluation()._memo_budget(selected=len(self.inputs.prompts))
        return self._budget

    def _budget_evaluation(self) -> DrafterEvaluation:
        """Where the budget is measured: this evaluation when the selection holds at least
        ``--drift-budget-min-prompts`` prompts (or ``--prompts`` holds no more), else an evaluation of the same
        drafter on the first that many prompts of ``--prompts`` (the selection and the prompts after it), whose
        completions and features are produced and cached like the selection's (:mod:`dflash_eval.suite.prompt_view`).
        The selection's own τ, drift and reports stay on the selection."""
        from dflash_eval.suite.prompt_view import PromptView

        s, selected = self.settings, self.inputs.prompts
        if len(selected) >= s.drift_budget_min_prompts or s.num_prompts is None:
            return self
        more = self.inputs.first_prompts(s.drift_budget_min_prompts)
        if len(more) <= len(selected) or [p.id for p in more[:len(selected)]] != [p.id for p in selected]:
            return self
        drafter = self.drafter  # a drafter that does not fit the target stops here, before anything is produced
        view = PromptView(self.inputs, more)
        store = FeatureStore(view)  # type: ignore[arg-type]
        store.probes = self.store.probes  # the kernels were probed once in this process
        ev = DrafterEvaluation(view, References(view, self.references.sglang_client),  # type: ignore[arg-type]
                               store, s)
        ev._adopt(self, drafter)
        return ev

    def _adopt(self, other: DrafterEvaluation, drafter: Any) -> None:
        """Take ``other``'s checkpoint, validated drafter and check results instead of reading them again."""
        self._checkpoint = other.checkpoint
        self.__dict__["drafter"] = drafter
        for name in ("checks", "refusal", "layer_ids"):
            if name in other.__dict__:
                self.__dict__[name] = other.__dict__[name]

    def _memo_budget(self, selected: int | None = None) -> DriftBudget:
        """One cache entry per ladder level (τ of every prompt and the injected errors under that perturbation), so
        the levels can be measured by several xdist workers side by side (:meth:`Cache.produce_many` over groups of
        levels, one group per worker; one group of all levels in a single process) and a changed ladder reuses the
        levels it keeps. Within a group the levels go through one lock-step simulation."""
        s, side, prompts = self.settings, self.inputs.reference_side, self.inputs.prompts
        cache = self.inputs.cache
        ladder = parse_ladder(s.drift_budget_ladder)
        usable = [p for p in ladder if p.available]
        extended = selected is not None and len(prompts) > selected  # a budget view: its chains alone, no DDTree
        base = self.tau_results if side == self.inputs.eval_side and not extended else self.tau_for(side, ())
        base_tau = [base[p.id].chain.tau for p in prompts]
        ids = [p.id for p in prompts]
        common = {**self._tau_fields(side, ()), "code": CODE_VERSION,
                  "prompt_ids": ids, "seed": s.drift_budget_seed}

        def fields(level: Perturbation) -> dict[str, Any]:
            return {**common, "level": level.label}

        def key(level: Perturbation) -> str:
            return cache_key("drift_budget", fields(level))

        def meta(level: Perturbation) -> dict[str, Any]:
            return {"prompt_ids": ids, "base": side.label, "level": level.label}

        def measure(levels: list[Perturbation]) -> dict[str, dict[str, torch.Tensor]]:
            comps, feats = self.completions(), self.features(side)
            items = [(p.id, feats[p.id], torch.tensor(comps[p.id].sequence, dtype=torch.long),
                      len(comps[p.id].prompt_ids)) for p in prompts]
            with self.inputs.meter.timed("drift_budget"):
                taus, inj = measure_ladder(self.drafter, self.inputs.head, items, levels, base_tau=base_tau,
                                           seed=s.drift_budget_seed, max_blocks=s.max_blocks)
            return {lv.label: {"tau": torch.tensor(t, dtype=torch.float64),
                               "injected": torch.tensor(e, dtype=torch.float64).reshape(len(prompts),
                                                                                        len(self.layer_ids))}
                    for lv, t, e in zip(levels, taus, inj)}

        def produce_group(levels: list[Perturbation]) -> None:
            todo = [lv for lv in levels if not cache.exists("drift_budget", key(lv))]
            if todo:
                got = measure(todo)
                for lv in todo:
                    cache.write("drift_budget", key(lv), got[lv.label], fields=fields(lv), meta=meta(lv))

        measured: dict[str, dict[str, torch.Tensor]] = {}
        todo = [lv for lv in usable if not cache.exists("drift_budget", key(lv))]
        if todo and cache.cache_only:  # derived entries are computed but not written
            measured = measure(todo)
        elif todo:  # groups of the whole ladder (not of what is missing now): every worker forms the same groups
            n = max(1, min(self.inputs.worker_count, len(usable)))
            groups = [usable[g * len(usable) // n:(g + 1) * len(usable) // n] for g in range(n)]
            cache.produce_many([Job("drift_budget-" + cache_key("budget_group", {"keys": [key(lv) for lv in grp]}),
                                    lambda grp=grp: all(cache.exists("drift_budget", key(lv)) for lv in grp),
                                    lambda grp=grp: produce_group(grp)) for grp in groups],
                               worker_index=self.inputs.worker_index, worker_count=self.inputs.worker_count)

        def produce_one(level: Perturbation) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
            if level.label not in measured:  # an entry that could not be read back: measured again, alone
                measured.update(measure([level]))
            return measured[level.label], meta(level)

        n_p, n_l = len(prompts), len(self.layer_ids)
        entries = [cache.get_or_produce("drift_budget", fields(lv), lambda lv=lv: produce_one(lv), derived=True,
                                        expect=Expected(tensors={"tau": (torch.float64, (n_p,)),
                                                                 "injected": (torch.float64, (n_p, n_l))},
                                                        meta=meta(lv)))
                   for lv in usable]
        return DriftBudget.build(
            drafter=self.checkpoint.fingerprint, base=side.label, prompt_ids=ids, base_tau=base_tau, ladder=usable,
            taus=[e.tensors["tau"].tolist() for e in entries],
            injected=[e.tensors["injected"].tolist() for e in entries], tol=s.drift_budget_tol,
            safety=s.drift_budget_safety, seed=s.drift_budget_seed, spec=s.drift_budget_ladder,
            skipped=[f"{p.label}: this torch has no such dtype" for p in ladder if not p.available],
            min_prompts=s.drift_budget_min_prompts, selected=selected)

    def drift_gate(self, name: str) -> dict[int, GateCheck]:
        """The gate of comparison ``name`` per target layer: its worst prompt's drift x safety <= the budget."""
        d, budget = self.drift(name), self.drift_budget()
        return {i: gate_check(name, i, {p: st[i].rel_err for p, st in d.stats.items()}, budget)
                for i in self.layer_ids}
