"""The second stage: each prompt's reference completion, and the target's teacher-forced check of it.

A completion comes from the cache, else from its source (``--completions``): ``local`` is the target's own greedy
generation, ``--generation-batch`` prompts of similar length per left-padded batch (one cache job per batch,
spread over xdist workers; still one cache entry per prompt, written as soon as its batch is done), ``sglang`` a
batch of greedy ``/generate`` requests to a server whose readiness and identity the SGLang service already checked
(it hands this stage a ready client), ``cache`` never computes. Nothing is cached unless every answer of a batch is
valid: an empty completion or a token id outside the target's vocabulary is an error naming the prompt, never an
entry, and every completion of an SGLang fetch must be reproduced by the local target's teacher-forced argmax
(:mod:`dflash_eval.suite.server_check`: a server that names the right model but serves other weights, for all
prompts or only some, is caught before anything of the fetch is cached). A
completion's text is always the local tokenizer's decoding of its ids (a server started with
``--skip-tokenizer-init`` returns none); the server's own text is kept in the entry's meta as ``server_text``.
Conversations are produced turn by turn, a later turn's prompt holding the earlier turns and their reference
replies (:mod:`dflash_eval.suite.conversations`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.store import CacheEntry, Job, cache_key, ids_digest
from dflash_eval.errors import EvalError
from dflash_eval.suite.conversations import HistoryMissing, turn_groups, turn_prompt_ids
from dflash_eval.suite.inputs import Inputs
from dflash_eval.suite.progress import Progress
from dflash_eval.suite.server_check import SERVER_MAX_DISAGREEMENT, check_server_completions, teacher_forced_tensors
from dflash_eval.target.backends import use_backend
from dflash_eval.target.generation import generation_groups
from dflash_eval.target.provenance import device_kind, library_versions

__all__ = ["CompletionRecord", "References", "SERVER_MAX_DISAGREEMENT", "argmax_fields", "out_of_vocab",
           "teacher_forced_tensors"]

_SOURCES = {"local": ("local",), "sglang": ("sglang",), "cache": ("local", "sglang")}


def out_of_vocab(ids: list[int], vocab_size: int) -> tuple[int, int] | None:
    """(position, id) of the first id outside ``0 .. vocab_size - 1``, or None."""
    for k, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            return k, t
    return None


@dataclass
class CompletionRecord:
    """A reference completion: generated ids only (no prompt), decoded text, where it came from."""

    prompt_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    source: str
    finish_reason: Any = None
    spec_accept_length: float | None = None  # meta_info.spec_accept_length of a speculative SGLang server
    spec_accept_histogram: list[int] | None = None  # its meta_info.spec_accept_histogram (rounds per accepted drafts)

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.output_ids


class References:
    """Reference completions of :attr:`Inputs.prompts` (see module docstring).

    ``sglang_client``: a ready :class:`dflash_eval.sglang.SGLangClient`, needed only for ``--completions sglang``
    on a cold cache (set by whoever started the service, before :meth:`completions`).
    """

    def __init__(self, inputs: Inputs, sglang_client: Any = None) -> None:
        self.inputs = inputs
        self.sglang_client = sglang_client
        self._records: dict[str, CompletionRecord] = {}
        self._argmax: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._turn_ids: dict[str, list[int]] = {}

    # ------------------------------------------------------------------------------------------------ keys
    def prompt_ids(self, pid: str) -> list[int]:
        """Token ids of ``pid``'s prompt; a later conversation turn's include the earlier turns and their reference
        replies (HistoryMissing until the previous turn's completion exists)."""
        p = self.inputs.prompt_by_id[pid]
        if not p.follows:
            return self.inputs.prompt_ids[pid]
        if pid not in self._turn_ids:
            earlier = []
            q: str | None = p.previous_id
            while q is not None:
                rec = self._records.get(q) or self._read(q)
                if rec is None:
                    raise HistoryMissing(f"turn {p.turn} of conversation {p.conversation!r} needs the reference "
                                         f"completion of {q!r} first")
                earlier.insert(0, rec)
                q = self.inputs.prompt_by_id[q].previous_id
            self._turn_ids[pid] = turn_prompt_ids(self.inputs, p, [r.text for r in earlier], earlier[-1].sequence)
        return self._turn_ids[pid]

    def fields(self, pid: str, source: str) -> dict[str, Any]:
        s, inp = self.inputs.settings, self.inputs
        f: dict[str, Any] = {"target": inp.target_identity, "prompt_ids": self.prompt_ids(pid),
                             "max_new_tokens": s.max_new_tokens, "source": source}
        if source == "local":
            f.update(backend=s.eval_backend, dtype=str(s.torch_dtype), device_kind=device_kind(s.torch_device),
                     versions=library_versions(), stop_at_eos=True)
            if s.generation_batch > 1:  # left-padded batches: equal to one-at-a-time up to float near-ties
                f["generation"] = "left-padded-batch"
        return f

    def _key(self, pid: str, source: str) -> str:
        return cache_key("completion", self.fields(pid, source))

    def _expected(self, pid: str, source: str) -> Expected:
        """A cached completion must be written for this request and hold 1-D int64 ids inside the vocabulary."""
        vocab = self.inputs.vocab_size

        def ids_in_vocab(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> str | None:
            bad = out_of_vocab(tensors["output_ids"].tolist(), vocab)
            return None if bad is None else (f"prompt {pid!r}: token id {bad[1]} at completion position {bad[0]} is "
                                             f"outside the target vocabulary (0..{vocab - 1})")

        return Expected(fields=self.fields(pid, source), tensors={"output_ids": (torch.int64, (None,))},
                        validate=ids_in_vocab)

    def _read(self, pid: str) -> CompletionRecord | None:
        for src in _SOURCES[self.inputs.settings.completions]:
            entry = self.inputs.cache.read("completion", self._key(pid, src), expect=self._expected(pid, src))
            if entry is not None:
                return self._record(pid, entry)
        return None

    def _record(self, pid: str, entry: CacheEntry) -> CompletionRecord:
        ids = entry.tensors["output_ids"].tolist()
        text = entry.meta.get("text", "")
        if entry.meta.get("source") == "sglang" and "server_text" not in entry.meta:  # written before local decoding
            text = self.inputs.tokenizer.decode(ids, skip_special_tokens=True)
        spec = entry.meta.get("spec_verify_ct") != 0  # 0 verify rounds (older SGLang, no speculation): no accept length
        return CompletionRecord(pid, self.prompt_ids(pid), ids, text,
                                entry.meta.get("source", entry.manifest.get("fields", {}).get("source", "?")),
                                entry.meta.get("finish_reason"), entry.meta.get("spec_accept_length") if spec else None,
                                entry.meta.get("spec_accept_histogram") if spec else None)

    def cached(self) -> bool:
        """Whether every prompt's completion is memoised or cached for the configured ``--completions`` source."""
        cache = self.inputs.cache

        def one(pid: str) -> bool:
            try:
                return any(cache.exists("completion", self._key(pid, src))
                           for src in _SOURCES[self.inputs.settings.completions])
            except HistoryMissing:
                return False

        return all(p.id in self._records or one(p.id) for p in self.inputs.prompts)

    def known(self, pid: str) -> CompletionRecord | None:
        """The completion of ``pid`` if this process already has it (never produces)."""
        return self._records.get(pid)

    # ------------------------------------------------------------------------------------------------ produce
    def completions(self) -> dict[str, CompletionRecord]:
        """Every prompt's reference completion (cache, else produced per ``--completions``)."""
        pids = [p.id for p in self.inputs.prompts]
        missing = [p for p in pids if p not in self._records]
        if missing:
            with self.inputs.meter.timed("completions"):
                for group in turn_groups([self.inputs.prompt_by_id[p] for p in missing]):
                    self._ensure(group)  # a later turn's prompt needs the earlier turns' completions
        return {p: self._records[p] for p in pids}

    def _ensure(self, pids: list[str]) -> None:
        inp = self.inputs
        for pid in pids:
            rec = self._read(pid)
            if rec is not None:
                self._records[pid] = rec
        todo = [p for p in pids if p not in self._records]
        if not todo:
            return
        mode = inp.settings.completions
        for pid in todo:
            inp.cache.miss("completion", self._key(pid, "local"), f"the reference completion of prompt {pid!r}" + (
                " (--completions cache never generates)" if mode == "cache" else ""))
        if mode == "cache":  # cache.miss raised already when cache_only; --completions cache alone also fails
            raise EvalError(f"--completions cache: no cached completion for prompts {todo} "
                            f"under {inp.settings.cache_dir}; run once with --completions local or sglang")
        if mode == "sglang":
            lock = "completion-sglang-" + cache_key("batch", {"keys": [self.fields(p, "sglang") for p in todo]})
            inp.cache.produce_many([Job(lock, lambda: all(self._read(p) is not None for p in todo),
                                        lambda: self._fetch_sglang([p for p in todo if self._read(p) is None]))])
        else:
            prog = Progress("reference completions (local generation)", len(todo), inp.progress)
            # Batches of every prompt of this turn group, cached or not (each batch generates only what is missing):
            # every worker forms the same batches, hence takes the same locks, whatever another has written already.
            groups = generation_groups({p: len(self.prompt_ids(p)) for p in pids}, inp.settings.generation_batch,
                                       min_groups=inp.worker_count)
            jobs = [Job("completion-" + cache_key("batch", {"keys": [self._key(p, "local") for p in grp]}),
                        lambda grp=grp: all(self._local_cached(p) for p in grp),
                        lambda grp=grp: self._generate_local(grp, prog)) for grp in groups]
            inp.cache.produce_many(jobs, worker_index=inp.worker_index, worker_count=inp.worker_count)
        for pid in todo:
            rec = self._read(pid)
            if rec is None:
                raise EvalError(f"completion of prompt {pid!r} missing after production (cache dir unwritable?)")
            self._records[pid] = rec

    def _write(self, pid: str, source: str, ids: list[int], text: str, finish: Any, seconds: float,
               extra_meta: dict[str, Any] | None = None) -> None:
        self._check_ids(pid, source, ids)
        fields = self.fields(pid, source)
        self.inputs.cache.write("completion", cache_key("completion", fields), {"output_ids": torch.tensor(ids)},
                                fields=fields, meta={"text": text, "source": source, "finish_reason": finish,
                                                     "prompt_id": pid, **(extra_meta or {})}, seconds=seconds)

    def _check_ids(self, pid: str, source: str, ids: list[int]) -> None:
        """Refuse (before anything is cached) an empty completion or one with an id outside the vocabulary."""
        if not ids:
            raise EvalError(f"empty completion for prompt {pid!r} from {source}: nothing to evaluate "
                            "(the target emitted EOS at once?); no cache entry written")
        vocab = self.inputs.vocab_size
        bad = out_of_vocab(ids, vocab)
        if bad is not None:
            raise EvalError(f"completion of prompt {pid!r} from {source}: token id {bad[1]} at completion position "
                            f"{bad[0]} is outside the target vocabulary (0..{vocab - 1}, config.json vocab_size of "
                            f"{self.inputs.settings.target_model}); the source does not serve this target's "
                            "tokenizer? No cache entry written")

    def _local_cached(self, pid: str) -> bool:
        return self.inputs.cache.exists("completion", self._key(pid, "local"))

    def _generate_local(self, pids: list[str], prog: Progress) -> None:
        """Greedy-generate, in one batch, the completions of those of ``pids`` not cached yet, and cache each."""
        from dflash_eval.target.generation import greedy_generate_batch

        inp = self.inputs
        todo = [p for p in pids if not self._local_cached(p)]
        if not todo:
            return
        t0 = time.perf_counter()
        with inp.meter.timed("generation"):
            outs = greedy_generate_batch(inp.target, [self.prompt_ids(p) for p in todo], inp.settings.max_new_tokens,
                                         backend=inp.settings.eval_backend)
        for pid, ids in zip(todo, outs):  # every answer of the batch checked before any is cached
            self._check_ids(pid, "local", ids)
        seconds = (time.perf_counter() - t0) / len(todo)
        for pid, ids in zip(todo, outs):
            inp.meter.counts["generated_tokens"] += len(ids)
            self._write(pid, "local", ids, inp.tokenizer.decode(ids, skip_special_tokens=True), None, seconds)
            prog.step(len(ids))

    def _fetch_sglang(self, pids: list[str]) -> None:
        """Fetch greedy completions from the ready server and cache them; nothing is cached unless every answer
        is valid and agrees with the local target (:func:`~dflash_eval.suite.server_check.check_server_completions`).
        """
        if not pids:
            return
        if self.sglang_client is None:
            raise EvalError("--completions sglang: reference completions are not cached and no SGLang server was "
                            "started (the suite's sglang fixture starts it; outside pytest pass a ready client)")
        inp = self.inputs
        t0 = time.perf_counter()
        with inp.meter.timed("sglang"):
            comps = self.sglang_client.generate_greedy([self.prompt_ids(p) for p in pids],
                                                       max_new_tokens=inp.settings.max_new_tokens)
        dt = (time.perf_counter() - t0) / max(1, len(pids))
        for pid, c in zip(pids, comps):
            self._check_ids(pid, "sglang", list(c.output_ids))
        check_server_completions(inp, [(p, self.prompt_ids(p), list(c.output_ids)) for p, c in zip(pids, comps)],
                                 getattr(self.sglang_client, "url", "the SGLang server"))
        for pid, c in zip(pids, comps):
            extra = {"server_text": c.text}
            if c.spec_accept_length is not None:
                extra.update(spec_accept_length=c.spec_accept_length, spec_verify_ct=c.spec_verify_ct)
            if getattr(c, "spec_accept_histogram", None) is not None:
                extra["spec_accept_histogram"] = list(c.spec_accept_histogram)
            text = inp.tokenizer.decode(list(c.output_ids), skip_special_tokens=True)  # as local completions
            self._write(pid, "sglang", list(c.output_ids), text, c.finish_reason, dt, extra)

    # ------------------------------------------------------------------------------------------------ consistency
    def teacher_forced(self, pid: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(argmax, top1 - top2 logit margin) of the target at every position of prompt + completion.

        Under xdist the first call produces every selected prompt's (:meth:`Cache.produce_many`: each worker starts
        at its own offset and takes what no other worker holds), instead of one prompt per test: the tests of
        different prompts land on different workers in no fixed order, and one lock per prompt would have the
        workers take turns on them."""
        if pid not in self._argmax:
            inp = self.inputs
            if inp.worker_count > 1 and not self._argmax:
                comps = self.completions()
                keys = {p.id: cache_key("argmax", argmax_fields(inp, comps[p.id].sequence)) for p in inp.prompts}
                jobs = [Job("argmax-job-" + keys[p.id], lambda k=keys[p.id]: inp.cache.exists("argmax", k),
                            lambda p=p.id, seq=comps[p.id].sequence: self._teacher_forced_seq(p, seq))
                        for p in inp.prompts]
                inp.cache.produce_many(jobs, worker_index=inp.worker_index, worker_count=inp.worker_count)
            self._argmax[pid] = self._teacher_forced_seq(pid, self.completions()[pid].sequence)
        return self._argmax[pid]

    def _teacher_forced_seq(self, pid: str, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(argmax, margin) of one causal target forward over ``seq`` (cached under the exact tokens; the feature
        store writes the entry too, from the forward that extracts the evaluation side's features)."""
        inp = self.inputs
        s = inp.settings

        def produce() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
            with inp.meter.timed("target_forward"), use_backend(s.eval_backend, s.torch_device), torch.no_grad():
                logits = inp.target.model(input_ids=torch.tensor([seq], device=inp.target.device)).logits[0].float()
            inp.meter.counts["target_forwards"] += 1
            return teacher_forced_tensors(logits), {"prompt_id": pid}

        e = inp.cache.get_or_produce("argmax", argmax_fields(inp, seq), produce,
                                     what=f"teacher-forced argmax of {pid!r}", expect=argmax_expected(len(seq)))
        return e.tensors["argmax"], e.tensors["margin"]


def argmax_fields(inp: Inputs, seq: list[int]) -> dict[str, Any]:
    """Key fields of the teacher-forced argmax entry of ``seq``: the target's full causal forward on the evaluation
    backend (no kernel fault) and dtype."""
    s = inp.settings
    return {"target": inp.target_identity, "tokens": ids_digest(seq), "n_tokens": len(seq),
            "backend": s.eval_backend, "dtype": str(s.torch_dtype), "device_kind": device_kind(s.torch_device),
            "versions": library_versions()}


def argmax_expected(n: int) -> Expected:
    return Expected(tensors={"argmax": (torch.int64, (n,)), "margin": (torch.float32, (n,))})
