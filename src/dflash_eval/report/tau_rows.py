"""Rows of the τ tables (terminal and eval.md alike): one row per prompt with its floors and verdict plus the mean
row, one row per category (mean, median, bootstrap 95 % CI, per DDTree budget too), and the line on the
``--baseline`` comparison. Every number reads through :func:`dflash_eval.report.format.fmt`."""

from __future__ import annotations

from typing import Any

from dflash_eval.metrics.stats import ddtree_budgets
from dflash_eval.report.format import fmt, is_number, span, verdict_text

__all__ = ["tau_rows", "category_rows", "baseline_line", "budgets"]


def budgets(data: dict[str, Any]) -> list[str]:
    """The DDTree budgets the run's prompts were measured with (as eval.json's keys)."""
    return ddtree_budgets(data.get("prompts", {}))


def _ci(s: dict[str, Any] | None) -> str:
    if not s or not s.get("ci95"):
        return fmt(None)
    return span(s["ci95"][0], s["ci95"][1], 2)


def category_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-category table: n, chain τ mean / median / 95 % CI, the same per DDTree budget,
    floors (chain/DDTree-N... in one cell), verdict; the overall ("all") row last."""
    cats = data.get("categories") or {}
    bs = budgets(data)
    header = ["category", "n", "chain mean", "median", "CI95"]
    for b in bs:
        header += [f"DDTree-{b} mean", "median", "CI95"]
    header += ["floors", "verdict"]  # "chain/DDTree-N..." floors in one cell (keeps the table within 120 columns)
    rows = []
    for c in sorted(cats, key=lambda k: (k == "all", k)):
        r = cats[c]
        row = [c, str(r.get("n", "-")), fmt(r["chain"]["mean"]), fmt(r["chain"]["median"]), _ci(r["chain"])]
        for b in bs:
            s = r.get("ddtree", {}).get(b) or {}
            row += [fmt(s.get("mean")), fmt(s.get("median")), _ci(s)]
        row.append("/".join([fmt(r.get("floor"))] + [fmt(r.get("ddtree_floor", {}).get(b)) for b in bs]))
        row.append(verdict_text(r.get("passed")))
        rows.append(row)
    return header, rows


def _mean(values: list[Any]) -> float | None:
    known = [v for v in values if is_number(v)]
    return sum(known) / len(known) if known else None


def _insert_column(header: list[str], rows: list[list[str]], name: str, values: list[Any]) -> None:
    """A column of numbers after the chain τ: one value per prompt row, then their mean in the mean row."""
    header.insert(2, name)
    for row, v in zip(rows, values + [_mean(values)]):
        row.insert(2, fmt(v))


def tau_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the τ table (prompt, chain τ, DDTree-N τ..., floor, verdict) plus a mean row."""
    bs = budgets(data)
    prompts = data.get("prompts", {})
    header = ["prompt", "chain τ"] + [f"DDTree-{b} τ" for b in bs] + ["floor"] + [f"DDTree-{b} floor" for b in bs] \
        + ["rounds", "verdict"]
    rows = []
    for pid, r in prompts.items():
        rows.append([pid, fmt(r.get("tau"))] + [fmt(r["ddtree"].get(b)) for b in bs] + [fmt(r.get("floor"))]
                    + [fmt(r.get("ddtree_floor", {}).get(b)) for b in bs] + [str(r.get("rounds", "-")),
                                                                             verdict_text(r.get("passed"))])
    if "mean_tau" in data:
        rows.append(["MEAN", fmt(data.get("mean_tau"))] + [fmt(data.get("mean_ddtree", {}).get(b)) for b in bs]
                    + [fmt(data.get("mean_floor"))] + [fmt(data.get("mean_ddtree_floor", {}).get(b)) for b in bs]
                    + ["", verdict_text(bool(data.get("mean_passed")))])
    # Columns shown by the fields' presence (a NaN τ is null in eval.json: the same table from the file and the run)
    if any(r.get("online") for r in prompts.values()):  # the real speculative loop's τ (--online-tau)
        _insert_column(header, rows, "online τ", [(r.get("online") or {}).get("tau") for r in prompts.values()])
    if any("server_accept_length" in r for r in prompts.values()):  # the SGLang server's own accept length
        _insert_column(header, rows, "server accept len", [r.get("server_accept_length") for r in prompts.values()])
    base = data.get("baseline")
    if base:  # per-prompt baseline τ and delta beside this run's
        header[2:2] = ["baseline τ", "Δτ"]
        for pid, row in zip(list(prompts) + ["MEAN"], rows):
            b = base["prompts"].get(pid, {}) if pid != "MEAN" else {"baseline": base["mean_baseline"],
                                                                       "delta": base["mean_diff"]}
            row[2:2] = [fmt(b.get("baseline")), fmt(b.get("delta"), 3, "+f")]
    return header, rows


def _percent(x: object, style: str = "+f") -> str:
    return fmt(100 * x if is_number(x) else None, 2 if style == "+f" else 6, style)


def baseline_line(data: dict[str, Any]) -> str | None:
    """One line on the --baseline comparison (None without one)."""
    b = data.get("baseline")
    if not b:
        return None
    lo, hi = b["ci95"]
    ok = verdict_text(bool(b["drop_passed"] and b["rise_passed"]))
    return (f"baseline {b['path']}: mean chain τ {fmt(b['mean_baseline'])} -> {fmt(b['mean_run'])} over {b['n']} "
            f"paired prompts, Δ {fmt(b['mean_diff'], 3, '+f')} (95 % CI {fmt(lo, 3, '+f')}..{fmt(hi, 3, '+f')}), "
            f"{_percent(b['rel_change'])} % (allowed -{_percent(b['drop_tol'], 'g')} % .. "
            f"+{_percent(b['rise_tol'], 'g')} %): {ok}"
            + (f"; {len(b['missing'])} prompt(s) not in the baseline" if b["missing"] else ""))
