"""τ of every prompt (chain and each DDTree budget) on one side's features: the ``tau`` measurement.

One lock-step simulation per chunk of prompts (``--chunk-memory``; each chunk's features read from the cache for it
alone) drafts, batched over prompts, only the block starts the simulated loops visit
(:func:`dflash_eval.metrics.tau.simulate_tau`); its accept lengths are one ``tau`` cache entry keyed by every input
(drafter weights and config, :data:`~dflash_eval.cache.code_version.CODE_VERSION`, the exact feature entries,
budgets, max_blocks), so a warm run does not even run the drafter. The entry is derived (recomputed, not refused,
under ``--cache-only``). Parameters: ``side`` (whose features) and ``budgets`` (the DDTree budgets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.common.progress import Progress
from dflash_eval.common.sizes import parse_memory
from dflash_eval.features.feature_map import lazy_items
from dflash_eval.measurements.registry import Measurement, Plan, Subject
from dflash_eval.metrics.drift import Side
from dflash_eval.metrics.tau import simulate_tau
from dflash_eval.metrics.tau_result import TauResult

if TYPE_CHECKING:
    from dflash_eval.features.feature_store import Features

__all__ = ["GreedyTau", "TAU", "PromptTau", "tau_fields"]


@dataclass
class PromptTau:
    """τ of one prompt: the chain loop and DDTree for each budget."""

    prompt_id: str
    category: str
    chain: TauResult
    ddtree: dict[int, TauResult]
    prompt_tokens: int
    completion_tokens: int


def tau_fields(ev: Subject, side: Side, budgets: tuple[int, ...]) -> dict[str, Any]:
    """The key fields of the τ entry of ``ev``'s drafter on ``side``'s features (also the drift budget's base)."""
    comps = ev.completions()
    s = ev.settings
    return {
        "drafter": ev.checkpoint.fingerprint, "drafter_config": ev.checkpoint.config.to_dict(),
        "code": CODE_VERSION, "budgets": list(budgets), "max_blocks": s.max_blocks,
        **ev.inputs.platform_fields(s.torch_dtype),
        "items": [{"prompt_len": len(comps[p.id].prompt_ids),
                   "features": [ev.store.key(comps[p.id].sequence, i, side) for i in ev.layer_ids]}
                  for p in ev.inputs.prompts],
    }


class GreedyTau(Measurement[None, dict[str, PromptTau]]):
    """τ of every prompt on the greedy references and one side's features (see module docstring)."""

    name: ClassVar[str] = "tau"
    kind: ClassVar[str] = "tau"

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[None]:
        """Before one worker takes the τ lock and drafts, every xdist worker extracts its share of the features
        (``prepare``): otherwise that one worker would extract them alone."""
        side, budgets = params["side"], tuple(params["budgets"])
        subject.check_drafter()  # fail fast (before producing anything) when the drafter does not fit
        prompts = subject.inputs.prompts

        def produce(todo: list[Request]) -> list[Produced]:
            res = simulate(subject, subject.features(side), budgets)
            tensors = {}
            for n, p in enumerate(prompts):
                tensors[f"chain/{n}"] = torch.tensor(res[p.id].chain.accept_lengths, dtype=torch.int32)
                for b in budgets:
                    tensors[f"ddtree{b}/{n}"] = torch.tensor(res[p.id].ddtree[b].accept_lengths, dtype=torch.int32)
            return [Produced(tensors, {"prompt_ids": [p.id for p in prompts], "side": side.label})]

        def prepare(misses: list[Request]) -> None:
            subject.features(side)

        req = Request(self.kind, tau_fields(subject, side, budgets), what=f"τ of every prompt ({side.label})",
                      derived=True)
        return Plan([Batch([req], produce)], {"tau": req}, prepare=prepare)

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[None],
               params: Mapping[str, Any]) -> dict[str, PromptTau]:
        entry, budgets = entries["tau"], tuple(params["budgets"])
        comps = subject.completions()
        bs = subject.checkpoint.config.block_size
        return {p.id: PromptTau(
            p.id, p.category, TauResult(entry.tensors[f"chain/{n}"].tolist(), bs, "chain"),
            {b: TauResult(entry.tensors[f"ddtree{b}/{n}"].tolist(), bs, f"ddtree-{b}") for b in budgets},
            len(comps[p.id].prompt_ids), len(comps[p.id].output_ids)) for n, p in enumerate(subject.inputs.prompts)}



#: The built-in measurement, reached by reference: ``ev.measure(TAU, side=..., budgets=...)``.
TAU = GreedyTau()

def simulate(ev: Subject, feats: Features, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
    """One lock-step simulation of every prompt's chain and DDTree loops on ``feats``."""
    comps = ev.completions()
    drafter = ev.drafter
    ids = [p.id for p in ev.inputs.prompts]
    items = lazy_items(feats, ids, ev.layer_ids, {pid: comps[pid].sequence for pid in ids},
                       {pid: len(comps[pid].prompt_ids) for pid in ids}, next(drafter.parameters()).dtype)
    prog = Progress("τ drafting", sum(max(0, len(comps[pid].sequence) - 1 - len(comps[pid].prompt_ids))
                                      for pid in ids), ev.inputs.progress, unit="positions")
    with ev.inputs.meter.timed("drafting"):
        sims = simulate_tau(drafter, ev.inputs.head, items, budgets, max_blocks=ev.settings.max_blocks,
                            memory=parse_memory(ev.settings.chunk_memory), progress=prog.reach)
    ev.inputs.meter.counts["drafted_blocks"] += sum(r.drafted for r in sims)
    prog.reach(prog.total)
    return {p.id: PromptTau(p.id, p.category, r.chain, r.ddtree, len(comps[p.id].prompt_ids),
                            len(comps[p.id].output_ids))
            for p, r in zip(ev.inputs.prompts, sims)}
