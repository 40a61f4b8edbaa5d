"""τ at ``--temperature`` > 0: sampled reference completions and the chain / DDTree τ simulated on them.

Each prompt gets ``--samples-per-prompt`` completions sampled from the target, sample ``k`` drawn with the stream
seed of (``--sampling-seed``, prompt id, k) (:func:`dflash_eval.target.sampling.stream_seed`): with
``--completions local`` by the local target in left-padded batches
(:func:`dflash_eval.target.generation.greedy_generate_batch` with ``sampling``), with ``--completions sglang`` by
the server, the stream seed sent as the request's ``sampling_seed`` and every answer checked against the local
target before anything is cached (:mod:`dflash_eval.references.sampled_server`). Each is one ``sampled_completion``
cache entry keyed by the target, the prompt ids, the length, the source, the sampling settings and the stream seed
(so a run with more samples reuses the first ones; greedy completions and their snapshots are other entries,
untouched; ``--completions cache`` takes either source's entry). The memoised τ is keyed by the references'
contents. The chain and DDTree loops are simulated on every sample as on a greedy reference
(:func:`dflash_eval.metrics.tau.simulate_tau`, features of one target forward over the sampled sequence), one
prompt's samples per batch; a prompt's τ is the mean over its samples
(:class:`dflash_eval.metrics.sampled_tau.SampledTau`), memoised in one ``tau_sampled`` entry (derived).

Later turns of multi-turn conversations are conditioned on the greedy completions of the earlier turns.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.errors import EvalError
from dflash_eval.metrics.sampled_tau import pool_samples
from dflash_eval.runtime.progress import Progress
from dflash_eval.target.provenance import device_kind, library_versions
from dflash_eval.target.sampling import stream_seed

if TYPE_CHECKING:
    from dflash_eval.evaluation.drafter_evaluation import DrafterEvaluation, PromptTau

__all__ = ["sampled_completions", "sampled_cached", "sampled_tau", "completion_request"]

Pair = tuple[str, int]  # (prompt id, sample index)


def _completion_fields(ev: DrafterEvaluation, pid: str, sample: int, source: str) -> dict[str, Any]:
    inp, s = ev.inputs, ev.settings
    fields: dict[str, Any] = {"target": inp.target_identity, "prompt_ids": ev.references.prompt_ids(pid),
                              "max_new_tokens": s.max_new_tokens, "source": source, "sampling": s.sampling.to_dict(),
                              "stream_seed": stream_seed(s.sampling_seed, pid, sample)}
    if source == "local":
        fields.update(backend=s.eval_backend, dtype=str(s.torch_dtype), device_kind=device_kind(s.torch_device),
                      versions=library_versions(), stop_at_eos=True)
    return fields


def completion_request(ev: DrafterEvaluation, pid: str, sample: int) -> Request:
    """The cache request of one sampled reference completion from the ``--completions`` source (``cache``: an
    entry of either source serves; the server's entry has the stream seed it was sent as ``sampling_seed``)."""
    mode = ev.settings.completions
    sources = ("local", "sglang") if mode == "cache" else (mode,)
    expect = Expected(tensors={"output_ids": (torch.int64, (None,))})
    what = f"sampled reference completion {sample} of prompt {pid!r}" + (
        " (--completions cache never samples)" if mode == "cache" else "")
    reqs = [Request("sampled_completion", _completion_fields(ev, pid, sample, src), expect=expect, what=what,
                    item=f"{pid}#{sample}") for src in sources]
    return Request(reqs[0].kind, reqs[0].fields, expect=expect, what=what, item=reqs[0].item,
                   alternatives=tuple(reqs[1:]))


def _pairs(ev: DrafterEvaluation) -> list[Pair]:
    return [(p.id, k) for p in ev.inputs.prompts for k in range(ev.settings.samples_per_prompt)]


def _producer(ev: DrafterEvaluation, pairs: list[Pair]) -> Any:
    """The producer of one batch's missing sampled completions for the ``--completions`` source."""
    mode = ev.settings.completions
    if mode == "sglang":
        from dflash_eval.references.sampled_server import fetch_sampled

        return lambda todo: fetch_sampled(ev, pairs, todo, completion_request)
    if mode == "cache":
        def refuse(todo: list[Request]) -> list[Produced]:
            raise EvalError(f"--completions cache: no cached sampled completion for {[r.item for r in todo]} under "
                            f"{ev.settings.cache_dir} (these sampling settings and --sampling-seed); run once with "
                            "--completions local or sglang")

        return refuse

    def produce(todo: list[Request]) -> list[Produced]:
        from dflash_eval.target.generation import greedy_generate_batch

        inp, s = ev.inputs, ev.settings
        keys = {r.key for r in todo}
        reqs = {p: completion_request(ev, *p) for p in pairs}
        want = [p for p in pairs if reqs[p].key in keys]
        seeds = [int(reqs[p].fields["stream_seed"]) for p in want]
        t0 = time.perf_counter()
        with inp.meter.timed("generation"):
            outs = greedy_generate_batch(inp.target, [ev.references.prompt_ids(pid) for pid, _ in want],
                                         s.max_new_tokens, backend=s.eval_backend, sampling=(s.sampling, seeds))
        for (pid, k), ids in zip(want, outs):
            if not ids:
                raise EvalError(f"empty sampled completion {k} of prompt {pid!r}: nothing to evaluate; "
                                "no cache entry written")
        inp.meter.counts["generated_tokens"] += sum(len(o) for o in outs)
        dt = (time.perf_counter() - t0) / max(1, len(want))
        made = {reqs[p].key: Produced({"output_ids": torch.tensor(ids, dtype=torch.int64)},
                                      {"prompt_id": p[0], "sample": p[1], "seconds": dt, "source": "local"},
                                      tokens=len(ids))
                for p, ids in zip(want, outs)}
        return [made[r.key] for r in todo]

    return produce


def sampled_cached(ev: DrafterEvaluation) -> bool:
    """Whether every selected prompt's sampled completions are cached for the ``--completions`` source (True for a
    greedy run, which has none)."""
    if not ev.sampled:
        return True
    return all(ev.inputs.cache.has(completion_request(ev, *p)) for p in _pairs(ev))


def sampled_completions(ev: DrafterEvaluation) -> dict[str, list[list[int]]]:
    """Every selected prompt's sampled completions (cache, else sampled in batches spread over xdist workers)."""
    from dflash_eval.target.generation import generation_groups

    inp = ev.inputs
    pairs = _pairs(ev)
    reqs = {p: completion_request(ev, *p) for p in pairs}
    label = {f"{pid}#{k}": (pid, k) for pid, k in pairs}
    groups = generation_groups({n: len(ev.references.prompt_ids(pid)) for n, (pid, _) in label.items()},
                               ev.settings.generation_batch, min_groups=inp.worker_count)
    batches = [Batch([reqs[label[n]] for n in grp], _producer(ev, [label[n] for n in grp])) for grp in groups]
    entries = inp.cache.ensure(batches, progress=lambda n: Progress("sampled reference completions", n, inp.progress),
                               worker_index=inp.worker_index, worker_count=inp.worker_count)
    out: dict[str, list[list[int]]] = {p.id: [] for p in inp.prompts}
    for pid, k in pairs:
        out[pid].append(entries[reqs[(pid, k)].key].tensors["output_ids"].tolist())
    return out


def _tau_fields(ev: DrafterEvaluation, comps: dict[str, list[list[int]]], budgets: tuple[int, ...]) -> dict[str, Any]:
    """The τ entry's key: the drafter, the settings and every sampled reference by its content (whichever source
    served it)."""
    s = ev.settings
    return {"drafter": ev.checkpoint.fingerprint, "drafter_config": ev.checkpoint.config.to_dict(),
            "code": CODE_VERSION, "budgets": list(budgets), "max_blocks": s.max_blocks,
            "backend": ev.inputs.eval_side.backend, "dtype": str(s.torch_dtype),
            "device_kind": device_kind(s.torch_device), "versions": library_versions(),
            "completions": [ids_digest(ev.references.prompt_ids(pid) + comps[pid][k]) for pid, k in _pairs(ev)]}


def _simulate(ev: DrafterEvaluation, comps: dict[str, list[list[int]]], budgets: tuple[int, ...]) -> Produced:
    """Every sample's chain and DDTree accept lengths, one prompt's samples per drafter batch."""
    from dflash_eval.metrics.tau import simulate_tau
    from dflash_eval.target.hidden_states import extract_features

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


def sampled_tau(ev: DrafterEvaluation, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
    """τ of every prompt at ``--temperature``: the mean over its samples (chain and each DDTree budget)."""
    from dflash_eval.metrics.tau import TauResult
    from dflash_eval.evaluation.drafter_evaluation import PromptTau

    comps = sampled_completions(ev)
    req = Request("tau_sampled", _tau_fields(ev, comps, budgets), what="τ of every prompt on its sampled references",
                  derived=True)
    entry = ev.inputs.cache.ensure([Batch([req], lambda todo: [_simulate(ev, comps, budgets)])])[req.key]
    bs, t = ev.checkpoint.config.block_size, entry.tensors
    out = {}
    for n, p in enumerate(ev.inputs.prompts):
        ks = range(len(comps[p.id]))
        chain = pool_samples([TauResult(t[f"chain/{n}/{k}"].tolist(), bs, "chain") for k in ks], bs, "chain")
        dd = {b: pool_samples([TauResult(t[f"ddtree{b}/{n}/{k}"].tolist(), bs, f"ddtree-{b}") for k in ks], bs,
                              f"ddtree-{b}") for b in budgets}
        out[p.id] = PromptTau(p.id, p.category, chain, dd, len(ev.references.prompt_ids(p.id)),
                              round(sum(len(c) for c in comps[p.id]) / max(1, len(comps[p.id]))))
    return out
