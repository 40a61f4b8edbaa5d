"""The run's τ and verdict as properties of the junit XML (``--junitxml``), valid under every ``junit_family``.

Test-suite ``<properties>`` (what ``record_testsuite_property`` writes; pytest's default family ``xunit2`` allows
properties only there), added by the xdist controller from the merged results, so a CI system that reads junit
sees the numbers without opening eval.json:

- the run: ``dflash_eval.mean_tau``, ``dflash_eval.mean_floor``, ``dflash_eval.mean_ddtree<N>``,
  ``dflash_eval.prompts`` (how many were evaluated), ``dflash_eval.failed_prompts``, ``dflash_eval.verdict``
  (``PASS`` / ``FAIL``: the run's verdict, the one pytest's exit status follows), ``dflash_eval.floors`` (``PASS`` /
  ``FAIL``: its floors part, the mean and every gated prompt and category against their floors) and, when the drift
  gate ran, ``dflash_eval.drift_gate`` (``PASS`` / ``FAIL`` / ``INCONCLUSIVE``: its drift gate part), as eval.json
  holds them; ``dflash_eval.near_ties`` (how many completions left their golden record or their
  teacher-forced argmax at a near tie of the target: not failures) and one ``dflash_eval.near_tie.<n>`` per near
  tie (prompt, what it was compared with, position, both tokens, the margin and the band);
- each prompt (the τ tests ``test_tau[<prompt>]`` and ``test_ddtree_tau[<prompt>-ddtree<N>]``):
  ``dflash_eval.prompt.<prompt>.tau``, ``.floor``, ``.rounds``, ``.ddtree<N>.tau``, ``.ddtree<N>.floor`` and
  ``.verdict``.

Under ``junit_family = xunit1`` (or ``legacy``) the τ tests also carry ``tau``, ``floor`` and ``rounds`` as
properties of their own test case, through the :func:`testcase_property` fixture; under ``xunit2`` that fixture
records nothing (pytest's ``record_property`` would warn there: test-case properties are not valid xunit2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dflash_eval.metrics.verdict import DRIFT_GATE, FLOORS, stored_verdict
from dflash_eval.session.run_result import RunResult

__all__ = ["junit_properties", "add_junit_properties", "testcase_property", "testcase_properties_allowed"]

#: The junit families whose schema allows ``<properties>`` inside a ``<testcase>``.
TESTCASE_PROPERTY_FAMILIES = ("xunit1", "legacy")


def junit_properties(result: RunResult) -> dict[str, Any]:
    """The properties of the run's ``result``: the near ties, and (when τ was measured) τ and the verdicts."""
    ties = result.near_ties or []
    near: dict[str, Any] = {"dflash_eval.near_ties": len(ties)} if ties or result.tau is not None else {}
    for n, tie in enumerate(ties):
        near[f"dflash_eval.near_tie.{n}"] = (f"{tie.prompt_id} against {tie.against} at completion token "
                                            f"{tie.position}: {tie.expected} vs {tie.got}, margin "
                                            f"{_round(tie.margin)} < band {tie.band:g} ({tie.dtype})")
    if result.tau is None:
        return near
    verdict = stored_verdict(result)
    prompts = result.prompts
    failed = [p for p, r in prompts.items() if r.passed is False]
    out: dict[str, Any] = {"dflash_eval.mean_tau": _round(result.tau.mean_tau),
                           "dflash_eval.mean_floor": _round(result.tau.mean_floor)}
    for b, v in result.tau.mean_ddtree.items():
        out[f"dflash_eval.mean_ddtree{b}"] = _round(v)
    out["dflash_eval.prompts"] = len(prompts)
    out["dflash_eval.failed_prompts"] = len(failed)
    out["dflash_eval.verdict"] = "FAIL" if verdict.passed is False else "PASS"
    out["dflash_eval.floors"] = "PASS" if verdict.outcome(FLOORS) == "pass" else "FAIL"
    gate = verdict.outcome(DRIFT_GATE)
    if gate is not None:
        out["dflash_eval.drift_gate"] = gate.upper()
    out.update(near)
    for n, group in enumerate(result.not_checked or []):  # what the verdict does not vouch for
        out[f"dflash_eval.not_checked.{n}"] = f"{group.reason} ({group.tests} tests)"
    for pid, r in prompts.items():
        key = f"dflash_eval.prompt.{pid}"
        out[f"{key}.tau"] = _round(r.tau)
        out[f"{key}.floor"] = _round(r.floor)
        out[f"{key}.rounds"] = r.rounds
        for b, v in r.ddtree.items():
            out[f"{key}.ddtree{b}.tau"] = _round(v)
            out[f"{key}.ddtree{b}.floor"] = _round(r.ddtree_floor.get(b))
        out[f"{key}.verdict"] = {True: "PASS", False: "FAIL", None: "-"}[r.passed]
    return out


def _round(x: object) -> object:
    return round(x, 4) if isinstance(x, float) and x == x else ("-" if x is None or x != x else x)


def add_junit_properties(config: pytest.Config, result: RunResult) -> None:
    """Add :func:`junit_properties` to the junit XML of this run as test-suite properties, when one is written."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest moved it: no properties, never a failed run
        return
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for name, value in junit_properties(result).items():
        xml.add_global_property(name, value)


def testcase_properties_allowed(config: pytest.Config) -> bool:
    """Whether this run's ``junit_family`` allows properties of a test case (xunit1, legacy)."""
    return str(config.getini("junit_family")) in TESTCASE_PROPERTY_FAMILIES


@pytest.fixture
def testcase_property(request: pytest.FixtureRequest) -> Callable[[str, object], None]:
    """``record(name, value)``: a property of the calling test's junit ``<testcase>`` where the junit family allows
    one (xunit1, legacy; what ``record_property`` does), else nothing: the same numbers are test-suite properties
    (:func:`junit_properties`), valid under xunit2 and written without a warning."""
    if not testcase_properties_allowed(request.config):
        return lambda name, value: None

    def record(name: str, value: object) -> None:
        request.node.user_properties.append((name, value))
    return record
