"""Strictly valid JSON for the reports: NaN and ±inf (τ of a prompt without a speculative round, a mean over no
prompts) are written as ``null``, never as the non-standard ``NaN`` / ``Infinity`` that ``json.dumps`` emits by
default and that strict parsers (``jq``, JavaScript's ``JSON.parse``, ``json.loads(..., parse_constant=...)``)
refuse."""

from __future__ import annotations

import json
import math
from pathlib import Path, PurePath
from typing import Any

__all__ = ["strict", "dumps_strict"]

#: The exact types :func:`strict` returns unchanged (their subclasses go through its checks).
_AS_IS = frozenset({str, int, bool, type(None)})


def strict(obj: object) -> Any:
    """``obj`` with every non-finite float replaced by None, tuples and sets as lists, paths as strings, and
    mapping keys as strings."""
    if type(obj) in _AS_IS:  # most of a report: kept as it is, without the checks below
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [strict(v) for v in sorted(obj, key=str)]
    if isinstance(obj, (Path, PurePath)):
        return str(obj)
    return obj


def dumps_strict(obj: object, *, indent: int | None = 1) -> str:
    """JSON text of ``obj`` after :func:`strict` (raises ValueError if anything non-finite remained)."""
    return json.dumps(strict(obj), indent=indent, default=str, allow_nan=False)
