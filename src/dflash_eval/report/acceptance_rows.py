"""Rows of the per-position acceptance table and the multi-turn conversation table (terminal and eval.md alike).

Acceptance: one row per prompt, per category and for the whole run (``all``), per source that counted rounds
(offline ``chain``, ``online`` with ``--online-tau``, ``server`` when an SGLang server reported a histogram): rounds,
τ of those rounds, the per-position acceptance rates (slot k accepted, % of rounds, k = 1..B-1) and the
acceptance-length histogram (% of rounds, lengths 1..B). Conversations: each conversation's τ per turn and over all
its rounds, then the mean over conversations of each turn.
"""

from __future__ import annotations

import math
from typing import Any

from dflash_eval.metrics.acceptance_rates import acceptance_block, acceptance_table, position_rates, row_histograms
from dflash_eval.report.format import fmt, percent_list, span

__all__ = ["acceptance_rows", "conversation_rows"]


def _row(scope: str, source: str, block: dict[str, Any]) -> list[str]:
    hist = block.get("histogram", [])
    rounds = block.get("rounds", sum(hist))
    shares = [c / rounds for c in hist] if rounds else [math.nan] * len(hist)
    rates = block.get("position_rates") or position_rates(hist)
    return [scope, source, str(rounds), fmt(block.get("tau")), percent_list(rates), percent_list(shares)]


def acceptance_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the acceptance table (module docstring); no rows when no prompt has a histogram."""
    header = ["scope", "source", "rounds", "τ", "slot k accepted, % of rounds (k=1..B-1)",
              "accept length, % of rounds (1..B)"]
    prompts = data.get("prompts", {})
    rows = []
    for pid, r in prompts.items():
        for src, h in row_histograms(r).items():
            rows.append(_row(pid, src, acceptance_block(h)))
    cats = {c: v.get("acceptance") for c, v in (data.get("categories") or {}).items()}
    if not cats or any(v is None for v in cats.values()):  # an eval.json from before the acceptance tables
        cats = acceptance_table(prompts)
    for c in sorted(cats, key=lambda k: (k == "all", k)):
        for src, block in (cats[c] or {}).items():
            rows.append(_row(f"category {c}" if c != "all" else "all prompts", src, block))
    return header, rows


def conversation_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the multi-turn table; no rows without conversations."""
    convs = data.get("conversations") or {}
    header = ["conversation", "category", "τ per turn", "conversation τ", "rounds"]
    rows = [[cid, str(c.get("category", "-")), " / ".join(fmt(t) for t in c.get("turn_tau", [])),
             fmt(c.get("tau")), str(c.get("rounds", "-"))] for cid, c in convs.items()]
    for k, t in (data.get("turns") or {}).items():
        ch = t.get("chain", {})
        lo, hi = (ch.get("ci95") or [None, None])[:2]
        rows.append([f"turn {k} (mean of {ch.get('n', 0)})", "", f"{fmt(ch.get('mean'))} (CI95 {span(lo, hi)})",
                     fmt(t.get("acceptance", {}).get("tau")), str(t.get("acceptance", {}).get("rounds", "-"))])
    return header, rows
