"""The third stage: target features ``hidden_states[i + 1]`` per prompt, target layer and side (backend, dtype).

One cache entry per (sequence, layer, backend, dtype, device kind, library versions, kernel probe digest, witness
token): a drafter reading other target layers reuses the layers already cached and extracts only the missing ones,
all in ONE target forward per prompt (one cache batch per prompt, spread over xdist workers). When that forward is the
evaluation backend's in the evaluation dtype it runs to the logits and also gives the references stage's
teacher-forced argmax entry of the sequence (that stage states the request and makes the entry from the logits:
:mod:`dflash_eval.references.teacher_forced`), so the argmax costs no forward of its own. Also the per-layer fingerprint
of a fixed text (regression detection across library upgrades).

The kernel probe (:mod:`dflash_eval.target.kernel_probe`) runs the side's forward in this process before the first
key is made, at the probe shape of each sequence's length bucket, so features extracted by kernels that computed
something else (patched, rebuilt, another Triton or driver under the same versions) are never served: they are
re-extracted, with a :class:`KernelOutputChanged` warning naming the first kernel whose output changed (or, under
``--cache-only``, an error saying what to do). Before the first key of a dtype is made, the witness
(:mod:`dflash_eval.features.witness`, registered here as the judge of the run's verdict on its kernels:
:mod:`dflash_eval.inputs.kernel_verdict`) re-runs a seeded sample of the run's sequences through the live target and
compares them with the cache: what the probe's one layer of each type on seeded inputs did not show, the real target
on real data does, and its token, in every key of the dtype (the platform fields), keeps whatever the changed kernels
made from being used as cached.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import cache_key, ids_digest
from dflash_eval.cache.requests import Batch, Produced, Producer, Request
from dflash_eval.common.progress import Progress
from dflash_eval.errors import CacheError
from dflash_eval.features.feature_map import FeatureMap
from dflash_eval.features.witness import FINGERPRINT, Witness
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.metrics.drift import Side
from dflash_eval.metrics.drift import fingerprint as layer_fingerprint
from dflash_eval.references.conversations import HistoryMissing
from dflash_eval.references.greedy import CompletionRecord, References
from dflash_eval.references.teacher_forced import (
    decode_forward,
    decode_produced,
    decode_request,
    teacher_forced_forward,
)
from dflash_eval.target.backends import check_backend_device, use_backend
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.kernel_probe import ProbeResult, ProbeShape
from dflash_eval.target.kernel_registry import KernelOutputChanged, KernelProbes
from dflash_eval.target.provenance import device_kind, kernel_versions, provenance

__all__ = ["FeatureStore", "FINGERPRINT_TEXT"]

FINGERPRINT_TEXT = "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"

Features = Mapping[str, dict[int, torch.Tensor]]  # prompt id -> {layer: [T, H]} (a FeatureMap: read on access)


class FeatureStore:
    """Cached target features (see module docstring) of the sequences of ``references`` (whose teacher-forced argmax
    entries its forwards also give), read from the cache when a consumer asks for a prompt
    (:class:`~dflash_eval.features.feature_map.FeatureMap`), never held for the session. ``probes`` / ``witness``:
    the process's kernel probes and witness when another store made them already (the drift budget's prompt view;
    by default the probes are the inputs' own)."""

    def __init__(self, inputs: Inputs, references: References, probes: KernelProbes | None = None,
                 witness: Witness | None = None) -> None:
        self.inputs, self.references = inputs, references
        self._present: set[tuple[str, str, str, int]] = set()  # (prompt, backend, dtype, layer) ensured this session
        self._fingerprint: dict[str, Any] | None = None
        self._plan: dict[str, tuple[int, ...]] | None = None
        self.probes = probes or inputs.kernel_probes
        if witness is None:
            witness = Witness(inputs, self._known_sequence, self._cached_feature, self._prompt_length)
            if inputs.kernel_verdict.judge is None:  # the run's verdict on its kernels (inputs/kernel_verdict.py)
                inputs.kernel_verdict.judge = witness.verdict
        self.witness = witness

    def probe(self, side: Side, n_tokens: int) -> ProbeResult:
        """The probe of the side's kernels at the extraction shape of a sequence of ``n_tokens``
        (:mod:`dflash_eval.target.kernel_probe`; run on the first call per backend, dtype and length bucket)."""
        shape = ProbeShape.for_sequence(n_tokens)
        if not self.probes.probed(side.backend, side.dtype, shape):
            with self.inputs.meter.timed("kernel_probe"):
                self.probes.get(side.backend, side.dtype, shape)
            self.inputs.meter.counts["kernel_probes"] += 1
        return self.probes.get(side.backend, side.dtype, shape)

    def kernel_digest(self, side: Side, n_tokens: int) -> str:
        """The digest of the side's kernels' output in this process at the extraction shape of ``n_tokens``."""
        return self.probe(side, n_tokens).digest

    def fields(self, seq: list[int], layer: int, side: Side, *, kernels: str | None = None) -> dict[str, Any]:
        """The key fields of one feature entry (the run's witness token of the side's dtype among the platform
        fields); ``kernels``: another kernel probe digest than the live one (to look for entries extracted with other
        kernels)."""
        return {"target": self.inputs.target_identity, "tokens": ids_digest(seq), "n_tokens": len(seq),
                "layer": int(layer), "backend": side.backend, **self.inputs.platform_fields(side.dtype),
                "kernels": kernels or self.kernel_digest(side, len(seq))}

    # ------------------------------------------------------------------------------------------------ the witness
    def _known_sequence(self, pid: str) -> list[int] | None:
        """Prompt + reference completion of ``pid`` when this process or the cache has the completion (never
        produces one); the fingerprint text's ids for ``fingerprint``."""
        if pid == FINGERPRINT:
            return self.inputs.text_ids(FINGERPRINT_TEXT, FINGERPRINT)
        try:
            rec = self.references.peek(pid)
        except HistoryMissing:
            return None
        return None if rec is None else rec.sequence

    def _prompt_length(self, pid: str) -> int | None:
        """The length of ``pid``'s prompt ids (None for the fingerprint text, or a later turn whose earlier turns are
        not known)."""
        if pid == FINGERPRINT:
            return None
        try:
            return len(self.references.prompt_ids(pid))
        except HistoryMissing:
            return None

    def _cached_feature(self, pid: str, seq: list[int], layer: int,
                        side: Side) -> tuple[torch.Tensor, int | None] | None:
        """The cached feature of one layer of ``seq`` (under the witness token in effect) and the torch thread count
        it was extracted with (None when not recorded); None when not cached."""
        fields = self.fields(seq, layer, side)
        key = cache_key("features", fields)
        if not self.inputs.cache.exists("features", key):
            return None
        req = Request("features", fields, expect=self._expected(fields, seq, layer, side), item=pid,
                      what=f"features of prompt {pid!r}, layer {layer}, {side.label}")
        e = self.inputs.cache.lookup(req, count=False)
        if e is None:
            return None
        threads = (e.meta.get("provenance") or {}).get("torch_threads")
        return e.tensors["features"], threads if isinstance(threads, int) else None

    def key(self, seq: list[int], layer: int, side: Side) -> str:
        return cache_key("features", self.fields(seq, layer, side))

    def expected(self, seq: list[int], layer: int, side: Side) -> Expected:
        """What a cached feature entry must hold for this request: written for exactly these key fields, a
        ``[len(seq), hidden_size]`` tensor of the side's dtype, extracted (provenance) with the side's backend and
        dtype, this layer, these library versions and kernels of this probe digest."""
        return self._expected(self.fields(seq, layer, side), seq, layer, side)

    def _expected(self, fields: dict[str, Any], seq: list[int], layer: int, side: Side) -> Expected:
        return Expected(fields=fields,
                        tensors={"features": (side.dtype, (len(seq), self.inputs.target_dir.hidden_size))},
                        meta={"provenance": {"backend": side.backend, "dtype": str(side.dtype).removeprefix("torch."),
                                             "device_kind": fields["device_kind"], "layer_ids": [int(layer)],
                                             "versions": fields["versions"], "kernel_probe": fields["kernels"]}})

    def request(self, pid: str, seq: list[int], layer: int, side: Side) -> Request:
        """The feature entry of one layer of ``seq`` (prompt ``pid``, or the fingerprint text) under ``side``."""
        what = f"features of prompt {pid!r}, layer {layer}, {side.label}" if pid != "fingerprint" else \
            f"the fingerprint's features, layer {layer}, {side.label}"
        return Request("features", self.fields(seq, layer, side), expect=self.expected(seq, layer, side), what=what,
                       item=pid)

    def _batch(self, pid: str, seq: list[int], layers: tuple[int, ...], side: Side, lock: str) -> Batch:
        """Every layer of ``layers`` of ``seq`` in one target forward; on the evaluation backend and dtype the
        forward gives the references stage's argmax entry of ``seq`` too, when it is not cached."""
        s = self.inputs.settings
        also = []
        if pid != "fingerprint" and side.backend == s.eval_backend and side.dtype == s.torch_dtype:
            also.append(self.references.argmax_request(pid, seq))
            if (starts := self._decode_plan().get(pid)) is not None:  # what a later witness decodes again
                also.append(decode_request(self.inputs, pid, seq, starts))
        return Batch([self.request(pid, seq, i, side) for i in layers], self._extractor(pid, seq, side), lock=lock,
                     also=also)

    def _group_lock(self, seq: list[int], side: Side) -> str:
        """One lock per (sequence, side): the layers of one sequence are extracted by one forward."""
        return "features-" + cache_key("featgroup", {k: v for k, v in self.fields(seq, -1, side).items()
                                                     if k != "layer"})

    def check_kernels(self, seqs: dict[str, list[int]], layers: tuple[int, ...], side: Side, what: str) -> None:
        """Before extracting what is missing: if any of these entries was cached with kernels of another probe
        digest (same target, tokens, backend, dtype, device kind, versions and probe shape), say so by name, naming
        the first kernel whose output changed, once per process and probe (a :class:`KernelOutputChanged` warning,
        eval.json's ``provenance.kernel_probe.changed``); under ``--cache-only`` raise CacheError saying what to do
        instead."""
        cache = self.inputs.cache
        by_shape: dict[ProbeShape, list[tuple[str, list[int], int]]] = {}
        for pid, seq in seqs.items():
            for i in layers:
                by_shape.setdefault(ProbeShape.for_sequence(len(seq)), []).append((pid, seq, i))
        for shape, items in by_shape.items():
            earlier = self.probes.earlier(side.backend, side.dtype, shape)
            missing = [(pid, seq, i) for pid, seq, i in items
                       if earlier and not cache.exists("features", self.key(seq, i, side))]
            for digest, kernels in earlier.items():
                stale = next((pid for pid, seq, i in missing
                              if cache.exists("features", cache_key("features", self.fields(seq, i, side,
                                                                                             kernels=digest)))), None)
                if stale is None:
                    continue
                msg = self.probes.note_change(side.backend, side.dtype, shape, digest, kernels, "features")
                if msg is None:  # said already in this process
                    break
                if cache.cache_only:
                    raise CacheError(f"{msg}, e.g. those of {stale}; --cache-only forbids re-extracting them: run once "
                                     "without --cache-only to extract them with the live kernels, or restore the "
                                     "kernels they were extracted with")
                msg += (f"; features extracted with other kernels are not used: {what} are re-extracted with the live "
                        "ones")
                warnings.warn(KernelOutputChanged(msg), stacklevel=2)
                self.inputs.log(msg)
                break

    def features(self, completions: dict[str, CompletionRecord], side: Side, layers: tuple[int, ...]) -> Features:
        """Per prompt, per target layer features [T, H] of prompt + completion under ``side``: every entry made
        present first (the missing ones extracted, spread over xdist workers; nothing read), then a
        :class:`~dflash_eval.features.feature_map.FeatureMap` that reads a prompt's layers when it is asked for."""
        inp = self.inputs
        seqs = {p.id: completions[p.id].sequence for p in inp.prompts}
        self.ensure(seqs, side, layers)
        return FeatureMap(list(seqs), {pid: len(seq) for pid, seq in seqs.items()},
                          lambda pid: self.read_prompt(pid, seqs[pid], side, layers))

    def _decode_plan(self) -> dict[str, tuple[int, ...]]:
        """The prompts whose decode entries are made beside their features, and where their steps start
        (:meth:`Witness.decode_plan`), found once per :meth:`ensure` call."""
        if self._plan is None:
            self._plan = self.witness.decode_plan()
        return self._plan

    def ensure(self, seqs: dict[str, list[int]], side: Side, layers: tuple[int, ...]) -> None:
        """Make every feature entry of ``seqs`` x ``layers`` present (not read: each consumer reads and checks what it
        needs); the entries ensured once are not looked up again in this session."""
        inp = self.inputs
        tag = (side.backend, str(side.dtype))
        for n in sorted({len(seq) for seq in seqs.values()}):
            self.probe(side, n)  # the probes first: the witness's keys need them, and they are timed apart
        inp.kernel_verdict.token(side.dtype)  # the witness's verdict, before any key of the side (timed apart too)
        self._plan = None  # the sequences known now decide it
        with inp.meter.timed("features"):
            batches = [self._batch(pid, seq, need, side, self._group_lock(seq, side)) for pid, seq in seqs.items()
                       if (need := tuple(i for i in layers if (pid, *tag, i) not in self._present))]
            if batches:
                def prepare(misses: list[Request]) -> None:
                    check_backend_device(side.backend, inp.settings.torch_device)  # fla (faulty or not) needs CUDA
                    todo = list(dict.fromkeys(r.item for r in misses))
                    self.check_kernels({f"prompt {pid!r}": seqs[pid] for pid in todo}, layers, side,
                                       f"the features of {len(todo)} prompt(s)")

                inp.cache.ensure(batches, prepare=prepare, worker_index=inp.worker_index,
                                 worker_count=inp.worker_count, keep=False,
                                 progress=lambda n: Progress(f"target features ({side.label}, layers {list(layers)})",
                                                             n, inp.progress))
            self._present.update((pid, *tag, i) for pid in seqs for i in layers)

    def read_prompt(self, pid: str, seq: list[int], side: Side, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
        """The layers of one prompt, read and checked (:meth:`Cache.lookup`); an entry that fails its check (reported
        and removed by the cache) is extracted again, once."""
        cache = self.inputs.cache
        out = {}
        for attempt in (0, 1):
            for i in layers:
                if i not in out and (e := cache.lookup(self.request(pid, seq, i, side), count=False)) is not None:
                    out[i] = e.tensors["features"]
            lost = [i for i in layers if i not in out]
            if not lost:
                return out
            if attempt == 0:
                tag = (side.backend, str(side.dtype))
                self._present.difference_update((pid, *tag, i) for i in lost)
                self.ensure({pid: seq}, side, tuple(lost))
        raise CacheError(f"features of prompt {pid!r} layers {lost} ({side.label}) are missing after their "
                         f"extraction: is the cache directory {cache.root} writable?")

    def _extractor(self, pid: str, seq: list[int], side: Side) -> Producer:
        """The producer of a batch of :meth:`_batch`: one target forward for the layers asked (and the argmax).

        With the argmax the forward runs to the logits (the teacher-forced argmax's own forward, with the layers
        captured on the way: the same features as a forward stopped after the deepest layer, bit for bit); with the
        decode entry the target's decode steps run too (:func:`~dflash_eval.references.teacher_forced.
        decode_forward`)."""
        inp = self.inputs

        def produce(todo: list[Request]) -> list[Produced]:
            missing = tuple(int(r.fields["layer"]) for r in todo if r.kind == "features")
            with_argmax = any(r.kind == "argmax" for r in todo)
            decode = next((r for r in todo if r.kind == "decode"), None)
            with inp.meter.timed("target_forward"), use_backend(side.backend, inp.settings.torch_device) as info:
                if with_argmax:
                    feats, logits = teacher_forced_forward(inp.target.model, seq, inp.target.device, missing)
                else:
                    feats = layer_features(inp.model_for(side.dtype), torch.tensor(seq, dtype=torch.long),
                                           list(missing))
                if decode is not None:
                    steps = decode_forward(inp.target.model, seq, decode.fields["decode_starts"], inp.target.device)
            inp.meter.counts["target_forwards"] += 1
            out = []
            for r in todo:
                if r.kind == "argmax":
                    out.append(self.references.argmax_produced(pid, logits))
                    continue
                if r.kind == "decode":
                    out.append(decode_produced(pid, steps))
                    continue
                i = int(r.fields["layer"])
                meta = {"prompt_id": pid, "provenance": provenance(
                    backend=info.name, dtype=side.dtype, device=inp.settings.torch_device, kernel=info.chunk_impl,
                    layer_ids=[i], kernel_probe=r.fields["kernels"],
                    torch_threads=torch.get_num_threads())}  # a CPU's reductions may split by it: the witness redoes it
                out.append(Produced({"features": feats[i]}, meta, tokens=len(seq)))
            return out
        return produce

    # ------------------------------------------------------------------------------------------------ fingerprint
    @property
    def fingerprint_computed(self) -> bool:
        return self._fingerprint is not None

    def fingerprint(self) -> dict[str, Any]:
        """Summary statistics of every target layer's features of :data:`FINGERPRINT_TEXT` on the evaluation
        backend, dtype and device (no second copy of the target is made), with the versions of the libraries whose
        numerics they depend on (torch, triton, fla, transformers). Under ``--kernel-fault`` the kernels run with
        the fault (``kernel_fault`` names it) while ``backend`` stays the clean one, so the run is compared with the
        clean golden: the fault-injection hook is how the fingerprint check is seen to catch a kernel change.

        The features come from the cache like any prompt's (keyed on the target, backend, dtype, device kind,
        library versions and the kernel probe's digest, so they are the live kernels' features): under xdist one
        worker runs the forward and the others read it, and a warm run loads no target for it. ``kernel_probe``
        records the probe's digest per kernel."""
        if self._fingerprint is None:
            inp = self.inputs
            s = inp.settings
            ids = inp.text_ids(FINGERPRINT_TEXT, "fingerprint")  # cached: a warm run loads no tokenizer
            layers = tuple(range(inp.target_dir.num_layers))
            side = inp.eval_side  # the evaluation backend (with a kernel fault, if any) and dtype
            self.probe(side, len(ids))
            inp.kernel_verdict.token(side.dtype)
            batch = self._batch("fingerprint", ids, layers, side,
                                "fingerprint-" + cache_key("fingerprint", self.fields(ids, -1, side)))
            entries = inp.cache.ensure([batch], prepare=lambda misses: self.check_kernels(
                {"the fingerprint text": ids}, layers, side, "the fingerprint's features"))
            feats = {int(r.fields["layer"]): entries[r.key].tensors["features"] for r in batch.requests}
            self._fingerprint = {
                "target": inp.target_identity, "text": FINGERPRINT_TEXT, "tokens": ids_digest(ids),
                "n_tokens": len(ids), "backend": s.eval_backend, "kernel_fault": s.kernel_fault,
                "dtype": str(side.dtype).removeprefix("torch."), "device_kind": device_kind(s.torch_device),
                "layers": {str(i): layer_fingerprint(feats[i]) for i in layers}, "versions": kernel_versions(),
                "kernel_probe": self.probe(side, len(ids)).by_kind()}
        return self._fingerprint
