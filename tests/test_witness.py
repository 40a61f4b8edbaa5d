"""The witness (:mod:`dflash_eval.features.witness`): a warm run re-extracts a seeded sample of its prompts with the
live target and compares them with the cached features.

- a fault the kernel probe cannot see (noise in the recurrent delta rule's prefill on sequences shorter than the
  probe's, patched from outside dflash-eval) leaves every probe digest as it was, and the witness, before anything of
  float32 is used, says which side, prompt, target layer and first position differ; everything the float32 kernels
  made is made again with the live kernels (a new witness token in their keys: the other side's features too, equal
  to the clean ones), and the features then equal a cold run's under the same fault, bit for bit;
- the next warm run with the same kernels reuses them (nothing produced); a run whose kernels went back to the clean
  ones goes back to the first entries (witnessed under the earlier token: nothing produced either);
- under ``--cache-only`` the mismatch is an error naming what differs and what to do;
- the τ impact of a mismatch is added to its message where the run's result is built;
- the cold run caches the decode steps of its shortest and longest sequences beside their features; a warm run makes
  them again, and a fault on the deeper layers' decode path alone is named as a decode mismatch;
- ``--witness-prompts 0`` checks nothing; a CPU compares bit for bit (with the torch thread count the cached
  features were extracted with), a GPU within the measured bound.

Run: ``pytest tests/test_witness.py -p no:cacheprovider``
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from kernel_faults import MODELING, install, noisy

from dflash_eval.errors import CacheError
from dflash_eval.features.witness import GPU_BOUND, reproducibility_bound
from dflash_eval.metrics.drift import Side
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_result import _with_witness_impact
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.target.kernel_probe import MIN_BUCKET
from dflash_eval.target.kernel_registry import KernelOutputChanged

ROOT = Path(__file__).resolve().parents[1]
RECURRENT = Side("torch-recurrent", torch.float32)
pytestmark = pytest.mark.slow


def _session(cache: Path, **over) -> EvalSession:
    s = EvalSettings.from_mapping({
        "target_model": ROOT / "fixtures" / "target", "drafter": ROOT / "fixtures" / "drafter",
        "prompts": ROOT / "fixtures" / "prompts.jsonl", "num_prompts": 2, "max_new_tokens": 16, "cache_dir": cache,
        "device": "cpu", "torch_threads": 1, "witness_prompts": 1, **over})
    return EvalSession(s, worker=("master", 0, 1), progress=None)


def _features(session: EvalSession, side: Side = RECURRENT) -> dict[str, dict[int, torch.Tensor]]:
    feats = session.evaluation.features(side)
    return {pid: dict(feats[pid]) for pid in feats}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[p][i], b[p][i]) for p in a for i in a[p])


@pytest.fixture
def short_prefill_fault(monkeypatch: pytest.MonkeyPatch):
    """Noise on the recurrent delta rule's multi-token calls shorter than the shortest probe: the torch-recurrent
    side's prefill of the bundled prompts, never a probe (and never the torch backend's generation)."""
    mod = importlib.import_module(MODELING)
    recur = mod.torch_recurrent_gated_delta_rule
    while hasattr(recur, "__wrapped__"):
        recur = recur.__wrapped__

    def short_prefill(query, key, value, g, beta, **kw):
        out, state = recur(query, key, value, g, beta, **kw)
        return (noisy(out) if 1 < query.shape[1] < MIN_BUCKET else out), state

    def install() -> None:
        monkeypatch.setattr(mod, "torch_recurrent_gated_delta_rule", short_prefill)

    return install


def test_the_witness_catches_what_the_probe_cannot_see(tmp_path, short_prefill_fault, monkeypatch):
    cache = tmp_path / "cache"
    first = _session(cache)
    clean = _features(first)
    clean_probes = {k: r.digest for k, r in first.inputs.kernel_probes.results.items()}
    assert first.store.witness.checks[RECURRENT.label].skipped  # a cold run: nothing cached to compare
    shutil.copytree(cache, tmp_path / "cache_only")

    short_prefill_fault()
    warm = _session(cache)
    with pytest.warns(KernelOutputChanged, match=r"witness: the live target's features of prompt 'code-bisect-[01]' "
                                                 r"\(torch-recurrent/float32\) differ from the cached ones bit for "
                                                 r"bit: target layer 1, first at position 0 of \d+ \(layer rel_err "):
        faulty = _features(warm)
    assert {k: r.digest for k, r in warm.inputs.kernel_probes.results.items() if k in clean_probes} == clean_probes
    check = warm.store.witness.checks[RECURRENT.label]
    assert check.mismatches and {m.prompt for m in check.mismatches} <= set(check.prompts)
    assert all((m.layer, m.position, m.bound) == (1, 0, 0.0) and m.rel_err > 0 for m in check.mismatches)
    assert check.token
    assert warm.inputs.cache.stats.produced > 0 and not _equal(faulty, clean)
    (change,) = [c for c in warm.inputs.kernel_probes.changes if c["kinds"] == ["witness"]]
    assert change["now"] == check.token and change["was"] == "" and "made again with the live kernels" in \
        change["message"]
    # the torch side's features were witnessed too, before anything of float32 was used, and match: its kernels are
    # not on the fault's path; the verdict is the dtype's, so they are made again under the new token, equal
    assert not warm.store.witness.checks[warm.inputs.eval_side.label].mismatches
    assert warm.inputs.kernel_verdict.decided()["torch.float32"] == check.token
    assert _equal(_features(warm, warm.inputs.eval_side), _features(first, first.inputs.eval_side))

    cold = _session(tmp_path / "cold")
    assert _equal(_features(cold), faulty)  # the warm run reads what a cold run makes

    again = _session(cache)
    assert _equal(_features(again), faulty) and again.inputs.cache.stats.produced == 0  # the new token's features
    assert not again.store.witness.checks[RECURRENT.label].mismatches

    with pytest.raises(CacheError, match=r"witness: .* target layer 1, first at position 0 .*--cache-only forbids "
                                         r"making again what the float32 kernels made "
                                         r"\(the features of torch-recurrent/float32"):
        _features(_session(tmp_path / "cache_only", cache_only=True))

    monkeypatch.undo()  # the clean kernels again: back to the first features, nothing extracted
    back = _session(cache)
    with pytest.warns(KernelOutputChanged, match="witness token"):
        restored = _features(back)
    assert _equal(restored, clean) and back.store.witness.checks[RECURRENT.label].token == ""
    assert back.inputs.cache.stats.produced == 0


def test_the_tau_impact_of_a_mismatch_is_reported(monkeypatch):
    """The layer's relative error goes to :func:`dflash_eval.metrics.drift_budget.impact` with the drafter's budget;
    its verdict is added to the entry and its message."""
    import dflash_eval.session.eval_result as eval_result

    budget = SimpleNamespace(name="the drafter's budget")
    seen = []
    monkeypatch.setattr(eval_result, "impact", lambda rel, b: seen.append((rel, b)) or "τ impact: within budget (x)")
    change = {"label": "torch/float32", "was": "", "now": "abc", "kernels": ["witness"], "kinds": ["witness"],
              "message": "witness: ...", "witness": {"rel_err": 1e-3}}
    probe_change = {**change, "kinds": ["conv1d"], "witness": None}
    ev = SimpleNamespace(drift_budget=lambda: budget)
    out = _with_witness_impact(ev, {"probes": [], "changed": [change, probe_change]})  # type: ignore[arg-type]
    assert seen == [(1e-3, budget)]
    assert out["changed"][0]["tau_impact"] == "τ impact: within budget (x)"
    assert out["changed"][0]["message"] == "witness: ...; τ impact: within budget (x)"
    assert "tau_impact" not in out["changed"][1]
    assert change["message"] == "witness: ..."  # the process's own record is left as it was


def test_no_witness_checks_nothing(tmp_path):
    _features(_session(tmp_path / "cache"))
    off = _session(tmp_path / "cache", witness_prompts=0)
    _features(off)
    assert off.store.witness.checks == {} and not off.inputs.target_loaded
    with pytest.raises(Exception, match="--witness-prompts must be >= 0"):
        _session(tmp_path / "cache", witness_prompts=-1).inputs.settings.validate_values()


def test_the_witness_extracts_with_the_thread_count_of_the_cache(tmp_path, monkeypatch):
    """The torch-recurrent rule's last bits depend on the CPU thread count (benchmarks/bench_witness.py --threads):
    a cache filled with one thread is witnessed with one thread by a process running two."""
    import dflash_eval.features.witness as witness_mod

    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _features(_session(tmp_path / "cache"))
        torch.set_num_threads(2)
        seen = []
        real = witness_mod.layer_features

        def spy(*a, **k):
            seen.append(torch.get_num_threads())
            return real(*a, **k)

        monkeypatch.setattr(witness_mod, "layer_features", spy)
        warm = _session(tmp_path / "cache")
        _features(warm)
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2  # every witnessed prompt, one thread
        assert not warm.store.witness.checks[RECURRENT.label].mismatches
    finally:
        torch.set_num_threads(saved)


def test_a_cpu_compares_bit_for_bit_a_gpu_within_the_measured_bound():
    assert reproducibility_bound(RECURRENT, "cpu") == 0.0
    assert reproducibility_bound(Side("fla", torch.bfloat16), "cuda") == GPU_BOUND["torch.bfloat16"]


def test_decode_steps_are_cached_for_the_next_witness_and_named_when_they_move(tmp_path):
    """The cold run caches the decode steps the next witness makes again (:meth:`Witness.decode_plan`: batch 1, a
    prefill with the model's cache, then single-token steps right after the prompt of the shortest sequence and at
    the end of the longest), which equal the teacher-forced logits at those positions up to float rounding; a warm
    run makes them again and compares them bit for bit, so a fault on the decode path alone (single-token calls of
    the recurrent rule in the deeper layers, which no prefill, no feature and no probe runs) is named as a decode
    mismatch of the evaluation side."""
    from dflash_eval.references.teacher_forced import DECODE_STEPS, decode_request

    off = _session(tmp_path / "off", witness_prompts=0, num_prompts=4)  # no witness: no decode entries
    _features(off, off.inputs.eval_side)
    assert off.store.witness.decode_plan() == {} and not list((tmp_path / "off").rglob("decode"))
    cache = tmp_path / "cache"
    cold = _session(cache, num_prompts=4)
    _features(cold, cold.inputs.eval_side)
    refs = cold.evaluation.references
    comps = refs.completions()
    seqs = {pid: comps[pid].sequence for pid in comps}
    short, long = min(seqs, key=lambda p: (len(seqs[p]), p)), max(seqs, key=lambda p: (len(seqs[p]), p))
    plan = cold.store.witness.decode_plan()
    assert plan == {short: (len(refs.prompt_ids(short)),), long: (len(seqs[long]) - DECODE_STEPS,)}, plan
    for pid, starts in plan.items():
        entry = cold.inputs.cache.lookup(decode_request(cold.inputs, pid, seqs[pid], starts), count=False)
        assert entry is not None, pid
        positions = [p for s in starts for p in range(s, min(s + DECODE_STEPS, len(seqs[pid])))]
        top = refs.argmax.top(pid)
        assert torch.equal(entry.tensors["top_ids"][:, 0], top["top_ids"][positions, 0])
        assert torch.allclose(entry.tensors["top_logits"], top["top_logits"][positions], atol=1e-4)

    warm = _session(cache, num_prompts=4)
    _features(warm, warm.inputs.eval_side)
    check = warm.store.witness.checks[warm.inputs.eval_side.label]
    assert set(check.decoded) == set(plan) and not check.mismatches  # the witness made the cached steps again

    undo = install("deep_decode")  # the deeper layers' single-token calls only: no probe runs them
    try:
        faulty = _session(cache, num_prompts=4)
        with pytest.warns(KernelOutputChanged, match=r"witness: the live target's decode steps of prompt '[^']+' "
                                                     r"\(torch/float32\) differ from the cached ones bit for bit: "
                                                     r"first at the step that reads position \d+ of \d+"):
            _features(faulty, faulty.inputs.eval_side)
    finally:
        undo()
    found = faulty.store.witness.checks[faulty.inputs.eval_side.label].mismatches
    assert found and all(m.what == "decode" and m.prompt in plan and m.position >= plan[m.prompt][0]
                         for m in found), found
