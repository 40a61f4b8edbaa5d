"""Sampled reference completions at ``--temperature`` > 0: ``--samples-per-prompt`` per prompt, sample ``k`` drawn
with the stream seed of (``--sampling-seed``, prompt id, k) (:func:`dflash_eval.target.sampling.stream_seed`).

With ``--completions local`` the local target samples them in left-padded batches
(:func:`dflash_eval.target.generation.greedy_generate_batch` with ``sampling``); with ``--completions sglang`` the
server does, the stream seed sent as the request's ``sampling_seed`` and every answer checked against the local
target before anything is cached (:mod:`dflash_eval.references.sampled_server`). Each is one ``sampled_completion``
cache entry keyed by the target, the prompt ids, the length, the source, the sampling settings and the stream seed
(so a run with more samples reuses the first ones; greedy completions and their snapshots are other entries,
untouched; ``--completions cache`` takes either source's entry); its meta holds the local tokenizer's text of the ids
and each token's piece of it (:mod:`dflash_eval.references.token_pieces`). Later turns of multi-turn conversations
are conditioned on the greedy completions of the earlier turns.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.requests import Batch, Produced, Producer, Request
from dflash_eval.common.progress import Progress
from dflash_eval.errors import EvalError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.references.completion import CompletionRecord
from dflash_eval.references.greedy import References
from dflash_eval.references.sampled_server import fetch_sampled
from dflash_eval.references.token_pieces import decode_pieces
from dflash_eval.target.generation import generation_groups, greedy_generate_batch
from dflash_eval.target.kernel_probe import bucket
from dflash_eval.target.sampling import stream_seed

__all__ = ["Pair", "SampledReferences"]

Pair = tuple[str, int]  # (prompt id, sample index)


class SampledReferences:
    """The sampled references of ``inputs``' prompts (see module docstring)."""

    def __init__(self, inputs: Inputs, references: References) -> None:
        self.inputs, self.references = inputs, references
        self.settings = inputs.settings
        self._records: dict[str, list[CompletionRecord]] | None = None

    @property
    def wanted(self) -> bool:
        """Whether the run takes sampled references (``--temperature`` > 0 without a truncation to greedy)."""
        return self.settings.temperature > 0 and not self.settings.sampling.greedy

    def pairs(self) -> list[Pair]:
        return [(p.id, k) for p in self.inputs.prompts for k in range(self.settings.samples_per_prompt)]

    def _fields(self, pid: str, sample: int, source: str) -> dict[str, Any]:
        inp, s = self.inputs, self.settings
        fields: dict[str, Any] = {"target": inp.target_identity, "prompt_ids": self.references.prompt_ids(pid),
                                  "max_new_tokens": s.max_new_tokens, "source": source,
                                  "sampling": s.sampling.to_dict(), "stream_seed": stream_seed(s.sampling_seed, pid,
                                                                                               sample)}
        if source == "local":
            fields.update(backend=s.eval_backend, **inp.platform_fields(s.torch_dtype), stop_at_eos=True,
                          kernels=self.references.generation_probe(pid))  # the greedy references' probe: same path
        return fields

    def request(self, pid: str, sample: int) -> Request:
        """The cache request of one sampled reference completion from the ``--completions`` source (``cache``: an
        entry of either source serves; the server's entry has the stream seed it was sent as ``sampling_seed``)."""
        mode = self.settings.completions
        sources = ("local", "sglang") if mode == "cache" else (mode,)
        expect = Expected(tensors={"output_ids": (torch.int64, (None,))})
        what = f"sampled reference completion {sample} of prompt {pid!r}" + (
            " (--completions cache never samples)" if mode == "cache" else "")
        reqs = [Request("sampled_completion", self._fields(pid, sample, src), expect=expect, what=what,
                        item=f"{pid}#{sample}") for src in sources]
        return Request(reqs[0].kind, reqs[0].fields, expect=expect, what=what, item=reqs[0].item,
                       alternatives=tuple(reqs[1:]))

    def _producer(self, pairs: list[Pair]) -> Producer:
        """The producer of one batch's missing sampled completions for the ``--completions`` source."""
        mode = self.settings.completions
        if mode == "sglang":
            return lambda todo: fetch_sampled(self.inputs, self.references, pairs, todo, self.request)
        if mode == "cache":
            def refuse(todo: list[Request]) -> list[Produced]:
                raise EvalError(f"--completions cache: no cached sampled completion for {[r.item for r in todo]} "
                                f"under {self.settings.cache_dir} (these sampling settings and --sampling-seed); run "
                                "once with --completions local or sglang")

            return refuse

        def produce(todo: list[Request]) -> list[Produced]:
            inp, s = self.inputs, self.settings
            keys = {r.key for r in todo}
            reqs = {p: self.request(*p) for p in pairs}
            want = [p for p in pairs if reqs[p].key in keys]
            seeds = [int(reqs[p].fields["stream_seed"]) for p in want]
            t0 = time.perf_counter()
            with inp.meter.timed("generation"):
                outs = greedy_generate_batch(inp.target, [self.references.prompt_ids(pid) for pid, _ in want],
                                             s.max_new_tokens, backend=s.eval_backend, sampling=(s.sampling, seeds))
            for (pid, k), ids in zip(want, outs):
                if not ids:
                    raise EvalError(f"empty sampled completion {k} of prompt {pid!r}: nothing to evaluate; "
                                    "no cache entry written")
            inp.meter.counts["generated_tokens"] += sum(len(o) for o in outs)
            dt = (time.perf_counter() - t0) / max(1, len(want))
            made = {}
            for p, ids in zip(want, outs):
                text, pieces = decode_pieces(inp.tokenizer, ids)
                made[reqs[p].key] = Produced({"output_ids": torch.tensor(ids, dtype=torch.int64)},
                                             {"prompt_id": p[0], "sample": p[1], "seconds": dt, "source": "local",
                                              "text": text, "pieces": pieces}, tokens=len(ids))
            return [made[r.key] for r in todo]

        return produce

    def cached(self) -> bool:
        """Whether every selected prompt's sampled completions are cached for the ``--completions`` source (True
        for a greedy run, which has none)."""
        if not self.wanted:
            return True
        return all(self.inputs.cache.has(self.request(*p)) for p in self.pairs())

    def completions(self) -> dict[str, list[list[int]]]:
        """Every selected prompt's sampled completions (cache, else sampled in batches spread over xdist workers)."""
        return {pid: [r.output_ids for r in recs] for pid, recs in self.records().items()}

    def records(self) -> dict[str, list[CompletionRecord]]:
        """Every selected prompt's sampled completions as records, in sample order: ids, text and pieces (None in an
        entry written before they were recorded), source and stream seed (:meth:`completions`: their ids)."""
        if self._records is None:
            self._records = self._read_records()
        return self._records

    def _read_records(self) -> dict[str, list[CompletionRecord]]:
        inp = self.inputs
        pairs = self.pairs()
        reqs = {p: self.request(*p) for p in pairs}
        label = {f"{pid}#{k}": (pid, k) for pid, k in pairs}
        lengths = {n: len(self.references.prompt_ids(pid)) for n, (pid, _) in label.items()}
        groups = [g for b in sorted({bucket(n) for n in lengths.values()}, reverse=True)  # one probe bucket a batch
                  for g in generation_groups({n: k for n, k in lengths.items() if bucket(k) == b},
                                             self.settings.generation_batch, min_groups=inp.worker_count)]
        batches = [Batch([reqs[label[n]] for n in grp], self._producer([label[n] for n in grp]))
                   for grp in groups]
        entries = inp.cache.ensure(batches,
                                   progress=lambda n: Progress("sampled reference completions", n, inp.progress),
                                   worker_index=inp.worker_index, worker_count=inp.worker_count)
        out: dict[str, list[CompletionRecord]] = {p.id: [] for p in inp.prompts}
        for pid, k in pairs:
            e = entries[reqs[(pid, k)].key]
            ids = e.tensors["output_ids"].tolist()
            out[pid].append(CompletionRecord(pid, self.references.prompt_ids(pid), ids, e.meta.get("text", ""),
                                             e.meta.get("source", e.manifest.get("fields", {}).get("source", "?")),
                                             e.meta.get("finish_reason"), pieces=e.meta.get("pieces"), sample=k,
                                             seed=int(reqs[(pid, k)].fields["stream_seed"])))
        return out
