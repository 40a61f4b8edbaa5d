"""Sampling at temperature > 0: the processing against transformers' warpers, the seeded position-indexed draws,
and sampled generation (batched = one at a time; greedy below the sampling epsilon)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from dflash_eval.target.generation import greedy_generate, greedy_generate_batch
from dflash_eval.target.sampling import (
    SamplingParams,
    gumbel_noise,
    process_logprobs,
    sample_tokens,
    stream_seed,
)


def _transformers_kept(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    x = TemperatureLogitsWarper(p.temperature)(None, logits.clone())
    if p.top_k > 0:
        x = TopKLogitsWarper(p.top_k)(None, x)
    if p.top_p < 1:
        x = TopPLogitsWarper(p.top_p)(None, x)
    if p.min_p > 0:
        x = MinPLogitsWarper(p.min_p)(None, x)
    return torch.isfinite(x)


@pytest.mark.parametrize("params", [SamplingParams(0.6), SamplingParams(1.0, top_k=20), SamplingParams(0.8, top_p=0.9),
                                    SamplingParams(0.7, top_k=30, top_p=0.8), SamplingParams(1.0, min_p=0.05),
                                    SamplingParams(0.6, top_k=40, top_p=0.95, min_p=0.02)])
def test_processing_keeps_the_tokens_transformers_keeps(params: SamplingParams) -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 500) * 3
    lp = process_logprobs(logits, params)
    assert torch.equal(torch.isfinite(lp), _transformers_kept(logits, params))
    assert torch.allclose(lp.exp().sum(-1), torch.ones(16), atol=1e-5)  # renormalised over the kept tokens
    kept = torch.isfinite(lp)
    ref = torch.log_softmax((logits / params.temperature).masked_fill(~kept, float("-inf")), -1)
    assert torch.allclose(lp[kept], ref[kept], atol=1e-5)


def test_draws_depend_on_seed_position_and_token_only() -> None:
    seeds, pos = torch.tensor([7, 7, 8]), torch.tensor([3, 3, 3])
    g = gumbel_noise(seeds, pos, 64)
    assert torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    assert torch.equal(gumbel_noise(seeds[:1], torch.tensor([4]), 64)[0, :32], gumbel_noise(seeds[:1],
                       torch.tensor([4]), 32)[0])  # a token's noise does not depend on the vocabulary size
    assert stream_seed(0, "p", 0) == stream_seed(0, "p", 0) != stream_seed(0, "p", 1)
    assert 0 <= stream_seed(123, "x", 5) < 2 ** 31


def test_draws_follow_the_processed_distribution() -> None:
    """Over many positions of one stream, the draws' frequencies match the processed probabilities (a chi-square
    bound far above its 99.9 % quantile would mean biased noise)."""
    torch.manual_seed(1)
    params = SamplingParams(0.8, top_k=12)
    logits = torch.randn(1, 40)
    n = 20000
    ids = sample_tokens(logits.expand(n, -1), params, seeds=torch.full((n,), 5), positions=torch.arange(n))
    probs = process_logprobs(logits, params).exp()[0]
    counts = torch.bincount(ids, minlength=40).double()
    kept = probs > 0
    assert counts[~kept].sum() == 0
    chi2 = float((((counts[kept] - n * probs[kept]) ** 2) / (n * probs[kept])).sum())
    assert chi2 < 40.0, chi2  # 11 degrees of freedom: the 99.9 % quantile is 31.3


def test_greedy_below_epsilon_and_top_k_one() -> None:
    logits = torch.randn(5, 100)
    for p in (SamplingParams(0.0), SamplingParams(5e-7), SamplingParams(1.0, top_k=1)):
        assert torch.equal(sample_tokens(logits, p, seeds=torch.zeros(5), positions=torch.arange(5)),
                           logits.argmax(-1))


def test_bad_values_are_refused() -> None:
    for kw in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": 2.0}, {"top_k": -3}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            SamplingParams(**kw)


def test_sampled_generation_is_batch_independent_and_greedy_at_zero(tiny_target) -> None:  # type: ignore[no-untyped-def]
    prompts = [list(range(3, 15)), list(range(20, 27)), list(range(5, 40))]
    params = SamplingParams(1.0)
    seeds = [stream_seed(0, f"p{i}", 0) for i in range(3)]
    batch = greedy_generate_batch(tiny_target, prompts, 16, backend="torch", stop_at_eos=False,
                                  sampling=(params, seeds))
    alone = [greedy_generate_batch(tiny_target, [p], 16, backend="torch", stop_at_eos=False,
                                   sampling=(params, [s]))[0] for p, s in zip(prompts, seeds)]
    assert batch == alone  # left padding moves no draw: draws are indexed by each sequence's own positions
    greedy = [greedy_generate(tiny_target, p, 16, backend="torch", stop_at_eos=False) for p in prompts]
    assert batch != greedy  # a random target at T = 1 does not sample its argmax 48 times in a row
    zero = greedy_generate_batch(tiny_target, prompts, 16, backend="torch", stop_at_eos=False,
                                 sampling=(SamplingParams(0.0), seeds))
    assert zero == greedy_generate_batch(tiny_target, prompts, 16, backend="torch", stop_at_eos=False)
