"""Sampled reference completions from an SGLang server: the request (one ``sampling_params`` per prompt with its
``sampling_seed``), the local target's plausibility check of every sampled completion, and the suite at
``--temperature`` > 0 with ``--completions sglang`` against the stand-in (``tests/sglang_standin.py``, NOT SGLang),
which samples with transformers' own sampler and honours the seed only with ``--enable-deterministic-inference``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_sglang_suite import ROOT, free_port, run_suite, show, standin_cmd

from dflash_eval.serving.server_sample_check import MIN_LIKELIHOOD_Z, sample_fit
from dflash_eval.sglang import SGLangError, generate_sampled

SAMPLED = ("--temperature", "0.6", "--samples-per-prompt", "2", "--max-new-tokens", "16", "-k", "tau")


def peaked_logq(gen: torch.Generator, n: int, vocab: int = 50) -> torch.Tensor:
    """Log-probabilities [n, vocab] of random, fairly peaked distributions."""
    return torch.log_softmax(3.0 * torch.randn(n, vocab, generator=gen), dim=-1)


# ------------------------------------------------------------------------------------------------ the statistic
def test_likelihood_z_of_true_draws_is_standard_normal_and_of_other_draws_far_below() -> None:
    gen = torch.Generator().manual_seed(0)
    right, wrong = [], []
    for i in range(300):
        lq = peaked_logq(gen, 24)
        draws = torch.multinomial(lq.exp(), 1, generator=gen)[:, 0].tolist()
        right.append(sample_fit(f"r{i}", draws, lq))
        other = torch.multinomial(peaked_logq(gen, 24).exp(), 1, generator=gen)[:, 0].tolist()  # other weights
        wrong.append(sample_fit(f"w{i}", other, lq))
    z = torch.tensor([f.z for f in right])
    assert abs(float(z.mean())) < 0.2 and 0.8 < float(z.std()) < 1.2, (float(z.mean()), float(z.std()))
    assert not any(f.refused for f in right), min(f.z for f in right)
    assert all(f.refused and f.z < MIN_LIKELIHOOD_Z for f in wrong), max(f.z for f in wrong)


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
    proc = subprocess.Popen([sys.executable, "tests/sglang_standin.py", "--model-path", "fixtures/target", "--port",
                             str(port), "--enable-deterministic-inference"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
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
def test_suite_at_temperature_takes_seeded_server_samples_reproducibly(tmp_path: Path) -> None:
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
def test_suite_warns_of_an_unseeded_server_and_refuses_one_that_samples_other_weights(tmp_path: Path) -> None:
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


@pytest.mark.slow
@pytest.mark.sglang
def test_a_warm_greedy_cache_still_starts_the_server_for_the_sampled_references(tmp_path: Path) -> None:
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
