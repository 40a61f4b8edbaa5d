"""The second stage: each prompt's reference completion, and the target's teacher-forced check of it.

A completion comes from the cache, else from its source (``--completions``): ``local`` is the target's own greedy
generation, ``--generation-batch`` prompts of similar length per left-padded batch (one cache job per batch,
spread over xdist workers; still one cache entry per prompt, written as soon as its batch is done), ``sglang`` a
batch of greedy ``/generate`` requests to a server whose readiness and identity the SGLang service already checked
(it hands this stage a ready client), ``cache`` never computes. Nothing is cached unless every answer of a batch is
valid: an empty completion or a token id outside the target's vocabulary is an error naming the prompt, never an
entry, and every completion of an SGLang fetch must be reproduced by the local target's teacher-forced argmax
(:mod:`dflash_eval.references.server_check`: a server that names the right model but serves other weights, for all
prompts or only some, is caught before anything of the fetch is cached). A
completion's text is always the local tokenizer's decoding of its ids (a server started with
``--skip-tokenizer-init`` returns none); the server's own text is kept in the entry's meta as ``server_text``.
Conversations are produced turn by turn, a later turn's prompt holding the earlier turns and their reference
replies (:mod:`dflash_eval.references.conversations`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import cache_key
from dflash_eval.cache.requests import Batch, Produced, Request, StepReporter
from dflash_eval.cache.store import CacheEntry
from dflash_eval.common.progress import Progress
from dflash_eval.errors import CacheError, EvalError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.references.completion import CompletionRecord
from dflash_eval.references.completion_sources import CompletionSources, out_of_vocab
from dflash_eval.references.conversations import HistoryMissing, turn_groups, turn_prompt_ids
from dflash_eval.references.server_check import SERVER_MAX_DISAGREEMENT, teacher_forced_tensors
from dflash_eval.references.server_link import ServerLink
from dflash_eval.references.teacher_forced import TeacherForced, argmax_fields, argmax_produced, argmax_request
from dflash_eval.target.generation import generation_groups
from dflash_eval.target.kernel_probe import ProbeShape, bucket
from dflash_eval.target.kernel_registry import KernelOutputChanged

__all__ = ["CompletionRecord", "References", "SERVER_MAX_DISAGREEMENT", "argmax_fields", "out_of_vocab",
           "teacher_forced_tensors"]

_SOURCES = {"local": ("local",), "sglang": ("sglang",), "cache": ("local", "sglang")}


class References:
    """Reference completions of :attr:`Inputs.prompts` (see module docstring); the owner of the ``completion`` and
    ``argmax`` cache kinds.

    ``server``: how a ready SGLang client is reached (:class:`~dflash_eval.references.server_link.ServerLink`), needed
    only for ``--completions sglang`` on a cold cache.
    """

    def __init__(self, inputs: Inputs, server: ServerLink | None = None) -> None:
        self.inputs = inputs
        self.server = server if server is not None else ServerLink()
        self.sources = CompletionSources(inputs, self.server, self.prompt_ids)
        self.argmax = TeacherForced(inputs, self.completions)
        self._records: dict[str, CompletionRecord] = {}
        self._turn_ids: dict[tuple[str, str], list[int]] = {}  # (prompt, witness token) -> ids

    # ------------------------------------------------------------------------------------------------ keys
    def prompt_ids(self, pid: str) -> list[int]:
        """Token ids of ``pid``'s prompt; a later conversation turn's include the earlier turns and their reference
        replies (HistoryMissing until the previous turn's completion exists)."""
        p = self.inputs.prompt_by_id[pid]
        if not p.follows:
            return self.inputs.prompt_ids[pid]
        # the earlier turns' replies are those cached under the token in effect (the witness tries several)
        key = (pid, self.inputs.kernel_verdict.token(self.inputs.settings.torch_dtype))
        if key not in self._turn_ids:
            earlier: list[CompletionRecord] = []
            q: str | None = p.previous_id
            while q is not None:
                rec = self._records.get(q) or self._read(q)
                if rec is None:
                    raise HistoryMissing(f"turn {p.turn} of conversation {p.conversation!r} needs the reference "
                                         f"completion of {q!r} first")
                earlier.insert(0, rec)
                q = self.inputs.prompt_by_id[q].previous_id
            self._turn_ids[key] = turn_prompt_ids(self.inputs, p, [r.text for r in earlier], earlier[-1].sequence)
        return self._turn_ids[key]

    def fields(self, pid: str, source: str) -> dict[str, Any]:
        s, inp = self.inputs.settings, self.inputs
        f: dict[str, Any] = {"target": inp.target_identity, "prompt_ids": self.prompt_ids(pid),
                             "max_new_tokens": s.max_new_tokens, "source": source}
        if source == "local":
            f.update(backend=s.eval_backend, **inp.platform_fields(s.torch_dtype), stop_at_eos=True,
                     kernels=self.generation_probe(pid))
            if s.generation_batch > 1:  # left-padded batches: equal to one-at-a-time up to float near-ties
                f["generation"] = "left-padded-batch"
        return f

    def generation_probe(self, pid: str) -> str:
        """The digest of the kernel probe of local generation at ``pid``'s prompt length bucket
        (:mod:`dflash_eval.target.kernel_probe`): prefill of a left-padded batch, then every decode step."""
        s = self.inputs.settings
        shape = ProbeShape.for_generation(len(self.prompt_ids(pid)), s.generation_batch, s.max_new_tokens)
        return self.inputs.kernel_probe(s.eval_backend, s.torch_dtype, shape).digest

    def request(self, pid: str) -> Request:
        """The completion entry of ``pid`` for the configured ``--completions`` source (``cache``: either source's
        entry serves). A cached completion must be written for this request and hold 1-D int64 ids inside the
        vocabulary."""
        mode = self.inputs.settings.completions
        vocab = self.inputs.vocab_size

        def ids_in_vocab(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> str | None:
            bad = out_of_vocab(tensors["output_ids"].tolist(), vocab)
            return None if bad is None else (f"prompt {pid!r}: token id {bad[1]} at completion position {bad[0]} is "
                                             f"outside the target vocabulary (0..{vocab - 1})")

        expect = Expected(tensors={"output_ids": (torch.int64, (None,))}, validate=ids_in_vocab)
        what = f"the reference completion of prompt {pid!r}" + (
            " (--completions cache never generates)" if mode == "cache" else "")
        reqs = [Request("completion", self.fields(pid, src), expect=expect, what=what, item=pid)
                for src in _SOURCES[mode]]
        return Request(reqs[0].kind, reqs[0].fields, expect=expect, what=what, item=pid, alternatives=tuple(reqs[1:]))

    def _read(self, pid: str) -> CompletionRecord | None:
        entry = self.inputs.cache.lookup(self.request(pid))
        return None if entry is None else self._record(pid, entry)

    def _record(self, pid: str, entry: CacheEntry) -> CompletionRecord:
        ids = entry.tensors["output_ids"].tolist()
        text = entry.meta.get("text", "")
        if entry.meta.get("source") == "sglang" and "server_text" not in entry.meta:  # written before local decoding
            text = self.inputs.tokenizer.decode(ids, skip_special_tokens=True)
        spec = entry.meta.get("spec_verify_ct") != 0  # 0 verify rounds (older SGLang, no speculation): no accept length
        return CompletionRecord(pid, self.prompt_ids(pid), ids, text,
                                entry.meta.get("source", entry.manifest.get("fields", {}).get("source", "?")),
                                entry.meta.get("finish_reason"), entry.meta.get("spec_accept_length") if spec else None,
                                entry.meta.get("spec_accept_histogram") if spec else None, entry.meta.get("pieces"))

    def cached(self) -> bool:
        """Whether every prompt's completion is memoised or cached for the configured ``--completions`` source."""
        def one(pid: str) -> bool:
            try:
                return self.inputs.cache.has(self.request(pid))
            except HistoryMissing:
                return False

        return all(p.id in self._records or one(p.id) for p in self.inputs.prompts)

    def known(self, pid: str) -> CompletionRecord | None:
        """The completion of ``pid`` if this process already has it (never produces)."""
        return self._records.get(pid)

    def peek(self, pid: str) -> CompletionRecord | None:
        """The completion of ``pid`` if this process has it or the cache holds it (never produces; HistoryMissing
        for a later turn whose earlier turns are not known)."""
        return self._records.get(pid) or self._read(pid)

    # ------------------------------------------------------------------------------------------------ produce
    def completions(self) -> dict[str, CompletionRecord]:
        """Every prompt's reference completion (cache, else produced per ``--completions``)."""
        pids = [p.id for p in self.inputs.prompts]
        missing = [p for p in pids if p not in self._records]
        if missing:
            self.inputs.kernel_verdict.token(self.inputs.settings.torch_dtype)  # the witness's verdict, timed apart
            with self.inputs.meter.timed("completions"):
                for group in turn_groups([self.inputs.prompt_by_id[p] for p in missing]):
                    self._ensure(group)  # a later turn's prompt needs the earlier turns' completions
        return {p: self._records[p] for p in pids}

    def _ensure(self, pids: list[str]) -> None:
        """The completions of one turn group: requests in batches of the configured source, served by the cache."""
        inp = self.inputs
        reqs = {p: self.request(p) for p in pids}
        mode = inp.settings.completions
        progress: Callable[[int], StepReporter] | None = None
        if mode == "local":
            # Batches of every prompt of this turn group, cached or not (each batch generates only what is missing):
            # every worker forms the same batches, hence takes the same locks, whatever another has written already.
            # Prompts of one kernel probe bucket only per batch: a batch is no wider than its prompts' probe.
            lengths = {p: len(self.prompt_ids(p)) for p in pids}
            buckets = sorted({bucket(n) for n in lengths.values()}, reverse=True)
            groups = [g for b in buckets for g in generation_groups(
                {p: n for p, n in lengths.items() if bucket(n) == b}, inp.settings.generation_batch,
                min_groups=inp.worker_count)]
            batches = [Batch([reqs[p] for p in grp], self.sources.generate_local,
                             lock="completion-" + cache_key("batch", {"keys": [reqs[p].key for p in grp]}))
                       for grp in groups]
            progress = lambda n: Progress(  # noqa: E731 - the one branch that reports progress
                "reference completions (local generation)", n, inp.progress)
        elif mode == "sglang":
            batches = [Batch(list(reqs.values()), self.sources.fetch_sglang,
                             lock="completion-sglang-" + cache_key("batch", {"keys": [r.key for r in reqs.values()]}))]
        else:
            batches = [Batch(list(reqs.values()), self._refuse_uncached)]
        entries = inp.cache.ensure(batches, progress=progress, worker_index=inp.worker_index,
                                   worker_count=inp.worker_count,
                                   prepare=self._check_kernels if mode != "sglang" else None)
        for pid in pids:
            self._records[pid] = self._record(pid, entries[reqs[pid].key])

    def _check_kernels(self, misses: list[Request]) -> None:
        """Before generating what is missing: a completion cached under another generation probe digest (same
        fields otherwise) is said by name, the first kernel whose output changed (a :class:`KernelOutputChanged`
        warning, once per process and probe), or under ``--cache-only`` a CacheError saying what to do."""
        inp, s = self.inputs, self.inputs.settings
        for r in misses:
            pid = str(r.item)
            shape = ProbeShape.for_generation(len(self.prompt_ids(pid)), s.generation_batch, s.max_new_tokens)
            local = self.fields(pid, "local")
            for digest, kernels in inp.kernel_probes.earlier(s.eval_backend, s.torch_dtype, shape).items():
                if not inp.cache.exists("completion", cache_key("completion", {**local, "kernels": digest})):
                    continue
                msg = inp.kernel_probes.note_change(s.eval_backend, s.torch_dtype, shape, digest, kernels,
                                                    "completions")
                if msg is not None and inp.cache.cache_only:
                    raise CacheError(f"{msg}, e.g. that of prompt {pid!r}; --cache-only forbids generating it again: "
                                     "run once without --cache-only to generate the completions with the live "
                                     "kernels, or restore the kernels they were generated with")
                if msg is not None:
                    msg += "; completions generated with other kernels are not used: they are generated again"
                    warnings.warn(KernelOutputChanged(msg), stacklevel=2)
                    inp.log(msg)
                break

    def _refuse_uncached(self, todo: list[Request]) -> list[Produced]:
        """``--completions cache`` never generates."""
        raise EvalError(f"--completions cache: no cached completion for prompts {[r.item for r in todo]} "
                        f"under {self.inputs.settings.cache_dir}; run once with --completions local or sglang")

    # ------------------------------------------------------------------------------------------------ argmax
    def teacher_forced(self, pid: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(argmax, top1 - top2 logit margin) of the target at every position of prompt + completion
        (:class:`~dflash_eval.references.teacher_forced.TeacherForced`)."""
        return self.argmax.get(pid)

    def argmax_request(self, pid: str, seq: list[int]) -> Request:
        """The teacher-forced argmax entry of ``seq`` (for a forward that computes the logits anyway)."""
        return argmax_request(self.inputs, pid, seq)

    @staticmethod
    def argmax_produced(pid: str, logits: torch.Tensor) -> Produced:
        """The argmax entry made from the target's [T, V] float32 logits over the sequence."""
        return argmax_produced(pid, logits)
