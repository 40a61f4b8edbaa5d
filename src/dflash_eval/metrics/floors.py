"""τ floors: the minimum acceptable τ per prompt, kept in ``golden/tau_floors.json`` (read here; written only by
:mod:`dflash_eval.golden.writer`; judged only by :mod:`dflash_eval.metrics.verdict`).

Floors are written from a measured run minus a stated margin, by ``dflash-eval record`` with the options of the run
to gate (which also writes the completion snapshots and the feature fingerprint), or by any suite run with
``--update-tau-floors``::

    dflash-eval record --target-model models/x --drafter ckpt/step_5000 --prompts humaneval:40 --tau-margin 0.25
    pytest tests_eval -k tau --update-tau-floors --tau-margin 0.25     # a checkout, the bundled fixtures

File layout (schema 2)::

    {"schema": 2, "margin": 0.25, "note": "...", "drafter": "<fingerprint it was recorded with>",
     "context": {"target", "max_new_tokens", "max_blocks", "block_size", "chat_template", "dtype", "backend"},
     "chain": {"<prompt id>": floor, ...},
     "ddtree": {"8": {"<prompt id>": floor, ...}}}

A floor is ``max(1.0, measured - margin)`` rounded down to 3 decimals (τ is never below 1).

Aggregate floors follow the selection: the floor of the mean τ of a run, and of each category's mean τ, is the
mean of the per-prompt floors of the prompts actually selected (``--num-prompts``, ``--prompts``), so any subset
of a recorded set passes with the drafter the floors were recorded from and fails with a worse one. A selected
prompt without a floor is reported as missing; no aggregate floor is invented around it.

Explicit thresholds replace the file's: ``--tau-floor`` is the floor of the MEAN τ (chain and every DDTree
budget), ``--tau-floor-prompt`` the floor of every prompt's τ. With ``--tau-floor`` alone, prompts without a floor
are not gated one by one (only the mean is).

The file's ``context`` must match the run (:mod:`dflash_eval.metrics.tau_context`): otherwise it is an error, unless
explicit thresholds are given (the file is then ignored, with a warning) or ``--allow-settings-mismatch`` (used
anyway, with a warning). Schema-1 files (``target`` and ``settings`` at the top, recorded mean and category
floors) are read too; their recorded aggregates are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["Floors", "load_floors", "make_floors", "floor_value", "UPDATE_COMMAND"]

SCHEMA = 2
UPDATE_COMMAND = "dflash-eval record"  # with the options of the run to gate (a pytest run: --update-tau-floors)


def floor_value(measured: float, margin: float) -> float:
    """``max(1, measured - margin)`` rounded DOWN to 3 decimals (so measured >= floor + margin - 0.001)."""
    if math.isnan(measured):
        return 1.0
    return max(1.0, math.floor((measured - margin) * 1000) / 1000)


@dataclass(frozen=True)
class Floors:
    """Floors of one run: the file's per-prompt floors (when it applies), the explicit thresholds, and the selected
    prompts (id -> category) that aggregate floors are derived from."""

    chain: dict[str, float] = field(default_factory=dict)
    ddtree: dict[int, dict[str, float]] = field(default_factory=dict)
    margin: float | None = None
    path: Path | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    mean_override: float | None = None  # --tau-floor
    prompt_override: float | None = None  # --tau-floor-prompt
    selection: dict[str, str] = field(default_factory=dict)

    def select(self, selection: dict[str, str]) -> Floors:
        """These floors for the selected prompts ``{prompt id: category}``."""
        return dataclasses.replace(self, selection=dict(selection))

    def without_file(self) -> Floors:
        """Only the explicit thresholds (the file does not apply to this run)."""
        return dataclasses.replace(self, chain={}, ddtree={})

    @property
    def explicit(self) -> bool:
        """Whether explicit thresholds were given (--tau-floor / --tau-floor-prompt)."""
        return self.mean_override is not None or self.prompt_override is not None

    @property
    def prompt_floors_required(self) -> bool:
        """A prompt without a floor fails, unless only the mean is gated (--tau-floor alone)."""
        return self.mean_override is None

    def for_prompt(self, prompt_id: str, budget: int | None = None) -> float | None:
        if self.prompt_override is not None:
            return self.prompt_override
        if budget is None:
            return self.chain.get(prompt_id)
        return self.ddtree.get(int(budget), {}).get(prompt_id)

    def missing(self, ids: list[str] | None = None, budget: int | None = None) -> list[str]:
        """The selected prompts (or ``ids``) without a floor."""
        return [i for i in (ids if ids is not None else list(self.selection)) if self.for_prompt(i, budget) is None]

    def _derived(self, ids: list[str], budget: int | None) -> float | None:
        vals = [self.for_prompt(i, budget) for i in ids]
        if not vals or any(v is None for v in vals):
            return None
        return statistics.fmean(vals)  # type: ignore[arg-type]  # no None in vals: returned above

    def for_mean(self, budget: int | None = None) -> float | None:
        """Floor of the mean τ over the selected prompts (chain, or DDTree-``budget``)."""
        if self.mean_override is not None:
            return self.mean_override
        return self._derived(list(self.selection), budget)

    def for_category(self, category: str, budget: int | None = None) -> float | None:
        """Floor of the mean τ of the selected prompts of ``category`` (chain, or DDTree-``budget``)."""
        return self._derived([i for i, c in self.selection.items() if c == category], budget)

    def missing_message(self, what: str, ids: list[str] | None = None) -> str:
        where = self.path or "golden/tau_floors.json"
        lacking = f" (no floor for prompts {ids[:5]}{' ...' if len(ids) > 5 else ''})" if ids else ""
        return (f"no τ floor for {what} in {where}{lacking}; record floors with `{UPDATE_COMMAND}` and this run's "
                "options (pytest: --update-tau-floors), or pass --tau-floor VALUE (the mean) / --tau-floor-prompt "
                "VALUE (every prompt)")


def _context(data: dict[str, Any]) -> dict[str, Any]:
    """The recorded run context (schema 2 ``context``; schema 1: ``target`` and resolved ``settings``)."""
    if isinstance(data.get("context"), dict):
        return dict(data["context"])
    out: dict[str, Any] = {}
    if data.get("target"):
        out["target"] = data["target"]
    settings = data.get("settings") or {}
    for k in ("max_new_tokens", "max_blocks"):
        if k in settings:
            out[k] = settings[k]
    return out


def load_floors(path: str | Path, *, mean_override: float | None = None,
                prompt_override: float | None = None) -> Floors:
    """Read the floors file (an absent file gives no file floors; a malformed one is a ConfigError)."""
    path = Path(path)
    if not path.is_file():
        return Floors(path=path, mean_override=mean_override, prompt_override=prompt_override)
    try:
        data = json.loads(path.read_text())
        return Floors(
            chain={str(k): float(v) for k, v in data.get("chain", {}).items()},
            ddtree={int(b): {str(k): float(v) for k, v in d.items()} for b, d in data.get("ddtree", {}).items()},
            margin=data.get("margin"),
            path=path,
            raw=data,
            context=_context(data),
            mean_override=mean_override,
            prompt_override=prompt_override,
        )
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: malformed τ floors file ({type(exc).__name__}: {exc}); "
                          f"regenerate it with `{UPDATE_COMMAND}`") from exc


def make_floors(
    measured_chain: dict[str, float],
    measured_ddtree: dict[int, dict[str, float]],
    *,
    margin: float,
    context: dict[str, Any],
    drafter: str | None = None,
    previous: dict[str, Any] | None = None,
    margins: tuple[dict[str, float], dict[int, dict[str, float]]] | None = None,
    sigmas: float | None = None,
) -> dict[str, Any]:
    """The floors document for measured per-prompt τ (entries of ``previous`` for prompts not measured are kept
    when it was recorded in the same context). ``margins``: per-prompt margins (chain, per DDTree budget) of a run
    at temperature > 0, derived from the spread over samples (``sigmas`` of them,
    :func:`dflash_eval.metrics.sampled_tau.spread_margin`), used instead of ``margin``."""
    if margin < 0:
        raise ConfigError(f"--tau-margin must be >= 0, got {margin}")
    prev = previous or {}
    if _context(prev) and any(_context(prev).get(k) != v for k, v in context.items() if k in _context(prev)):
        prev = {}  # floors of another context are not kept beside these
    chain = dict(prev.get("chain", {}))
    cm, dm = margins if margins is not None else ({}, {})
    chain.update({k: floor_value(v, cm.get(k, margin)) for k, v in measured_chain.items()})
    ddtree = {str(b): dict(d) for b, d in prev.get("ddtree", {}).items()}
    for b, d in measured_ddtree.items():
        ddtree.setdefault(str(b), {}).update({k: floor_value(v, dm.get(b, {}).get(k, margin)) for k, v in d.items()})
    spread = {} if margins is None else {"margin_sigmas": sigmas, "margins": {
        "chain": {k: round(v, 4) for k, v in sorted(cm.items())},
        "ddtree": {str(b): {k: round(v, 4) for k, v in sorted(d.items())} for b, d in sorted(dm.items())}}}
    return {
        "schema": SCHEMA,
        "margin": margin,
        **spread,
        "note": f"measured τ minus margin, floored at 1.0; regenerate with `{UPDATE_COMMAND}` and the options of "
                "the gated run (a pytest run: --update-tau-floors)",
        "drafter": drafter,
        "context": context,
        "chain": dict(sorted(chain.items())),
        "ddtree": {b: dict(sorted(d.items())) for b, d in sorted(ddtree.items(), key=lambda x: int(x[0]))},
    }
