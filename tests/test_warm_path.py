"""Checkpoint after checkpoint, a warm run loads only what it needs.

- a warm session never builds the target (load_target is made to raise) nor the tokenizer, reads exactly the
  embedding and lm_head tensors from the safetensors files, and does not re-hash the weights;
- the same with a sharded target (model.safetensors.index.json);
- a drafter with other target_layer_ids extracts only the missing layers, in one forward per prompt;
- an interrupted cold run keeps what it finished and the next run resumes;
- progress lines (prompts done / total, tokens/s) on productions;
- ``EvalSession(..., shared=first)``: a second checkpoint reuses the first session's stages.

Run: ``pytest tests/test_warm_path.py -p no:cacheprovider --torch-threads 1``
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from patch_uses import patch_uses

import dflash_eval.target.generation as generation_mod
import dflash_eval.target.head as head_mod
import dflash_eval.target.hidden_states as features_mod
import dflash_eval.target.loader as target_mod
from dflash_eval.drafter import DFlashDrafter, save_drafter
from dflash_eval.errors import CheckpointError, ConfigError
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.target.head import EMBED_KEYS, HEAD_KEYS, TargetHead
from dflash_eval.testing.tiny import build_random_target, random_drafter_config

TEXTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):"]


def _prompts(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"id": f"p{i}", "category": "code", "text": t}) + "\n"
                         for i, t in enumerate(TEXTS)))
    return p


def _session(target: Path, drafter: Path, tmp_path: Path, shared: EvalSession | None = None, progress=None,
             **over) -> EvalSession:
    values = {"target_model": target, "drafter": drafter, "prompts": _prompts(tmp_path),
              "cache_dir": tmp_path / "cache", "max_new_tokens": 8, "device": "cpu", "torch_threads": 1,
              "tau_floor": 1.0, "witness_prompts": 0, **over}  # the witness loads the target: tests/test_witness.py
    return EvalSession(EvalSettings.from_mapping(values), worker=("master", 0, 1), shared=shared, progress=progress)


def _drafter(target: Path, out: Path, seed: int = 1, **over) -> Path:
    torch.manual_seed(seed)
    save_drafter(DFlashDrafter(random_drafter_config(target, **over)).eval(), out)
    return out


def _taus(session: EvalSession) -> dict[str, tuple[float, dict[int, float]]]:
    return {p: (r.chain.tau, {b: t.tau for b, t in r.ddtree.items()}) for p, r in session.tau_results.items()}


class _Spy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, module, name: str, fail_after: int | None = None,
                 where=lambda args: True):
        """``where``: the calls that count towards ``fail_after`` (the others pass, recorded)."""
        self.calls: list[tuple] = []
        real = getattr(module, name)

        def spy(*a, **k):
            if fail_after is not None and where(a) and sum(where(c[0]) for c in self.calls) >= fail_after:
                raise KeyboardInterrupt(f"interrupted after {fail_after} call(s) of {name}")
            self.calls.append((a, k))
            return real(*a, **k)

        patch_uses(monkeypatch, module, name, spy)


def _generations(spy: _Spy) -> list[tuple]:
    """The spied generation calls on the target itself: the kernel probe's run on its own seeded probe model."""
    return [c for c in spy.calls if hasattr(c[0][0], "path")]


def _forbid_target(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("a warm run must not load the target model")

    def boom_hash(*a, **k):
        raise AssertionError("a warm run must not hash the target weights again")

    patch_uses(monkeypatch, target_mod, "load_target", boom)
    monkeypatch.setattr(target_mod.TargetDir, "fingerprint", boom_hash)


def _forbid_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("a warm run must not build the tokenizer")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)


def _warm_reads_only_head(target: Path, drafter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cold = _session(target, drafter, tmp_path)
    expected = _taus(cold)
    assert cold.inputs.target_loaded and cold.inputs.meter.counts["target_forwards"] == len(TEXTS)

    with monkeypatch.context() as m:
        _forbid_target(m)
        _forbid_tokenizer(m)
        reads = _Spy(m, head_mod, "_read_tensor")
        warm = _session(target, drafter, tmp_path)
        assert _taus(warm) == expected
        assert warm.tau_summary().mean_tau == cold.tau_summary().mean_tau
        frag = warm.result().to_dict()
    keys = [a[0] for a, _ in reads.calls]
    assert len(keys) == len(set(keys)) and keys, keys
    assert keys[0] in EMBED_KEYS and all(k in EMBED_KEYS + HEAD_KEYS for k in keys), keys
    assert not warm.inputs.target_loaded, "warm run built the target"
    counts = warm.inputs.meter.counts
    assert counts["target_forwards"] == 0 and counts["generated_tokens"] == 0
    assert frag["target"]["loaded"] is False and frag["prompts"]
    # The head read from the files is the loaded model's.
    full = TargetHead.from_model(cold.inputs.target.model)
    ids = torch.tensor([1, 5, 7])
    assert torch.equal(warm.inputs.head.embed(ids), full.embed(ids))
    h = full.embed(ids)
    assert torch.equal(warm.inputs.head.logits(h), full.logits(h))


def test_warm_run_reads_only_embedding_and_head(tiny_target_dir, tiny_drafter_dir, tmp_path, monkeypatch):
    _warm_reads_only_head(tiny_target_dir, tiny_drafter_dir, tmp_path, monkeypatch)


def test_warm_run_with_a_sharded_target(tmp_path, monkeypatch):
    target = build_random_target(tmp_path / "sharded", seed=3, max_shard_size="200KB")
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and not (target / "model.safetensors").exists()
    drafter = _drafter(target, tmp_path / "drafter")
    _warm_reads_only_head(target, drafter, tmp_path, monkeypatch)


def test_other_layer_ids_extract_only_the_missing_layers_in_one_forward(tiny_target_dir, tiny_drafter_dir,
                                                                        tmp_path, monkeypatch):
    a = _session(tiny_target_dir, tiny_drafter_dir, tmp_path)
    a.tau_results  # noqa: B018 - cold: completions + features of layers a.evaluation.layer_ids
    assert a.evaluation.layer_ids == (0, 1, 2)
    b_dir = _drafter(tiny_target_dir, tmp_path / "drafter_b", seed=7, num_features=2, target_layer_ids=(1, 3))
    before = {(r["kind"]) for r in a.inputs.cache.productions()}
    n_before = len(a.inputs.cache.productions())
    assert "features" in before
    with monkeypatch.context() as m:
        forwards = _Spy(m, features_mod, "layer_features")
        gen = _Spy(m, generation_mod, "greedy_generate_batch")
        b = _session(tiny_target_dir, b_dir, tmp_path)
        b.tau_results  # noqa: B018
    assert _generations(gen) == []
    assert len(forwards.calls) == len(TEXTS)  # one target forward per prompt ...
    assert all(list(a_[2]) == [3] for a_, _ in forwards.calls)  # ... for the missing layer only
    assert b.inputs.meter.counts["target_forwards"] == len(TEXTS)
    new = a.inputs.cache.productions()[n_before:]
    assert sorted(r["kind"] for r in new) == sorted(["features"] * len(TEXTS) + ["tau"])
    # A third drafter on layers both saw: no forward at all.
    c_dir = _drafter(tiny_target_dir, tmp_path / "drafter_c", seed=8, num_features=2, target_layer_ids=(0, 3))
    with monkeypatch.context() as m:
        _forbid_target(m)
        c = _session(tiny_target_dir, c_dir, tmp_path)
        c.tau_results  # noqa: B018
    assert c.inputs.meter.counts["target_forwards"] == 0 and not c.inputs.target_loaded


def test_interrupted_cold_run_keeps_finished_prompts_and_resumes(tiny_target_dir, tiny_drafter_dir, tmp_path,
                                                                 monkeypatch):
    # Batches of at most 2 prompts: the 3 prompts are generated as [longest] and [the other two].
    with monkeypatch.context() as m:
        _Spy(m, generation_mod, "greedy_generate_batch", fail_after=1, where=lambda a: hasattr(a[0], "path"))
        s1 = _session(tiny_target_dir, tiny_drafter_dir, tmp_path, generation_batch=2)
        with pytest.raises(KeyboardInterrupt):
            s1.tau_results  # noqa: B018
    kinds = [r["kind"] for r in s1.inputs.cache.productions()]
    assert kinds.count("completion") == 1  # the finished batch was written as soon as it was ready
    with monkeypatch.context() as m:
        gen = _Spy(m, generation_mod, "greedy_generate_batch")
        _Spy(m, features_mod, "LayerCapture", fail_after=1)  # every feature forward captures through it
        s2 = _session(tiny_target_dir, tiny_drafter_dir, tmp_path, generation_batch=2)
        with pytest.raises(KeyboardInterrupt):
            s2.tau_results  # noqa: B018
    # only the batch the first run did not finish
    assert len(_generations(gen)) == 1 and len(_generations(gen)[0][0][1]) == 2
    kinds = [r["kind"] for r in s2.inputs.cache.productions()]
    assert kinds.count("completion") == 3 and kinds.count("features") == 3  # one prompt's 3 layers
    with monkeypatch.context() as m:  # the same batches: a completion is vouched for at the batch it was made in
        gen = _Spy(m, generation_mod, "greedy_generate_batch")
        forwards = _Spy(m, features_mod, "LayerCapture")
        s3 = _session(tiny_target_dir, tiny_drafter_dir, tmp_path, generation_batch=2)
        res = _taus(s3)
    assert _generations(gen) == [] and len(forwards.calls) == len(TEXTS) - 1 and set(res) == {"p0", "p1", "p2"}
    fresh = _session(tiny_target_dir, tiny_drafter_dir, tmp_path / "fresh", generation_batch=2)
    assert _taus(fresh) == res  # resuming gives what an uninterrupted run gives


def test_progress_lines_on_productions(tiny_target_dir, tiny_drafter_dir, tmp_path):
    lines: list[str] = []
    s = _session(tiny_target_dir, tiny_drafter_dir, tmp_path, progress=lambda event: lines.append(str(event)))
    s.tau_results  # noqa: B018
    gen = [x for x in lines if "reference completions" in x]
    feat = [x for x in lines if "target features" in x]
    drafting = [x for x in lines if "τ drafting" in x]
    assert gen and feat and drafting, lines
    assert f"{len(TEXTS)}/{len(TEXTS)} prompts" in gen[-1] and "tokens/s" in gen[-1] and gen[-1].endswith("done")
    assert f"{len(TEXTS)}/{len(TEXTS)} prompts" in feat[-1] and "tokens/s" in feat[-1]
    # one batch of every prompt: its start (no rate yet) and its end, never an ETA from one early-stopping prompt
    assert f"0/{len(TEXTS)} prompts" in gen[0] and gen[0].endswith("ETA ?") and len(gen) == 2
    assert drafting[0].split(": ")[1].startswith("0/") and " positions, " in drafting[-1]
    assert drafting[-1].endswith("done")
    warm = _session(tiny_target_dir, tiny_drafter_dir, tmp_path, progress=lambda event: lines.append(str(event)))
    n = len(lines)
    warm.tau_results  # noqa: B018
    assert len(lines) == n  # nothing produced, nothing shown


def test_head_falls_back_to_the_model_when_the_weights_layout_is_unknown(tiny_target_dir, tiny_drafter_dir,
                                                                          tmp_path, monkeypatch):
    def unknown(*a, **k):
        raise CheckpointError("no model.safetensors")

    monkeypatch.setattr(TargetHead, "from_pretrained", classmethod(lambda cls, *a, **k: unknown()))
    s = _session(tiny_target_dir, tiny_drafter_dir, tmp_path)
    head = s.inputs.head
    assert s.inputs.target_loaded  # the head came from the loaded model
    assert head.vocab_size == s.inputs.target.vocab_size


def test_shared_session_reuses_the_first_sessions_stages(tiny_target_dir, tiny_drafter_dir, tmp_path, monkeypatch):
    a = _session(tiny_target_dir, tiny_drafter_dir, tmp_path)
    ta = _taus(a)
    forwards = a.inputs.meter.counts["target_forwards"]
    b_dir = _drafter(tiny_target_dir, tmp_path / "drafter_b", seed=5)
    with monkeypatch.context() as m:
        _forbid_target(m)
        _forbid_tokenizer(m)
        reads = _Spy(m, head_mod, "_read_tensor")
        feats = _Spy(m, features_mod, "layer_features")
        gen = _Spy(m, generation_mod, "greedy_generate_batch")
        b = _session(tiny_target_dir, b_dir, tmp_path, shared=a)
        tb = _taus(b)
    assert reads.calls == [] and feats.calls == [] and _generations(gen) == []
    assert b.inputs.head is a.inputs.head and b.inputs.target is a.inputs.target
    assert b.inputs.meter.counts["target_forwards"] == forwards and set(tb) == set(ta)
    assert b.result().drafter.path == str(b_dir) != a.result().drafter.path
    with pytest.raises(ConfigError, match="max_new_tokens"):
        _session(tiny_target_dir, b_dir, tmp_path, shared=a, max_new_tokens=4)
