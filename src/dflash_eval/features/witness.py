"""The witness: every run, warm ones too, re-extracts a seeded sample of its real prompts through the live target and
compares them with the cached features before any of them is used.

The kernel probe (:mod:`dflash_eval.target.kernel_probe`) runs the target's code on seeded inputs at both ends of
each length bucket; the witness runs the real target on real data, at the lengths the run really uses. For each side
(backend, dtype) whose features a process reads, the first time it reads them, it takes the sequences whose features
of the asked layers are cached among: the fingerprint text (:data:`dflash_eval.features.feature_store.
FINGERPRINT_TEXT`, on the side it is extracted on), the shortest and the longest sequence (prompt + reference
completion) of the selection in each length bucket (:func:`dflash_eval.target.kernel_probe.bucket`), and
``--witness-prompts`` more prompts of the selection in a seeded order; it extracts those layers with the live kernels
(one forward per sequence, stopped after the deepest of them: the deepest layer the drafter reads) and compares them
with the cache:
exactly where the backend is deterministic (every backend on a CPU, run with the torch thread count the cached
features were extracted with: the torch-recurrent rule's last bits depend on it), within
:func:`reproducibility_bound` elsewhere (measured across clean re-runs: docs/gpu-drift.md). Nothing cached, nothing
to compare: a cold run produces its features with the live kernels anyway.

A mismatch names the side, the prompt, the layer and the first position where the features differ (with the layer's
relative error); the features of that side are then not used: a new *witness token* (a digest of the live witnessed
features) goes into every feature key of the side, so they are all extracted again with the live kernels, and so is
everything keyed by them (τ, the drift budget, the fingerprint). Under ``--cache-only`` the mismatch is an error
instead. The token of each side is remembered in ``<cache>/v1/witness/<context>.json`` (context = target, backend,
dtype, device kind, library versions) with the digests it was minted for, so the next run with the same kernels
uses the re-extracted features without extracting them again, and a run whose kernels went back to what an earlier
token was minted for goes back to that token's features. Under xdist the workers witness under one file lock and
mint the same token from the same live features.

Example::

    w = Witness(inputs, sequence=lambda pid: seq_or_none, lookup=lambda pid, seq, layer, side, token: tensor_or_none)
    token = w.token(Side("torch", torch.float32), (1, 3, 5))
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash_eval.cache.keys import cache_key
from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.errors import CacheError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.metrics.drift import Side
from dflash_eval.target.backends import use_backend
from dflash_eval.target.hidden_states import layer_features
from dflash_eval.target.kernel_probe import bucket, tensor_digest
from dflash_eval.target.kernel_registry import KernelOutputChanged
from dflash_eval.target.provenance import platform_fields

__all__ = ["Witness", "WitnessCheck", "WitnessMismatch", "reproducibility_bound", "WITNESS_SEED"]

WITNESS_SEED = "dflash-eval witness"
#: The name the fingerprint text goes by among the witness's sequences (the feature store's own item name).
FINGERPRINT = "fingerprint"
#: relative L2 error between two clean extractions of the same sequence on a GPU (per dtype), above which the
#: witness calls a difference a mismatch; measured across clean re-runs (docs/gpu-drift.md, "The witness")
GPU_BOUND = {"torch.float32": 1e-5, "torch.float16": 1e-3, "torch.bfloat16": 1e-2}

Lookup = Callable[[str, list[int], int, Side, str], tuple[Tensor, int | None] | None]


def reproducibility_bound(side: Side, device: torch.device | str) -> float:
    """How far two clean extractions may differ: 0 (bit for bit) on a CPU, :data:`GPU_BOUND` of the dtype
    elsewhere."""
    if torch.device(device).type == "cpu":
        return 0.0
    return GPU_BOUND.get(str(side.dtype), 1e-2)


@dataclass
class WitnessMismatch:
    """Where live features first differ from the cached ones."""

    side: str
    prompt: str
    layer: int
    position: int
    tokens: int
    rel_err: float
    max_abs: float
    bound: float

    def describe(self) -> str:
        how = "bit for bit" if self.bound == 0 else f"beyond the reproducibility bound {self.bound:.0e}"
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
        if rel <= bound:
            return None
        rows = diff.norm(dim=-1) > bound * b.norm(dim=-1).clamp_min(1e-30)
    pos = int(rows.nonzero()[0, 0]) if bool(rows.any()) else 0
    return pos, rel, float(diff.abs().max())


def _extract(model: torch.nn.Module, seq: list[int], layers: list[int], side: Side, device: torch.device | str,
             threads: int | None) -> dict[int, Tensor]:
    """The live features of ``seq``; on a CPU with ``threads`` torch threads, those the cached ones were extracted
    with (a CPU's reductions may split by the thread count: the torch-recurrent rule's last bits do)."""
    saved = torch.get_num_threads()
    if threads and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
    try:
        with use_backend(side.backend, device), torch.no_grad():
            return layer_features(model, torch.tensor(seq, dtype=torch.long), layers)
    finally:
        torch.set_num_threads(saved)


class Witness:
    """The witness of one process (module docstring). ``sequence``: a prompt's prompt + reference completion ids
    when they are known without producing anything (None otherwise); ``lookup``: the cached feature of (prompt,
    sequence, layer, side, witness token), None when not cached."""

    def __init__(self, inputs: Inputs, sequence: Callable[[str], list[int] | None], lookup: Lookup) -> None:
        self.inputs, self.sequence, self.lookup = inputs, sequence, lookup
        self.checks: dict[str, WitnessCheck] = {}
        self._tokens: dict[str, str] = {}
        self._state: dict[str, str] = {}  # prompt -> digest of its witnessed cached features (the last check)
        self._live: dict[str, str] = {}  # prompt -> digest of its witnessed live features (the last check)

    # ------------------------------------------------------------------------------------ registry
    def _context(self, side: Side) -> str:
        inp, s = self.inputs, self.inputs.settings
        return cache_key("witness", {"target": inp.target_identity, "backend": side.backend,
                                     **platform_fields(side.dtype, s.torch_device)})

    def _path(self, side: Side) -> Path:
        return self.inputs.cache.base / "witness" / f"{self._context(side)[:32]}.json"

    def _read(self, side: Side) -> dict[str, Any]:
        try:
            data = json.loads(self._path(side).read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict) or not isinstance(data.get("states"), dict):
            data = {"current": "", "states": {}}
        return data

    def _write(self, side: Side, data: dict[str, Any]) -> None:
        path = self._path(side)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            raise CacheError(f"cannot record the witness token in {path} ({exc}): is the cache directory "
                             f"{self.inputs.cache.root} writable?") from exc

    # ------------------------------------------------------------------------------------ the witness
    def known(self, side: Side) -> str | None:
        """The side's token when this process witnessed it already."""
        return self._tokens.get(side.label)

    def token(self, side: Side, layers: tuple[int, ...]) -> str:
        """The witness token of ``side`` (empty: the features as first cached), witnessing it on the first call of
        this process (``layers``: the layers to compare, those of the first read)."""
        if side.label in self._tokens:
            return self._tokens[side.label]
        inp = self.inputs
        n = inp.settings.witness_prompts
        if n <= 0:
            self._tokens[side.label] = self._read(side).get("current", "") or ""
            return self._tokens[side.label]
        t0 = time.perf_counter()
        lock = nullcontext() if inp.cache.cache_only else inp.cache.locked("witness-" + self._context(side)[:24])
        with inp.meter.timed("witness"), lock:  # --cache-only writes nothing: no lock (the cache may be read-only)
            data = self._read(side)
            token = str(data.get("current") or "")
            check = self._check(side, tuple(sorted(set(layers))), token, n)
            if check.mismatches:
                token = self._mint(side, data, check)
            elif check.prompts and not inp.cache.cache_only:
                data["states"].setdefault(token, {}).update(self._state)
                data["current"] = token
                self._write(side, data)
        check.total_seconds, check.token = time.perf_counter() - t0, token
        self.checks[side.label] = check
        self._tokens[side.label] = token
        return token

    def _check(self, side: Side, layers: tuple[int, ...], token: str, n: int) -> WitnessCheck:
        """Extract the sample's features with the live kernels and compare them with the cached ones."""
        inp = self.inputs
        self._state, self._live = {}, {}
        check = WitnessCheck(side.label, [], [], 0.0, token)
        if not layers:
            check.skipped = "no layers asked"
            return check
        bound = reproducibility_bound(side, inp.settings.torch_device)
        sample = 0
        for pid, seq, extreme in self._order():
            if not extreme and sample >= n:
                break
            found = {i: t for i in layers if (t := self.lookup(pid, seq, i, side, token)) is not None}
            if not found:
                continue  # not cached: produced with the live kernels
            cached = {i: t[0] for i, t in found.items()}
            threads = next((t[1] for t in found.values() if t[1] is not None), None)
            sample += not extreme
            check.prompts.append(pid)
            check.layers = sorted(set(check.layers) | set(cached))
            t0 = time.perf_counter()
            model = inp.model_for(side.dtype)
            t1 = time.perf_counter()
            check.load_seconds += t1 - t0
            live = _extract(model, seq, list(cached), side, inp.settings.torch_device, threads)
            inp.meter.counts["witness_prompts"] += 1
            self._state[pid] = tensor_digest({str(i): t for i, t in cached.items()})
            self._live[pid] = tensor_digest({str(i): live[i] for i in cached})
            for i in cached:
                diff = _first_difference(live[i], cached[i], bound)
                if diff is not None:
                    check.mismatches.append(WitnessMismatch(side.label, pid, i, diff[0], len(seq), diff[1], diff[2],
                                                            bound))
                    break
            check.seconds += time.perf_counter() - t1
        if not check.prompts:
            check.skipped = "no prompt of the selection has these features cached (a cold run: nothing to compare)"
        return check

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

    def _mint(self, side: Side, data: dict[str, Any], check: WitnessCheck) -> str:
        """The token for the live kernels' features after a mismatch: an earlier token minted for exactly these
        live features, else a new one (a digest of them, the same in every worker); CacheError under --cache-only."""
        inp = self.inputs
        first = check.mismatches[0].describe()
        if inp.cache.cache_only:
            raise CacheError(f"{first}; --cache-only forbids re-extracting the features of {side.label}: run once "
                             "without --cache-only to extract them with the live kernels, or restore the kernels "
                             "they were extracted with")
        was = str(data.get("current") or "")
        data["states"].setdefault(was, {}).update(self._state)  # what the features under the old token hold
        token = next((t for t, st in data["states"].items()
                      if st and all(st.get(p) == d for p, d in self._live.items())), None)
        if token is None:
            token = hashlib.sha256(json.dumps(sorted(self._live.items())).encode()).hexdigest()[:16]
            data["states"][token] = dict(self._live)
        data["current"] = token
        self._write(side, data)
        msg = (f"{first}: the kernels compute something the kernel probe did not see; the cached features of "
               f"{side.label} are not used: they are re-extracted with the live kernels (witness token "
               f"{was or 'none'} -> {token or 'none'})")
        warnings.warn(KernelOutputChanged(msg), stacklevel=4)
        inp.log(msg)
        m = check.mismatches[0]
        inp.kernel_probes.changes.append({  # said at the end of the run and in eval.md with the probes' changes
            "label": side.label, "backend": side.backend, "dtype": str(side.dtype).removeprefix("torch."),
            "was": was, "now": token, "kernels": ["witness"], "first": "witness", "kinds": ["witness"],
            "what": "features", "message": msg, "witness": asdict(m)})
        return token

    def to_json(self) -> dict[str, Any]:
        """eval.json's ``provenance.witness``."""
        return {"prompts": self.inputs.settings.witness_prompts,
                "seconds": round(sum(c.total_seconds for c in self.checks.values()), 6),
                "checks": [c.to_json() for c in self.checks.values()]}
