"""Measurements registered from outside the suite (``dflash_eval.measurements.registry.register`` in a conftest or
plugin, or the ``dflash_eval.measurements`` entry-point group): one test each, which runs the measurement on the
run's drafter and fails with the measurement's own check; its report lands in eval.json's ``measurements``. The
built-in measurements (τ, the drift budget, the online loop) have tests of their own."""

from __future__ import annotations

import pytest

from dflash_eval.measurements.registry import registered_here

_NAMES = sorted(registered_here())


@pytest.mark.parametrize("name", _NAMES or [pytest.param(None, marks=pytest.mark.skip(
    reason="no measurement registered from outside the suite (dflash_eval.measurements.registry.register)"))])
def test_registered_measurement(eval_session, name: str) -> None:
    m = registered_here()[name]
    if not m.applies(eval_session.settings):
        pytest.skip(f"measurement {name!r} does not apply to this run's settings")
    problem = m.check(eval_session.evaluation.measure(name))
    assert problem is None, f"measurement {name!r}: {problem}"
