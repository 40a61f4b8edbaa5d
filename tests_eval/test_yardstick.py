"""τ of the drafter against ``--reference-drafter`` (a released drafter of the same target) on the same prompts.

The reference's τ and the paired difference (drafter - reference, per prompt, paired 95 % CI over the prompts) are
reported beside the drafter's (eval.json ``drafter.reference``); the test fails when the drafter is worse than the
reference beyond noise (the whole CI below 0; a single prompt gives no interval, and no evidence). The architecture
comparison against the reference is ``test_checkpoint.py::test_matches_reference_drafter``.
"""

from __future__ import annotations

import pytest

from dflash_eval.errors import DFlashEvalError


def test_drafter_against_reference(eval_session, tau_results) -> None:
    if eval_session.settings.reference_drafter is None:
        pytest.skip("no --reference-drafter given")
    try:
        block = eval_session.reference_comparison()
    except DFlashEvalError as exc:
        pytest.fail(f"reference drafter {eval_session.settings.reference_drafter}: {type(exc).__name__}: {exc}",
                    pytrace=False)
    paired = block["paired"]
    assert paired["n"] == len(tau_results), "the reference was not evaluated on the drafter's prompts"
    lo, hi = paired["ci95"]
    assert not hi < 0, (f"mean chain τ (macro) {paired['mean_drafter']:.3f} is below the reference drafter's "
                        f"{paired['mean_reference']:.3f} ({block['path']}) beyond noise: paired Δ "
                        f"{paired['mean_diff']:+.3f} (95 % CI ({paired['ci_method']}) [{lo:+.3f}, {hi:+.3f}]) over "
                        f"{paired['n']} prompts")
