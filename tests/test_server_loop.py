"""The server-style speculative loop: one verify forward per round against the target's caches, exact.

- A tree verify gives every node the logits and states of its root path run on its own, and keeping a path makes the
  caches what running that path alone makes them (conv windows, recurrent states, KV entries).
- At T = 0 the loop's tokens are plain greedy decoding's and every round's acceptance is the offline simulation's,
  chain and DDTree, on every bundled prompt (fp32, CPU); the target runs each token once (the prompt, then k a round).
- At T > 0 with the references' stream seeds the loop reproduces the sampled references and the offline rounds; over
  independent seeds its acceptance lengths follow the offline sampled law (a two-sided test that rejects the offline
  law at a nearby temperature).
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch

from dflash_eval.metrics.ddtree import build_ddtree
from dflash_eval.metrics.server_loop import ServerLoop, server_generate
from dflash_eval.metrics.tau import chain_tau, ddtree_tau, draft_table, simulate_tau
from dflash_eval.target.backends import use_backend
from dflash_eval.target.generation import greedy_generate, greedy_generate_batch
from dflash_eval.target.hidden_states import extract_features
from dflash_eval.target.sampling import SamplingParams, sample_tokens, stream_seed
from dflash_eval.target.tree_verify import VerifyTree, tree_cache

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _states(cache) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Every state tensor of a cache, layer by layer: conv windows, recurrent states, keys, values."""
    out = []
    for layer in cache.layers:
        linear = (*getattr(layer, "conv_states", {}).values(), *getattr(layer, "recurrent_states", {}).values())
        out += [t for t in linear if t is not None]
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            out += [layer.keys, layer.values]
    return out


def _random_tree(rng: random.Random, size: int, root: int, vocab: int) -> VerifyTree:
    parents = [-1] + [rng.randrange(i) for i in range(1, size)]
    return VerifyTree((root, *(rng.randrange(vocab) for _ in range(1, size))), tuple(parents))


@torch.no_grad()
@pytest.mark.parametrize("shape", ["chain", "random", "ddtree"])
def test_tree_verify_equals_each_root_path_run_alone(tiny_target, shape: str) -> None:  # type: ignore[no-untyped-def]
    model = tiny_target.model
    prompt = torch.arange(3, 40)
    rng = random.Random(7)
    if shape == "chain":
        tree = VerifyTree.chain([11, 12, 13, 14, 15, 16])
    elif shape == "random":
        tree = _random_tree(rng, 12, 11, 200)
    else:
        logp, ids = torch.randn(7, 8).log_softmax(-1).sort(-1, descending=True)
        nodes = build_ddtree(torch.randint(5, 200, (7, 8)), logp, 10)
        tree = VerifyTree((11, *(n.token for n in nodes)), (-1, *(n.parent + 1 for n in nodes)), 7)
    with use_backend("torch"):
        cache = tree_cache(model.config)
        model(prompt[None], cache=cache, use_cache=True)
        before = [t.clone() for t in _states(cache)]
        with cache.verifying(tree) as ver:
            ids, pos, mask = tree.inputs(ver.start, torch.float32, torch.device("cpu"))
            logits = model(ids, cache=cache, use_cache=True, position_ids=pos,
                           attention_mask={"full_attention": mask, "linear_attention": None}).logits[0]
        for old, now in zip(before, _states(cache)):  # the request's linear-attention states are as they were
            if now.shape == old.shape:
                assert torch.equal(old, now)
        for node in range(tree.size):
            path = tree.path(node)
            alone = copy.deepcopy(cache)
            for layer, old in zip(alone.layers, cache.layers):  # the context's KV only, as before the verify
                if isinstance(getattr(old, "keys", None), torch.Tensor) and old.keys.numel():
                    layer.keys, layer.values = old.keys[..., :ver.start, :], old.values[..., :ver.start, :]
            ref = model(torch.tensor([[tree.tokens[j] for j in path]]), cache=alone, use_cache=True).logits[0, -1]
            assert torch.allclose(logits[node], ref, atol=1e-4), f"node {node} (path {path})"
            kept = copy.deepcopy(cache)
            kept.keep(ver, path)
            for a, b in zip(_states(kept), _states(alone)):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5), f"states after keeping {path}"


def test_the_tree_mask_hides_siblings_and_positions_follow_depth() -> None:
    # root ─ a ─ c ─ e
    #      └ b ─ d
    tree = VerifyTree((7, 11, 12, 13, 14, 15), (-1, 0, 0, 1, 2, 3))
    ids, pos, mask = tree.inputs(10, torch.float32, torch.device("cpu"))
    assert ids.tolist() == [[7, 11, 12, 13, 14, 15]] and pos.tolist() == [[10, 11, 11, 12, 12, 13]]
    seen = mask[0, 0, :, 10:] == 0
    assert seen.tolist()[4] == [True, False, True, False, True, False]  # d sees the root, b and itself
    assert bool((mask[0, 0, :, :10] == 0).all())  # every node sees the whole context
    assert tree.walk([11, 13, 0, 15, 0, 0], limit=5) == [0, 1, 3, 5]  # root → a → c → e
    assert tree.walk([12, 0, 99, 0, 0, 0], limit=5) == [0, 2]  # root → b, then no child 99
    assert tree.walk([11, 13, 0, 15, 0, 0], limit=1) == [0, 1]  # at most `limit` drafts
    assert tree.walk([11, 13, 0, 15, 0, 0], limit=5, eos=13) == [0, 1]  # a drafted EOS is not accepted
    assert tree.path_index().tolist()[4] == [6, 0, 2, 4]  # d's path, left-padded with the padding row (k = 6)
    assert VerifyTree(tree.tokens, tree.parents, 5).path_index().shape == (6, 6)  # padded to the pad depth
    with pytest.raises(ValueError):
        VerifyTree((1, 2), (-1, 1))


def _check(target, drafter, head, prompts: list[list[int]], n: int, budgets: tuple[int, ...]) -> int:  # type: ignore[no-untyped-def]
    """Every prompt: the loop's tokens are greedy's, its rounds the offline simulation's, each token run once."""
    refs = [greedy_generate(target, ids, n, backend="torch", stop_at_eos=False) for ids in prompts]
    items = []
    for ids, ref in zip(prompts, refs):
        seq = torch.tensor(ids + ref)
        items.append((extract_features(target, seq, drafter.config.target_layer_ids, backend="torch")[0], seq,
                      len(ids)))
    offline = simulate_tau(drafter, head, items, budgets=budgets)
    loop = ServerLoop(target, drafter, head, backend="torch", max_new_tokens=n)
    rounds = 0
    with loop.running():
        for ids, ref, off in zip(prompts, refs, offline):
            for budget in (None, *budgets):
                res = loop.generate(ids, budget=budget)
                want = off.chain if budget is None else off.ddtree[budget]
                assert res.tokens == ref, f"budget {budget}: the loop's tokens differ from greedy decoding"
                assert res.tau.accept_lengths == want.accept_lengths, f"budget {budget}: {res.tau} vs {want}"
                k = drafter.config.block_size if budget is None else budget + 1
                assert res.target_tokens == len(ids) + k * res.tau.rounds  # nothing committed runs twice
                assert res.target_forwards == 1 + res.tau.rounds
                rounds += res.tau.rounds
    return rounds


def test_server_loop_is_greedy_decoding_on_random_models(tiny_target, tiny_drafter, tiny_head) -> None:  # type: ignore[no-untyped-def]
    assert _check(tiny_target, tiny_drafter, tiny_head, [list(range(3, 23)), list(range(40, 52))], 24, (2, 6)) > 0


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
def test_server_loop_is_greedy_decoding_and_offline_tau_on_every_bundled_prompt() -> None:
    """Chain, DDTree-8 and DDTree-32 on every bundled prompt (fp32): the drafter accepts most drafts here, so every
    path (deep trees, KV cuts of many lengths, the drafter's context grown by 1 to B positions) is exercised."""
    target, drafter, head, prompts = _bundled()
    rounds = _check(target, drafter, head, list(prompts.values()), 32, (8, 32))
    assert rounds > 4 * len(prompts)


def test_eos_and_max_new_tokens_end_the_loop_as_they_end_greedy_decoding(tiny_target, tiny_drafter,  # type: ignore[no-untyped-def]
                                                                        tiny_head, monkeypatch) -> None:
    prompt = list(range(3, 23))
    ref = greedy_generate(tiny_target, prompt, 24, backend="torch", stop_at_eos=False)
    for n in (1, 2, 5):
        res = server_generate(tiny_target, tiny_drafter, tiny_head, prompt, max_new_tokens=n, budget=4,
                              backend="torch")
        assert res.tokens == ref[:n] and 1 + sum(res.tau.accept_lengths) == n
    eos = ref[6]  # a token the greedy completion reaches: the loop stops there as greedy decoding with that EOS does
    monkeypatch.setattr(type(tiny_target), "eos_token_id", property(lambda self: eos))
    with_eos = greedy_generate(tiny_target, prompt, 24, backend="torch", stop_at_eos=True)
    assert with_eos[-1] == eos and len(with_eos) < 24
    for budget in (None, 3):
        res = server_generate(tiny_target, tiny_drafter, tiny_head, prompt, max_new_tokens=24, budget=budget,
                              backend="torch", stop_at_eos=True)
        assert res.tokens == with_eos


def _pick(params: SamplingParams, seed: int):  # type: ignore[no-untyped-def]
    return lambda logits, pos: sample_tokens(logits, params, seeds=torch.full((logits.shape[0],), seed), positions=pos)


def _sampled(target, drafter, head, prompts: dict[str, list[int]], params: SamplingParams, n: int,  # type: ignore[no-untyped-def]
             seeds: list[int], budget: int):
    """Offline: the sampled references of every (prompt, seed) and the chain and DDTree-``budget`` rounds on them."""
    out = {}
    for pid, ids in prompts.items():
        refs = greedy_generate_batch(target, [ids] * len(seeds), n, backend="torch", sampling=(params, seeds))
        for seed, ref in zip(seeds, refs):
            seq = torch.tensor(ids + ref)
            feats = extract_features(target, seq, drafter.config.target_layer_ids, backend="torch")[0]
            table = draft_table(drafter, head, [(feats, seq, len(ids))], top_k=budget)[0]
            out[(pid, seed)] = (ref, chain_tau(table), ddtree_tau(table, budget))
    return out


@pytest.mark.slow
def test_server_loop_at_temperature_reproduces_the_sampled_references_and_their_rounds() -> None:
    target, drafter, head, prompts = _bundled()
    prompts = dict(list(prompts.items())[:3])
    params = SamplingParams(0.7, top_p=0.95)
    seeds = [stream_seed(0, "server-loop", k) for k in range(2)]
    offline = _sampled(target, drafter, head, prompts, params, 24, seeds, 8)
    for (pid, seed), (ref, chain, tree) in offline.items():
        for budget, want in ((None, chain), (8, tree)):
            res = server_generate(target, drafter, head, prompts[pid], max_new_tokens=24, budget=budget,
                                  backend="torch", stop_at_eos=True, pick=_pick(params, seed))
            assert res.tokens == ref, f"{pid} seed {seed} budget {budget}: tokens differ from the sampled reference"
            assert res.tau.accept_lengths == want.accept_lengths, f"{pid} seed {seed} budget {budget}"


def _law_p(a: list[float], b: list[float]) -> float:
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


@pytest.mark.slow
def test_server_loop_at_temperature_follows_the_offline_sampled_law() -> None:
    """Independent seeds on each side: the loop's per-sample τ (chain and DDTree-8) and the offline sampled τ are
    draws of one law (Mann-Whitney two-sided, p > 0.01), and the same test tells apart the offline τ at a nearby
    temperature, 0.7 against 1.0 (p < 0.01): it can fail."""
    target, drafter, head, prompts = _bundled()
    prompts = dict(list(prompts.items())[:2])
    params, n, k = SamplingParams(1.0), 24, 16
    loop_seeds = [stream_seed(1, "loop", i) for i in range(k)]
    off_seeds = [stream_seed(2, "offline", i) for i in range(k)]
    offline = _sampled(target, drafter, head, prompts, params, n, off_seeds, 8)
    cooler = _sampled(target, drafter, head, prompts, SamplingParams(0.7), n, off_seeds, 8)
    loop = ServerLoop(target, drafter, head, backend="torch", max_new_tokens=n, stop_at_eos=True)
    for which, budget in ((1, None), (2, 8)):
        online = []
        for ids in prompts.values():
            for seed in loop_seeds:
                loop.pick = _pick(params, seed)
                with loop.running():
                    online.append(loop.generate(ids, budget=budget).tau.tau)
        same = [v[which].tau for v in offline.values()]
        other = [v[which].tau for v in cooler.values()]
        assert _law_p(online, same) > 0.01, f"budget {budget}: the loop's τ does not follow the offline law"
        assert _law_p(online, other) < 0.01, f"budget {budget}: the test cannot tell T = 0.7 from T = 1.0"
