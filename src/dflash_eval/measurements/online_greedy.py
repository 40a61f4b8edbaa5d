"""τ from the real speculative loop (``--online-tau``), the ``online`` measurement: the target verifies every drafted
block (:func:`dflash_eval.metrics.online_loop.online_generate`, greedy, stopping at EOS and at ``--max-new-tokens``
like the reference completions), reported beside the offline simulation's τ and per-position acceptance.

On the same greedy completion both count the same rounds (up to numerical near-ties between a batched and an
incremental forward), so a disagreement points at a convention bug or at kernel differences; each prompt's row says
whether the online tokens reproduce the reference completion and where they first differ. One cache entry holds
every prompt's online rounds and tokens, keyed by the target, the drafter, the code of the loop, the prompt ids and
the generation settings; it is a real computation (a cache miss, refused under ``--cache-only``).

At ``--temperature`` > 0 the loop runs once per sampled reference instead: the ``online_sampled`` measurement
(:mod:`dflash_eval.measurements.online_sampled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.common.progress import Progress
from dflash_eval.measurements.registry import Measurement, Plan, Subject
from dflash_eval.metrics.online_loop import online_generate
from dflash_eval.metrics.tau_result import TauResult

__all__ = ["OnlineGreedy", "ONLINE", "OnlineTau", "divergence"]


@dataclass
class OnlineTau:
    """One prompt's online rounds and whether its tokens reproduce the reference completion."""

    tau: TauResult
    tokens: int
    first_divergence: int | None  # index in the completion of the first token that differs; None: identical

    @property
    def matches_reference(self) -> bool:
        return self.first_divergence is None


def divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter length when one is a prefix of the
    other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class OnlineGreedy(Measurement[None, dict[str, OnlineTau]]):
    """Every prompt's online τ on the greedy references (cache, else one online generation per prompt); no
    parameters."""

    name: ClassVar[str] = "online"
    kind: ClassVar[str] = "online_tau"

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[None]:
        ev = subject
        inp, s = ev.inputs, ev.settings
        comps = ev.completions()
        prompts = inp.prompts
        fields: dict[str, Any] = {
            "target": inp.target_identity, "drafter": ev.checkpoint.fingerprint,
            "drafter_config": ev.checkpoint.config.to_dict(), "code": CODE_VERSION,
            "prompts": [ids_digest(comps[p.id].prompt_ids) for p in prompts], "max_new_tokens": s.max_new_tokens,
            "max_blocks": s.max_blocks, "stop_at_eos": True, "backend": s.eval_backend,
            **inp.platform_fields(s.torch_dtype)}

        def produce(todo: list[Request]) -> list[Produced]:
            prog = Progress("online speculative decoding", len(prompts), inp.progress)
            tensors = {}
            for n, p in enumerate(prompts):
                with inp.meter.timed("online"):
                    res = online_generate(inp.target, ev.drafter, inp.head, comps[p.id].prompt_ids,
                                          max_new_tokens=s.max_new_tokens, backend=s.eval_backend, stop_at_eos=True,
                                          max_blocks=s.max_blocks)
                inp.meter.counts["target_forwards"] += res.target_forwards
                tensors[f"lens/{n}"] = torch.tensor(res.tau.accept_lengths, dtype=torch.int32)
                tensors[f"tokens/{n}"] = torch.tensor(res.tokens, dtype=torch.int64)
                prog.step(len(res.tokens))
            return [Produced(tensors, {"prompt_ids": [p.id for p in prompts]})]

        req = Request(self.kind, fields, what="online speculative decoding of every prompt")
        return Plan([Batch([req], produce)], {"online": req})

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[None],
               params: Mapping[str, Any]) -> dict[str, OnlineTau]:
        entry, s, comps = entries["online"], subject.settings, subject.completions()
        bs = subject.checkpoint.config.block_size
        out = {}
        for n, p in enumerate(subject.inputs.prompts):
            toks = entry.tensors[f"tokens/{n}"].tolist()
            ref = comps[p.id].output_ids
            # max_blocks stops the loop early: compare only the tokens it produced
            div = divergence(toks, ref[:len(toks)] if s.max_blocks is not None else ref)
            out[p.id] = OnlineTau(TauResult(entry.tensors[f"lens/{n}"].tolist(), bs, "online-chain"), len(toks), div)
        return out


#: The built-in measurement, reached by reference: ``ev.measure(ONLINE)``.
ONLINE = OnlineGreedy()
