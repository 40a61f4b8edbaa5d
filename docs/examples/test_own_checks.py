"""A project's own checks on top of the dflash-eval suite's fixtures: copy this file into your repository's tests.

The suite's fixtures (``eval_settings``, ``eval_session``, ``target``, ``drafter``, ``reference_completions``,
``eval_features``, ``tau_results``) come from the installed plugin; everything is computed once per run (and
cached), whether this file runs alone or with the suite. Tests that use these fixtures are recorded in
``reports/eval.json`` ("tests") like the suite's own::

    pytest tests/test_own_checks.py --target-model=/models/Qwen3-8B --drafter=ckpt/step_5000 --prompts=humaneval:40
    dflash-eval run tests/test_own_checks.py --target-model /models/Qwen3-8B --drafter ckpt/step_5000   # + the suite

(Give paths as ``--option=PATH`` to plain pytest: pytest chooses its rootdir before it knows plugin options, and
would take ``--target-model PATH`` for a test path; ``dflash-eval run`` joins them for you.)
"""

from __future__ import annotations

import pytest

from dflash_eval.pytest_plugin import SetupError, prompt_ids

MIN_ACCEPTED_ROUND = 2  # some round of every prompt accepts at least one drafted token besides the bonus token
MAX_STALLED_SHARE = 0.9  # at most this share of a prompt's rounds accept nothing but the bonus token


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "prompt_id" in metafunc.fixturenames:  # one test per prompt of the run (--prompts, --num-prompts)
        metafunc.parametrize("prompt_id", prompt_ids(metafunc.config))


def test_drafter_helps_on_every_prompt(prompt_id, tau_results) -> None:
    """The drafter is not useless on any prompt: some round accepts a drafted token, and most rounds do."""
    if isinstance(prompt_id, SetupError):
        prompt_id.fail()
    chain = tau_results[prompt_id].chain
    assert max(chain.accept_lengths, default=1) >= MIN_ACCEPTED_ROUND, (
        f"prompt {prompt_id!r}: no drafted token accepted in {chain.rounds} rounds (τ {chain.tau:.3f})")
    stalled = sum(1 for a in chain.accept_lengths if a == 1) / max(1, chain.rounds)
    assert stalled <= MAX_STALLED_SHARE, (
        f"prompt {prompt_id!r}: {stalled:.0%} of {chain.rounds} rounds accepted only the bonus token")


def test_completions_are_full_length(reference_completions, eval_settings) -> None:
    """Every reference completion reached --max-new-tokens (an early EOS makes τ of that prompt less telling)."""
    short = {p: len(r.output_ids) for p, r in reference_completions.items()
             if len(r.output_ids) < eval_settings.max_new_tokens}
    assert not short, f"completions shorter than {eval_settings.max_new_tokens} tokens: {short}"
