"""The predicted speed-up of the drafter over plain decoding, on this run's own device and dtype (docs/speedup.md).

τ is what the suite measures; speed is what it buys: ``speed-up = τ x the cost of a plain decoding step / the cost
of a round``, both costs timed on the run's target and a drafter of the run's drafter config (the ``round_costs``
measurement: about a second on the bundled fixtures on a CPU; cached per target, drafter shape, device kind, dtype
and versions). Every run reports the prediction of the chain and of each DDTree budget, with the interval τ's CI maps
to, and names the best budget (eval.md, eval.json's ``speedup``, the verdict block, ``speedup.png``);
``--speedup-floor X`` gates the predicted chain speed-up as ``--tau-floor`` gates τ. A floor holds for the device it
was measured on: the same drafter is faster on a GPU than on a CPU, relative to plain decoding as well.
"""

from __future__ import annotations

import pytest

from dflash_eval.errors import DFlashEvalError
from dflash_eval.metrics.verdict import speedup_floor_reason
from dflash_eval.session.eval_result import speedup_summary

NO_FLOOR = ("no --speedup-floor: the predicted speed-up on this device is reported (eval.md, eval.json's speedup), "
            "not gated")


def _x(v: object) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "-"


def test_predicted_speedup(tau_results, eval_session, testcase_property) -> None:
    """The predicted chain speed-up on this run's device >= --speedup-floor (skips without a floor: the prediction is
    reported in every run)."""
    try:
        speedup = speedup_summary(eval_session.evaluation, eval_session.tau_summary())
    except DFlashEvalError as exc:
        pytest.fail(f"{type(exc).__name__}: {exc}", pytrace=False)
    chain = speedup.strategies["chain"]
    testcase_property("speedup", round(chain.speedup, 4))  # --junitxml <property>, like τ's
    testcase_property("speedup_floor", speedup.floor)
    testcase_property("device", speedup.device)
    if speedup.floor is None:
        pytest.skip(NO_FLOOR)
    reason = speedup_floor_reason(speedup)
    costs = speedup.costs
    detail = (f"; plain step {1e3 * costs.step:.2f} ms, round {1e3 * chain.round_s:.2f} ms (parts: "
              + ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in chain.parts.items())
              + f"), mean chain τ {chain.tau:.3f}; best strategy {speedup.best} "
              f"{_x(speedup.strategies[speedup.best].speedup) if speedup.best else '-'}")
    assert reason is None, reason + detail
