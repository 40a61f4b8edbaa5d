"""A module that judges a measured number itself, as no module outside the verdict may: the fixture that proves
``tests/test_one_verdict.py``'s comparison check can fail. Never imported; only parsed."""

from __future__ import annotations


def prompt_ok(row: dict[str, float]) -> bool:
    return row["tau"] >= row["floor"]


def drift_ok(rel_err: float, rel_tol: float) -> bool:
    return rel_err <= rel_tol


def agrees(a: float, b: float, accept_tol: float) -> bool:
    return abs(a - b) <= accept_tol


def fast_enough(speedup: float, floor: float) -> bool:
    return not speedup < floor


def within_budget(scaled: float, budget: float) -> bool:
    return scaled <= budget


def counts_only(n: int, limit: int, rows: list[int]) -> bool:
    """Comparisons of counts and sizes are no verdict: the check leaves these alone."""
    return n > 0 and len(rows) <= limit
