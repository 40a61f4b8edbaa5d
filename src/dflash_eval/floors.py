"""τ floors: the minimum acceptable τ per prompt and on average, kept in ``golden/tau_floors.json`` (read here;
written only by :mod:`dflash_eval.golden`; judged only by :mod:`dflash_eval.verdict`).

Floors are written from a measured run minus a stated margin, by the documented command::

    pytest tests_eval -k tau --update-tau-floors --tau-margin 0.25

File layout (schema 1)::

    {"schema": 1, "margin": 0.25, "note": "...", "settings": {...run settings...},
     "target": "<identity>", "drafter": "<fingerprint>",
     "chain": {"<prompt id>": floor, ...},
     "ddtree": {"8": {"<prompt id>": floor, ...}},
     "mean": {"chain": floor, "ddtree": {"8": floor}},
     "categories": {"<category>": floor, ...},
     "categories_ddtree": {"8": {"<category>": floor, ...}}}

Category floors apply to the category's mean τ over its prompts (``test_category_mean_tau[<category>]``).

A floor is ``max(1.0, measured - margin)`` rounded down to 3 decimals (τ is never below 1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["Floors", "load_floors", "make_floors", "floor_value", "UPDATE_COMMAND"]

SCHEMA = 1
UPDATE_COMMAND = "pytest tests_eval -k tau --update-tau-floors --tau-margin 0.25"


def floor_value(measured: float, margin: float) -> float:
    """``max(1, measured - margin)`` rounded DOWN to 3 decimals (so measured >= floor + margin - 0.001)."""
    if math.isnan(measured):
        return 1.0
    return max(1.0, math.floor((measured - margin) * 1000) / 1000)


@dataclass
class Floors:
    """Loaded floors; ``override`` (``--tau-floor``) replaces every per-prompt and mean floor."""

    chain: dict[str, float] = field(default_factory=dict)
    ddtree: dict[int, dict[str, float]] = field(default_factory=dict)
    mean_chain: float | None = None
    mean_ddtree: dict[int, float] = field(default_factory=dict)
    categories: dict[str, float] = field(default_factory=dict)
    categories_ddtree: dict[int, dict[str, float]] = field(default_factory=dict)
    margin: float | None = None
    path: Path | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    override: float | None = None

    def for_prompt(self, prompt_id: str, budget: int | None = None) -> float | None:
        if self.override is not None:
            return self.override
        if budget is None:
            return self.chain.get(prompt_id)
        return self.ddtree.get(int(budget), {}).get(prompt_id)

    def for_mean(self, budget: int | None = None) -> float | None:
        if self.override is not None:
            return self.override
        return self.mean_chain if budget is None else self.mean_ddtree.get(int(budget))

    def for_category(self, category: str, budget: int | None = None) -> float | None:
        """Floor of the mean τ of ``category``'s prompts (chain, or DDTree-``budget``)."""
        if self.override is not None:
            return self.override
        if budget is None:
            return self.categories.get(category)
        return self.categories_ddtree.get(int(budget), {}).get(category)

    def missing_message(self, what: str) -> str:
        where = self.path or "golden/tau_floors.json"
        return (f"no τ floor for {what} in {where}; record floors with `{UPDATE_COMMAND}` "
                "or pass --tau-floor VALUE")


def load_floors(path: str | Path, *, override: float | None = None) -> Floors:
    """Read the floors file (an absent file gives empty floors; a malformed one is a ConfigError)."""
    path = Path(path)
    if not path.is_file():
        return Floors(path=path, override=override)
    try:
        data = json.loads(path.read_text())
        mean = data.get("mean", {})
        return Floors(
            chain={str(k): float(v) for k, v in data.get("chain", {}).items()},
            ddtree={int(b): {str(k): float(v) for k, v in d.items()} for b, d in data.get("ddtree", {}).items()},
            mean_chain=None if mean.get("chain") is None else float(mean["chain"]),
            mean_ddtree={int(b): float(v) for b, v in (mean.get("ddtree") or {}).items()},
            categories={str(k): float(v) for k, v in (data.get("categories") or {}).items()},
            categories_ddtree={int(b): {str(k): float(v) for k, v in d.items()}
                               for b, d in (data.get("categories_ddtree") or {}).items()},
            margin=data.get("margin"),
            path=path,
            raw=data,
            override=override,
        )
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: malformed τ floors file ({type(exc).__name__}: {exc}); "
                          f"regenerate it with `{UPDATE_COMMAND}`") from exc


def make_floors(
    measured_chain: dict[str, float],
    measured_ddtree: dict[int, dict[str, float]],
    mean_chain: float,
    mean_ddtree: dict[int, float],
    *,
    margin: float,
    context: dict[str, Any] | None = None,
    previous: dict[str, Any] | None = None,
    category_chain: dict[str, float] | None = None,
    category_ddtree: dict[int, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The floors document for measured τ values (per-prompt and per-category entries of ``previous`` not
    measured are kept). ``category_chain`` / ``category_ddtree``: measured mean τ per category."""
    if margin < 0:
        raise ConfigError(f"--tau-margin must be >= 0, got {margin}")
    prev = previous or {}
    chain = dict(prev.get("chain", {}))
    chain.update({k: floor_value(v, margin) for k, v in measured_chain.items()})
    ddtree = {str(b): dict(d) for b, d in prev.get("ddtree", {}).items()}
    for b, d in measured_ddtree.items():
        ddtree.setdefault(str(b), {}).update({k: floor_value(v, margin) for k, v in d.items()})
    cats = dict(prev.get("categories", {}))
    cats.update({k: floor_value(v, margin) for k, v in (category_chain or {}).items()})
    cats_dd = {str(b): dict(d) for b, d in prev.get("categories_ddtree", {}).items()}
    for b, d in (category_ddtree or {}).items():
        cats_dd.setdefault(str(b), {}).update({k: floor_value(v, margin) for k, v in d.items()})
    doc = {
        "schema": SCHEMA,
        "margin": margin,
        "note": f"measured τ minus margin, floored at 1.0; regenerate with `{UPDATE_COMMAND}`",
        "chain": dict(sorted(chain.items())),
        "ddtree": {b: dict(sorted(d.items())) for b, d in sorted(ddtree.items(), key=lambda x: int(x[0]))},
        "mean": {"chain": floor_value(mean_chain, margin),
                 "ddtree": {str(b): floor_value(v, margin) for b, v in sorted(mean_ddtree.items())}},
        "categories": dict(sorted(cats.items())),
        "categories_ddtree": {b: dict(sorted(d.items())) for b, d in sorted(cats_dd.items(), key=lambda x: int(x[0]))},
    }
    doc.update(context or {})
    return doc
