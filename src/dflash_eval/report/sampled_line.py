"""The line of a run at temperature > 0 in the terminal summary and eval.md: the mean τ over prompts of each
prompt's mean over samples with the nested 95 % CI over prompts and samples (eval.json's ``sampled`` block,
:func:`dflash_eval.metrics.sampled_ci.sampled_summary`); None for a greedy run."""

from __future__ import annotations

from typing import Any

from dflash_eval.report.format import fmt

__all__ = ["sampled_line"]


def _part(label: str, s: dict[str, Any]) -> str:
    lo, hi = s["ci95"]
    return f"{label} {fmt(s['mean'])} ({fmt(lo)}..{fmt(hi)})"


def sampled_line(data: dict[str, Any]) -> str | None:
    """``sampled at T=0.6: 8 prompts x 4 samples; mean τ (nested 95 % CI over prompts and samples): chain ...``."""
    s = data.get("sampled")
    if not s:
        return None
    temp = (data.get("settings") or {}).get("temperature")
    parts = [_part("chain", s["chain"])] + [_part(f"DDTree-{b}", v) for b, v in s.get("ddtree", {}).items()]
    if s.get("online"):
        parts.append(_part("online", s["online"]))
    per = s["samples"] / s["prompts"] if s["prompts"] else 0
    return (f"sampled at T={temp}: {s['prompts']} prompts x {per:g} samples; mean τ (nested 95 % CI over prompts "
            "and samples): " + ", ".join(parts))
