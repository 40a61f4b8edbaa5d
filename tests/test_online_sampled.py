"""Offline τ on a sampled reference equals the online speculative loop at temperature > 0 exactly when both consume
the same random draws (the same stream seed: draws indexed by absolute position), and T -> 0 gives greedy τ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash_eval.metrics.online_loop import online_generate
from dflash_eval.metrics.tau import chain_tau, ddtree_tau, draft_table
from dflash_eval.target.generation import greedy_generate_batch
from dflash_eval.target.hidden_states import extract_features
from dflash_eval.target.sampling import SamplingParams, sample_tokens, stream_seed

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _pick(params: SamplingParams, seed: int):  # type: ignore[no-untyped-def]
    return lambda logits, pos: sample_tokens(logits, params, seeds=torch.full((logits.shape[0],), seed), positions=pos)


def _offline(target, drafter, head, prompt: list[int], completion: list[int]):  # type: ignore[no-untyped-def]
    seq = torch.tensor(prompt + completion)
    feats, _ = extract_features(target, seq, drafter.config.target_layer_ids, backend="torch")
    return draft_table(drafter, head, [(feats, seq, len(prompt))], top_k=8)[0]


def _check_prompts(target, drafter, head, prompts: dict[str, list[int]], params: SamplingParams, n: int) -> int:  # type: ignore[no-untyped-def]
    """Every prompt: the online loop's tokens are the sampled reference and its rounds the offline chain's."""
    seeds = {pid: stream_seed(0, pid, 0) for pid in prompts}
    refs = greedy_generate_batch(target, list(prompts.values()), n, backend="torch",
                                 sampling=(params, list(seeds.values())))
    rounds = 0
    for (pid, ids), ref in zip(prompts.items(), refs):
        res = online_generate(target, drafter, head, ids, max_new_tokens=n, backend="torch", stop_at_eos=True,
                              pick=_pick(params, seeds[pid]))
        assert res.tokens == ref, f"{pid}: the online loop's tokens differ from the sampled reference"
        off = chain_tau(_offline(target, drafter, head, ids, ref))
        assert res.tau.accept_lengths == off.accept_lengths, f"{pid}: online {res.tau.accept_lengths} vs {off}"
        rounds += res.tau.rounds
    return rounds


def test_online_equals_offline_at_temperature_on_random_models(tiny_target, tiny_drafter, tiny_head) -> None:  # type: ignore[no-untyped-def]
    prompts = {"a": list(range(3, 23)), "b": list(range(40, 52))}
    assert _check_prompts(tiny_target, tiny_drafter, tiny_head, prompts, SamplingParams(1.0, top_p=0.9), 24) > 0


def _bundled():  # type: ignore[no-untyped-def]
    from dflash_eval.drafter import TargetSpec, build_drafter, read_checkpoint
    from dflash_eval.target.head import TargetHead
    from dflash_eval.target.loader import load_target

    if not (FIXTURES / "target" / "config.json").is_file():
        pytest.fail(f"bundled fixtures missing under {FIXTURES}: run python fixtures/build.py")
    target = load_target(FIXTURES / "target", device="cpu", dtype="fp32")
    drafter = build_drafter(read_checkpoint(FIXTURES / "drafter"), dtype="fp32", spec=TargetSpec.from_target(target))
    rows = [json.loads(line) for line in (FIXTURES / "prompts.jsonl").read_text().splitlines() if line.strip()]
    prompts = {r["id"]: target.tokenizer(r["text"], add_special_tokens=False)["input_ids"] for r in rows}
    return target, drafter, TargetHead.from_model(target.model), prompts


@pytest.mark.slow
def test_online_equals_offline_at_temperature_on_every_bundled_prompt() -> None:
    target, drafter, head, prompts = _bundled()
    assert _check_prompts(target, drafter, head, prompts, SamplingParams(0.6), 32) > len(prompts)


@pytest.mark.slow
def test_temperature_to_zero_is_greedy_tau_on_bundled_prompts() -> None:
    """At T = 1e-4 the sampled references are the greedy ones, so chain and DDTree τ are greedy τ."""
    target, drafter, head, prompts = _bundled()
    ids = list(prompts.values())[:6]
    greedy = greedy_generate_batch(target, ids, 32, backend="torch")
    params = SamplingParams(1e-4)
    sampled = greedy_generate_batch(target, ids, 32, backend="torch",
                                    sampling=(params, [stream_seed(0, p, 0) for p in list(prompts)[:6]]))
    assert sampled == greedy
    for p, g, s in zip(ids, greedy, sampled):
        a, b = _offline(target, drafter, head, p, g), _offline(target, drafter, head, p, s)
        assert chain_tau(a).accept_lengths == chain_tau(b).accept_lengths
        assert ddtree_tau(a, 8).accept_lengths == ddtree_tau(b, 8).accept_lengths
