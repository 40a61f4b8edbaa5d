"""``--online-tau`` at ``--temperature`` > 0, the ``online_sampled`` measurement: the real speculative loop once per
sampled reference.

Sample k of a prompt runs :func:`dflash_eval.metrics.online_loop.online_generate` with the target's tokens drawn by
:func:`dflash_eval.target.sampling.sample_tokens` under the stream seed of (``--sampling-seed``, prompt id, k), the
seed its sampled reference was drawn with (:mod:`dflash_eval.references.sampled`). The draws are indexed by absolute
position, so the loop consumes the reference's random numbers: its tokens reproduce the reference and its rounds
equal the offline chain's (``docs/temperature.md``), which each row's ``matches_reference`` and
``first_divergence`` (of the first sample that differs) report. A prompt's online τ is the mean over its samples
(:class:`dflash_eval.metrics.sampled_tau.SampledTau`, rounds pooled). One cache entry holds every sample's online
rounds and tokens, keyed as the greedy entry plus the sampling settings and the stream seeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Producer, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.common.progress import Progress
from dflash_eval.measurements.online_greedy import OnlineTau, divergence
from dflash_eval.measurements.registry import Measurement, Plan, Subject
from dflash_eval.measurements.tau_sampled import SampledCompletions
from dflash_eval.metrics.online_loop import online_generate
from dflash_eval.metrics.sampled_tau import pool_samples
from dflash_eval.metrics.tau_result import TauResult
from dflash_eval.target.sampling import sample_tokens, stream_seed

__all__ = ["OnlineSampled", "ONLINE_SAMPLED"]


def _fields(ev: Subject, seeds: dict[str, list[int]]) -> dict[str, Any]:
    inp, s = ev.inputs, ev.settings
    return {"target": inp.target_identity, "drafter": ev.checkpoint.fingerprint,
            "drafter_config": ev.checkpoint.config.to_dict(), "code": CODE_VERSION,
            "prompts": [ids_digest(ev.references.prompt_ids(p.id)) for p in inp.prompts],
            "max_new_tokens": s.max_new_tokens, "max_blocks": s.max_blocks, "stop_at_eos": True,
            "backend": s.eval_backend, **inp.platform_fields(s.torch_dtype),
            "sampling": s.sampling.to_dict(), "stream_seeds": seeds}


def _producer(ev: Subject, seeds: dict[str, list[int]]) -> Producer:
    def produce(todo: list[Request]) -> list[Produced]:
        inp, s = ev.inputs, ev.settings
        prog = Progress("online speculative decoding (sampled)", sum(map(len, seeds.values())), inp.progress)
        tensors = {}
        for n, p in enumerate(inp.prompts):
            for k, seed in enumerate(seeds[p.id]):
                def pick(logits: torch.Tensor, pos: torch.Tensor, seed: int = seed) -> torch.Tensor:
                    return sample_tokens(logits, s.sampling, seeds=torch.full((logits.shape[0],), seed),
                                         positions=pos)

                with inp.meter.timed("online"):
                    res = online_generate(inp.target, ev.drafter, inp.head, ev.references.prompt_ids(p.id),
                                          max_new_tokens=s.max_new_tokens, backend=s.eval_backend,
                                          stop_at_eos=True, max_blocks=s.max_blocks, pick=pick)
                inp.meter.counts["target_forwards"] += res.target_forwards
                tensors[f"lens/{n}/{k}"] = torch.tensor(res.tau.accept_lengths, dtype=torch.int32)
                tensors[f"tokens/{n}/{k}"] = torch.tensor(res.tokens, dtype=torch.int64)
                prog.step(len(res.tokens))
        return [Produced(tensors, {"prompt_ids": [p.id for p in inp.prompts]})]

    return produce


class OnlineSampled(Measurement[SampledCompletions, dict[str, OnlineTau]]):
    """Every prompt's online τ at ``--temperature`` > 0: the mean over its sampled references (cache, else one
    online generation per sample); no parameters."""

    name: ClassVar[str] = "online_sampled"
    kind: ClassVar[str] = "online_tau"

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[SampledCompletions]:
        s = subject.settings
        comps = subject.sampled_references.completions()
        seeds = {p.id: [stream_seed(s.sampling_seed, p.id, k) for k in range(len(comps[p.id]))]
                 for p in subject.inputs.prompts}
        req = Request(self.kind, _fields(subject, seeds), what="online speculative decoding of every sampled reference")
        return Plan([Batch([req], _producer(subject, seeds))], {"online": req}, state=comps)

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[SampledCompletions],
               params: Mapping[str, Any]) -> dict[str, OnlineTau]:
        s, comps = subject.settings, plan.state
        bs, t = subject.checkpoint.config.block_size, entries["online"].tensors
        out = {}
        for n, p in enumerate(subject.inputs.prompts):
            samples, tokens, first = [], 0, None
            for k, ref in enumerate(comps[p.id]):
                toks = t[f"tokens/{n}/{k}"].tolist()
                samples.append(TauResult(t[f"lens/{n}/{k}"].tolist(), bs, "online-chain"))
                tokens += len(toks)
                div = divergence(toks, ref[:len(toks)] if s.max_blocks is not None else ref)
                first = div if first is None else first
            out[p.id] = OnlineTau(pool_samples(samples, bs, "online-chain"), tokens, first)
        return out


#: The built-in measurement, reached by reference: ``ev.measure(ONLINE_SAMPLED)``.
ONLINE_SAMPLED = OnlineSampled()
