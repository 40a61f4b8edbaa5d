"""The kernel probe (:mod:`dflash_eval.target.kernel_probe`) on the bundled target:

- an unchanged kernel gives the same digest bit for bit in two separate processes, at the extraction and the
  generation shape, in fp32 and bf16;
- the probe runs the target's own classes: every kernel function of the forward is recorded (both delta rules, both
  convolutions, the gated norm, the attention function, the norms, the projections, prefill and decode apart), at
  both ends of the sequence length's bucket, and for generation the run's batch, one prompt alone and the longest
  cache the run's decode steps reach;
- every class of fault patched in from OUTSIDE dflash-eval (tests/kernel_faults.py: noise on the chunked delta rule,
  its decay gate x1.1, bf16 accumulation, noise only on long inputs, in ``causal_conv1d_fn``, in
  ``causal_conv1d_update``, in the gated RMSNorm, on decode steps only, on long attention queries, in the recurrent
  rule's prefill, and faults confined to shorter inputs of a bucket, single chunks, decode steps over a short or a
  long cache, batches of more than one sequence) moves the digest of exactly the probes whose path it is on, and
  names its own function as the first kernel whose output changed, in the regime where it shows; a fault on inputs
  longer than a bucket leaves that bucket's probe alone; a fault confined to what the probe's model never runs (the
  deeper layers, large activations, bf16 in the deeper layers, late positions in the deeper attention layers, the
  layers past the drafter's, decode steps in the deeper layers) moves no digest: the witness is what sees those;
- the backend decides what is probed (``torch-recurrent`` runs the recurrent function for prefill; a ``+<fault>``
  suffix is already in the cache key and is not probed); head shapes are checked from config.json, dense targets
  run their attention layer alone, a missing field is an error naming the file and the key;
- the registry of digests names the first kernel whose output changed since an entry was cached; xdist workers'
  probes merge into one ``provenance.kernel_probe`` block that validates against eval.json's schema;
- the exact integer fold used on a GPU sees a one-bit change, and folded in batches it is each tensor's fold;
- with fla on a GPU, fla's kernels are what the probe records (skipped on a CPU, naming what was not checked).

Run: ``pytest tests/test_kernel_probe.py -p no:cacheprovider``
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_faults import BLIND, FAULTS, LONG, UNSEEN, install

from dflash_eval.errors import ConfigError
from dflash_eval.target import kernel_probe as kp
from dflash_eval.target.kernel_probe import (
    DECODE_STEPS,
    MIN_BUCKET,
    TAIL,
    ProbeShape,
    ProbeShapes,
    bucket,
    fold,
    probe,
)
from dflash_eval.target.kernel_registry import KernelProbes, kernel_change
from dflash_eval.target.loader import TargetDir

ROOT = Path(__file__).resolve().parents[1]
TARGET = TargetDir(ROOT / "fixtures" / "target")
MODELING = "transformers.models.qwen3_5.modeling_qwen3_5"
EXTRACT = ProbeShape.for_sequence(300)  # the bundled prompts + completions: one bucket, 512 tokens
GENERATE = ProbeShape.for_generation(200, 32, 16)  # the run's batch of 32, 16 new tokens (the run: 128)

SCRIPT = """
import json, sys, torch
from dflash_eval.target.kernel_probe import ProbeShape, probe
from dflash_eval.target.loader import TargetDir
out = {}
for dtype in (torch.float32, torch.bfloat16):
    for name, shape in (("extract", ProbeShape.for_sequence(300)),
                        ("generate", ProbeShape.for_generation(200, 32, 16))):
        r = probe(TargetDir(sys.argv[1]), "torch", dtype, "cpu", shape)
        out[f"{dtype}/{name}"] = {"digest": r.digest, "kernels": r.digests()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def clean() -> dict[tuple[str, str], object]:
    """The clean probes of both torch backends at both shapes, and a long one."""
    long = ProbeShape.for_sequence(1000)
    return {(b, k): probe(TARGET, b, torch.float32, "cpu", s) for b in ("torch", "torch-recurrent")
            for k, s in (("extract", EXTRACT), ("generate", GENERATE), ("long", long))}


@pytest.mark.slow
def test_an_unchanged_kernel_gives_the_same_digest_in_separate_processes():
    runs = [subprocess.run([sys.executable, "-c", SCRIPT, str(TARGET.path)], capture_output=True, text=True,
                           timeout=600, cwd=ROOT) for _ in range(2)]
    assert all(p.returncode == 0 for p in runs), [p.stderr[-2000:] for p in runs]
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in runs)
    assert a == b
    here = probe(TARGET, "torch", torch.float32, "cpu", EXTRACT)
    assert {"digest": here.digest, "kernels": here.digests()} == a["torch.float32/extract"]
    assert a["torch.float32/extract"]["digest"] != a["torch.bfloat16/extract"]["digest"]  # the run's dtype is probed
    assert probe(TARGET, "torch", torch.float32, "cpu", EXTRACT).digest == here.digest


def test_the_probe_runs_every_kernel_of_the_forward_at_the_runs_shapes(clean):
    ext, gen = clean[("torch", "extract")], clean[("torch", "generate")]
    assert bucket(1) == bucket(MIN_BUCKET) == MIN_BUCKET and bucket(MIN_BUCKET + 1) == 2 * MIN_BUCKET
    assert ext.shape.length == MIN_BUCKET + TAIL and ext.shape.length % 64  # the last chunk is a padded one
    assert ext.shape.low == 1 and clean[("torch", "long")].shape.low == MIN_BUCKET + 1  # both ends of each bucket
    for regime in ("short:", ""):  # the bucket's lowest length (a single chunk here) and its highest
        for phase in ("", "cached:"):  # without the model's cache (extraction) and with it (the argmax's forward)
            assert ext.kernels[f"{regime}{phase}linear_attention.torch_chunk_gated_delta_rule"].function == \
                f"{MODELING}.torch_chunk_gated_delta_rule"
            for name in ("embed_tokens", "linear_attention.causal_conv1d_fn", "linear_attention.linear_attn.norm",
                         "linear_attention.linear_attn.in_proj_qkv", "full_attention.attention",
                         "full_attention.self_attn.q_norm", "norm", "lm_head"):
                assert f"{regime}{phase}{name}" in ext.kernels, name
    assert ext.kernels["linear_attention.linear_attn.norm"].kind == "gated-norm"
    assert ext.kernels["full_attention.attention"].function.startswith("sdpa: ")  # transformers' default here
    assert not any("decode" in k for k in ext.kernels)
    # generation at the run's regimes: the run's batch (padded prefill), two prompts over the bucket, one short prompt,
    # the longest cache; a few decode steps each through the decode kernels
    assert gen.shape.rows == 32 and gen.shape.new_tokens == 16
    for regime in ("batch:", "long:", "short:", "long-kv:"):
        for name in ("linear_attention.torch_recurrent_gated_delta_rule", "linear_attention.causal_conv1d_update",
                     "full_attention.attention"):  # each decode step apart; a one-token prompt's prefill is one too
            steps = [k for k in gen.kernels if k.startswith(regime + "decode") and k.endswith(":" + name)]
            assert len(steps) in (DECODE_STEPS, DECODE_STEPS + 1), (regime, name, steps)
        assert gen.kernels[f"{regime}generated_ids"].kind == "generation"
    assert gen.kernels["batch:linear_attention.apply_mask_to_padding_states"].calls == 1
    assert gen.kernels["long:linear_attention.apply_mask_to_padding_states"].calls == 1
    assert len({ext.digest, gen.digest, clean[("torch", "long")].digest}) == 3


def _plain(name: str | None) -> str | None:
    """A kernel's name without the probe regime it ran in (``short:``, ``batch:``, ``long:``, ``long-kv:``) and with
    its decode step's number dropped (``decode2:`` -> ``decode:``)."""
    if name is None:
        return None
    for regime in ("short:", "batch:", "long:", "long-kv:"):
        name = name.removeprefix(regime)
    return re.sub(r"^decode\d+:", "decode:", name)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_kernel_patched_from_outside_moves_the_digest_of_the_probes_on_its_path(fault, clean):
    """Which probes move, and the first kernel named: the patched function itself, in the regime where it shows."""
    undo = install(fault)
    try:
        now = {k: probe(TARGET, k[0], torch.float32, "cpu", c.shape) for k, c in clean.items()}
    finally:
        undo()
    first = {k: (kernel_change(c.digests(), now[k]) or [None])[0] for k, c in clean.items()}
    moved = {k for k, f in first.items() if f is not None}
    chunk = "linear_attention.torch_chunk_gated_delta_rule"
    prefill = {(b, k) for b in ("torch", "torch-recurrent") for k in ("extract", "generate", "long")}
    generate = {("torch", "generate"), ("torch-recurrent", "generate")}
    short_chunk = {("torch", "extract"), ("torch", "generate")}  # the bucket's lowest length: one token
    expect = {"chunk_noise": ({(b, k) for b, k in prefill if b == "torch"}, chunk),
              "gate": ({(b, k) for b, k in prefill if b == "torch"}, chunk),
              "bf16_chunk": ({(b, k) for b, k in prefill if b == "torch"}, chunk),
              "long_inputs": ({(b, k) for b, k in prefill if b == "torch"}, chunk),
              "conv1d": (prefill, "linear_attention.causal_conv1d_fn"),
              "conv1d_update": (generate, "decode:linear_attention.causal_conv1d_update"),
              "gated_norm": (prefill, "linear_attention.linear_attn.norm"),
              # the torch-recurrent side extracts the bucket's one-token end with the recurrent rule: a decode's shape
              "decode_only": (generate | {("torch-recurrent", "extract")},
                              {"decode:linear_attention.torch_recurrent_gated_delta_rule", chunk}),
              "recurrent_prefill": ({(b, k) for b, k in prefill if b == "torch-recurrent"}, chunk),
              "attention_long": (prefill, "full_attention.attention"),
              "short_inputs": (short_chunk, chunk),
              "single_chunk": (short_chunk, chunk),
              "short_kv": (generate, "decode:full_attention.attention"),
              "long_kv": (generate, "decode:full_attention.attention"),
              "batched": (generate, "decode:linear_attention.torch_recurrent_gated_delta_rule")}[fault]
    assert moved == expect[0], first
    assert {_plain(first[k]) for k in moved} == (expect[1] if isinstance(expect[1], set) else {expect[1]})
    regimes = {"short_inputs": ("short:", "batch:"), "single_chunk": ("short:", "batch:"), "short_kv": ("batch:",),
               "long_kv": ("long:",), "batched": ("batch:",)}  # the extraction's short end; the batch's short rows
    if fault in regimes:  # named in the regime where it shows
        assert all(first[k].startswith(regimes[fault]) for k in moved), first
    for k in moved:
        function = now[k].kernels[first[k]].function
        assert "kernel_faults" in function or "attention" in first[k], function  # sdpa: inside transformers' own
    assert LONG < EXTRACT.length  # the long-inputs fault is on the path of every probe of the bundled bucket


@pytest.mark.parametrize("fault", BLIND + UNSEEN)
def test_a_fault_confined_to_what_the_probes_model_never_runs_moves_no_digest(fault, clean):
    """What the witness is for: a fault confined to the deeper layers, to large activations, to bf16 in the deeper
    layers, to late positions in the deeper attention layers, past the drafter's layers, or to decode steps in the
    deeper layers (tests/kernel_faults.py) leaves every probe's digest as it was, in fp32 and in bf16: the probe's
    model has one layer of each type, seeded weights and small activations."""
    bf16 = {(b, k): probe(TARGET, b, torch.bfloat16, "cpu", clean[(b, k)].shape)
            for b in ("torch", "torch-recurrent") for k in ("extract", "generate")}
    undo = install(fault)
    try:
        moved = [k for k, c in clean.items() if probe(TARGET, k[0], torch.float32, "cpu", c.shape).digest != c.digest]
        moved += [(*k, "bf16") for k, c in bf16.items()
                  if probe(TARGET, k[0], torch.bfloat16, "cpu", c.shape).digest != c.digest]
    finally:
        undo()
    assert moved == [], f"{fault}: the probe sees it after all ({moved}): it belongs with kernel_faults.FAULTS"


def test_a_fault_on_inputs_longer_than_a_bucket_leaves_that_buckets_probe_alone(clean, monkeypatch):
    import importlib

    mod = importlib.import_module(MODELING)
    chunk = mod.torch_chunk_gated_delta_rule
    while hasattr(chunk, "__wrapped__"):
        chunk = chunk.__wrapped__

    def beyond_600(query, key, value, g, beta, **kw):
        out, state = chunk(query, key, value, g, beta, **kw)
        return (out * 1.01 if query.shape[1] > 600 else out), state

    monkeypatch.setattr(mod, "torch_chunk_gated_delta_rule", beyond_600)
    assert probe(TARGET, "torch", torch.float32, "cpu", EXTRACT).digest == clean[("torch", "extract")].digest
    long = probe(TARGET, "torch", torch.float32, "cpu", clean[("torch", "long")].shape)
    assert long.shape.length > 1000 and long.digest != clean[("torch", "long")].digest


def test_the_backend_decides_what_is_probed(clean):
    torch_r, recur_r = clean[("torch", "extract")], clean[("torch-recurrent", "extract")]
    chunk = "linear_attention.torch_chunk_gated_delta_rule"
    assert recur_r.kernels[chunk].function == f"{MODELING}.torch_recurrent_gated_delta_rule"
    assert recur_r.kernels[chunk].digest != torch_r.kernels[chunk].digest
    assert recur_r.kernels["linear_attention.causal_conv1d_fn"].digest == \
        torch_r.kernels["linear_attention.causal_conv1d_fn"].digest  # the same inputs before the delta rule
    # the diagnostic fault is named in the cache key already: its backend is probed without it
    fault = probe(TARGET, "torch+noise=0.01", torch.float32, "cpu", EXTRACT)
    assert fault.backend == "torch" and fault.digest == torch_r.digest


def test_the_integer_fold_sees_one_bit():
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    a = fold(x)
    y = x.clone()
    y.view(torch.int32)[2, 517] ^= 1  # the lowest mantissa bit of one element
    assert not torch.equal(fold(y), a) and torch.equal(fold(x.clone()), a)
    assert not torch.equal(fold(x.to(torch.bfloat16)), fold(x.to(torch.bfloat16) * (1 + 2 ** -7)))
    assert fold(torch.tensor([True, False])).shape == (4,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool])
def test_the_integer_fold_is_its_definition(dtype):
    """Four sums over the elements' 16-bit halves (lo, hi, lo, hi), each weighted by ``(i a + b) mod p + 1``, modulo
    2**61 - 1, written out in Python: the fold's tensor operations compute exactly that, for elements of 4 bytes and
    of 2 or 1 (no high half)."""
    x = torch.randn(1500, generator=torch.Generator().manual_seed(1)) * 300
    x = x > 0 if dtype == torch.bool else x.to(dtype)
    size = max(1, x.element_size())
    raw = x.to(torch.uint8) if dtype == torch.bool else x
    words = raw.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[size]).tolist()
    ints = [v & ((1 << (8 * size)) - 1) for v in words]
    halves = ([v & 0xFFFF for v in ints], [v >> 16 for v in ints])
    want = [sum(h * ((i * a + b) % kp._FOLD_P + 1) for i, h in enumerate(halves[k % 2])) % ((1 << 61) - 1)
            for k, (a, b) in enumerate(kp._FOLD_AB)]
    assert fold(x).tolist() == want


def test_cpu_digests_are_the_bytes_as_recorded_hashed_in_order():
    """The CPU probe hashes on a thread of its own: interleaved kernels, a backlog smaller than one output (every
    update waits), a tensor changed in place right after it was recorded, all give sha256 of the bytes as recorded,
    in call order; a failing update is raised (at the latest when the tape closes), and the thread is gone after it."""
    gen = torch.Generator().manual_seed(3)
    outs = [(f"k{i % 3}", torch.randn(4, 257, generator=gen)) for i in range(12)]
    want: dict[str, Any] = {}
    for name, t in outs:
        h = want.setdefault(name, [hashlib.sha256(), 0])
        h[1] += 1
        h[0].update(f"call {h[1]}\0".encode() + f"{t.dtype}{tuple(t.shape)}\0".encode() + t.numpy().tobytes())
    for backlog in (kp._Hasher.BACKLOG, 1):
        tape = kp._Tape(on_device=False)
        tape.hasher.BACKLOG = backlog  # type: ignore[union-attr]
        for name, t in outs:
            live = t.clone()
            tape.add(name, "f", "matmul", live)
            live.mul_(2)  # what is hashed is what was recorded
        tape.close()
        assert {k: v.digest() for k, v in tape.kernels.items()} == {k: h.hexdigest() for k, (h, _) in want.items()}
    tape = kp._Tape(on_device=False)
    tape.add("k", "f", "matmul", torch.ones(3))
    tape.kernels["k"]._h = None  # type: ignore[assignment]  # the next update has no hash to go into
    with pytest.raises(AttributeError):  # raised by the add that finds it done, else by the close
        try:
            tape.add("k", "f", "matmul", torch.ones(3))
        finally:
            tape.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("dflash-eval-probe-hash")]


def test_device_folds_in_batches_are_each_tensors_fold(monkeypatch):
    """The GPU tape folds small outputs in batches (:class:`kp._Folds`): each kernel's digest is the one folding
    every recorded tensor alone (:func:`fold`) in call order gives, for every element width (1, 2, 4 and 8 bytes,
    bool), empty, 0-d and non-contiguous tensors, absent outputs, tensors folded alone (larger than ``SMALL``),
    batches filled and folded mid-way, and tensors changed in place right after they were recorded. Run on the CPU
    here (the tape's device code is device-agnostic); test_fla_kernels_are_probed_on_a_gpu runs probes on a card."""
    monkeypatch.setattr(kp._Folds, "BATCH", 3000)
    monkeypatch.setattr(kp._Folds, "SMALL", 1200)
    gen = torch.Generator().manual_seed(11)
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8,
              torch.uint8, torch.bool]
    outs: list[tuple[str, Any]] = []
    for i in range(60):
        dt = dtypes[i % len(dtypes)]
        n = (7, 300, 1100, 1300, 0, 2500)[i % 6]
        x = torch.randn(n, generator=gen) * 1000
        t = x > 0 if dt == torch.bool else x.to(dt)
        if i % 5 == 0 and n >= 300:
            t = t[: n // 2 * 2].reshape(2, -1).T  # non-contiguous
        out: Any = t
        if i % 7 == 0:
            out = (t, None, {"state": torch.tensor(float(i))})  # 0-d, absent, nested
        outs.append((f"k{i % 4}", out))
    want: dict[str, list[Any]] = {}
    tape = kp._Tape(on_device=True)
    for name, out in outs:
        h = want.setdefault(name, [hashlib.sha256(), 0, []])
        h[1] += 1
        parts = [f"call {h[1]}\0".encode()]
        for t in kp._tensors(out):
            if t is None:
                parts.append(b"none\0")
                continue
            parts.append(f"{t.dtype}{tuple(t.shape)}\0".encode())
            h[2].append(fold(t.clone()))
        for p in parts:
            h[0].update(p)
        tape.add(name, "f", "matmul", out)
        for t in kp._tensors(out):  # what is folded is what was recorded
            if t is not None and t.numel():
                t.logical_not_() if t.dtype == torch.bool else t.add_(1)
    tape.close()
    for h, _, folds in want.values():
        h.update(torch.stack(folds).numpy().astype("<i8").tobytes())
    assert {k: v.digest() for k, v in tape.kernels.items()} == {k: h.hexdigest() for k, (h, _, _) in want.items()}
    only_empty = kp._Folds()  # a batch of empty tensors alone: their folds are zeros, as fold's
    slots = [only_empty.add(torch.zeros(0, dtype=dt)) for dt in (torch.bfloat16, torch.int64)]
    only_empty.close()
    assert only_empty.rows(slots) == torch.zeros(2, 4, dtype=torch.int64).numpy().astype("<i8").tobytes()


def _target_dir(tmp_path: Path, **over) -> TargetDir:
    d = tmp_path / "target"
    d.mkdir(exist_ok=True)
    cfg = {**json.loads((TARGET.path / "config.json").read_text()), **over}
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return TargetDir(d)


def test_head_shapes_come_from_the_config(tmp_path, clean):
    shapes = ProbeShapes.from_target(TARGET)
    assert shapes == ProbeShapes(num_heads=4, num_kv_heads=2, head_dim=64, linear=(4, 4, 32, 32))
    # grouped value heads (more value than key heads), as the large Qwen3.5 models have
    wide = probe(_target_dir(tmp_path, linear_num_value_heads=8, linear_value_head_dim=16), "torch", torch.float32,
                 "cpu", EXTRACT)
    assert wide.shapes.linear == (4, 8, 32, 16) and wide.digest != clean[("torch", "extract")].digest

    with pytest.raises(ConfigError, match=r"config\.json: no 'linear_key_head_dim', which the kernel probe needs"):
        ProbeShapes.from_target(_target_dir(tmp_path, linear_key_head_dim=None))
    with pytest.raises(ConfigError, match=r"linear_num_value_heads 6 is not a multiple of linear_num_key_heads 4"):
        ProbeShapes.from_target(_target_dir(tmp_path, linear_num_value_heads=6))


def test_a_dense_target_gets_its_attention_layer_alone(tmp_path):
    d = tmp_path / "dense"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                               "hidden_size": 64, "num_attention_heads": 4,
                                               "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                                               "intermediate_size": 96, "vocab_size": 128}))
    r = probe(TargetDir(d), "torch", torch.float32, "cpu", EXTRACT)
    assert r.shapes.linear is None
    assert {k.kind for k in r.kernels.values()} >= {"attention", "norm", "matmul", "embedding"}
    assert "linear-attention" not in {k.kind for k in r.kernels.values()}
    assert any(k.endswith(".attention") for k in r.kernels)


def test_the_registry_names_the_changed_kernel(tmp_path):
    reg = tmp_path / "registry"
    first = KernelProbes(TARGET, "cpu", registry_dir=reg)
    clean = first.get("torch", torch.float32, EXTRACT)
    assert first.earlier("torch", torch.float32, EXTRACT) == {}
    undo = install("conv1d")
    try:
        second = KernelProbes(TARGET, "cpu", registry_dir=reg)  # another run, same cache, the kernel patched
        earlier = second.earlier("torch", torch.float32, EXTRACT)
        assert list(earlier) == [clean.digest]
        msg = second.note_change("torch", torch.float32, EXTRACT, clean.digest, earlier[clean.digest], "features")
    finally:
        undo()
    assert msg is not None and msg.startswith(
        "the conv1d kernel's output changed since these features were cached (backend 'torch', float32, cpu, "
        "extraction of 1 and 549 tokens: first changed in call order short:linear_attention.causal_conv1d_fn "
        "(kernel_faults.")
    assert clean.kernels["short:linear_attention.causal_conv1d_fn"].digest[:12] in msg
    assert second.note_change("torch", torch.float32, EXTRACT, clean.digest, earlier[clean.digest], "x") is None
    (change,) = second.to_json()["changed"]
    assert change["first"] == "short:linear_attention.causal_conv1d_fn" and change["kinds"] == ["conv1d"]
    assert change["was"] == clean.digest and change["now"] == second.get("torch", torch.float32, EXTRACT).digest
    # another shape is another registry: nothing earlier there
    assert KernelProbes(TARGET, "cpu", registry_dir=reg).earlier("torch", torch.float32, GENERATE) == {}
    shutil.rmtree(reg)  # an unreadable or missing registry only costs the message
    assert KernelProbes(TARGET, "cpu", registry_dir=reg).earlier("torch", torch.float32, EXTRACT) == {}


@pytest.mark.fla
@pytest.mark.gpu
def test_fla_kernels_are_probed_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: fla's kernels (chunk and fused recurrent delta rule) were not probed")
    r = probe(TARGET, "fla", torch.bfloat16, "cuda", EXTRACT)
    assert r.kernels["linear_attention.torch_chunk_gated_delta_rule"].function.startswith("fla.ops.gated_delta_rule")
    g = probe(TARGET, "fla", torch.bfloat16, "cuda", GENERATE)
    assert "fused_recurrent" in g.kernels["batch:decode1:linear_attention.torch_recurrent_gated_delta_rule"].function
    assert probe(TARGET, "fla", torch.bfloat16, "cuda", EXTRACT).digest == r.digest  # bit for bit, twice
    torch_r = probe(TARGET, "torch", torch.bfloat16, "cuda", EXTRACT)
    chunk = "linear_attention.torch_chunk_gated_delta_rule"
    assert torch_r.kernels[chunk].digest != r.kernels[chunk].digest
    assert torch_r.kernels["linear_attention.causal_conv1d_fn"].digest == \
        r.kernels["linear_attention.causal_conv1d_fn"].digest


def test_workers_probes_merge_into_one_valid_block(tmp_path):
    """Two xdist workers' ``provenance.kernel_probe``: each probe once, the change only one of them noticed kept, the
    probe time per worker; the merged eval.json validates against the published schema."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    from importlib import resources

    from result_rows import fragment

    from dflash_eval import report

    reg = tmp_path / "registry"
    was = KernelProbes(TARGET, "cpu", registry_dir=reg).get("torch", torch.float32, EXTRACT)
    undo = install("gate")
    try:
        gw0, gw1 = (KernelProbes(TARGET, "cpu", registry_dir=reg) for _ in range(2))
        for w in (gw0, gw1):
            w.get("torch", torch.float32, EXTRACT)
            w.get("torch", torch.float32, GENERATE)
        gw0.note_change("torch", torch.float32, EXTRACT, was.digest, was.digests(), "features")
    finally:
        undo()
    frags = [fragment(worker=name, provenance={"backend": "torch", "kernel_probe": w.to_json()})
             for name, w in (("gw1", gw1), ("gw0", gw0))]
    data = report.merge(frags, wall_s=1.0).to_dict()
    kp = data["provenance"]["kernel_probe"]
    assert [(p["backend"], p["dtype"], p["shape"]["new_tokens"]) for p in kp["probes"]] == [
        ("torch", "float32", 0), ("torch", "float32", 16)]
    assert [c["label"] for c in kp["changed"]] == ["torch/float32"] and set(kp["per_worker"]) == {"gw0", "gw1"}
    assert kp["changed"][0]["kinds"] == ["linear-attention"]
    assert kp["seconds"] == round(max(gw0.seconds, gw1.seconds), 6) > 0
    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    data["tests"] = {"counts": {}, "outcomes": {}}
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(data)))
    data["provenance"]["kernel_probe"]["changed"][0]["kinds"] = ["conv2d"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(data)))
