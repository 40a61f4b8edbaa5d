"""Kernel behaviour, not a version string, decides whether cached features are still valid (the eval suite end to end
on the bundled target and drafter, each run a pytest of its own in a subprocess):

1. a clean run warms the cache;
2. a clean re-run probes the same digests and stays warm (nothing produced, no target forward);
3. the same libraries with transformers' torch chunked delta rule patched from OUTSIDE dflash-eval (a plugin in the
   test's folder adding 1e-2 relative noise to its output): under ``--cache-only`` the run stops with an error naming
   the changed kernel and what to do; without it the run says by name that the linear-attention kernel's output
   changed since these features were cached, re-extracts the features with the patched kernel, and the drift
   regression and golden fingerprint tests fail exactly as on a cold cache (the same run on an empty cache);
4. a golden fingerprint recorded by a clean run holds the probe's digests, and the patched run's fingerprint failures
   name the kernel whose output changed since the recording.

Run: ``pytest tests/test_kernel_probe_suite.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"
pytestmark = pytest.mark.slow
SELECT = "drift_regression or fingerprint"
CHANGED = "the linear-attention kernel's output changed since these features were cached (backend 'torch'"

NOISY_KERNEL = '''
"""1e-2 relative noise (seeded) on the output of transformers' torch chunked delta rule, patched in its module."""
import torch
import transformers.models.qwen3_5.modeling_qwen3_5 as modeling

_torch_chunk = modeling.torch_chunk_gated_delta_rule
while hasattr(_torch_chunk, "__wrapped__"):
    _torch_chunk = _torch_chunk.__wrapped__


def noisy_chunk_gated_delta_rule(query, key, value, g, beta, **kwargs):
    out, state = _torch_chunk(query, key, value, g, beta, **kwargs)
    noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.device)
    return (out.float() + 1e-2 * out.float().pow(2).mean().sqrt() * noise).to(out.dtype), state


modeling.torch_chunk_gated_delta_rule = noisy_chunk_gated_delta_rule
'''


@pytest.fixture
def suite(pytester, suite_checkout, tmp_path):
    suite_checkout()
    (pytester.path / "noisy_kernel.py").write_text(NOISY_KERNEL)

    def run(name: str, cache: str, *args: str, select: str = SELECT, golden: Path = ROOT / "golden"):
        report = tmp_path / name
        res = pytester.runpytest_subprocess(
            "tests_eval", "-q", "-k", select, "--target-model", str(TARGET), "--drafter", str(DRAFTER),
            "--prompts", "humaneval:2", "--cache-dir", str(tmp_path / cache), "--golden-dir", str(golden),
            "--floors-file", str(ROOT / "golden" / "tau_floors.json"), "--report-dir", str(report), *args,
            timeout=600)
        data = json.loads((report / "eval.json").read_text()) if (report / "eval.json").is_file() else {}
        return res, data

    return run


def failed(data: dict) -> set[str]:
    return {k.split("::")[-1] for k, v in data["tests"]["outcomes"].items() if v == "failed"}


def probes(data: dict) -> dict[str, dict]:
    return {f"{p['backend']}/{p['dtype']}": p for p in data["provenance"]["kernel_probe"]["probes"]}


def test_a_kernel_patched_under_a_warm_cache_is_caught_as_on_a_cold_cache(suite, tmp_path):
    cold, cold_data = suite("cold", "cache")
    assert cold.ret == 0, cold.stdout.str()
    clean = probes(cold_data)
    assert {"torch/float32", "torch/bfloat16", "torch-recurrent/float32"} <= set(clean)
    assert cold_data["provenance"]["kernel_probe"]["changed"] == []

    warm, warm_data = suite("warm", "cache")
    assert warm.ret == 0, warm.stdout.str()
    assert {k: p["digest"] for k, p in probes(warm_data).items()} == {k: p["digest"] for k, p in clean.items()}
    counts, cache = warm_data["counts"]["master"], warm_data["cache"]["master"]
    assert cache["produced"] == 0 and cache["misses"] == 0 and cache["hits"] > 0, cache
    assert counts.get("target_forwards", 0) == 0 and counts["kernel_probes"] == len(clean), counts
    assert warm_data["provenance"]["kernel_probe"]["changed"] == [] and "kernel's output changed" not in \
        warm.stdout.str()
    assert 0 < warm_data["provenance"]["kernel_probe"]["seconds"] < 30
    golden = tmp_path / "golden"
    shutil.copytree(ROOT / "golden", golden)
    rec, _ = suite("record", "cache", "--update-fingerprints", select="fingerprint", golden=golden)
    recorded = json.loads((golden / "fingerprints" / "cpu-torch-float32.json").read_text())
    assert rec.ret == 0 and recorded["kernel_probe"] == {k: v["digest"] for k, v in clean["torch/float32"][
        "kernels"].items()}, rec.stdout.str()

    only, _ = suite("cache_only", "cache", "-p", "noisy_kernel", "--cache-only")
    out = only.stdout.str()
    assert only.ret != 0 and CHANGED in out and "--cache-only forbids re-extracting them" in out, out

    patched, data = suite("patched", "cache", "-p", "noisy_kernel")
    out = patched.stdout.str()
    assert patched.ret == 1, out
    live = probes(data)["torch/float32"]["kernels"]
    assert live["linear_attention_chunk"]["function"] == "noisy_kernel.noisy_chunk_gated_delta_rule"
    assert live["linear_attention_chunk"]["digest"] != clean["torch/float32"]["kernels"]["linear_attention_chunk"][
        "digest"]
    assert live["attention"] == clean["torch/float32"]["kernels"]["attention"]
    changes = {c["label"]: c for c in data["provenance"]["kernel_probe"]["changed"]}
    assert set(changes) == {"torch/float32", "torch/bfloat16"}, changes  # torch-recurrent's kernels are unchanged
    assert all(c["kinds"] == ["linear-attention"] and c["kernels"] == ["linear_attention_chunk"]
               for c in changes.values())
    assert changes["torch/float32"]["was"] == clean["torch/float32"]["digest"]
    assert f"kernel probe: {CHANGED}" in out and "KernelOutputChanged" in out, out
    assert data["counts"]["master"]["target_forwards"] > 0  # the features came from the patched kernel
    assert any(t.startswith("test_drift_regression[torch-vs-torch-recurrent") for t in failed(data)), failed(data)
    assert {t for t in failed(data) if t.startswith("test_fingerprint_regression")} == {
        f"test_fingerprint_regression[L{i}]" for i in range(8)}

    named, _ = suite("patched_golden", "cache", "-p", "noisy_kernel", select="fingerprint", golden=golden)
    assert named.ret == 1 and "kernel probe against the golden's: the output of linear_attention_chunk changed" in \
        named.stdout.str(), named.stdout.str()

    fresh, fresh_data = suite("patched_cold", "cold_cache", "-p", "noisy_kernel")
    assert fresh.ret == 1 and fresh_data["provenance"]["kernel_probe"]["changed"] == []
    assert failed(fresh_data) == failed(data)
    assert probes(fresh_data)["torch/float32"]["digest"] == probes(data)["torch/float32"]["digest"]
