"""Architecture checks of the drafter against the target, one test per check (dflash_eval.drafter.checks.CHECKS).

A check with status 'warn' passes with a warning, 'skip' skips, 'fail' fails with the check's message (the key,
the expected and the actual value). With ``--reference-drafter DIR`` one more test lists every difference in
architecture fields and key shapes between the drafter and the reference.
"""

from __future__ import annotations

import warnings

import pytest

from dflash_eval.drafter import CHECKS


@pytest.mark.parametrize("check", list(CHECKS))
def test_architecture_check(check, eval_session) -> None:
    try:
        ckpt = eval_session.evaluation.checkpoint
    except Exception as exc:  # noqa: BLE001 - an unreadable drafter fails every check with the cause
        pytest.fail(f"drafter {eval_session.settings.drafter} cannot be read: {type(exc).__name__}: {exc}",
                    pytrace=False)
    try:
        spec = eval_session.inputs.spec  # from the target's config.json and weights; the model itself is not needed
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"target {eval_session.settings.target_model} cannot be read: {type(exc).__name__}: {exc}",
                    pytrace=False)
    result = CHECKS[check](ckpt, spec)
    if result.status == "skip":
        pytest.skip(f"{check}: {result.message}")
    if result.status == "warn":
        warnings.warn(f"{check}: {result.message}", UserWarning, stacklevel=1)
        return
    assert result.status == "pass", f"{check}: {result.message}"


def test_matches_reference_drafter(eval_session) -> None:
    if eval_session.settings.reference_drafter is None:
        pytest.skip("no --reference-drafter given")
    from dflash_eval.drafter import compare_architectures

    diffs = compare_architectures(eval_session.evaluation.checkpoint,
                                  eval_session.evaluation.reference_checkpoint)
    assert not diffs, (f"{len(diffs)} architecture difference(s) between {eval_session.settings.drafter} and "
                       f"the reference {eval_session.settings.reference_drafter}:\n  " + "\n  ".join(diffs))
