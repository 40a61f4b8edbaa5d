"""How a value reads in every report and message: the terminal tables, eval.md, gate.md, the verdict lines and
their reasons, and the gate CLI.

One number formatter (:func:`fmt`) with one convention for a value that is not there: ``-`` for None, NaN and
anything that is not a number (a τ without a round, a floor never recorded, a CI that could not be computed).
``-`` rather than ``nan`` because eval.json and gate.json are strict JSON, which writes NaN as null: a table rendered
during the run and one rendered again from the file read the same. Infinities read ``inf`` / ``-inf``. One
interval formatter (:func:`ci_text`): a confidence interval reads ``lo–hi`` in a table's cell and ``[lo, hi]`` after
its estimate, each end through :func:`fmt`.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

__all__ = ["MISSING", "fmt", "ci_text", "ends", "percent_list", "verdict_text", "is_number"]

#: The text of a value that is not there (None, NaN, not a number).
MISSING = "-"


def is_number(x: object) -> TypeGuard[int | float]:
    """A real number with a value: an int or float (not a bool), not NaN."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def fmt(x: object, digits: int = 3, style: str = "f") -> str:
    """``x`` as text: ``style`` is a format type (``f`` fixed, ``e`` scientific, ``g`` general; a leading ``+``
    signs it) with ``digits`` digits (``fmt(4.31435)`` ``4.314``, ``fmt(1e-3, 2, "e")`` ``1.00e-03``,
    ``fmt(0.05, 3, "+f")`` ``+0.050``); :data:`MISSING` for None, NaN and anything that is not a number."""
    if not is_number(x):
        return MISSING
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    sign, kind = ("+", style[1:]) if style.startswith("+") else ("", style)
    return format(x, f"{sign}.{digits}{kind}")


def ends(ci: object) -> tuple[object, object]:
    """The two ends of an interval as eval.json, gate.json or a history record hold it (a pair, possibly with a
    null end; anything else: no interval, both ends None)."""
    lo, hi = (list(ci) + [None, None])[:2] if isinstance(ci, (list, tuple)) else (None, None)
    return lo, hi


def ci_text(lo: object, hi: object, digits: int = 3, style: str = "f", *, unit: str = "", brackets: bool = False,
            sep: str = "–") -> str:
    """An interval (a CI) as text, each end through :func:`fmt` with ``digits`` and ``style`` (``unit`` after an end
    that is a number): ``lo–hi`` (a table's cell; ``sep`` another separator, ``..`` inside a sentence's
    parentheses), or with ``brackets`` ``[lo, hi]`` (after its estimate)."""
    a, b = (f"{fmt(x, digits, style)}{unit if is_number(x) else ''}" for x in (lo, hi))
    return f"[{a}, {b}]" if brackets else f"{a}{sep}{b}"


def percent_list(values: list[Any]) -> str:
    """Fractions as whole percentages separated by spaces (``"93 81 70"``; :data:`MISSING` for NaN)."""
    return " ".join(fmt(100 * v if is_number(v) else None, 0) for v in values)


def verdict_text(passed: bool | None) -> str:
    """``PASS`` / ``FAIL``, :data:`MISSING` when the value was not judged (None)."""
    return MISSING if passed is None else "PASS" if passed else "FAIL"
