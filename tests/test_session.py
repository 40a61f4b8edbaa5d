"""Unit tests of dflash_eval.session.eval_session and its stages: drift comparisons, the light head, empty completions,
the τ memo, layer reuse across drafters."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from patch_uses import patch_uses

import dflash_eval.target.generation as generation_mod
from dflash_eval.errors import EvalError
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession


@pytest.fixture
def session(tiny_target_dir, tiny_drafter_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "text": "def add(a, b):"}) + "\n" +
                       json.dumps({"id": "b", "text": "The quick brown fox"}) + "\n")
    s = EvalSettings.from_mapping({"target_model": tiny_target_dir, "drafter": tiny_drafter_dir, "prompts": prompts,
                                   "cache_dir": tmp_path / "cache", "max_new_tokens": 8, "device": "cpu"})
    return EvalSession(s, worker=("master", 0, 1))


def test_cpu_comparisons_say_fla_was_not_checked(session):
    comps = {c.name: c for c in session.inputs.comparisons}
    assert set(comps) == {"torch-vs-torch-recurrent", "bf16-vs-fp32", "fla-vs-torch"}
    assert "fla not checked" in comps["fla-vs-torch"].skip_reason
    assert comps["bf16-vs-fp32"].a.dtype == torch.bfloat16 and comps["bf16-vs-fp32"].rel_tol > \
        comps["torch-vs-torch-recurrent"].rel_tol
    ref_fla = EvalSession(dataclasses.replace(session.settings, reference_backend="fla"), worker=("master", 0, 1))
    ref = {c.name: c for c in ref_fla.inputs.comparisons}
    assert "fla not checked" in ref["torch-vs-fla"].skip_reason


def test_light_head_matches_the_loaded_model(session):
    light = session.inputs.head  # read from safetensors, no model
    assert not session.inputs.target_loaded
    ids = torch.tensor([1, 5, 7])
    full = type(light).from_model(session.inputs.target.model)
    h = full.embed(ids)
    assert torch.equal(light.embed(ids), h) and torch.equal(light.logits(h), full.logits(h))
    assert session.inputs.spec.vocab_size == session.inputs.target.vocab_size


def test_empty_completion_is_an_error_and_not_cached(session, monkeypatch):
    patch_uses(monkeypatch, generation_mod, "greedy_generate_batch",
               lambda target, prompts, *a, **k: [[]] * len(prompts))
    with pytest.raises(EvalError, match="empty completion for prompt '[ab]' from local"):
        session.completions()
    assert not list((session.settings.cache_dir / "v1").glob("completion/**/manifest.json"))


def test_batched_local_completions_one_entry_per_prompt_and_a_key_that_says_batched(session, monkeypatch):
    calls = []
    real = generation_mod.greedy_generate_batch
    patch_uses(monkeypatch, generation_mod, "greedy_generate_batch",
                        lambda target, prompts, *a, **k: calls.append(len(prompts)) or real(target, prompts, *a, **k))
    batched = {p: r.output_ids for p, r in session.completions().items()}
    assert calls == [2]  # both prompts in one batch (default --generation-batch 32)
    cache = session.settings.cache_dir / "v1"
    manifests = [json.loads(m.read_text()) for m in cache.glob("completion/**/manifest.json")]
    assert sorted(m["meta"]["prompt_id"] for m in manifests) == ["a", "b"]  # still one entry per prompt
    assert all(m["fields"]["generation"] == "left-padded-batch" for m in manifests)
    one = EvalSession(dataclasses.replace(session.settings, generation_batch=1), worker=("master", 0, 1))
    assert "generation" not in one.references.fields("a", "local")  # one at a time: the keys of unbatched runs
    assert {p: r.output_ids for p, r in one.completions().items()} == batched  # not reused: generated again ...
    assert calls == [2, 1, 1]  # ... one prompt at a time, with the same ids


def test_tau_results_end_to_end(session):
    res = session.tau_results
    assert set(res) == {"a", "b"}
    for r in res.values():
        assert 1 + sum(r.chain.accept_lengths) == r.completion_tokens
        assert r.ddtree[8].tau >= 1.0


def test_tau_memo_is_reused_and_keyed_on_settings(session):
    first = {p: r.chain.accept_lengths for p, r in session.tau_results.items()}
    again = EvalSession(session.settings, worker=("master", 0, 1))
    assert {p: r.chain.accept_lengths for p, r in again.tau_results.items()} == first
    assert "drafting" not in again.inputs.meter.timings  # read from the cache, the drafter did not run

    capped = EvalSession(dataclasses.replace(session.settings, max_blocks=2), worker=("master", 0, 1))
    assert all(r.chain.rounds <= 2 for r in capped.tau_results.values()) and "drafting" in capped.inputs.meter.timings


def test_other_layer_ids_reuse_shared_layers(session, tmp_path):
    """A drafter with different target_layer_ids extracts only the layers not cached yet, in one forward each."""
    from dflash_eval.drafter import DFlashDrafter, save_drafter

    session.evaluation.features(session.inputs.eval_side)
    old = set(session.evaluation.layer_ids)
    n_layers = session.inputs.spec.num_layers
    new_ids = tuple(sorted({min(old), *[i for i in range(n_layers) if i not in old][:1]}))
    assert len(new_ids) == 2, (old, n_layers)
    cfg = dataclasses.replace(session.evaluation.checkpoint.config, target_layer_ids=new_ids)
    torch.manual_seed(3)
    save_drafter(DFlashDrafter(cfg), tmp_path / "d2")
    other = EvalSession(dataclasses.replace(session.settings, drafter=tmp_path / "d2"), worker=("master", 0, 1))
    before = len(other.inputs.cache.productions())
    feats = other.evaluation.features(other.inputs.eval_side)
    made = other.inputs.cache.productions()[before:]
    n_prompts = len(session.inputs.prompts)
    assert [m["kind"] for m in made] == ["features"] * n_prompts  # one new layer per prompt
    assert other.inputs.meter.counts["target_forwards"] == n_prompts
    assert all(set(f) == set(new_ids) for f in feats.values())
