"""The witness: every run, warm ones too, re-runs the live target on a seeded sample of its real sequences and
compares what it gives with what the cache holds, before any entry the target's kernels made is used; its verdict
is the run's verdict on the kernels (:mod:`dflash_eval.inputs.kernel_verdict`).

The kernel probe (:mod:`dflash_eval.target.kernel_probe`) runs the target's code on one layer of each type, seeded
weights and inputs, at both ends of each length bucket; the witness runs the real target (every layer, its weights,
real data) at the lengths the run really uses. Once per process and dtype, before the first cache key of that dtype
is made, it witnesses every side (backend) of that dtype the run reads (:attr:`Inputs.sides`): of each it takes the
sequences with something cached among the fingerprint text (:data:`dflash_eval.features.feature_store.
FINGERPRINT_TEXT`, on the side it is extracted on), the shortest and the longest sequence (prompt + reference
completion) of the selection in each length bucket (:func:`dflash_eval.target.kernel_probe.bucket`), and
``--witness-prompts`` more prompts of the selection in a seeded order; it extracts their cached layers with the live
kernels (one forward per sequence, stopped after the deepest cached layer), on the evaluation backend and dtype
through the forward to the logits, which it also compares with the cached teacher-forced argmax entry (every layer
and the head, at the real lengths), and there it makes again the cached decode steps of the sequence (the references
stage's ``decode`` entry, made beside the features of two sequences every later witness takes: :meth:`Witness.
decode_plan`): single-token steps with the model's cache right after the prompt of the shortest sequence and at the
end of the longest, every layer's decode path at the shortest and the longest cache, which no prefill runs; it
compares exactly where the backend is deterministic (every backend on a CPU, run with the torch thread count the
cached entries were made with: the torch-recurrent rule's last bits depend on it), within
:func:`reproducibility_bound` elsewhere (measured across clean re-runs: docs/gpu-drift.md). Nothing cached, nothing
to compare: a cold run produces everything with the live kernels anyway.

A mismatch names the side, the prompt, the layer (or the logits) and the first position where the live target
differs (with the relative error); then nothing the kernels of that dtype made is used as cached: another *witness
token* goes into the key of every entry computed in that dtype (:func:`dflash_eval.target.provenance.
platform_fields`): the completions, the teacher-forced argmax, the features of every side, the fingerprint and
everything computed from them (τ, the drift budget, the online loop), so each is made again with the live kernels, as
a cold run makes it. The new token is an earlier one whose entries the live kernels reproduce (witnessed the same
way: kernels that went back to what they were), else a digest of the live features (the same in every xdist worker,
which witness under one file lock). Under ``--cache-only`` the mismatch is an error instead. The token of each dtype
is remembered in the cache (:class:`~dflash_eval.inputs.kernel_verdict.KernelVerdict`), so the next run with the
same kernels uses what was made again without making it again.

Example::

    w = Witness(inputs, sequence=lambda pid: seq_or_none, lookup=lambda pid, seq, layer, side: cached_or_none)
    inputs.kernel_verdict.judge = w.verdict
    token = inputs.kernel_verdict.token(torch.float32)  # witnessed on the first call
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from dflash_eval.cache.requests import Request
from dflash_eval.errors import CacheError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.metrics.drift import Side
from dflash_eval.metrics.verdict import within_bound
from dflash_eval.references.server_check import teacher_forced_tensors
from dflash_eval.references.teacher_forced import (
    DECODE_STEPS,
    argmax_request,
    decode_forward,
    decode_request,
    teacher_forced_forward,
)
from dflash_eval.target.backends import use_backend
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.kernel_probe import bucket, tensor_digest
from dflash_eval.target.kernel_registry import KernelOutputChanged

__all__ = ["Witness", "WitnessCheck", "WitnessMismatch", "reproducibility_bound", "WITNESS_SEED"]

WITNESS_SEED = "dflash-eval witness"
#: The name the fingerprint text goes by among the witness's sequences (the feature store's own item name).
FINGERPRINT = "fingerprint"
#: stages a witness may run into that the run pays anyway, timed apart (not counted as the witness's seconds)
APART = ("kernel_probe", "tokenize", "target_hash")
#: relative L2 error between two clean extractions of the same sequence on a GPU (per dtype), above which the
#: witness calls a difference a mismatch; measured across clean re-runs (docs/gpu-drift.md, "The witness")
GPU_BOUND = {"torch.float32": 1e-5, "torch.float16": 1e-3, "torch.bfloat16": 1e-2}

Lookup = Callable[[str, list[int], int, Side], tuple[Tensor, int | None] | None]


def reproducibility_bound(side: Side, device: torch.device | str) -> float:
    """How far two clean extractions may differ: 0 (bit for bit) on a CPU, :data:`GPU_BOUND` of the dtype
    elsewhere."""
    if torch.device(device).type == "cpu":
        return 0.0
    return GPU_BOUND.get(str(side.dtype), 1e-2)


@dataclass
class WitnessMismatch:
    """Where the live target first differs from the cache: a layer's features, or (``what`` ``logits``, ``layer``
    the layer count) the teacher-forced argmax entry's best logits."""

    side: str
    prompt: str
    layer: int
    position: int
    tokens: int
    rel_err: float
    max_abs: float
    bound: float
    what: str = "features"

    def describe(self) -> str:
        how = "bit for bit" if self.bound == 0 else f"beyond the reproducibility bound {self.bound:.0e}"
        if self.what == "decode":
            return (f"witness: the live target's decode steps of prompt {self.prompt!r} ({self.side}) differ from the "
                    f"cached ones {how}: first at the step that reads position {self.position} of {self.tokens} "
                    f"(best logits rel_err {self.rel_err:.3e}, max |diff| {self.max_abs:.3e})")
        if self.what == "logits":
            return (f"witness: the live target's teacher-forced logits of prompt {self.prompt!r} ({self.side}) differ "
                    f"from the cached ones {how}: first at position {self.position} of {self.tokens} (best logits "
                    f"rel_err {self.rel_err:.3e}, max |diff| {self.max_abs:.3e})")
        return (f"witness: the live target's features of prompt {self.prompt!r} ({self.side}) differ from the cached "
                f"ones {how}: target layer {self.layer}, first at position {self.position} of {self.tokens} "
                f"(layer rel_err {self.rel_err:.3e}, max |diff| {self.max_abs:.3e})")


@dataclass
class WitnessCheck:
    """One side's witness in this process."""

    side: str
    prompts: list[str]
    layers: list[int]
    seconds: float  # the witnessed prompts' forwards and comparisons
    token: str
    mismatches: list[WitnessMismatch] = field(default_factory=list)
    skipped: str | None = None
    decoded: list[str] = field(default_factory=list)  # prompts whose cached decode steps were made again
    load_seconds: float = 0.0  # the target (in the side's dtype) loaded for the witness, when it was not yet
    total_seconds: float = 0.0  # the whole witness of the side: the cache reads, the registry and lock too

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for k in ("seconds", "load_seconds", "total_seconds"):
            out[k] = round(out[k], 6)
        return out


def _first_difference(live: Tensor, cached: Tensor, bound: float) -> tuple[int, float, float] | None:
    """(first position, relative L2 error, max |diff|) where ``live`` differs from ``cached`` ([T, H]), None when
    equal (bit for bit with ``bound`` 0, else within it)."""
    if live.shape != cached.shape:
        return 0, float("inf"), float("inf")
    a, b = live.detach().double().cpu(), cached.detach().double().cpu()
    diff = a - b
    rel = float(diff.norm() / b.norm().clamp_min(1e-30))
    if bound == 0.0:
        if torch.equal(live.detach().cpu(), cached.detach().cpu()):
            return None
        rows = (live.detach().cpu() != cached.detach().cpu()).any(dim=-1)
    else:
        if within_bound(rel, bound):
            return None
        rows = diff.norm(dim=-1) > bound * b.norm(dim=-1).clamp_min(1e-30)
    pos = int(rows.nonzero()[0, 0]) if bool(rows.any()) else 0
    return pos, rel, float(diff.abs().max())


def _extract(model: torch.nn.Module, seq: list[int], layers: tuple[int, ...], side: Side, device: torch.device | str,
             threads: int | None, logits: bool = False) -> tuple[dict[int, Tensor], Tensor | None]:
    """The live features of ``seq`` (and with ``logits`` the [T, V] logits, through the forward every teacher-forced
    argmax entry is made by); on a CPU with ``threads`` torch threads, those the cached ones were made with (a CPU's
    reductions may split by the thread count: the torch-recurrent rule's last bits do)."""
    saved = torch.get_num_threads()
    if threads and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
    try:
        with use_backend(side.backend, device), torch.no_grad():
            if logits:
                return teacher_forced_forward(model, seq, device, layers)
            return layer_features(model, torch.tensor(seq, dtype=torch.long), list(layers)), None
    finally:
        torch.set_num_threads(saved)


def _decode(model: torch.nn.Module, seq: list[int], starts: tuple[int, ...], side: Side,
            device: torch.device | str, threads: int | None) -> Tensor:
    """The live logits of the decode steps of ``seq`` from ``starts`` (:func:`~dflash_eval.references.
    teacher_forced.decode_forward`), on a CPU with the torch thread count the cached entry was made with."""
    saved = torch.get_num_threads()
    if threads and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
    try:
        with use_backend(side.backend, device):
            return decode_forward(model, seq, starts, device)
    finally:
        torch.set_num_threads(saved)


def _argmax_difference(live: dict[str, Tensor], cached: dict[str, Tensor],
                       bound: float) -> tuple[int, float, float] | None:
    """(first position, relative L2 error of the best logits, max |diff|) where the live teacher-forced entry differs
    from the cached one (bit for bit, best ids and logits, with ``bound`` 0; else its best logits beyond it), None
    when equal."""
    a, b = live["top_logits"].detach().cpu(), cached["top_logits"].detach().cpu()
    ids_a, ids_b = live["top_ids"].detach().cpu(), cached["top_ids"].detach().cpu()
    if a.shape != b.shape or ids_a.shape != ids_b.shape:
        return 0, float("inf"), float("inf")
    diff = a.double() - b.double()
    rel = float(diff.norm() / b.double().norm().clamp_min(1e-30))
    if bound == 0.0:
        rows = (a != b).any(dim=-1) | (ids_a != ids_b).any(dim=-1)
    else:
        if within_bound(rel, bound):
            return None
        rows = diff.norm(dim=-1) > bound * b.double().norm(dim=-1).clamp_min(1e-30)
    if not bool(rows.any()):
        return None
    return int(rows.nonzero()[0, 0]), rel, float(diff.abs().max())


class Witness:
    """The witness of one process (module docstring), the judge of the run's verdict on its kernels
    (:meth:`verdict`). ``sequence``: a prompt's prompt + reference completion ids when they are known without
    producing anything (None otherwise), under the witness token in effect; ``lookup``: the cached feature of (prompt,
    sequence, layer, side) under the token in effect and the torch thread count it was extracted with, None when not
    cached."""

    def __init__(self, inputs: Inputs, sequence: Callable[[str], list[int] | None], lookup: Lookup,
                 prompt_length: Callable[[str], int | None] = lambda pid: None) -> None:
        self.inputs, self.sequence, self.lookup, self.prompt_length = inputs, sequence, lookup, prompt_length
        self.checks: dict[str, WitnessCheck] = {}
        self._live: dict[str, str] = {}  # side/prompt -> digest of its live witnessed features (the last check)

    # ------------------------------------------------------------------------------------ the verdict
    def verdict(self, dtype: torch.dtype) -> str:
        """The token of ``dtype``'s kernels in this process (:mod:`dflash_eval.inputs.kernel_verdict`): every side
        of that dtype the run reads (:attr:`Inputs.sides`) witnessed under the current token; on a mismatch an
        earlier token whose entries the live kernels reproduce, else a new one, said by name once
        (:class:`KernelOutputChanged`), or under ``--cache-only`` a CacheError."""
        inp = self.inputs
        s, kv = inp.settings, inp.kernel_verdict
        sides = [side for side in inp.sides if side.dtype == dtype]
        if s.witness_prompts <= 0 or not sides:
            return kv.current(dtype)
        if dtype != s.torch_dtype:
            kv.token(s.torch_dtype)  # the witnessed sequences hold the completions, made in the evaluation dtype
        t0, apart0 = time.perf_counter(), self._apart()
        with inp.meter.timed("witness"), kv.lock(dtype):
            was = kv.current(dtype)
            checks = self._witness(dtype, sides, was)
            first = next((m for c in checks for m in c.mismatches), None)
            token, earlier = was, None
            if first is not None:
                if inp.cache.cache_only:
                    name = str(dtype).removeprefix("torch.")
                    raise CacheError(f"{first.describe()}; --cache-only forbids making again what the {name} kernels "
                                     f"made (the features of {first.side}, the completions, the teacher-forced "
                                     "argmax, ...): run once without --cache-only to make them with the live kernels, "
                                     "or restore the kernels they were made with")
                live = dict(self._live)
                earlier = self._earlier(dtype, sides, was)
                token = earlier if earlier is not None else \
                    hashlib.sha256(json.dumps(sorted(live.items())).encode()).hexdigest()[:16]
            if (first is not None or any(c.prompts for c in checks)) and not inp.cache.cache_only:
                kv.record(dtype, token)
        # the lock, the registry, the sequences' lookup; what the run pays anyway is timed apart (:data:`APART`), and
        # left out of the witness's own stage time too (it ran inside it: the first keys of the run are the witness's)
        apart = self._apart() - apart0
        inp.meter.timings["witness"] -= apart
        checks[0].total_seconds += time.perf_counter() - t0 - sum(c.total_seconds for c in checks) - apart
        for c in checks:
            c.token = token
            self.checks[c.side] = c
        if first is not None:
            self._report(dtype, was, token, first, earlier is not None)
        return token

    def _witness(self, dtype: torch.dtype, sides: list[Side], token: str) -> list[WitnessCheck]:
        """Every side of ``sides`` witnessed under ``token``: their sequences, features and argmax entries those
        cached under it."""
        layers = tuple(range(self.inputs.target_dir.num_layers))  # whatever is cached: the forward stops after it
        self._live = {}
        with self.inputs.kernel_verdict.trying(dtype, token):
            order = self._order()
            plan = self.decode_plan(order)
            return [self._check(side, layers, token, self.inputs.settings.witness_prompts, order, plan)
                    for side in sides]

    def _earlier(self, dtype: torch.dtype, sides: list[Side], was: str) -> str | None:
        """The most recent earlier token whose cached entries the live kernels reproduce (something compared, nothing
        differs): kernels that went back to what they were."""
        for token in self.inputs.kernel_verdict.earlier(dtype):
            if token == was:
                continue
            checks = self._witness(dtype, sides, token)
            if any(c.prompts for c in checks) and not any(c.mismatches for c in checks):
                return token
        return None

    def _report(self, dtype: torch.dtype, was: str, token: str, first: WitnessMismatch, reused: bool) -> None:
        """Say once, by name, what the witness saw and what the run does about it (a :class:`KernelOutputChanged`
        warning, the run's log, eval.json's ``provenance.kernel_probe.changed``)."""
        inp = self.inputs
        what = str(dtype).removeprefix("torch.")
        done = ("the live kernels reproduce the entries cached under an earlier token: those are used" if reused else
                "they are made again with the live kernels")
        msg = (f"{first.describe()}: the kernels compute something the kernel probe did not see; nothing the "
               f"{what} kernels made is used as cached (completions, teacher-forced argmax, features and what is "
               f"computed from them: τ, the drift budget): {done} (witness token {was or 'none'} -> "
               f"{token or 'none'})")
        warnings.warn(KernelOutputChanged(msg), stacklevel=5)
        inp.log(msg)
        side = next(x for x in inp.sides if x.label == first.side)
        inp.kernel_probes.changes.append({  # said at the end of the run and in eval.md with the probes' changes
            "label": first.side, "backend": side.backend, "dtype": what, "was": was, "now": token,
            "kernels": ["witness"], "first": "witness", "kinds": ["witness"], "what": "entries", "message": msg,
            "witness": asdict(first)})

    # ------------------------------------------------------------------------------------ one side
    def _check(self, side: Side, layers: tuple[int, ...], token: str, n: int,
               order: list[tuple[str, list[int], bool]], plan: dict[str, tuple[int, ...]]) -> WitnessCheck:
        """Extract the sample's features (of the sequences in ``order``: :meth:`_order`) with the live kernels and
        compare them with the cached ones; on the evaluation backend and dtype through the forward to the logits,
        compared with the cached teacher-forced argmax entry too (every layer and the head, at the run's real
        lengths), and the cached decode steps of the prompts of ``plan`` (:meth:`decode_plan`) made again."""
        inp, s = self.inputs, self.inputs.settings
        check = WitnessCheck(side.label, [], [], 0.0, token)
        t_side, apart0 = time.perf_counter(), self._apart()
        bound = reproducibility_bound(side, s.torch_device)
        with_argmax = side.backend == s.eval_backend and side.dtype == s.torch_dtype
        sample = 0
        for pid, seq, extreme in order:
            if not extreme and sample >= n:
                break
            found = {i: t for i in layers if (t := self.lookup(pid, seq, i, side)) is not None}
            argmax = self._cached(argmax_request(inp, pid, seq)) if with_argmax and pid != FINGERPRINT else None
            if not found and argmax is None:
                continue  # not cached: produced with the live kernels
            cached = {i: t[0] for i, t in found.items()}
            threads = next((t[1] for t in found.values() if t[1] is not None), None)
            if threads is None and argmax is not None:
                threads = argmax[1]
            sample += not extreme
            check.prompts.append(pid)
            check.layers = sorted(set(check.layers) | set(cached))
            t0 = time.perf_counter()
            model = inp.model_for(side.dtype)
            t1 = time.perf_counter()
            check.load_seconds += t1 - t0
            live, logits = _extract(model, seq, tuple(cached), side, s.torch_device, threads, argmax is not None)
            inp.meter.counts["witness_prompts"] += 1
            self._live[f"{side.label}/{pid}"] = tensor_digest({**{str(i): live[i] for i in cached},
                                                               **({"logits": logits} if logits is not None else {})})
            for i in cached:
                diff = _first_difference(live[i], cached[i], bound)
                if diff is not None:
                    check.mismatches.append(WitnessMismatch(side.label, pid, i, diff[0], len(seq), diff[1], diff[2],
                                                            bound))
                    break
            if argmax is not None and logits is not None and not any(m.prompt == pid for m in check.mismatches):
                diff = _argmax_difference(teacher_forced_tensors(logits), argmax[0], bound)
                if diff is not None:
                    check.mismatches.append(WitnessMismatch(side.label, pid, inp.target_dir.num_layers, diff[0],
                                                            len(seq), diff[1], diff[2], bound, what="logits"))
            starts = plan.get(pid) if with_argmax else None
            decode = self._cached(decode_request(inp, pid, seq, starts)) if starts is not None else None
            if starts is not None and decode is not None and not any(m.prompt == pid for m in check.mismatches):
                live_steps = _decode(model, seq, starts, side, s.torch_device, decode[1])
                diff = _argmax_difference(teacher_forced_tensors(live_steps), decode[0], bound)
                check.decoded.append(pid)
                if diff is not None:
                    at = [p for st in starts for p in range(st, min(st + DECODE_STEPS, len(seq)))][diff[0]]
                    check.mismatches.append(WitnessMismatch(side.label, pid, inp.target_dir.num_layers, at,
                                                            len(seq), diff[1], diff[2], bound, what="decode"))
            check.seconds += time.perf_counter() - t1
        if not check.prompts:
            check.skipped = "no prompt of the selection has these features cached (a cold run: nothing to compare)"
        check.total_seconds = time.perf_counter() - t_side - (self._apart() - apart0)
        return check

    def _apart(self) -> float:
        """The seconds this process spent so far in the stages :data:`APART`."""
        return sum(self.inputs.meter.timings.get(k, 0.0) for k in APART)

    def _cached(self, req: Request) -> tuple[dict[str, Tensor], int | None] | None:
        """The tensors of the cached entry of ``req`` (a teacher-forced argmax or decode entry, under the token in
        effect) and the torch thread count it was made with (None when not recorded); None when not cached."""
        if not self.inputs.cache.exists(req.kind, req.key):
            return None
        e = self.inputs.cache.lookup(req, count=False)
        if e is None:
            return None
        threads = e.meta.get("torch_threads")
        return dict(e.tensors), threads if isinstance(threads, int) else None

    def decode_plan(self, order: list[tuple[str, list[int], bool]] | None = None) -> dict[str, tuple[int, ...]]:
        """Which prompts' decode entries a run makes beside their features on the evaluation side, and where their
        single-token steps start: right after the prompt of the shortest known sequence (the first decode steps over
        the shortest KV cache) and :data:`~dflash_eval.references.teacher_forced.DECODE_STEPS` before the end of the
        longest (the last steps over the longest); two sequences a later witness always takes (the extremes of
        ``order``, by default :meth:`_order`). Empty without a witness."""
        if self.inputs.settings.witness_prompts <= 0:
            return {}
        known = [(len(seq), pid) for pid, seq, extreme in (self._order() if order is None else order)
                 if extreme and pid != FINGERPRINT]
        if not known:
            return {}
        (_, short), (n_long, long) = min(known), max(known)
        first = self.prompt_length(short)
        plan: dict[str, set[int]] = {}
        if first is not None:
            plan.setdefault(short, set()).add(first)
        last = self.prompt_length(long)
        if last is not None:
            plan.setdefault(long, set()).add(max(last, n_long - DECODE_STEPS))
        return {pid: tuple(sorted(starts)) for pid, starts in plan.items()}

    def _order(self) -> list[tuple[str, list[int], bool]]:
        """(name, sequence, is an extreme) of the sequences the witness may take, in order: the fingerprint text, the
        shortest and the longest known sequence of each length bucket, then the other prompts in the seeded order."""
        known = {p.id: seq for p in self.inputs.prompts if (seq := self.sequence(p.id)) is not None}
        by_bucket: dict[int, list[str]] = {}
        for pid, seq in known.items():
            by_bucket.setdefault(bucket(len(seq)), []).append(pid)
        extremes: list[str] = []
        for b in sorted(by_bucket):
            ids = sorted(by_bucket[b], key=lambda p: (len(known[p]), p))
            extremes += [ids[0]] + ([ids[-1]] if len(ids) > 1 else [])
        order = sorted(known)
        random.Random(WITNESS_SEED).shuffle(order)
        out = [(pid, known[pid], True) for pid in extremes]
        fingerprint = self.sequence(FINGERPRINT)
        if fingerprint is not None:
            out.insert(0, (FINGERPRINT, fingerprint, True))
        return out + [(pid, known[pid], False) for pid in order if pid not in extremes]

    def to_json(self) -> dict[str, Any]:
        """eval.json's ``provenance.witness``."""
        return {"prompts": self.inputs.settings.witness_prompts,
                "seconds": round(sum(c.total_seconds for c in self.checks.values()), 6),
                "checks": [c.to_json() for c in self.checks.values()]}
