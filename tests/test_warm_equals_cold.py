"""For every class of kernel fault, a warm run's evidence is a cold run's: with a fault patched in from OUTSIDE
dflash-eval (tests/kernel_faults.py) a run on a cache warmed by clean kernels reads or makes exactly the completions,
teacher-forced argmax, features (every side the drift tests compare), fingerprint and τ that the same run makes on
an empty cache, bit for bit; and the fault shows in that evidence (it differs from the clean run's), so the warm run
cannot have passed on stale evidence; and the warm run names a kernel whose output changed (the probe's, or the
witness's mismatch).

The fault classes the kernel probe sees: noise on the chunked delta rule's output, its decay gate x1.1, bf16
accumulation in it, noise only on inputs longer than the sequences the old probe ran (:data:`kernel_faults.LONG`
tokens), in ``causal_conv1d_fn``, in ``causal_conv1d_update`` (decode steps), in the gated RMSNorm, on decode steps of
the recurrent rule only, on attention with long queries, in the recurrent rule's prefill (the ``torch-recurrent``
side); and faults confined to a length regime within one probe bucket or to a batch size: the chunked rule on the
bucket's shorter sequences only, on single-chunk calls only (the fingerprint text), attention on decode steps over a
short or a long KV cache only, the recurrent rule on decode steps of batches of more than one sequence only.

The fault classes it cannot see (:data:`kernel_faults.BLIND`), confined to what its one-layer model on seeded
weights and inputs never runs: the deeper layers (the chunked rule; the recurrent rule, the other kernel path), the
large activations of the real target's deeper layers, one dtype (bf16 only, in a bf16 run), positions past some
length (the rotary tables), the layers past the deepest one the drafter reads (only the logits show it). The witness
sees them on the real target, and the run's verdict on its kernels then keeps every entry those kernels made from
being used: the warm run makes them again, as the cold run does. One class no warm check sees
(:data:`kernel_faults.UNSEEN`: batched decode steps in the deeper layers) is checked to stay unseen, the limit
docs/design.md states.

In-process (the session API, as the suite's fixtures use it) on the bundled target and drafter, 2 prompts x 64 new
tokens, one thread: the stages the suite's tests read, without pytest around them. The same end to end through the
suite, exit codes and failing tests included: tests/test_kernel_probe_suite.py.

Run: ``pytest tests/test_warm_equals_cold.py -p no:cacheprovider``
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_faults import BLIND, FAULTS, SETTINGS, UNSEEN, install

from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _session(cache: Path, **over: object) -> EvalSession:
    s = EvalSettings.from_mapping({
        "target_model": ROOT / "fixtures" / "target", "drafter": ROOT / "fixtures" / "drafter",
        "prompts": ROOT / "fixtures" / "prompts.jsonl", "num_prompts": 2, "max_new_tokens": 64, "cache_dir": cache,
        "device": "cpu", "torch_threads": 1, "witness_prompts": 1, **over})
    return EvalSession(s, worker=("master", 0, 1), progress=None)


def evidence(session: EvalSession) -> dict[str, Any]:
    """What the suite's tests read: every prompt's completion and teacher-forced entry, the features of every side
    the run compares at the drafter's layers, the fingerprint's per-layer statistics, every prompt's τ (chain and
    DDTree accept lengths: a memoised result keyed by the entries it was computed from)."""
    out: dict[str, Any] = {}
    comps = session.completions()
    for pid, rec in comps.items():
        out[f"completion/{pid}"] = torch.tensor(rec.output_ids)
        for name, t in session.references.argmax.top(pid).items():  # the best ids and their logits
            out[f"argmax/{pid}/{name}"] = t
    for pid, tau in session.tau_results.items():
        out[f"tau/{pid}"] = [tau.chain.accept_lengths, {b: r.accept_lengths for b, r in tau.ddtree.items()}]
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
def warm_caches(tmp_path_factory) -> Callable[[str], tuple[Path, dict[str, Any]]]:
    """A cache warmed by a clean run under a fault's settings (:data:`kernel_faults.SETTINGS`), and that run's
    evidence; one per settings."""
    made: dict[str, tuple[Path, dict[str, Any]]] = {}

    def warmed(fault: str) -> tuple[Path, dict[str, Any]]:
        over = SETTINGS.get(fault, {})
        name = "-".join(f"{k}-{v}" for k, v in sorted(over.items())) or "default"
        if name not in made:
            cache = tmp_path_factory.mktemp(f"clean-{name}") / "cache"
            made[name] = cache, evidence(_session(cache, **over))
        return made[name]

    return warmed


def _warm_and_cold(fault: str, clean_cache: Path, tmp_path: Path) -> tuple[EvalSession, dict[str, Any], dict[str, Any]]:
    """The warm session on a copy of the clean cache and both runs' evidence, with ``fault`` installed."""
    over = SETTINGS.get(fault, {})
    warm_cache = tmp_path / "warm"
    shutil.copytree(clean_cache, warm_cache)
    undo = install(fault)
    try:
        warm = _session(warm_cache, **over)
        warm_ev = evidence(warm)
        cold_ev = evidence(_session(tmp_path / "cold", **over))
    finally:
        undo()
    return warm, warm_ev, cold_ev


@pytest.mark.parametrize("fault", FAULTS + BLIND)
def test_a_warm_run_reads_what_a_cold_run_makes(fault: str, warm_caches, tmp_path) -> None:
    clean_cache, clean = warm_caches(fault)
    warm, warm_ev, cold_ev = _warm_and_cold(fault, clean_cache, tmp_path)
    differs = _same(warm_ev, cold_ev)
    assert not differs, f"{fault}: the warm run read other evidence than the cold run made: {differs[:8]}"
    moved = _same(clean, cold_ev)
    assert moved, f"{fault}: the fault changed nothing the run reads (the test would prove nothing)"
    assert warm.inputs.cache.stats.produced > 0, f"{fault}: the warm run produced nothing, yet {moved[:4]} moved"
    changed = warm.inputs.kernel_probes.to_json()["changed"]
    assert changed, f"{fault}: the warm run did not say which kernel's output changed"
    kernels = {k for p in warm.inputs.kernel_probes.results.values() for k in p.kernels}
    assert {c["first"] for c in changed} <= kernels | {"witness"}
    if fault in BLIND:  # the probe saw nothing: the witness did
        assert {c["first"] for c in changed} == {"witness"}, changed


@pytest.mark.parametrize("fault", UNSEEN)
def test_a_fault_no_warm_check_sees_stays_unseen(fault: str, warm_caches, tmp_path) -> None:
    """The limit docs/design.md states ("What the warm run re-checks and what it cannot see"): decode steps of
    batches confined to the deeper layers change the completions of a cold run (made in batches), and nothing a warm
    run re-checks runs them (the witness decodes one sequence at a time)."""
    clean_cache, clean = warm_caches(fault)
    warm, warm_ev, cold_ev = _warm_and_cold(fault, clean_cache, tmp_path)
    assert any(k.startswith("completion/") for k in _same(clean, cold_ev)), "the fault moved no completion"
    assert not _same(clean, warm_ev) and warm.inputs.cache.stats.produced == 0
    assert warm.inputs.kernel_probes.to_json()["changed"] == []
