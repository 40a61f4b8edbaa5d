"""The kernel probe (:mod:`dflash_eval.target.kernel_probe`) on the bundled target's head shapes:

- an unchanged kernel gives the same digest bit for bit in two separate processes, and the probe's kernel calls take
  well under a second on a CPU;
- a change to one kernel (the chunked or the recurrent delta rule, the attention function), patched in from outside
  dflash-eval with the same library versions, moves that kernel's digest and no other;
- the backend decides what is probed (``torch-recurrent`` probes the recurrent function for prefill; a ``+<fault>``
  suffix is already in the cache key and is not probed); the head shapes come from config.json, dense targets get
  the attention probe alone, a missing field is an error naming the file and the key;
- the registry of digests names the kernel whose output changed since features were cached; xdist workers' probes
  merge into one ``provenance.kernel_probe`` block that validates against eval.json's schema;
- with fla on a GPU, fla's chunk kernel is probed (skipped on a CPU, naming what was not checked).

Run: ``pytest tests/test_kernel_probe.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_eval.errors import ConfigError
from dflash_eval.target.kernel_probe import ProbeShapes, probe
from dflash_eval.target.kernel_registry import KernelProbes
from dflash_eval.target.loader import TargetDir

ROOT = Path(__file__).resolve().parents[1]
TARGET = TargetDir(ROOT / "fixtures" / "target")
MODELING = "transformers.models.qwen3_5.modeling_qwen3_5"

SCRIPT = """
import json, sys, torch
from dflash_eval.target.kernel_probe import probe
from dflash_eval.target.loader import TargetDir
out = {}
for dtype in (torch.float32, torch.bfloat16):
    r = probe(TargetDir(sys.argv[1]), "torch", dtype, "cpu")
    out[str(dtype)] = {"digest": r.digest, "kernels": {k: v.digest for k, v in r.kernels.items()}}
print(json.dumps(out))
"""


@pytest.fixture
def modeling():
    """The bundled target's modeling module; patches of it are undone after the test."""
    import importlib

    return importlib.import_module(MODELING)


def _inner(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _digests(r) -> dict[str, str]:
    return {k: v.digest for k, v in r.kernels.items()}


@pytest.mark.slow
def test_an_unchanged_kernel_gives_the_same_digest_in_separate_processes():
    runs = [subprocess.run([sys.executable, "-c", SCRIPT, str(TARGET.path)], capture_output=True, text=True,
                           timeout=300, cwd=ROOT) for _ in range(2)]
    assert all(p.returncode == 0 for p in runs), [p.stderr[-2000:] for p in runs]
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in runs)
    assert a == b
    here = {str(dt): probe(TARGET, "torch", dt, "cpu") for dt in (torch.float32, torch.bfloat16)}
    assert {k: {"digest": r.digest, "kernels": _digests(r)} for k, r in here.items()} == a
    assert a["torch.float32"]["digest"] != a["torch.bfloat16"]["digest"]  # the run's dtype is probed
    again = probe(TARGET, "torch", torch.float32, "cpu")
    assert again.digest == here["torch.float32"].digest
    assert again.seconds < 1.0, f"the probe's kernel calls took {again.seconds:.3f} s on a CPU"


def test_a_patched_chunk_kernel_moves_only_its_digest(modeling, monkeypatch):
    clean = probe(TARGET, "torch", torch.float32, "cpu")
    assert set(clean.kernels) == {"linear_attention_chunk", "linear_attention_recurrent", "attention"}
    assert clean.kernels["linear_attention_chunk"].function == f"{MODELING}.torch_chunk_gated_delta_rule"
    inner = _inner(modeling.torch_chunk_gated_delta_rule)

    def gate_times_1_1(query, key, value, g, beta, **kwargs):
        return inner(query, key, value, g * 1.1, beta, **kwargs)

    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule", gate_times_1_1)
    patched = probe(TARGET, "torch", torch.float32, "cpu")
    moved = {k for k in clean.kernels if clean.kernels[k].digest != patched.kernels[k].digest}
    assert moved == {"linear_attention_chunk"}
    assert patched.kernels["linear_attention_chunk"].function.endswith("gate_times_1_1")
    assert patched.digest != clean.digest
    monkeypatch.undo()
    assert probe(TARGET, "torch", torch.float32, "cpu").digest == clean.digest


def test_a_patched_recurrent_or_attention_kernel_moves_only_its_digest(modeling, monkeypatch):
    clean = _digests(probe(TARGET, "torch", torch.float32, "cpu"))
    inner = _inner(modeling.torch_recurrent_gated_delta_rule)

    def bf16_state(query, key, value, g, beta, initial_state=None, **kwargs):  # a state kept in bf16
        state = None if initial_state is None else initial_state.to(torch.bfloat16).float()
        return inner(query, key, value, g, beta, initial_state=state, **kwargs)

    monkeypatch.setattr(modeling, "torch_recurrent_gated_delta_rule", bf16_state)
    recur = _digests(probe(TARGET, "torch", torch.float32, "cpu"))
    assert {k for k in clean if clean[k] != recur[k]} == {"linear_attention_recurrent"}
    monkeypatch.undo()

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def noisy_sdpa(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        return out + 1e-6 * torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", noisy_sdpa)
    attn = _digests(probe(TARGET, "torch", torch.float32, "cpu"))
    assert {k for k in clean if clean[k] != attn[k]} == {"attention"}


def test_the_backend_decides_what_is_probed():
    torch_r = probe(TARGET, "torch", torch.float32, "cpu")
    recur_r = probe(TARGET, "torch-recurrent", torch.float32, "cpu")
    assert recur_r.kernels["linear_attention_chunk"].function == f"{MODELING}.torch_recurrent_gated_delta_rule"
    assert recur_r.kernels["linear_attention_chunk"].digest != torch_r.kernels["linear_attention_chunk"].digest
    assert recur_r.kernels["attention"].digest == torch_r.kernels["attention"].digest
    # the diagnostic fault is named in the cache key already: its backend is probed without it
    fault = probe(TARGET, "torch+noise=0.01", torch.float32, "cpu")
    assert fault.backend == "torch" and fault.digest == torch_r.digest
    assert torch_r.kernels["attention"].function.startswith("sdpa: ")  # transformers' default for this class


def _target_dir(tmp_path: Path, **over) -> TargetDir:
    d = tmp_path / "target"
    d.mkdir(exist_ok=True)
    cfg = {**json.loads((TARGET.path / "config.json").read_text()), **over}
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return TargetDir(d)


def test_head_shapes_come_from_the_config(tmp_path):
    shapes = ProbeShapes.from_target(TARGET)
    assert shapes == ProbeShapes(num_heads=4, num_kv_heads=2, head_dim=64, linear=(4, 4, 32, 32))
    r = probe(TARGET, "torch", torch.float32, "cpu")
    assert r.kernels["linear_attention_chunk"].shapes["value"] == [1, 80, 4, 32]
    assert r.kernels["attention"].shapes["key"] == [1, 2, 24, 64]
    # grouped value heads (more value than key heads), as the large Qwen3.5 models have
    wide = probe(_target_dir(tmp_path, linear_num_value_heads=8, linear_value_head_dim=16), "torch", torch.float32,
                 "cpu")
    assert wide.kernels["linear_attention_chunk"].shapes["value"] == [1, 80, 8, 16]
    assert wide.digest != r.digest

    with pytest.raises(ConfigError, match=r"config\.json: no 'linear_key_head_dim', which the kernel probe needs"):
        ProbeShapes.from_target(_target_dir(tmp_path, linear_key_head_dim=None))
    with pytest.raises(ConfigError, match=r"linear_num_value_heads 6 is not a multiple of linear_num_key_heads 4"):
        ProbeShapes.from_target(_target_dir(tmp_path, linear_num_value_heads=6))


def test_a_dense_target_gets_the_attention_probe_alone(tmp_path):
    d = tmp_path / "dense"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                               "hidden_size": 64, "num_attention_heads": 4,
                                               "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                                               "vocab_size": 128}))
    r = probe(TargetDir(d), "torch", torch.float32, "cpu")
    assert set(r.kernels) == {"attention"} and r.shapes.linear is None
    assert r.kernels["attention"].shapes["query"] == [1, 4, 24, 16]


def test_the_registry_names_the_changed_kernel(tmp_path, modeling, monkeypatch):
    reg = tmp_path / "registry"
    first = KernelProbes(TARGET, "cpu", registry_dir=reg)
    clean = first.get("torch", torch.float32)
    assert first.earlier("torch", torch.float32) == {}
    inner = _inner(modeling.torch_chunk_gated_delta_rule)

    def noisy(query, key, value, g, beta, **kwargs):
        out, state = inner(query, key, value, g, beta, **kwargs)
        return out + 1e-2 * out.pow(2).mean().sqrt() * torch.randn(out.shape, generator=torch.Generator()), state

    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule", noisy)
    second = KernelProbes(TARGET, "cpu", registry_dir=reg)  # another run, same cache, the kernel patched
    earlier = second.earlier("torch", torch.float32)
    assert list(earlier) == [clean.digest]
    msg = second.note_change("torch", torch.float32, clean.digest, earlier[clean.digest], "features")
    assert msg is not None and msg.startswith(
        "the linear-attention kernel's output changed since these features were cached (backend 'torch', float32")
    assert "noisy" in msg and clean.kernels["linear_attention_chunk"].digest[:12] in msg
    assert second.note_change("torch", torch.float32, clean.digest, earlier[clean.digest], "features") is None
    (change,) = second.to_json()["changed"]
    assert change["kernels"] == ["linear_attention_chunk"] and change["kinds"] == ["linear-attention"]
    assert change["was"] == clean.digest and change["now"] == second.get("torch", torch.float32).digest
    shutil.rmtree(reg)  # an unreadable or missing registry only costs the message
    assert KernelProbes(TARGET, "cpu", registry_dir=reg).earlier("torch", torch.float32) == {}


@pytest.mark.fla
@pytest.mark.gpu
def test_fla_chunk_kernel_is_probed_on_a_gpu():
    r = probe(TARGET, "fla", torch.bfloat16, "cuda")
    assert r.kernels["linear_attention_chunk"].function.startswith("fla.ops.gated_delta_rule")
    assert "fused_recurrent" in r.kernels["linear_attention_recurrent"].function
    assert probe(TARGET, "fla", torch.bfloat16, "cuda").digest == r.digest  # bit for bit, twice
    torch_r = probe(TARGET, "torch", torch.bfloat16, "cuda")
    assert torch_r.kernels["linear_attention_chunk"].digest != r.kernels["linear_attention_chunk"].digest
    assert torch_r.kernels["attention"].digest == r.kernels["attention"].digest


def test_workers_probes_merge_into_one_valid_block(tmp_path, modeling, monkeypatch):
    """Two xdist workers' ``provenance.kernel_probe``: each probe once, the change only one of them noticed kept, the
    probe time per worker; the merged eval.json validates against the published schema."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    from importlib import resources

    from dflash_eval import report

    reg = tmp_path / "registry"
    clean = KernelProbes(TARGET, "cpu", registry_dir=reg)
    was = clean.get("torch", torch.float32)
    inner = _inner(modeling.torch_chunk_gated_delta_rule)
    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule",
                        lambda q, k, v, g, beta, **kw: inner(q, k, v, g * 1.1, beta, **kw))
    gw0, gw1 = (KernelProbes(TARGET, "cpu", registry_dir=reg) for _ in range(2))
    for w in (gw0, gw1):
        w.get("torch", torch.float32)
        w.get("torch-recurrent", torch.float32)
    gw0.note_change("torch", torch.float32, was.digest, {k: v.digest for k, v in was.kernels.items()}, "features")
    frags = [{"worker": name, "provenance": {"backend": "torch", "kernel_probe": w.to_json()}, "prompts": {}}
             for name, w in (("gw1", gw1), ("gw0", gw0))]
    data = report.merge(frags, wall_s=1.0)
    kp = data["provenance"]["kernel_probe"]
    assert [(p["backend"], p["dtype"]) for p in kp["probes"]] == [("torch", "float32"), ("torch-recurrent", "float32")]
    assert [c["label"] for c in kp["changed"]] == ["torch/float32"] and set(kp["per_worker"]) == {"gw0", "gw1"}
    assert kp["seconds"] == round(max(gw0.seconds, gw1.seconds), 6) > 0
    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    data["tests"] = {"counts": {}, "outcomes": {}}
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(data)))
    data["provenance"]["kernel_probe"]["changed"][0]["kinds"] = ["conv1d"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(data)))
