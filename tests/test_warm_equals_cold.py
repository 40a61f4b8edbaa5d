"""For every class of kernel fault, a warm run's evidence is a cold run's: with a fault patched in from OUTSIDE
dflash-eval (tests/kernel_faults.py) a run on a cache warmed by clean kernels reads or makes exactly the completions,
teacher-forced argmax, features (every side the drift tests compare) and fingerprint that the same run makes on an
empty cache, bit for bit; and the fault shows in that evidence (it differs from the clean run's), so the warm run
cannot have passed on stale evidence; and the warm run names a kernel whose output changed (the probe's, or the
witness's mismatch).

The fault classes: noise on the chunked delta rule's output, its decay gate x1.1, bf16 accumulation in it, noise only
on inputs longer than the sequences the old probe ran (:data:`kernel_faults.LONG` tokens), in ``causal_conv1d_fn``,
in ``causal_conv1d_update`` (decode steps), in the gated RMSNorm, on decode steps of the recurrent rule only, on
attention with long queries, in the recurrent rule's prefill (the ``torch-recurrent`` side); and faults confined to
a length regime within one probe bucket or to a batch size: the chunked rule on the bucket's shorter sequences only,
on single-chunk calls only (the fingerprint text), attention on decode steps over a short or a long KV cache only,
the recurrent rule on decode steps of batches of more than one sequence only. In-process (the
session API, as the suite's fixtures use it) on the bundled target and drafter, 2 prompts x 64 new tokens, one
thread: the stages the suite's tests read, without pytest around them. The same for one class end to end through
the suite, exit codes and test outcomes included: tests/test_kernel_probe_suite.py.

Run: ``pytest tests/test_warm_equals_cold.py -p no:cacheprovider``
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_faults import FAULTS, install

from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _session(cache: Path) -> EvalSession:
    s = EvalSettings.from_mapping({
        "target_model": ROOT / "fixtures" / "target", "drafter": ROOT / "fixtures" / "drafter",
        "prompts": ROOT / "fixtures" / "prompts.jsonl", "num_prompts": 2, "max_new_tokens": 64, "cache_dir": cache,
        "device": "cpu", "torch_threads": 1, "witness_prompts": 1})
    return EvalSession(s, worker=("master", 0, 1), progress=None)


def evidence(session: EvalSession) -> dict[str, Any]:
    """What the suite's tests read: every prompt's completion and teacher-forced argmax, the features of every side
    the run compares at the drafter's layers, the fingerprint's per-layer statistics."""
    out: dict[str, Any] = {}
    comps = session.completions()
    for pid, rec in comps.items():
        out[f"completion/{pid}"] = torch.tensor(rec.output_ids)
        out[f"argmax/{pid}"] = session.references.teacher_forced(pid)[0]
    sides = {session.inputs.eval_side} | {side for c in session.inputs.comparisons if not c.skip_reason
                                          for side in (c.a, c.b)}
    for side in sorted(sides, key=lambda s: s.label):
        feats = session.evaluation.features(side)
        for pid in feats:
            for layer, t in feats[pid].items():
                out[f"features/{side.label}/{pid}/L{layer}"] = t
    out["fingerprint"] = session.store.fingerprint()["layers"]
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The names whose evidence differs (tensors bit for bit)."""
    def eq(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        return x == y

    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or not eq(a[k], b[k]))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """A cache warmed by a clean run, and that run's evidence."""
    cache = tmp_path_factory.mktemp("clean") / "cache"
    return cache, evidence(_session(cache))


@pytest.mark.parametrize("fault", FAULTS)
def test_a_warm_run_reads_what_a_cold_run_makes(fault: str, warmed, tmp_path) -> None:
    clean_cache, clean = warmed
    warm_cache = tmp_path / "warm"
    shutil.copytree(clean_cache, warm_cache)
    undo = install(fault)
    try:
        warm = _session(warm_cache)
        warm_ev = evidence(warm)
        cold_ev = evidence(_session(tmp_path / "cold"))
    finally:
        undo()
    differs = _same(warm_ev, cold_ev)
    assert not differs, f"{fault}: the warm run read other evidence than the cold run made: {differs[:8]}"
    moved = _same(clean, cold_ev)
    assert moved, f"{fault}: the fault changed nothing the run reads (the test would prove nothing)"
    assert warm.inputs.cache.stats.produced > 0, f"{fault}: the warm run produced nothing, yet {moved[:4]} moved"
    changed = warm.inputs.kernel_probes.to_json()["changed"]
    assert changed, f"{fault}: the warm run did not say which kernel's output changed"
    assert {c["first"] for c in changed} <= {k for p in warm.inputs.kernel_probes.results.values() for k in p.kernels}
