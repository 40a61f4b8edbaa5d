"""Golden reference completions (syrupy JSON snapshots under golden/snapshots/) and their consistency with the
target's own teacher-forced argmax, both judged by the target: where a completion leaves what it is compared with,
the target's own margin at that token decides (:mod:`dflash_eval.metrics.near_tie`). Within the dtype's near-tie
band it is a named near tie (eval.json's ``near_ties``, the verdict block), not a failure, and the tokens after it
are not compared; outside it the test fails naming the position, both tokens and the margin.

Update the snapshots with ``pytest tests_eval/test_reference_completions.py --snapshot-update`` (a snapshot the run
left at a near tie is kept as it is).
"""

from __future__ import annotations

import pytest

from dflash_eval.golden.completions import GoldenCompletions
from dflash_eval.golden.writer import golden_extension
from dflash_eval.pytest_plugin import SetupError, collect, safe_id, setup_error_param


@pytest.fixture
def snapshot(snapshot, eval_settings):
    """Snapshots under --golden-dir, in a folder named after the target directory."""
    return snapshot.use_extension(golden_extension(eval_settings.golden_dir, eval_settings.snapshot_folder))


@pytest.fixture(scope="session")
def golden_completions(eval_session) -> GoldenCompletions:
    """The run's completions judged against their golden records, each once."""
    return GoldenCompletions(eval_session)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "prompt_id" in metafunc.fixturenames:
        ids, err = collect(metafunc.config, lambda s: [p.id for p in s.inputs.prompts])
        metafunc.parametrize("prompt_id", [setup_error_param(err)] if err else
                             [pytest.param(i, id=safe_id(i)) for i in ids])


def test_reference_completion(prompt_id, reference_completions, golden_completions, snapshot) -> None:
    """Pins the token ids and their local decoding (``rec.text`` is always the local tokenizer's decoding: a
    server's own text, absent under SGLang's --skip-tokenizer-init, is not pinned). A completion that leaves the
    golden one at a near tie of the target passes (the golden record stays as it is); one that leaves it where the
    target is confident fails, naming the position, both tokens and the margin."""
    if isinstance(prompt_id, SetupError):
        prompt_id.fail()
    rec = reference_completions[prompt_id]
    assert rec.output_ids, f"prompt {prompt_id!r}: empty completion"
    judged = golden_completions.compare(prompt_id)
    if not judged.pinned == snapshot:  # syrupy records the comparison (and rewrites the record under --snapshot-update)
        pytest.fail(judged.message, pytrace=False)


def test_teacher_forced_agreement(prompt_id, reference_completions, eval_session) -> None:
    """The target's argmax over prompt + completion (one causal forward) reproduces the completion, up to a near tie
    of the target (the decode path and the prefill path round differently)."""
    if isinstance(prompt_id, SetupError):
        prompt_id.fail()
    d = eval_session.references.argmax.divergence(prompt_id)
    if d is not None and not d.near_tie:
        pytest.fail(d.describe(), pytrace=False)
