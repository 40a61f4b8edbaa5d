"""Kernel behaviour, not a version string, decides whether cached features are still valid (the eval suite end to end
on the bundled target and drafter, each run a pytest of its own in a subprocess):

1. a clean run warms the cache;
2. a clean re-run probes the same digests and stays warm (nothing produced, no target forward but the witness's);
3. the same libraries with transformers' torch chunked delta rule patched from OUTSIDE dflash-eval (a plugin in the
   test's folder adding 1e-2 relative noise to its output): under ``--cache-only`` the run stops with an error naming
   the changed kernel and what to do; without it the run says by name that the linear-attention kernel's output
   changed since these completions and features were cached, generates and extracts them again with the patched
   kernel, and the drift
   regression and golden fingerprint tests fail exactly as on a cold cache (the same run on an empty cache);
4. a golden fingerprint recorded by a clean run holds the probe's digests per kind of kernel, and the patched run's
   fingerprint failures name the kinds whose output changed since the recording.

5. a fault the probe cannot see (the chunked delta rule wrong only in the deeper Gated DeltaNet layers): the witness
   sees it, and the warm run fails exactly the tests the cold run fails (the teacher-forced checks as well as the
   drift and fingerprint tests: nothing the changed kernels made was used as cached), naming the cause once in its
   verdict.

Every other class of fault, warm against cold, in-process: tests/test_warm_equals_cold.py.

Run: ``pytest tests/test_kernel_probe_suite.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from kernel_faults import plugin_source

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
    """backend/dtype/shape label -> probe."""
    return {f"{p['backend']}/{p['dtype']}/{p['label']}": p for p in data["provenance"]["kernel_probe"]["probes"]}


CHUNK = "linear_attention.torch_chunk_gated_delta_rule"
EXTRACT = "torch/float32/extraction of 1 and 549 tokens"


def test_a_kernel_patched_under_a_warm_cache_is_caught_as_on_a_cold_cache(suite, tmp_path):
    cold, cold_data = suite("cold", "cache")
    assert cold.ret == 0, cold.stdout.str()
    clean = probes(cold_data)
    assert {"torch/float32/extraction of 1 and 549 tokens", "torch/bfloat16/extraction of 1 and 549 tokens",
            "torch-recurrent/float32/extraction of 1 and 549 tokens",
            "torch/float32/generation of 32 x 1-549 tokens, decoding at cache lengths 1-677"} <= set(clean), \
        sorted(clean)
    assert cold_data["provenance"]["kernel_probe"]["changed"] == []

    warm, warm_data = suite("warm", "cache", "--witness-prompts", "2")
    assert warm.ret == 0, warm.stdout.str()
    assert {k: p["digest"] for k, p in probes(warm_data).items()} == {k: p["digest"] for k, p in clean.items()}
    counts, cache = warm_data["counts"]["master"], warm_data["cache"]["master"]
    assert cache["produced"] == 0 and cache["misses"] == 0 and cache["hits"] > 0, cache
    assert counts.get("target_forwards", 0) == 0 and counts["kernel_probes"] == len(clean), counts
    witness = warm_data["provenance"]["witness"]  # both prompts of every side re-extracted, none differs
    assert witness["prompts"] == 2 and {c["side"] for c in witness["checks"]} >= {"torch/float32"}, witness
    assert all({"humaneval-0", "humaneval-1"} <= set(c["prompts"]) and not c["mismatches"]
               for c in witness["checks"]), witness
    # the fingerprint text too, on the side it is extracted on
    assert "fingerprint" in next(c for c in witness["checks"] if c["side"] == "torch/float32")["prompts"], witness
    assert warm_data["provenance"]["kernel_probe"]["changed"] == [] and "kernel's output changed" not in \
        warm.stdout.str()
    assert warm_data["provenance"]["kernel_probe"]["seconds"] > 0  # its cost: benchmarks/bench_kernel_probe.py
    golden = tmp_path / "golden"
    shutil.copytree(ROOT / "golden", golden)
    rec, _ = suite("record", "cache", "--update-fingerprints", select="fingerprint", golden=golden)
    recorded = json.loads((golden / "fingerprints" / "cpu-torch-float32.json").read_text())
    assert rec.ret == 0 and {"linear-attention", "conv1d", "gated-norm", "attention"} <= set(
        recorded["kernel_probe"]), rec.stdout.str()

    only, _ = suite("cache_only", "cache", "-p", "noisy_kernel", "--cache-only")
    out = only.stdout.str()
    # the completions come first: the generation probe, whose prefill runs the chunked rule, names the kernel
    assert only.ret != 0 and "the linear-attention kernel's output changed since these completions were cached" in \
        out and "--cache-only forbids generating it again" in out, out

    patched, data = suite("patched", "cache", "-p", "noisy_kernel")
    out = patched.stdout.str()
    assert patched.ret == 1, out
    live = probes(data)[EXTRACT]["kernels"]
    assert live[CHUNK]["function"] == "noisy_kernel.noisy_chunk_gated_delta_rule"
    assert live[CHUNK]["digest"] != clean[EXTRACT]["kernels"][CHUNK]["digest"]
    assert live["linear_attention.causal_conv1d_fn"] == clean[EXTRACT]["kernels"]["linear_attention.causal_conv1d_fn"]
    changes = {c["label"]: c for c in data["provenance"]["kernel_probe"]["changed"] if c["what"] == "features"}
    assert set(changes) == {"torch/float32", "torch/bfloat16"}, changes  # torch-recurrent's kernels are unchanged
    # named in the probe's first regime: the bucket's short end
    assert all(c["kinds"] == ["linear-attention"] and c["first"] == f"short:{CHUNK}" for c in changes.values())
    assert changes["torch/float32"]["was"] in {p["digest"] for k, p in clean.items() if k.startswith("torch/float32")}
    # the generation probe runs the chunked rule in its prefill: the completions are generated again
    assert any(c["what"] == "completions" and c["first"].endswith(CHUNK) for c in data["provenance"]["kernel_probe"][
        "changed"]), data["provenance"]["kernel_probe"]["changed"]
    assert f"kernel probe: {CHANGED}" in out and "KernelOutputChanged" in out, out
    assert data["counts"]["master"]["target_forwards"] > 0  # the features came from the patched kernel
    assert any(t.startswith("test_drift_regression[torch-vs-torch-recurrent") for t in failed(data)), failed(data)
    assert {t for t in failed(data) if t.startswith("test_fingerprint_regression")} == {
        f"test_fingerprint_regression[L{i}]" for i in range(8)}

    named, _ = suite("patched_golden", "cache", "-p", "noisy_kernel", select="fingerprint", golden=golden)
    assert named.ret == 1 and "kernel probe against the golden's: the output of" in named.stdout.str() and \
        "linear-attention" in named.stdout.str(), named.stdout.str()

    fresh, fresh_data = suite("patched_cold", "cold_cache", "-p", "noisy_kernel")
    assert fresh.ret == 1 and fresh_data["provenance"]["kernel_probe"]["changed"] == []
    assert failed(fresh_data) == failed(data)
    assert probes(fresh_data)[EXTRACT]["digest"] == probes(data)[EXTRACT]["digest"]


def test_a_fault_the_probe_cannot_see_fails_the_warm_run_as_the_cold_one(suite, pytester, tmp_path):
    (pytester.path / "deep_kernel.py").write_text(plugin_source("deep_chunk"))
    clean, _ = suite("clean", "cache", select="")
    assert clean.ret == 0, clean.stdout.str()
    shutil.copytree(tmp_path / "cache", tmp_path / "warm_cache")
    warm, warm_data = suite("warm", "warm_cache", "-p", "deep_kernel", select="")
    cold, cold_data = suite("cold", "cold_cache", "-p", "deep_kernel", select="")
    assert warm.ret == cold.ret == 1, warm.stdout.str()
    assert failed(warm_data) == failed(cold_data), (failed(warm_data) ^ failed(cold_data))
    # what the cold run fails reaches past the features: the teacher-forced check of a completion
    assert any(t.startswith("test_teacher_forced_agreement") for t in failed(cold_data)), failed(cold_data)
    changed = warm_data["provenance"]["kernel_probe"]["changed"]
    assert {c["first"] for c in changed} == {"witness"}, changed  # the probe saw nothing
    assert [c["label"] for c in changed] == ["torch/float32", "torch/bfloat16"], changed  # one per dtype it reaches
    out = warm.stdout.str()  # the cause, once in the verdict, then by name
    assert out.count("notice: the target's kernels changed since the cache was made: torch/float32 (witness), "
                     "torch/bfloat16 (witness), named below") == 1, out
    assert "kernel probe: witness: the live target's features of prompt 'fingerprint' (torch/float32)" in out, out
    assert cold_data["provenance"]["kernel_probe"]["changed"] == []
