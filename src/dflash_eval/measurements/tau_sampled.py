"""τ at ``--temperature`` > 0: the ``tau_sampled`` measurement, chain and DDTree τ simulated on the sampled references
(:mod:`dflash_eval.references.sampled`).

The chain and DDTree loops are simulated on every sample as on a greedy reference
(:func:`dflash_eval.metrics.tau.simulate_tau`, features of one target forward over the sampled sequence), one
prompt's samples per batch; a prompt's τ is the mean over its samples
(:class:`dflash_eval.metrics.sampled_tau.SampledTau`), memoised in one ``tau_sampled`` entry (derived) keyed by the
drafter, the settings and every sampled reference by its content (whichever source served it). Parameter:
``budgets`` (the DDTree budgets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.measurements.registry import Measurement, Plan, Subject
from dflash_eval.measurements.tau_greedy import PromptTau
from dflash_eval.metrics.sampled_tau import pool_samples
from dflash_eval.metrics.tau import simulate_tau
from dflash_eval.metrics.tau_result import TauResult
from dflash_eval.target.hidden_states import extract_features

__all__ = ["SampledTauMeasurement", "TAU_SAMPLED", "SampledCompletions"]

#: Every prompt's sampled completions (token ids), in sample order: what the entry is keyed by and decoded with.
SampledCompletions = dict[str, list[list[int]]]


def _tau_fields(ev: Subject, comps: SampledCompletions, budgets: tuple[int, ...]) -> dict[str, Any]:
    """The τ entry's key: the drafter, the settings and every sampled reference by its content (whichever source
    served it)."""
    s = ev.settings
    return {"drafter": ev.checkpoint.fingerprint, "drafter_config": ev.checkpoint.config.to_dict(),
            "code": CODE_VERSION, "budgets": list(budgets), "max_blocks": s.max_blocks,
            "backend": ev.inputs.eval_side.backend, **ev.inputs.platform_fields(s.torch_dtype),
            "completions": [ids_digest(ev.references.prompt_ids(pid) + comps[pid][k])
                            for pid, k in ev.sampled_references.pairs()]}


def _simulate(ev: Subject, comps: SampledCompletions, budgets: tuple[int, ...]) -> Produced:
    """Every sample's chain and DDTree accept lengths, one prompt's samples per drafter batch."""
    inp, drafter = ev.inputs, ev.drafter
    dt = next(drafter.parameters()).dtype
    tensors: dict[str, torch.Tensor] = {}
    for n, p in enumerate(inp.prompts):
        prompt = ev.references.prompt_ids(p.id)
        items = []
        for out in comps[p.id]:
            seq = torch.tensor(prompt + out, dtype=torch.long)
            with inp.meter.timed("target_forward"):
                feats, _ = extract_features(inp.target, seq.to(inp.target.device), ev.layer_ids,
                                            backend=inp.eval_side.backend)
            inp.meter.counts["target_forwards"] += 1
            items.append((feats.to(dt), seq, len(prompt)))
        with inp.meter.timed("drafting"):
            sims = simulate_tau(drafter, inp.head, items, budgets, max_blocks=ev.settings.max_blocks)
        for k, r in enumerate(sims):
            tensors[f"chain/{n}/{k}"] = torch.tensor(r.chain.accept_lengths, dtype=torch.int32)
            for b in budgets:
                tensors[f"ddtree{b}/{n}/{k}"] = torch.tensor(r.ddtree[b].accept_lengths, dtype=torch.int32)
    return Produced(tensors, {"prompt_ids": [p.id for p in inp.prompts]})


class SampledTauMeasurement(Measurement[SampledCompletions, dict[str, PromptTau]]):
    """τ of every prompt at ``--temperature``: the mean over its samples (chain and each DDTree budget)."""

    name: ClassVar[str] = "tau_sampled"
    kind: ClassVar[str] = "tau_sampled"

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[SampledCompletions]:
        budgets = tuple(params["budgets"])
        subject.check_drafter()
        comps = subject.sampled_references.completions()
        req = Request(self.kind, _tau_fields(subject, comps, budgets),
                      what="τ of every prompt on its sampled references", derived=True)
        return Plan([Batch([req], lambda todo: [_simulate(subject, comps, budgets)])], {"tau": req}, state=comps)

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[SampledCompletions],
               params: Mapping[str, Any]) -> dict[str, PromptTau]:
        budgets = tuple(params["budgets"])
        comps = plan.state  # the sampled completions :meth:`plan` keyed its entry by
        bs, t = subject.checkpoint.config.block_size, entries["tau"].tensors
        out: dict[str, PromptTau] = {}
        for n, p in enumerate(subject.inputs.prompts):
            ks = range(len(comps[p.id]))
            chain = pool_samples([TauResult(t[f"chain/{n}/{k}"].tolist(), bs, "chain") for k in ks], bs, "chain")
            dd: dict[int, TauResult] = {
                b: pool_samples([TauResult(t[f"ddtree{b}/{n}/{k}"].tolist(), bs, f"ddtree-{b}") for k in ks], bs,
                                f"ddtree-{b}") for b in budgets}
            out[p.id] = PromptTau(p.id, p.category, chain, dd, len(subject.references.prompt_ids(p.id)),
                                  round(sum(len(c) for c in comps[p.id]) / max(1, len(comps[p.id]))))
        return out


#: The built-in measurement, reached by reference: ``ev.measure(TAU_SAMPLED, budgets=...)``.
TAU_SAMPLED = SampledTauMeasurement()
