"""The run's τ and verdict as properties of the junit XML (``--junitxml``): global ``<properties>`` of the test
suite, so a CI system that reads junit sees the mean τ, its floor and the verdict without opening eval.json.

Properties: ``dflash_eval.mean_tau``, ``dflash_eval.mean_floor``, ``dflash_eval.mean_ddtree<N>``,
``dflash_eval.prompts`` (how many were evaluated), ``dflash_eval.failed_prompts``, ``dflash_eval.verdict``
(``PASS`` / ``FAIL``: the mean and every gated prompt and category against their floors).
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["junit_properties", "add_junit_properties"]


def junit_properties(data: dict[str, Any]) -> dict[str, Any]:
    """The properties of merged eval.json ``data`` (empty without τ)."""
    if "mean_tau" not in data:
        return {}
    prompts = data.get("prompts", {})
    failed = [p for p, r in prompts.items() if r.get("passed") is False]
    cats = [c for c, r in (data.get("categories") or {}).items() if r.get("passed") is False]
    out: dict[str, Any] = {"dflash_eval.mean_tau": _round(data.get("mean_tau")),
                           "dflash_eval.mean_floor": _round(data.get("mean_floor"))}
    for b, v in (data.get("mean_ddtree") or {}).items():
        out[f"dflash_eval.mean_ddtree{b}"] = _round(v)
    out["dflash_eval.prompts"] = len(prompts)
    out["dflash_eval.failed_prompts"] = len(failed)
    out["dflash_eval.verdict"] = "PASS" if data.get("mean_passed") and not failed and not cats else "FAIL"
    return out


def _round(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) and x == x else ("-" if x is None or x != x else x)


def add_junit_properties(config: pytest.Config, data: dict[str, Any]) -> None:
    """Add :func:`junit_properties` to the junit XML of this run, when one is written."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest moved it: no properties, never a failed run
        return
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for name, value in junit_properties(data).items():
        xml.add_global_property(name, value)
