"""What the completion and feature stages refuse to cache or to use: token ids outside the target vocabulary, a
server whose answers the local target does not reproduce, cached features of another dtype; and that a
completion's text is the local decoding of its ids whatever the server sent."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from patch_uses import patch_uses

import dflash_eval.target.generation as generation_mod
from dflash_eval.cache.store import CacheCorruption
from dflash_eval.errors import EvalError
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.sglang import Completion


def _session(target, drafter, tmp_path, **extra: Any) -> EvalSession:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "text": "def add(a, b):"}) + "\n" +
                       json.dumps({"id": "b", "text": "The quick brown fox"}) + "\n")
    s = EvalSettings.from_mapping({"target_model": target, "drafter": drafter, "prompts": prompts,
                                   "cache_dir": tmp_path / "cache", "max_new_tokens": 8, "device": "cpu",
                                   "torch_threads": 1, **extra})
    return EvalSession(s, worker=("master", 0, 1))


@pytest.fixture
def session(tiny_target_dir, tiny_drafter_dir, tmp_path):
    return _session(tiny_target_dir, tiny_drafter_dir, tmp_path)


@pytest.fixture
def sglang_session(tiny_target_dir, tiny_drafter_dir, tmp_path):
    return _session(tiny_target_dir, tiny_drafter_dir, tmp_path, completions="sglang",
                    sglang_url="http://127.0.0.1:9")


def cached_completions(session: EvalSession) -> list[Any]:
    return list((session.settings.cache_dir / "v1").glob("completion/**/manifest.json"))


class FakeServer:
    """A ready SGLang client stand-in answering with ``answer(prompt ids) -> output ids`` and ``text``."""

    url = "http://sglang.test:30000"

    def __init__(self, answer: Any, text: str = "") -> None:
        self.answer, self.text, self.calls = answer, text, 0

    def generate_greedy(self, batch_input_ids: list[list[int]], *, max_new_tokens: int) -> list[Completion]:
        self.calls += 1
        return [Completion(list(self.answer(p))[:max_new_tokens], self.text, {"type": "length"}, None, None)
                for p in batch_input_ids]


@pytest.mark.parametrize("bad", [10**6, -3], ids=["above_vocab", "negative"])
def test_local_ids_outside_the_vocabulary_are_refused_naming_prompt_and_id(session, monkeypatch, bad):
    a_ids = session.inputs.prompt_ids["a"]
    patch_uses(monkeypatch, generation_mod, "greedy_generate_batch",  # prompt 'a' gets the bad id; its batch too
                        lambda target, prompts, *x, **k: [[5, 6, bad, 7] if list(p) == a_ids else [5, 6, 7]
                                                          for p in prompts])
    with pytest.raises(EvalError) as err:
        session.completions()
    msg = str(err.value)
    assert "prompt 'a'" in msg and f"token id {bad} at completion position 2" in msg
    assert f"0..{session.inputs.vocab_size - 1}" in msg and "No cache entry written" in msg
    assert not cached_completions(session)


def test_server_ids_outside_the_vocabulary_are_refused_before_caching(sglang_session):
    vocab = sglang_session.inputs.vocab_size
    sglang_session.references.server.attach(FakeServer(lambda p: [3, 4] if p[0] % 2 else [vocab, 4]))
    with pytest.raises(EvalError, match=rf"token id {vocab} at completion position 0 is outside"):
        sglang_session.completions()
    assert not cached_completions(sglang_session)


def test_cached_ids_outside_the_vocabulary_are_not_used(session, monkeypatch):
    """An entry cached by an older version with a bad id is recomputed instead of crashing τ with IndexError."""
    patch_uses(monkeypatch, generation_mod, "greedy_generate_batch",
                        lambda target, prompts, *a, **k: [[5, 6, 7]] * len(prompts))
    session.completions()
    (man,) = [m for m in cached_completions(session) if json.loads(m.read_text())["meta"]["prompt_id"] == "a"]
    manifest = json.loads(man.read_text())
    session.inputs.cache.write("completion", manifest["key"], {"output_ids": torch.tensor([5, 10**6])},
                               fields=manifest["fields"], meta=manifest["meta"])
    again = EvalSession(session.settings, worker=("master", 0, 1))
    with pytest.warns(CacheCorruption, match=r"prompt 'a': token id 1000000 at completion position 1"):
        assert again.completions()["a"].output_ids == [5, 6, 7]  # regenerated


def test_server_that_answers_wrongly_is_refused_before_caching(sglang_session):
    vocab = sglang_session.inputs.vocab_size
    server = FakeServer(lambda p: [(p[-1] * 7 + 11 * k + 3) % vocab for k in range(8)])
    sglang_session.references.server.attach(server)
    with pytest.raises(EvalError) as err:
        sglang_session.completions()
    msg = str(err.value)
    assert server.url in msg and "does not serve the target" in msg and "prompt 'a'" in msg
    assert "teacher-forced" in msg and "No completion cached" in msg
    assert not cached_completions(sglang_session)


def test_batched_check_equals_each_rows_own_forward(tiny_target):
    """The server check's right-padded batch gives every row the argmax of its own unpadded forward (a causal model
    never looks at the padding after a row's last token)."""
    from dflash_eval.references.greedy import teacher_forced_tensors
    from dflash_eval.references.server_check import teacher_forced_logits

    rows = [([5, 9, 17, 3], [40, 41, 42]), ([7], [8, 9, 10, 11, 12, 13]), ([1, 2, 3, 4, 5, 6, 7, 8, 9], [100])]
    got = list(map(teacher_forced_tensors, teacher_forced_logits(tiny_target.model, rows, tiny_target.device)))
    for (p, c), t in zip(rows, got, strict=True):
        with torch.no_grad():
            logits = tiny_target.model(input_ids=torch.tensor([p + c])).logits[0].float()
        own = teacher_forced_tensors(logits)
        assert torch.equal(t["top_ids"][:, 0], own["top_ids"][len(p) - 1:len(p) - 1 + len(c), 0])
        torch.testing.assert_close(t["top_logits"], own["top_logits"][len(p) - 1:len(p) - 1 + len(c)], rtol=1e-4,
                                   atol=1e-4)


def test_server_with_the_targets_answers_is_cached_with_locally_decoded_text(sglang_session, tiny_target):
    """The right answers pass the check; a server started with --skip-tokenizer-init sends no text: the cached
    text is the local decoding (what the golden snapshots pin), the server's text is kept aside."""
    inp = sglang_session.inputs
    greedy = {tuple(inp.prompt_ids[p.id]): generation_mod.greedy_generate(tiny_target, inp.prompt_ids[p.id], 8)
              for p in inp.prompts}
    sglang_session.references.server.attach(FakeServer(lambda p: greedy[tuple(p)], text=""))
    comps = sglang_session.completions()
    for pid, rec in comps.items():
        assert rec.source == "sglang" and rec.output_ids == greedy[tuple(inp.prompt_ids[pid])]
        assert rec.text == inp.tokenizer.decode(rec.output_ids, skip_special_tokens=True) and rec.text
    metas = [json.loads(m.read_text())["meta"] for m in cached_completions(sglang_session)]
    assert len(metas) == 2 and all(m["server_text"] == "" and m["text"] for m in metas)
    warm = EvalSession(sglang_session.settings, worker=("master", 0, 1))
    assert {p: r.text for p, r in warm.completions().items()} == {p: r.text for p, r in comps.items()}


def test_cached_zero_verify_rounds_read_as_no_server_accept_length(sglang_session, tiny_target):
    """An entry cached with ``spec_accept_length: 0, spec_verify_ct: 0`` (a non-speculative answer of an older SGLang,
    stored before such answers were recognised) reads as no server accept length; a real one is kept."""
    inp = sglang_session.inputs
    greedy = {tuple(inp.prompt_ids[p.id]): generation_mod.greedy_generate(tiny_target, inp.prompt_ids[p.id], 8)
              for p in inp.prompts}
    sglang_session.references.server.attach(FakeServer(lambda p: greedy[tuple(p)]))
    sglang_session.completions()
    spec = {"a": {"spec_accept_length": 0, "spec_verify_ct": 0, "spec_accept_histogram": [0]},
            "b": {"spec_accept_length": 2.5, "spec_verify_ct": 3, "spec_accept_histogram": [1, 1, 1]}}
    for man in cached_completions(sglang_session):
        manifest = json.loads(man.read_text())
        pid = manifest["meta"]["prompt_id"]
        ids = torch.tensor(sglang_session.completions()[pid].output_ids)
        inp.cache.write("completion", manifest["key"], {"output_ids": ids}, fields=manifest["fields"],
                        meta={**manifest["meta"], **spec[pid]})
    warm = EvalSession(sglang_session.settings, worker=("master", 0, 1)).completions()
    assert (warm["a"].spec_accept_length, warm["a"].spec_accept_histogram) == (None, None)
    assert (warm["b"].spec_accept_length, warm["b"].spec_accept_histogram) == (2.5, [1, 1, 1])


def test_cached_features_of_another_dtype_are_recomputed(session):
    side = session.inputs.eval_side
    pid = "a"
    layer = session.evaluation.layer_ids[0]
    expected = session.evaluation.features(side)[pid][layer].clone()
    seq = session.completions()[pid].sequence
    store, cache = session.store, session.inputs.cache
    key = store.key(seq, layer, side)
    entry = cache.read("features", key)
    cache.write("features", key, {"features": entry.tensors["features"].to(torch.bfloat16)},
                fields=entry.manifest["fields"], meta=entry.meta)  # a bf16 tensor under the fp32 key
    again = EvalSession(session.settings, worker=("master", 0, 1))
    with pytest.warns(CacheCorruption, match=r"tensor 'features' is torch.bfloat16, the request needs torch.float32"):
        refetched = again.evaluation.features(side)[pid][layer]  # features are read when a consumer asks
    assert refetched.dtype == torch.float32
    assert torch.equal(refetched, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheCorruption)
        EvalSession(session.settings, worker=("master", 0, 1)).evaluation.features(side)[pid][layer]  # clean


def test_server_disagreements_are_judged_by_the_near_tie_rule():
    """A server token within the near-tie band of the local target's best is a near tie and does not count against
    the server; one outside it does (more than max(1, 10 %) of the tokens: refused)."""
    from dflash_eval.references.server_check import disagreement

    n, vocab = 20, 50
    logits = torch.zeros(n, vocab)
    logits[:, 0] = 5.0  # the local argmax is token 0 everywhere
    logits[:, 1] = 5.0 - 0.1  # token 1: 0.1 below it (a bf16 near tie, not an fp32 one)
    logits[:, 2] = 5.0 - 3.0  # token 2: confidently below
    ties = [1 if k % 2 else 0 for k in range(n)]  # the server flips every other token at a near tie
    d = disagreement("p", 7, ties, logits, torch.bfloat16)
    assert len(d.near_ties) == 10 and not d.wrong and not d.refused
    assert d.near_ties[0].position == 1 and d.near_ties[0].absolute == 8 and d.near_ties[0].against == "server"
    fp32 = disagreement("p", 7, ties, logits, torch.float32)
    assert len(fp32.wrong) == 10 and fp32.refused  # 0.1 is far outside the float32 band
    wrong = [2 if k in (3, 9, 15) else 1 if k % 2 else 0 for k in range(n)]  # three confident ones among the ties
    d = disagreement("p", 7, wrong, logits, "bfloat16")
    assert [w.position for w in d.wrong] == [3, 9, 15] and d.refused and d.wrong[0].margin == pytest.approx(3.0)
