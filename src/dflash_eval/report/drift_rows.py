"""Rows of the drift tables (terminal and eval.md alike): the hidden-state drift regression check per comparison and
layer, the drift budget's ladder of injected errors, the drift gate (measured drift against the budget), and the
line on the budget. Every number reads through :func:`dflash_eval.report.format.fmt`."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from dflash_eval.report.format import MISSING, fmt, span, verdict_text
from dflash_eval.report.summary import row_outcome

__all__ = ["drift_rows", "ladder_rows", "gate_rows", "budget_line"]


def _sci(x: object) -> str:
    return fmt(x, 2, "e")


def drift_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per comparison x layer: worst rel_err / cos over prompts against tolerance, τ difference."""
    header = ["comparison", "layer", "max rel_err", "rel tol", "min cos", "cos tol", "max |Δτ|", "Δτ tol", "verdict"]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in data.get("drift", []):
        groups[(r["comparison"], r["layer"])].append(r)
    acc: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in data.get("drift_accept", []):
        acc[r["comparison"]].append(r)
    rows = []
    for (comp, layer), rs in groups.items():
        a = acc.get(comp, [])
        dmax = max((x["diff"] for x in a if x["diff"] is not None and not math.isnan(x["diff"])), default=None)
        ok = all(x["passed"] for x in rs) and all(x["passed"] for x in a)
        rows.append([comp, str(layer), _sci(max(x["rel_err"] for x in rs)), fmt(rs[0]["rel_tol"], 1, "e"),
                     fmt(min(x["cos"] for x in rs), 6), fmt(rs[0]["cos_tol"], 12, "g"), fmt(dmax),
                     fmt(a[0]["tol"]) if a else fmt(None), verdict_text(ok)])
    return header, rows


def _order(x: float | None) -> float:
    """Sort key of a number that strict JSON may have turned into null (NaN: last)."""
    return float("inf") if x is None else x


def budget_line(data: dict[str, Any]) -> str | None:
    """One line on the drafter's drift budget and the gate's limit (None when the budget was not measured)."""
    b = data.get("drift_budget")
    if not b:
        return None
    bound = ">= " if b["lower_bound"] else ""
    why = ("every level stayed within the tolerance: a lower bound" if b["lower_bound"] else
           f"the next level, {b['limiting']}, moved τ more")
    return (f"drift budget of drafter {str(b['drafter'])[:12]}: {bound}{_sci(b['budget'])} relative feature error "
            f"(largest injected error whose mean |Δτ| over {b['n_prompts']} prompts stays <= {fmt(b['tol'], 6, 'g')}, "
            f"upper end of its 95 % CI; {b['base']} features, mean τ {fmt(b['base_mean_tau'])}; {why}); gate: "
            f"measured drift x {fmt(b['safety'], 6, 'g')} <= budget, i.e. drift <= {_sci(b['gate_limit'])}"
            + _budget_prompts_note(b))


def _budget_prompts_note(b: dict[str, Any]) -> str:
    """Where the budget's prompts came from, and whether it is conclusive (fewer than the minimum: not)."""
    n, sel, least = b["n_prompts"], b.get("selected_prompts"), b.get("min_prompts")
    note = f"; measured on the {n} first prompts of --prompts ({sel} selected)" if sel is not None and n > sel else ""
    if b.get("conclusive") is False:
        harm, tol = b.get("harm_level"), fmt(b["tol"], 6, "g")
        note += (f"; fewer than --drift-budget-min-prompts {least}: over it a gate is inconclusive unless the drift x "
                 f"{fmt(b['safety'], 6, 'g')} reaches " + (f"{harm} ({_sci(b['harm'])}), the smallest level whose mean "
                                                          f"|Δτ| exceeded {tol}" if harm else
                                                          f"a level whose mean |Δτ| exceeds {tol} (none did)"))
    return note


def ladder_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The drift budget's ladder: one row per perturbation, in order of injected error."""
    header = ["perturbation", "injected rel err", "mean τ", "mean |Δτ|", "CI95", "max |Δτ|", "within"]
    b = data.get("drift_budget") or {}
    levels = sorted(b.get("levels", []), key=lambda lv: _order(lv["injected_rel_err"]))
    rows = [[lv["label"], _sci(lv["injected_rel_err"]), fmt(lv["mean_tau"]), fmt(lv["mean_abs_dtau"]),
             span(lv["ci95"][0], lv["ci95"][1]), fmt(lv["max_abs_dtau"]), "yes" if lv["within"] else "NO"]
            for lv in levels]
    return header, rows


def _margin(g: dict[str, Any]) -> str:
    """budget / drift as ``12.3x``; ``inf`` for no drift at all (strict JSON writes the infinite margin as null)."""
    m, err = g.get("margin"), g.get("max_rel_err")
    if m is None:
        return "inf" if err == 0 else MISSING
    text = fmt(m, 3, "g")
    return text if text in ("inf", MISSING) else text + "x"


def gate_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The drift gate: per comparison and layer, the worst prompt's drift against the budget, and the margin
    (budget / drift; the gate needs at least the safety factor)."""
    header = ["comparison", "layer", "max rel_err", "worst prompt", "x safety", "budget", "margin", "verdict"]
    rows = []
    for g in data.get("drift_gate", []):
        err = g.get("max_rel_err")
        scaled = None if err is None else err * g["safety"]
        rows.append([g["comparison"], str(g["layer"]), _sci(err), g.get("worst_prompt", "-"), _sci(scaled),
                     (">= " if g.get("lower_bound") else "") + _sci(g["budget"]), _margin(g),
                     row_outcome(g).upper()])
    return header, rows
