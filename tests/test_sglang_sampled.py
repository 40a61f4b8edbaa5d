"""Sampled reference completions from an SGLang server: the request (one ``sampling_params`` per prompt with its
``sampling_seed``), the local target's plausibility check of every sampled completion, and the suite at
``--temperature`` > 0 with ``--completions sglang`` against the stand-in (``tests/sglang_standin.py``, NOT SGLang),
which samples with transformers' own sampler and honours the seed only with ``--enable-deterministic-inference``.
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_sglang_suite import (
    ROOT,
    SuiteRun,
    free_port,
    run_suite,  # noqa: F401 - the suite's fixture
    show,
    standin_cmd,
)

from dflash_eval.references.server_sample_check import (
    FETCH_Z_FLAT,
    FETCH_Z_SHARP,
    SAMPLE_Z_FLAT,
    SAMPLE_Z_SHARP,
    SHARP_GUARANTEE,
    TOO_FLAT,
    TOO_SHARP,
    FetchFit,
    freedman_tail,
    sample_fit,
)
from dflash_eval.sglang import SGLangError, generate_sampled

SAMPLED = ("--temperature", "0.6", "--samples-per-prompt", "2", "--max-new-tokens", "16", "-k", "tau")


def peaked_logq(gen: torch.Generator, n: int, vocab: int = 50) -> torch.Tensor:
    """Log-probabilities [n, vocab] of random, fairly peaked distributions."""
    return torch.log_softmax(3.0 * torch.randn(n, vocab, generator=gen), dim=-1)


def draws(gen: torch.Generator, lq: torch.Tensor, power: float = 1.0) -> list[int]:
    """One token per row of ``lq``, drawn from ``q^power`` renormalised (power 1: q itself; inf: the argmax)."""
    if math.isinf(power):
        return lq.argmax(-1).tolist()
    return torch.multinomial(torch.softmax(power * lq, -1), 1, generator=gen)[:, 0].tolist()


# ------------------------------------------------------------------------------------------------ the statistic
def test_likelihood_z_of_true_draws_is_standard_normal_and_of_other_draws_far_below() -> None:
    gen = torch.Generator().manual_seed(0)
    right, wrong = [], []
    for i in range(300):
        lq = peaked_logq(gen, 24)
        right.append(sample_fit(f"r{i}", draws(gen, lq), lq))
        wrong.append(sample_fit(f"w{i}", draws(gen, peaked_logq(gen, 24)), lq))  # other weights
    z = torch.tensor([f.z for f in right])
    assert abs(float(z.mean())) < 0.2 and 0.8 < float(z.std()) < 1.2, (float(z.mean()), float(z.std()))
    assert not any(f.refused for f in right), (min(f.z for f in right), max(f.z for f in right))
    assert all(f.refused and f.z < SAMPLE_Z_FLAT for f in wrong), max(f.z for f in wrong)


def fetch_of(gen: torch.Generator, power: float, n: int = 8, length: int = 16) -> FetchFit:
    """A fetch of ``n`` completions of ``length`` tokens drawn from ``q^power`` and judged against ``q``."""
    fits = []
    for i in range(n):
        lq = peaked_logq(gen, length)
        fits.append(sample_fit(f"p{i // 2}#{i % 2}", draws(gen, lq, power), lq))
    return FetchFit(tuple(fits))


def test_the_pooled_score_of_true_draws_is_standard_normal_and_accepted() -> None:
    gen = torch.Generator().manual_seed(2)
    fetches = [fetch_of(gen, 1.0) for _ in range(300)]
    z = torch.tensor([f.z for f in fetches])
    assert abs(float(z.mean())) < 0.2 and 0.8 < float(z.std()) < 1.2, (float(z.mean()), float(z.std()))
    assert not any(f.refusals() for f in fetches), (float(z.min()), float(z.max()))


@pytest.mark.parametrize("power, what, length", [(math.inf, TOO_SHARP, 16), (2.0, TOO_SHARP, 16),
                                                 (1.6, TOO_SHARP, 48), (0.5, TOO_FLAT, 16)])
def test_draws_sharper_or_flatter_than_asked_are_refused_by_the_pooled_score(power: float, what: str,
                                                                             length: int) -> None:
    """Greedy (power inf), half the temperature (2), 0.6 of it (1.6, a smaller effect: longer completions) and twice
    the temperature (0.5, on the flat side): the pooled score refuses every fetch, naming its most extreme sample;
    at half the temperature and below, each completion of 16 tokens passes on its own."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        fetch = fetch_of(gen, power, length=length)
        if power in (2.0, 1.6):
            assert not any(f.refused for f in fetch.samples), [f.z for f in fetch.samples]
        pooled = [r for r in fetch.refusals() if r.pooled]
        assert len(pooled) == 1 and pooled[0].what == what, (fetch.z, [f.z for f in fetch.samples])
        assert (fetch.z > FETCH_Z_SHARP) if what == TOO_SHARP else (fetch.z < FETCH_Z_FLAT)
        extreme = (max if what == TOO_SHARP else min)(fetch.samples, key=lambda f: f.z)
        assert pooled[0].fit is extreme  # the fetch's most extreme sample is the one named


def test_one_greedy_completion_among_right_ones_is_refused_on_its_own() -> None:
    gen = torch.Generator().manual_seed(4)
    lq = peaked_logq(gen, 128)
    greedy = sample_fit("p3#1", draws(gen, lq, math.inf), lq)
    assert greedy.z > SAMPLE_Z_SHARP and greedy.refused, greedy.z
    fetch = FetchFit((*fetch_of(gen, 1.0, n=31, length=128).samples, greedy))
    assert fetch.z < FETCH_Z_SHARP  # diluted in the pool ...
    r = fetch.refusals()
    assert r and not r[0].pooled and r[0].what == TOO_SHARP and r[0].fit.item == "p3#1"  # ... caught on its own


def test_near_deterministic_positions_neither_add_evidence_nor_dilute_it() -> None:
    gen = torch.Generator().manual_seed(5)
    lq = peaked_logq(gen, 16)
    ids = draws(gen, lq, 2.0)
    det = torch.full((16, lq.shape[1]), -60.0).scatter(1, torch.zeros(16, 1, dtype=torch.long), 0.0)
    det = torch.log_softmax(det, -1)  # one token has all the mass
    both = sample_fit("p#0", ids + [0] * 16, torch.cat([lq, det]))
    alone = sample_fit("p#0", ids, lq)
    assert both.z == pytest.approx(alone.z, abs=1e-6) and both.n_inside == 32


def test_a_few_heavy_tailed_positions_do_not_make_a_right_draw_look_sharp() -> None:
    """A moderately likely argmax (2 %) over a flat tail of 1999 tokens: a right server draws the argmax at both
    positions of a short completion once in 2500, and then scores z ~ +10, far past the thresholds; Freedman's bound
    with the positions' largest term says such a score is no evidence, so it is not refused. Over many positions
    of the same kind, the same per-token excess is."""
    vocab = 2000
    row = torch.full((vocab,), math.log(0.98 / (vocab - 1)))
    row[7] = math.log(0.02)
    lq = row.expand(2, vocab).clone()
    fit = sample_fit("p#0", [7, 7], lq)
    assert fit.z > SAMPLE_Z_SHARP + FETCH_Z_SHARP and freedman_tail(fit.z, fit.max_gain, fit.variance) > SHARP_GUARANTEE
    assert not fit.refused and not FetchFit((fit,)).refusals()
    greedy_long = sample_fit("p#0", [7] * 400, row.expand(400, vocab).clone())
    assert greedy_long.refused and FetchFit((greedy_long,)).refusals()[0].what == TOO_SHARP
    assert freedman_tail(4.0, 0.0, 1.0) == pytest.approx(math.exp(-8.0))  # no term bound: the normal exponent
    assert freedman_tail(5.0, 1.0, 100.0) < freedman_tail(4.0, 1.0, 100.0) < freedman_tail(4.0, 5.0, 100.0)


def test_tokens_outside_the_support_are_counted_with_the_slack_of_one_token() -> None:
    gen = torch.Generator().manual_seed(1)
    lq = peaked_logq(gen, 20)
    top = lq.argmax(-1)
    kept = torch.full_like(lq, -math.inf).scatter(1, top[:, None], 0.0)  # top-k 1: only the argmax survives
    one_off = top.tolist()
    one_off[3] = (one_off[3] + 1) % lq.shape[1]
    fit = sample_fit("p#0", one_off, kept)
    assert fit.outside == [3] and not fit.refused  # one token across a boundary: a bf16 server may do that
    three_off = list(one_off)
    for k in (5, 9, 11):
        three_off[k] = (three_off[k] + 1) % lq.shape[1]
    fit = sample_fit("p#0", three_off, kept)
    assert fit.outside == [3, 5, 9, 11] and fit.refused


# ------------------------------------------------------------------------------------------------ the request
def test_generate_sampled_refuses_bad_arguments_before_any_request() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: an argument error must come first
    with pytest.raises(SGLangError, match="temperature > 0"):
        generate_sampled(url, [[1]], sampling={"temperature": 0.0}, seeds=[1], max_new_tokens=4)
    with pytest.raises(SGLangError, match="one int .* per prompt"):
        generate_sampled(url, [[1], [2]], sampling={"temperature": 0.6}, seeds=[1], max_new_tokens=4)
    with pytest.raises(SGLangError, match="must not set"):
        generate_sampled(url, [[1]], sampling={"temperature": 0.6, "sampling_seed": 3}, seeds=[1], max_new_tokens=4)


@pytest.fixture(scope="module")
def seeded_standin() -> str:
    """A ready stand-in serving the bundled target that honours sampling_seed."""
    import requests

    port = free_port()
    proc = subprocess.Popen(shlex.split(standin_cmd(port, "--enable-deterministic-inference")), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        from dflash_eval.sglang import wait_until_ready

        wait_until_ready(url, timeout_s=120, process=proc)
        assert requests.get(url + "/server_info", timeout=5).json()["enable_deterministic_inference"] is True
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.sglang
def test_a_seeded_server_answers_each_seed_reproducibly_and_seeds_apart(seeded_standin: str) -> None:
    prompts = [[10, 11, 12, 13], [20, 21, 22]]
    kw = dict(sampling={"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0}, max_new_tokens=12,
              timeout_s=60)
    a = generate_sampled(seeded_standin, prompts, seeds=[7, 8], **kw)
    b = generate_sampled(seeded_standin, prompts[::-1], seeds=[8, 7], **kw)  # another order, same seeds
    assert [c.output_ids for c in a] == [c.output_ids for c in b[::-1]]
    others = generate_sampled(seeded_standin, prompts, seeds=[1007, 1008], **kw)
    assert [c.output_ids for c in others] != [c.output_ids for c in a]


# ------------------------------------------------------------------------------------------------ the suite
def sampled_entries(cache: Path) -> list[dict]:
    return [json.loads(m.read_text())["meta"] for m in (cache / "v1" / "sampled_completion").glob("*/*/manifest.json")]


@pytest.mark.slow
@pytest.mark.sglang
def test_suite_at_temperature_takes_seeded_server_samples_reproducibly(
        tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:  # noqa: F811
    results = []
    for run in ("first", "second"):  # each its own server start and a fresh cache
        port = free_port()
        work = tmp_path / run
        proc = run_suite(work, "--sglang-launch", standin_cmd(port, "--enable-deterministic-inference"),
                         "--sglang-url", f"http://127.0.0.1:{port}", "--num-prompts", "2", *SAMPLED,
                         )
        assert proc.returncode == 0, show(proc)
        assert "UnseededServerWarning" not in proc.stdout + proc.stderr
        metas = sampled_entries(work / "cache")
        assert len(metas) == 4 and {m["source"] for m in metas} == {"sglang"} and all(m["seeded"] for m in metas)
        data = json.loads((work / "reports" / "eval.json").read_text())
        results.append({pid: r["sample_tau"] for pid, r in data["prompts"].items()})
        assert data["sampled"]["samples"] == 4 and data["sampled"]["prompts"] == 2, data["sampled"]
    assert results[0] == results[1]


@pytest.mark.slow
@pytest.mark.sglang
def test_suite_warns_of_an_unseeded_server_and_refuses_one_that_samples_other_weights(
        tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:  # noqa: F811
    port = free_port()
    proc = run_suite(tmp_path / "unseeded", "--sglang-launch", standin_cmd(port), "--sglang-url",
                     f"http://127.0.0.1:{port}", "--num-prompts", "1", *SAMPLED)
    assert proc.returncode == 0, show(proc)
    assert "UnseededServerWarning" in proc.stdout and "--enable-deterministic-inference" in proc.stdout, show(proc)
    assert not any(m["seeded"] for m in sampled_entries(tmp_path / "unseeded" / "cache"))

    port = free_port()
    proc = run_suite(tmp_path / "wrong", "--sglang-launch",
                     standin_cmd(port, "--enable-deterministic-inference", "--wrong-answer-at", "1"),
                     "--sglang-url", f"http://127.0.0.1:{port}", "--num-prompts", "1", *SAMPLED)
    assert proc.returncode != 0, show(proc)
    out = proc.stdout + proc.stderr
    assert "does not sample the target" in out and "likelihood z-score" in out, show(proc)
    assert not sampled_entries(tmp_path / "wrong" / "cache")


#: A fetch large enough for the pooled score to see a sampler at half the temperature: 2 prompts x 4 samples x 32
#: tokens, all in one fetch (no xdist, one generation batch).
POOLED = ("--temperature", "0.6", "--num-prompts", "2", "--samples-per-prompt", "4", "--max-new-tokens", "32", "-k",
          "tau")


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.parametrize("fault, asked, what", [
    ("greedy", (), "too sharp"),
    ("half-temperature", (), "too sharp"),
    # a top-k 20 that was not asked sharpens less per token (benchmarks/bench_sample_check.py: pooled z about +13 over
    # 4096 tokens, +3.3 over the 256 above): 2 prompts x 8 samples x 64 tokens, about +6.6
    ("extra-top-k", ("--samples-per-prompt", "8", "--max-new-tokens", "64"), "too sharp"),
    ("double-temperature", (), "too flat"),
    ("ignore-top-k", ("--top-k", "20"), "outside the support"),
])
def test_a_server_that_samples_otherwise_than_asked_is_refused_and_nothing_cached(
        tmp_path: Path, fault: str, asked: tuple[str, ...], what: str,
        run_suite: Callable[..., SuiteRun]) -> None:  # noqa: F811
    """A server that answers a sampled request greedily, at half or twice the temperature, with a top-k it was not
    asked or without the one it was asked (what a proxy that drops or rewrites sampling_params keys serves) is
    refused, naming the direction, the sample and the score; no sampled reference is cached."""
    port = free_port()
    proc = run_suite(tmp_path, "--sglang-launch",
                     standin_cmd(port, "--enable-deterministic-inference", "--sampling-fault", fault),
                     "--sglang-url", f"http://127.0.0.1:{port}", *POOLED, *asked)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, show(proc)
    assert "does not sample the target" in out and what in out, show(proc)
    if what != "outside the support":
        assert "likelihood z-score" in out and "#" in out, show(proc)  # the score and a sample prompt#k
    assert not sampled_entries(tmp_path / "cache"), sampled_entries(tmp_path / "cache")


@pytest.mark.slow
@pytest.mark.sglang
def test_a_warm_greedy_cache_still_starts_the_server_for_the_sampled_references(
        tmp_path: Path, run_suite: Callable[..., SuiteRun]) -> None:  # noqa: F811
    port = free_port()
    launch = ("--sglang-launch", standin_cmd(port, "--enable-deterministic-inference"), "--sglang-url",
              f"http://127.0.0.1:{port}", "--num-prompts", "1", "--max-new-tokens", "16", "-k", "tau")
    greedy = run_suite(tmp_path, *launch)
    assert greedy.returncode == 0, show(greedy)
    assert not sampled_entries(tmp_path / "cache")
    sampled = run_suite(tmp_path, *launch, "--temperature", "0.6", "--samples-per-prompt", "2")
    assert sampled.returncode == 0, show(sampled)
    assert len(sampled_entries(tmp_path / "cache")) == 2
    taus = json.loads((tmp_path / "reports" / "eval.json").read_text())["prompts"]
    again = run_suite(tmp_path, "--sglang-url", f"http://127.0.0.1:{free_port()}", *launch[4:], "--temperature",
                      "0.6", "--samples-per-prompt", "2")  # everything cached: no server is asked
    assert again.returncode == 0 and "SGLang" not in again.stderr, show(again)
    assert "sglang" not in json.loads((tmp_path / "reports" / "eval.json").read_text())  # no server was started
    cached = run_suite(tmp_path, *launch[4:], "--completions", "cache", "--temperature", "0.6",
                       "--samples-per-prompt", "2")  # --completions cache takes the server's sampled entries
    assert cached.returncode == 0, show(cached)
    again_taus = json.loads((tmp_path / "reports" / "eval.json").read_text())["prompts"]
    assert {p: r["sample_tau"] for p, r in again_taus.items()} == {p: r["sample_tau"] for p, r in taus.items()}


def test_online_tau_at_temperature_needs_local_references() -> None:
    from dflash_eval.errors import ConfigError
    from dflash_eval.options.settings import EvalSettings

    with pytest.raises(ConfigError, match="--online-tau at --temperature 0.6 .* --completions local"):
        EvalSettings.from_mapping({"temperature": 0.6, "online_tau": True, "completions": "sglang",
                                   "sglang_url": "http://127.0.0.1:1"})
    assert EvalSettings.from_mapping({"temperature": 0.6, "completions": "sglang",
                                      "sglang_url": "http://127.0.0.1:1"}).sampling_params().temperature == 0.6
