"""The online speculative loop: exact greedy parity with the target, and agreement with offline τ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_eval.drafter import TargetSpec, build_drafter, read_checkpoint
from dflash_eval.metrics.online_loop import online_generate
from dflash_eval.metrics.tau import chain_tau, draft_table
from dflash_eval.target.generation import greedy_generate
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import extract_features
from dflash_eval.target.loader import load_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _offline(target, drafter, head, prompt: list[int], completion: list[int]):  # type: ignore[no-untyped-def]
    seq = torch.tensor(prompt + completion)
    feats, _ = extract_features(target, seq, drafter.config.target_layer_ids, backend="torch")
    return chain_tau(draft_table(drafter, head, [(feats, seq, len(prompt))])[0])


def test_online_matches_greedy_and_offline_on_random_models(tiny_target, tiny_drafter, tiny_head) -> None:  # type: ignore[no-untyped-def]
    prompt = list(range(3, 23))
    ref = greedy_generate(tiny_target, prompt, 24, backend="torch", stop_at_eos=False)
    res = online_generate(tiny_target, tiny_drafter, tiny_head, prompt, max_new_tokens=24, backend="torch")
    assert res.tokens == ref  # speculative decoding must reproduce greedy decoding exactly
    assert 1 + sum(res.tau.accept_lengths) == len(ref)
    assert res.tau.accept_lengths == _offline(tiny_target, tiny_drafter, tiny_head, prompt, ref).accept_lengths


@pytest.mark.slow
def test_online_equals_offline_on_bundled_model_fp32() -> None:
    """On the bundled (trained) target and drafter in fp32, per-prompt online and offline τ agree.

    Offline features come from one causal forward over prompt+completion; online ones from a prefill plus
    incremental forwards on a cache. In fp32 the two differ by ~1e-6 relative, far below the margins of the
    drafter's argmax on these prompts, so the acceptance lengths must be identical; a mismatch would mean a
    convention bug (positions, context visibility, bonus counting), not a tie flip.
    """
    import json

    if not (FIXTURES / "target" / "config.json").is_file() or not (FIXTURES / "drafter" / "config.json").is_file():
        pytest.fail(f"bundled fixtures missing under {FIXTURES}: run python fixtures/build.py")
    target = load_target(FIXTURES / "target", device="cpu", dtype="fp32")
    head = TargetHead.from_model(target.model)
    drafter = build_drafter(read_checkpoint(FIXTURES / "drafter"), dtype="fp32", spec=TargetSpec.from_target(target))
    prompts = [json.loads(line) for line in (FIXTURES / "prompts.jsonl").read_text().splitlines() if line.strip()][:4]
    total_rounds = 0
    for p in prompts:
        ids = target.tokenizer(p["text"], add_special_tokens=False)["input_ids"]
        res = online_generate(target, drafter, head, ids, max_new_tokens=64, backend="torch")
        ref = greedy_generate(target, ids, 64, backend="torch", stop_at_eos=False)
        assert res.tokens == ref, f"{p['id']}: online speculative output differs from greedy"
        off = _offline(target, drafter, head, ids, ref)
        assert res.tau.accept_lengths == off.accept_lengths, (
            f"{p['id']}: online {res.tau.accept_lengths} vs offline {off.accept_lengths}")
        total_rounds += res.tau.rounds
    assert total_rounds > 0
