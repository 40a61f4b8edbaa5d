"""Kernel probe: the digest of what the target's forward computes, so that cached features and completions follow
kernel behaviour.

Cache keys name the backend and the library versions, which say nothing about a kernel patched or rebuilt in place,
a new Triton or driver under the same fla version, or a wheel installed by hand. The probe runs, in this process,
the target's own transformers classes through the very call path a run takes, on seeded inputs, and hashes the exact
bytes of everything they output:

- **The model it runs.** The target's causal LM class built from its config.json with one decoder layer per layer
  type (a Gated DeltaNet target: one ``linear_attention`` and one ``full_attention`` layer, each with the target's
  widths, heads, convolution and MLP), the final norm and a small vocabulary (:data:`PROBE_VOCAB`: the embedding and
  lm_head are the only shapes that are not the target's), seeded random weights from the class's own initialisation,
  in the run's dtype, on its device, with the attention implementation the target loads with. Every function the
  layers call is the one the target's forward would call now: module globals of the modeling module (the delta
  rules, ``causal_conv1d_fn`` / ``causal_conv1d_update``) as :func:`dflash_eval.target.backends.use_backend` sets them
  for the backend, classes' ``forward`` (the gated RMSNorm, the norms, the MLP), the attention interface, torch's
  own functions: a kernel patched from outside the project (a module global, a class's method, a function of torch
  or fla) is what the probe runs.
- **What it runs.** A :class:`ProbeShape`: the lengths a sequence of one bucket can have, from the bucket's lowest
  length (:attr:`ProbeShape.low`: one token in the first bucket, one chunk or less; half the bucket plus one above
  it) to its highest plus ``TAIL`` (:attr:`ProbeShape.length`): kernels choose code paths by length (a single chunk
  against many, a padded last chunk, split counts chosen from the KV length), and a fault that shows only on shorter
  or only on longer inputs of a bucket shows at one of its ends. The *extraction* probe runs one unpadded sequence of
  each end, each twice: without the model's cache (as features are extracted) and with it (as the forward that also
  gives the teacher-forced argmax runs). The *generation* probe runs :func:`dflash_eval.target.generation.
  greedy_generate_batch`, the references stage's own function, four times for a few decode steps each: the run's
  batch (``rows``: ``--generation-batch``) of left-padded prompts from the bucket's lowest length up to one chunk
  longer (``batch:``); two left-padded prompts spread over the bucket, the longer at its top (``long:``); one prompt
  of the bucket's lowest length, decoding at the shortest KV cache the bucket starts from (``short:``); and one
  prompt decoding at the longest KV cache the run reaches (``long-kv:``: a prompt of the bucket's top plus
  ``new_tokens`` - 2, so its last step attends over ``length + new_tokens`` keys). That is the chunked prefill with
  padding, decode steps through ``causal_conv1d_update``, the recurrent delta rule and attention at the cache
  lengths the run decodes from and to, at batch 1 and the run's batch, without running all ``new_tokens`` steps (on
  a CPU the run's batch of full-length prompts would cost seconds of a warm run). Sequence lengths are bucketed
  (:func:`bucket`: the next power of two, at least :data:`MIN_BUCKET`): a cache entry is keyed by the probe of its
  own bucket, so a fault changes the key of the entries of the buckets where it shows, and a run on another
  selection of prompts reuses every entry of the same bucket. What it cannot see: a fault confined to lengths
  strictly inside a bucket (neither end), or to decode steps strictly between the first and the last; the witness
  (:mod:`dflash_eval.features.witness`) re-extracts the run's shortest and longest real sequence of each bucket and
  the fingerprint text for that.
- **What it hashes.** Every output of every submodule (forward hooks: ``linear_attention.linear_attn.norm``,
  ``full_attention.self_attn.q_proj``, ``embed_tokens``, ``lm_head``, ...), every call of the modeling module's
  kernel functions (``linear_attention.torch_chunk_gated_delta_rule``, ``linear_attention.causal_conv1d_fn``, ...),
  the attention function's output (the input of ``o_proj``: ``full_attention.attention``) and the generated ids,
  each a :class:`KernelDigest` in the order of its first call; the calls of each regime are named apart
  (``short:...`` for the bucket's lowest length, ``batch:...`` / ``long:...`` / ``long-kv:...`` for the other
  generation runs), each
  decode step's calls too (``decode1:...``, ``decode2:...``), and so are the extraction probe's calls with the cache
  (``cached:...``).
  On a CPU the digests are sha256 over the exact bytes; on a GPU over an exact integer fold of them made on the
  device (:func:`fold`; small outputs staged as they are recorded and folded together, :class:`_Folds`), so nothing
  large is copied to the host and no Python loop runs over the data. The probe's digest is a sha256 over its
  kernels' digests.

An unchanged kernel gives the same digest bit for bit in every process (CPU probes run with one thread, so the
digest does not depend on ``--torch-threads`` or the xdist worker count). :class:`dflash_eval.target.kernel_registry.
KernelProbes` keeps one :class:`ProbeResult` per (backend, dtype, shape) of a run and the registry of the digests
cached entries were made with; a changed digest is explained by the first kernel, in call order, whose output moved.

Example::

    from dflash_eval.target.loader import TargetDir
    r = probe(TargetDir("fixtures/target"), "torch", torch.float32, "cpu", ProbeShape.for_sequence(300))
    print(r.digest[:12], r.shape.label, len(r.kernels), f"{r.seconds:.2f} s")
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from dflash_eval.common.heap import importing
from dflash_eval.errors import ConfigError
from dflash_eval.target.backends import split_backend, use_backend

# a name of its own: a test's stand-in for the references' generation (patched by name) is not what the probe runs
from dflash_eval.target.generation import greedy_generate_batch as references_generation
from dflash_eval.target.hidden_states import decoder_parts
from dflash_eval.target.kernel_cache import KEY_WAIT_S, hash_installation
from dflash_eval.target.loader import TargetDir, text_config

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = ["KernelDigest", "ProbeResult", "ProbeShape", "ProbeShapes", "KERNEL_KINDS", "probe", "modeling_module",
           "attention_implementation", "tensor_digest", "fold", "bucket", "bucket_floor", "probe_model", "PROBE_SEED",
           "MIN_BUCKET", "TAIL", "DECODE_STEPS", "PROBE_VOCAB"]

PROBE_SEED = 20240611
MIN_BUCKET = 512  # the shortest probe: every sequence up to 512 tokens shares one (the bundled prompts and more)
TAIL = 37  # probe length = bucket + TAIL: longer than every sequence of the bucket, last 64-token chunk padded
DECODE_STEPS = 2  # decode steps of each generation run of the probe (after the prefill's own token)
CHUNK = 64  # the chunked delta rule's chunk: the generation probe's batch of the run's size spans about one
PROBE_VOCAB = 512  # the probe model's vocabulary: embedding and lm_head are the only shapes not the target's
#: the modeling module's kernel functions the probe records (module global -> kind); those absent are skipped
FUNCTION_KINDS = {"torch_chunk_gated_delta_rule": "linear-attention",
                  "torch_recurrent_gated_delta_rule": "linear-attention", "causal_conv1d_fn": "conv1d",
                  "causal_conv1d_update": "conv1d", "torch_causal_conv1d_update": "conv1d",
                  "apply_mask_to_padding_states": "padding"}
#: every kind of kernel the probe names (what messages and eval.json's ``kinds`` say)
KERNEL_KINDS = ("linear-attention", "conv1d", "gated-norm", "norm", "attention", "matmul", "embedding", "rotary",
                "activation", "mlp", "padding", "layer", "model", "generation")


def bucket(n_tokens: int) -> int:
    """The probe bucket of a sequence of ``n_tokens``: the next power of two, at least :data:`MIN_BUCKET`."""
    n = max(int(n_tokens), 1)
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def bucket_floor(tokens: int) -> int:
    """The lowest length of the bucket ``tokens``: 1 for the first bucket, else half the bucket plus one."""
    return 1 if tokens <= MIN_BUCKET else tokens // 2 + 1


@dataclass(frozen=True)
class ProbeShape:
    """What one probe runs: the bucket ``tokens`` (the probe runs its lowest length :attr:`low` and its highest
    :attr:`length`), ``rows`` left-padded prompts (the run's generation batch) and ``new_tokens`` (the decode steps the
    run makes: the probe decodes at the first and at the last of their cache lengths; 0: the extraction probe)."""

    tokens: int
    rows: int = 1
    new_tokens: int = 0

    @classmethod
    def for_sequence(cls, n_tokens: int) -> ProbeShape:
        """The extraction probe of a sequence of ``n_tokens`` (features, the fingerprint, the teacher-forced
        argmax)."""
        return cls(bucket(n_tokens))

    @classmethod
    def for_generation(cls, prompt_tokens: int, batch: int, new_tokens: int) -> ProbeShape:
        """The generation probe of a prompt of ``prompt_tokens`` generated in batches of up to ``batch`` prompts for
        ``new_tokens`` steps."""
        if new_tokens < 1:
            raise ValueError(f"a generation probe needs at least one decode step, got {new_tokens}")
        return cls(bucket(prompt_tokens), max(1, int(batch)), int(new_tokens))

    @property
    def low(self) -> int:
        """The bucket's lowest length (:func:`bucket_floor`)."""
        return bucket_floor(self.tokens)

    @property
    def length(self) -> int:
        """Tokens of the probe's longest prompt or sequence: longer than every sequence of the bucket."""
        return self.tokens + TAIL

    @property
    def generation(self) -> bool:
        return self.new_tokens > 0

    @property
    def label(self) -> str:
        if not self.generation:
            return f"extraction of {self.low} and {self.length} tokens"
        return (f"generation of {self.rows} x {self.low}-{self.length} tokens, decoding at cache lengths "
                f"{self.low}-{self.length + self.new_tokens}")

    def to_json(self) -> dict[str, int]:
        return {"tokens": self.tokens, "rows": self.rows, "new_tokens": self.new_tokens, "low": self.low,
                "length": self.length}


# ------------------------------------------------------------------------------------------------ digests
def tensor_digest(tensors: dict[str, Tensor | None]) -> str:
    """sha256 over each tensor's name, dtype, shape and exact bytes (in name order; None is hashed as absent)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode() + b"\0")
        if t is None:
            h.update(b"none\0")
            continue
        t = t.detach().contiguous().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_MERSENNE = (1 << 61) - 1
_FOLD_P = 1_048_573  # a prime below 2**20: weights < 2**20, 16-bit halves < 2**16, products < 2**36
_FOLD_AB = ((40_503, 17), (65_521, 7_919), (1_000_003 % _FOLD_P, 104_729), (524_287, 1))
_FOLD_CHUNK = 1 << 23  # elements per partial sum: < 2**23 x 2**36 = 2**59, no int64 overflow
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int32}
_INT_MASK = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: 0xFFFFFFFF}
_BASE: dict[tuple[str, int], Tensor] = {}  # (device, size) -> the [4, size] fold weights of positions 0..size-1
_BASE_LOCK = threading.Lock()


def _fold_weights(n: int, device: torch.device) -> Tensor:
    """The fold's weights of positions 0..n-1 (n <= :data:`_FOLD_CHUNK`), [4, n] int64 on ``device``: made once per
    (device, power-of-two size) and sliced, so a fold is a few tensor operations and no Python loop over data."""
    size = max(1024, 1 << (max(n, 1) - 1).bit_length())
    key = (str(device), size)
    with _BASE_LOCK:
        w = _BASE.get(key)
        if w is None:
            idx = torch.arange(size, device=device, dtype=torch.int64)
            w = _BASE[key] = torch.stack([(idx * a + b) % _FOLD_P + 1 for a, b in _FOLD_AB])
    return w[:, :n]


def _words(t: Tensor) -> Tensor:
    """``t``'s bytes as one flat run of integers of its element size (8-, 16- or 32-bit; 8-byte elements as two
    32-bit words, bool as bytes): what :func:`fold` sums."""
    x = t.detach().contiguous().reshape(-1)
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    return x.view(_INT_VIEW[x.element_size()])


def fold(t: Tensor) -> Tensor:
    """An exact integer fingerprint of ``t``'s bytes, computed on ``t``'s device (integer sums: the same in any
    order, so the same on every run): four int64 sums of its elements' 16-bit halves, each weighted by fixed
    position-dependent weights in [1, 2**20), partial sums of at most 2**23 elements reduced modulo 2**61 - 1
    (nothing overflows). Changing one bit of one element changes the fold (the change of that half, below 2**16 in
    size, times its weight is non-zero and below the modulus); several changes cancel only by coincidence. One
    weighted reduction per 2**23 elements, the weights made once (:func:`_fold_weights`; a later chunk's are those
    of its first position shifted: ``(i a + b) mod p`` is linear in ``i``). The four sums of a chunk are one
    product and one reduction over rows (lo, hi, lo, hi), and elements of two bytes or less have no high half (its
    two sums are zero): a probe folds every output of every call, and each tensor operation is a kernel launch."""
    words = _words(t)
    size = words.element_size()
    out: Tensor | None = None
    for start in range(0, words.numel(), _FOLD_CHUNK):
        ints = words[start:start + _FOLD_CHUNK].to(torch.int64) & _INT_MASK[size]
        w = _fold_weights(ints.numel(), words.device)
        if start:
            shift = torch.tensor([(start * a) % _FOLD_P for a, _ in _FOLD_AB], device=words.device)[:, None]
            w = (w - 1 + shift) % _FOLD_P + 1
        if size <= 2:  # one 16-bit half: the hi rows' sums are zero
            lo = (ints * w[0::2]).sum(dim=1)
            sums = torch.stack((lo, torch.zeros_like(lo)), dim=1).reshape(4)
        else:
            halves = torch.stack((ints & 0xFFFF, ints >> 16))
            sums = (halves[_lo_hi_rows(words.device)] * w).sum(dim=1)
        sums = sums % _MERSENNE
        out = sums if out is None else (out + sums) % _MERSENNE
    return out if out is not None else torch.zeros(4, dtype=torch.int64, device=words.device)


_LO_HI_ROWS: dict[torch.device, Tensor] = {}  # device -> the row index (0, 1, 0, 1): lo, hi, lo, hi


def _lo_hi_rows(device: torch.device) -> Tensor:
    rows = _LO_HI_ROWS.get(device)
    if rows is None:
        rows = _LO_HI_ROWS[device] = torch.tensor([0, 1, 0, 1], device=device)
    return rows


def _tensors(out: Any) -> Iterator[Tensor | None]:
    """The tensors of a module's or function's output, in order (None where an output is absent)."""
    if out is None or isinstance(out, Tensor):
        yield out
    elif isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict of what is set
        for v in out.values():
            if v is None or isinstance(v, Tensor | tuple | list | dict):
                yield from _tensors(v)
    elif isinstance(out, tuple | list):
        for v in out:
            if v is None or isinstance(v, Tensor | tuple | list | dict):
                yield from _tensors(v)


class _Hasher:
    """sha256 of a CPU probe's outputs on a thread of its own. A CPU probe runs torch with one thread, so on a machine
    of two cores or more hashing its outputs' bytes (about a quarter of a CPU probe's time inline) runs beside the
    next forward instead of after it; hashlib releases the GIL over large buffers. The bytes are copied as they are
    recorded (a later in-place operation cannot change what is hashed) and absorbed in the order recorded, by one
    thread: the digests are those inline hashing gives. At most :attr:`BACKLOG` bytes wait at a time."""

    BACKLOG = 256 << 20

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dflash-eval-probe-hash")
        self._pending: deque[tuple[Future[None], int]] = deque()
        self._waiting = 0

    def update(self, h: Any, parts: list[bytes]) -> None:
        """Absorb ``parts`` into ``h`` after everything submitted before."""
        size = sum(map(len, parts))
        self._pending.append((self._pool.submit(_absorb, h, parts), size))
        self._waiting += size
        while self._pending and (self._waiting > self.BACKLOG or self._pending[0][0].done()):
            self._settle()

    def close(self) -> None:
        """Wait for every update (raising the first one's error), then stop the thread."""
        try:
            while self._pending:
                self._settle()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _settle(self) -> None:
        done, size = self._pending.popleft()
        self._waiting -= size
        done.result()


def _absorb(h: Any, parts: list[bytes]) -> None:
    for part in parts:
        h.update(part)


class _Folds:
    """The folds (:func:`fold`) of every tensor a GPU probe records, made in batches: a probe records hundreds of
    small outputs, and folding each alone is about seven tensor operations (each a kernel launch) and a copy to the
    host per kernel at the end. A tensor of up to :attr:`SMALL` words (the 8-, 16- or 32-bit integers :func:`fold`
    reads its bytes as) is copied as it is recorded into a staging buffer of its word type on the device (one copy: a
    later in-place operation cannot change what is folded); once :attr:`BATCH` words of a type wait, and when the
    tape closes, every staged tensor is folded at once: the same four weighted sums of 16-bit halves per tensor, each
    weight looked up by the element's position in its own tensor (:func:`_fold_weights`), each tensor's sum the
    difference of a running sum over the batch at its two ends (a scan: exact integer sums below 2**63 for a batch of
    up to 3 :attr:`BATCH` words, in no order that atomics could vary), modulo 2**61 - 1: :func:`fold`'s value to the
    bit. A larger tensor is folded alone as it comes. :meth:`close` copies every fold to the host at once; each kernel
    then reads its rows in call order."""

    BATCH = 1 << 21  # words of one type staged before they are folded
    SMALL = 1 << 20  # a tensor of more words is folded alone (fold) as it is recorded
    _WORDS = (torch.int8, torch.int16, torch.int32)  # staging order of the word types

    def __init__(self) -> None:
        self._device: torch.device | None = None
        self._stage: dict[torch.dtype, Tensor] = {}
        self._used: dict[torch.dtype, int] = {}
        self._staged: dict[torch.dtype, list[tuple[int, int]]] = {}  # word type -> (slot, words) in staging order
        self._parts: list[Tensor] = []  # folded rows ([k, 4] int64 on the device), in the order they were made
        self._row: list[int] = []  # slot -> its row in the parts concatenated (-1 while staged)
        self._made = 0
        self._host: Any = None  # every row on the host (numpy), once closed

    def add(self, t: Tensor) -> int:
        """Record ``t`` (its bytes as they are now); returns its slot."""
        slot = len(self._row)
        self._row.append(-1)
        words = _words(t)
        n = words.numel()
        if self._device is None:
            self._device = words.device
        if n > self.SMALL or words.device != self._device:
            self._parts.append(fold(words).reshape(1, 4))
            self._row[slot] = self._made
            self._made += 1
            return slot
        kind = words.dtype
        if self._used.get(kind, 0) + n > self.BATCH:
            self.flush()
        if kind not in self._stage:
            self._stage[kind] = torch.empty(self.BATCH, dtype=kind, device=self._device)
        at = self._used.get(kind, 0)
        self._stage[kind][at:at + n].copy_(words)
        self._used[kind] = at + n
        self._staged.setdefault(kind, []).append((slot, n))
        return slot

    def flush(self) -> None:
        """Fold every staged tensor (see the class docstring)."""
        entries = [e for kind in self._WORDS for e in self._staged.get(kind, [])]
        dev = self._device
        if not entries or dev is None:
            return
        ints = torch.cat([self._stage[kind][:self._used.get(kind, 0)].to(torch.int64) & _INT_MASK[kind.itemsize]
                          for kind in self._WORDS if kind in self._staged])
        bounds = [0]  # where each tensor starts in the batch (concatenated in staging order), and the batch's end
        for _, n in entries:
            bounds.append(bounds[-1] + n)
        edges = torch.tensor(bounds, dtype=torch.int64, device=dev)
        starts, stops = edges[:-1], edges[1:]
        seg = torch.repeat_interleave(torch.arange(len(entries), device=dev), stops - starts, output_size=ints.numel())
        pos = torch.arange(ints.numel(), device=dev) - starts[seg]
        weights = _fold_weights(max(n for _, n in entries), dev)  # made once per size: looked up per element
        halves = (ints & 0xFFFF, ints >> 16)
        prefix = torch.zeros(ints.numel() + 1, dtype=torch.int64, device=dev)
        sums = torch.empty(4, len(entries), dtype=torch.int64, device=dev)
        for k in range(4):  # row by row: a few [words] temporaries at a time, not [4, words]
            torch.cumsum(halves[k % 2] * weights[k][pos], 0, out=prefix[1:])  # a scan: no atomics
            sums[k] = prefix[stops] - prefix[starts]
        self._parts.append((sums % _MERSENNE).T)
        for i, (slot, _) in enumerate(entries):
            self._row[slot] = self._made + i
        self._made += len(entries)
        self._staged.clear()
        self._used.clear()

    def close(self) -> None:
        """Fold what is staged and copy every fold to the host (one copy)."""
        self.flush()
        self._stage.clear()
        if self._host is None and self._parts:
            self._host = torch.cat(self._parts).cpu().numpy().astype("<i8")
            self._parts = []

    def rows(self, slots: list[int]) -> bytes:
        """The folds of ``slots`` in order, as :func:`fold` gives them stacked (little-endian int64), after
        :meth:`close`."""
        return self._host[[self._row[s] for s in slots]].tobytes()


class _Kernel:
    """One kernel's calls: their outputs hashed as they come (CPU, by the tape's :class:`_Hasher`) or folded on the
    device (GPU, by the tape's :class:`_Folds`)."""

    def __init__(self, function: str, kind: str, hasher: _Hasher | None, folds: _Folds | None) -> None:
        self.function, self.kind, self.hasher, self.folds = function, kind, hasher, folds
        self.calls = 0
        self._h = hashlib.sha256()
        self._slots: list[int] = []

    def add(self, out: Any) -> None:
        self.calls += 1
        parts = [f"call {self.calls}\0".encode()]
        for t in _tensors(out):
            if t is None:
                parts.append(b"none\0")
                continue
            parts.append(f"{t.dtype}{tuple(t.shape)}\0".encode())
            if self.folds is not None:
                self._slots.append(self.folds.add(t))
            else:
                parts.append(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        if self.hasher is None:
            _absorb(self._h, parts)
        else:
            self.hasher.update(self._h, parts)

    def digest(self) -> str:
        """The kernel's digest, once the tape is closed."""
        if self._slots:
            assert self.folds is not None
            self._h.update(self.folds.rows(self._slots))
            self._slots = []
        return self._h.hexdigest()


class _Tape:
    """What the probe's hooks and wrappers record, kernel by kernel in the order of their first call."""

    def __init__(self, on_device: bool) -> None:
        self.hasher = None if on_device else _Hasher()
        self.folds = _Folds() if on_device else None
        self.kernels: dict[str, _Kernel] = {}
        self.regime = ""  # "short:" / "batch:" / "long-kv:" while such a run of the probe runs
        self.phase = ""  # "cached:" / "decode<step>:" while such calls run
        self.layer = ""  # the layer type whose decoder layer is running

    def add(self, name: str, function: str, kind: str, out: Any) -> None:
        key = self.regime + self.phase + name
        k = self.kernels.get(key)
        if k is None:
            k = self.kernels[key] = _Kernel(function, kind, self.hasher, self.folds)
        k.add(out)

    def close(self) -> None:
        """Every recorded output hashed (CPU) or folded and on the host (GPU): the digests are final."""
        if self.hasher is not None:
            self.hasher.close()
        if self.folds is not None:
            self.folds.close()


# ------------------------------------------------------------------------------------------------ shapes
def _int_field(cfg: dict[str, Any], key: str, where: Path, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: no {key!r}, which the kernel probe needs for the head shapes")
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n <= 0:
        raise ConfigError(f"{where}: {key!r} is {value!r}; the kernel probe needs a positive integer")
    return n


@dataclass(frozen=True)
class ProbeShapes:
    """The head shapes the target's kernels run at (config.json, text part), checked before the probe model is
    built: a missing or non-positive field is one error naming it."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    linear: tuple[int, int, int, int] | None  # key heads, value heads, key head dim, value head dim

    @classmethod
    def from_target(cls, target_dir: TargetDir) -> ProbeShapes:
        """Read from ``target_dir``'s config.json; a missing or non-positive field is a ConfigError naming it."""
        cfg, where = target_dir.text, target_dir.config_file
        heads = _int_field(cfg, "num_attention_heads", where)
        kv = _int_field(cfg, "num_key_value_heads", where, heads)
        hidden = _int_field(cfg, "hidden_size", where)
        head_dim = _int_field(cfg, "head_dim", where, hidden // heads if hidden >= heads else None)
        if heads % kv:
            raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        linear = None
        if "linear_attention" in target_dir.layer_types:
            hk, hv = (_int_field(cfg, k, where) for k in ("linear_num_key_heads", "linear_num_value_heads"))
            dk, dv = (_int_field(cfg, k, where) for k in ("linear_key_head_dim", "linear_value_head_dim"))
            if hv % hk:
                raise ConfigError(f"{where}: linear_num_value_heads {hv} is not a multiple of linear_num_key_heads "
                                  f"{hk}")
            linear = (hk, hv, dk, dv)
        return cls(heads, kv, head_dim, linear)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                               "head_dim": self.head_dim}
        if self.linear is not None:
            out["linear"] = dict(zip(("key_heads", "value_heads", "key_head_dim", "value_head_dim"), self.linear))
        return out


# ------------------------------------------------------------------------------------------------ the probe model
def _model_class(target_dir: TargetDir) -> type[PreTrainedModel]:
    """The transformers class ``AutoModelForCausalLM`` builds for the target (else the config's architecture; its
    modeling module imported with the garbage collector paused: :mod:`dflash_eval.common.heap`)."""
    with importing():
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        raw = target_dir.raw
        names = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(raw.get("model_type"))),
                 MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(target_dir.text.get("model_type"))),
                 *(raw.get("architectures") or [])]
        for name in names:
            cls = getattr(transformers, name, None) if isinstance(name, str) else None
            if cls is not None:
                return cls
    raise ConfigError(f"{target_dir.config_file}: model_type {raw.get('model_type')!r} / architectures "
                      f"{raw.get('architectures')!r} name no causal LM class of this transformers "
                      f"({transformers.__version__}): the kernel probe cannot tell which kernels the target calls")


def modeling_module(target_dir: TargetDir) -> ModuleType:
    """The transformers modeling module of the target's causal LM class (imported; no model is built)."""
    return importlib.import_module(_model_class(target_dir).__module__)


def attention_implementation(target_dir: TargetDir) -> str:
    """The attention implementation :func:`dflash_eval.target.loader.load_target` ends up with: the config's own
    ``attn_implementation`` if it names one, else transformers' default (``sdpa`` where the class supports it,
    else ``eager``)."""
    named = target_dir.raw.get("attn_implementation") or target_dir.raw.get("_attn_implementation")
    if isinstance(named, str) and named:
        return named
    return "sdpa" if getattr(_model_class(target_dir), "_supports_sdpa", False) else "eager"


def _describe(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"


def probe_config(target_dir: TargetDir) -> PretrainedConfig:
    """The target's text config with one decoder layer per layer type (in the order they first appear) and a
    :data:`PROBE_VOCAB`-token vocabulary; every other field (widths, heads, convolution, MLP, norms, RoPE) is the
    target's."""
    from transformers import AutoConfig

    try:
        cfg = text_config(AutoConfig.from_pretrained(target_dir.path, local_files_only=True))
    except Exception as exc:
        raise ConfigError(f"{target_dir.config_file}: transformers cannot read it for the kernel probe: "
                          f"{type(exc).__name__}: {exc}") from exc
    d = cfg.to_dict()
    types = [str(t) for t in (getattr(cfg, "layer_types", None) or [])]
    distinct = list(dict.fromkeys(types))
    d.update(num_hidden_layers=max(1, len(distinct)), vocab_size=PROBE_VOCAB, pad_token_id=0, bos_token_id=None,
             eos_token_id=None)
    if distinct:
        d["layer_types"] = distinct
    for key in ("mlp_only_layers", "sliding_window_layers"):  # per-layer lists that name the target's layer ids
        d.pop(key, None)
    return type(cfg).from_dict(d)


def probe_model(target_dir: TargetDir, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """The probe's model (module docstring): the target's causal LM class, seeded random weights from its own
    initialisation, ``dtype``, on ``device``, eval mode."""
    from transformers import AutoModelForCausalLM

    cfg = probe_config(target_dir)
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), torch.device(dev):
        torch.manual_seed(PROBE_SEED)
        try:
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attention_implementation(target_dir),
                                                     dtype=dtype)
        except Exception as exc:
            raise ConfigError(f"{target_dir.config_file}: the kernel probe cannot build the target's class "
                              f"{_model_class(target_dir).__name__} from it: {type(exc).__name__}: {exc}") from exc
    return model.to(dev).eval()


# ------------------------------------------------------------------------------------------------ the result
@dataclass(frozen=True)
class KernelDigest:
    """One kernel of the probe: the function or class method called (``module.qualname``), its kind, how many
    calls, the digest of all their outputs."""

    function: str
    kind: str
    calls: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "kind": self.kind, "calls": self.calls, "digest": self.digest[:16]}


@dataclass(frozen=True)
class ProbeResult:
    """The probe of one (backend, dtype, device, shape): a digest per kernel (in the order of their first call),
    their combined digest, the time the probe took (``seconds``: building the probe model and running it) and the
    time to import the modeling module (``import_seconds``, paid by the first probe of a process; with fla,
    importing fla's ops is paid by the backend switch, in ``seconds``)."""

    backend: str
    dtype: str
    device: str
    shapes: ProbeShapes
    shape: ProbeShape
    kernels: dict[str, KernelDigest]
    seconds: float
    import_seconds: float = 0.0

    @cached_property
    def digest(self) -> str:
        """sha256 over the shape and the kernels' digests in call order: what cache keys carry."""
        return hashlib.sha256(json.dumps([self.shape.to_json(), [(k, v.digest) for k, v in self.kernels.items()]]
                                         ).encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.dtype}"

    def digests(self) -> dict[str, str]:
        """kernel -> digest, in call order (what the registry remembers)."""
        return {k: v.digest for k, v in self.kernels.items()}

    def by_kind(self) -> dict[str, str]:
        """kind -> a digest over the kernels of that kind (the golden fingerprint keeps these)."""
        kinds: dict[str, list[str]] = {}
        for k in self.kernels.values():
            kinds.setdefault(k.kind, []).append(k.digest)
        return {kind: hashlib.sha256("".join(ds).encode()).hexdigest()[:16] for kind, ds in sorted(kinds.items())}

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "dtype": self.dtype, "device": self.device, "digest": self.digest,
                "seconds": round(self.seconds, 6), "import_seconds": round(self.import_seconds, 6),
                "shapes": self.shapes.to_json(), "shape": self.shape.to_json(), "label": self.shape.label,
                "kernels": {k: v.to_json() for k, v in self.kernels.items()}}


# ------------------------------------------------------------------------------------------------ running it
def _module_kind(module: nn.Module, name: str) -> str:
    cls = type(module).__name__
    if name.endswith("lm_head") or isinstance(module, nn.Linear):
        return "matmul"
    for part, kind in (("NormGated", "gated-norm"), ("Norm", "norm"), ("Rotary", "rotary"),
                       ("Embedding", "embedding"), ("DecoderLayer", "layer"), ("MLP", "mlp"), ("Moe", "mlp"),
                       ("MoE", "mlp"), ("Experts", "mlp"), ("GatedDeltaNet", "linear-attention"),
                       ("Attention", "attention"), ("Model", "model")):
        if part in cls:
            return kind
    return "activation" if "act" in name.rsplit(".", 1)[-1] or "Activation" in cls else "layer"


def _event_names(model: nn.Module) -> dict[str, tuple[str, str]]:
    """Submodule path -> (event name, layer type): ``linear_attention.linear_attn.norm`` for a module of a decoder
    layer, ``embed_tokens`` / ``norm`` / ``lm_head`` / ``model`` for the others."""
    base, layers, _ = decoder_parts(model)
    types = list(getattr(model.config, "layer_types", None) or [])
    layer_path = {id(layer): (i, types[i] if i < len(types) else f"layer{i}") for i, layer in enumerate(layers)}
    paths = {id(m): p for p, m in model.named_modules()}
    prefix = {i: paths[id(layer)] for i, layer in enumerate(layers)}
    out: dict[str, tuple[str, str]] = {}
    for path, module in model.named_modules():
        if not path or isinstance(module, nn.ModuleList | nn.ModuleDict):
            continue
        if id(module) in layer_path:
            _, t = layer_path[id(module)]
            out[path] = (t, t)
            continue
        owner = next((i for i, p in prefix.items() if path.startswith(p + ".")), None)
        if owner is not None:
            t = layer_path[id(layers[owner])][1]
            out[path] = (f"{t}.{path[len(prefix[owner]) + 1:]}", t)
        else:
            out[path] = ("model" if module is base else path.rsplit(".", 1)[-1] if module in
                         (getattr(base, "embed_tokens", None), getattr(base, "norm", None),
                          getattr(base, "rotary_emb", None)) else path, "")
    return out


@contextmanager
def _recording(model: nn.Module, mod: ModuleType, target_dir: TargetDir, tape: _Tape) -> Iterator[None]:
    """Forward hooks on every submodule of ``model``, a pre-hook on each attention's ``o_proj`` (the attention
    function's output) and wrappers around the modeling module's kernel functions, all removed on exit."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    handles: list[Any] = []
    names = _event_names(model)
    impl = attention_implementation(target_dir)
    attention_fn = _describe(ALL_ATTENTION_FUNCTIONS.get_interface(impl, getattr(mod, "eager_attention_forward",
                                                                                 None)))  # type: ignore[arg-type]  # None only for a registered impl
    for path, module in model.named_modules():
        if path not in names:
            continue
        event, layer_type = names[path]
        kind, function = _module_kind(module, path), _describe(type(module).forward)

        def hook(_m: nn.Module, _inp: Any, out: Any, event: str = event, kind: str = kind,
                 function: str = function) -> None:
            tape.add(event, function, kind, out)

        if layer_type and event == layer_type:  # a decoder layer: its calls run under its type
            def enter(_m: nn.Module, _inp: Any, layer_type: str = layer_type) -> None:
                tape.layer = layer_type

            handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(hook))
        if path.endswith(".o_proj") and layer_type:
            def attention_out(_m: nn.Module, inp: tuple[Any, ...], layer_type: str = layer_type) -> None:
                tape.add(f"{layer_type}.attention", f"{impl}: {attention_fn}", "attention", inp[0])

            handles.append(module.register_forward_pre_hook(attention_out))
    saved = {name: getattr(mod, name) for name in FUNCTION_KINDS if callable(getattr(mod, name, None))}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            tape.add(f"{tape.layer or 'model'}.{name}", _describe(fn), FUNCTION_KINDS[name], out)
            return out

        return call

    try:
        for name, fn in saved.items():
            setattr(mod, name, wrap(name, fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(mod, name, fn)
        for h in handles:
            h.remove()


def _run_extraction(model: nn.Module, shape: ProbeShape, gen: torch.Generator, dev: torch.device,
                    tape: _Tape) -> None:
    """One unpadded sequence of each end of the bucket (the lowest length named ``short:``) through the model without
    its cache (feature extraction) and with it (the forward that also gives the teacher-forced argmax)."""
    for regime, n in (("short:", shape.low), ("", shape.length)):
        ids = torch.randint(1, PROBE_VOCAB, (1, n), generator=gen).to(dev)
        tape.regime = regime
        try:
            model(input_ids=ids, use_cache=False)
            tape.phase = "cached:"
            model(input_ids=ids)
        finally:
            tape.regime, tape.phase = "", ""


def _spread(rows: int, low: int, high: int, gen: torch.Generator) -> list[Tensor]:
    """``rows`` prompts of lengths spread evenly from ``high`` down to ``low`` (one row: ``high``)."""
    lengths = [high - (high - low) * r // max(1, rows - 1) for r in range(rows)] if rows > 1 else [high]
    return [torch.randint(1, PROBE_VOCAB, (n,), generator=gen) for n in lengths]


def _run_generation(model: nn.Module, shape: ProbeShape, gen: torch.Generator, dev: torch.device, backend: str,
                    tape: _Tape) -> None:
    """The references stage's greedy generation at the run's regimes (module docstring), :data:`DECODE_STEPS`
    decode steps each: the run's batch of short left-padded prompts (``batch:``), two prompts spread over the bucket
    (``long:``: a padded prefill at its top), one prompt of the bucket's lowest length (``short:``) and one prompt
    decoding at the longest cache the run reaches (``long-kv:``); each decode step recorded
    apart (``decode1:``, ``decode2:``, ...), so the first kernel whose output changed is named in the step where it
    changed, not in a later step that only read a token it moved."""
    base = getattr(model, "model", model)
    forwards = [0]  # forwards of the current generation call: the first is its prefill (a one-token one too)

    def phase(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tape.phase = f"decode{forwards[0]}:" if forwards[0] else ""
        forwards[0] += 1

    last = shape.length + max(0, shape.new_tokens - DECODE_STEPS)  # its last step attends over length + new_tokens
    runs = (("batch:", _spread(shape.rows, shape.low, min(shape.length, shape.low + CHUNK), gen)),
            ("long:", _spread(min(shape.rows, 2), shape.low, shape.length, gen)),
            ("short:", _spread(1, shape.low, shape.low, gen)),
            ("long-kv:", _spread(1, last, last, gen)))
    handle = base.register_forward_pre_hook(phase, with_kwargs=True)
    target = SimpleNamespace(model=model, device=dev, eos_token_id=None)
    try:
        for regime, rows in runs:
            tape.regime, forwards[0] = regime, 0
            out = references_generation(target, rows, DECODE_STEPS + 1, backend=backend,  # type: ignore[arg-type]  # what greedy_generate_batch reads of a Target
                                        stop_at_eos=False)
            tape.phase = ""
            tape.add("generated_ids", _describe(references_generation), "generation",
                     torch.tensor(out, dtype=torch.int64))
    finally:
        handle.remove()
        tape.regime, tape.phase = "", ""


_THREADS_LOCK = threading.Lock()


def probe(target_dir: TargetDir, backend: str, dtype: torch.dtype, device: torch.device | str,
          shape: ProbeShape | None = None) -> ProbeResult:
    """Run the target's forward for ``backend`` (a ``+<fault>`` suffix is dropped: the fault is named in the cache
    key already) in ``dtype`` on ``device`` at ``shape`` (default: the extraction probe of the shortest bucket) on
    seeded inputs; see the module docstring."""
    shape = shape or ProbeShape(MIN_BUCKET)
    t0 = time.perf_counter()
    shapes = ProbeShapes.from_target(target_dir)
    base = split_backend(backend)[0]
    # Triton's installation key, hashed while the modeling code is imported and the probe model is built
    # (dflash_eval.target.kernel_cache); joined before the first kernel, and before the call returns
    keying = hash_installation(import_triton=True) if base == "fla" else None
    try:
        mod = modeling_module(target_dir)
        dev = torch.device(device)
        t1 = time.perf_counter()
        tape = _Tape(on_device=dev.type != "cpu")
        with _THREADS_LOCK:
            threads = torch.get_num_threads()
            if dev.type == "cpu":
                torch.set_num_threads(1)  # CPU reductions may split differently with another thread count
            try:
                model = probe_model(target_dir, dtype, dev)
                if keying is not None:
                    keying.join(KEY_WAIT_S)
                gen = torch.Generator().manual_seed(PROBE_SEED + shape.length)
                try:
                    with torch.no_grad(), use_backend(base, dev), _recording(model, mod, target_dir, tape):
                        if shape.generation:
                            _run_generation(model, shape, gen, dev, base, tape)
                        else:
                            _run_extraction(model, shape, gen, dev, tape)
                finally:
                    tape.close()
                kernels = {k: KernelDigest(v.function, v.kind, v.calls, v.digest()) for k, v in tape.kernels.items()}
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
            finally:
                torch.set_num_threads(threads)
    finally:  # the thread may import (kernel_cache): it ends within this call
        if keying is not None:
            keying.join(KEY_WAIT_S)
    return ProbeResult(base, str(dtype).removeprefix("torch."), str(dev), shapes, shape, kernels,
                       seconds=time.perf_counter() - t1, import_seconds=t1 - t0)
