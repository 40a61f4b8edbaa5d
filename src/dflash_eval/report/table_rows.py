"""The rows of every table of the reports (terminal and eval.md alike), built from eval.json's data; every number
reads through :func:`dflash_eval.common.number_text.fmt`, :mod:`.render` writes them through one table type.

- τ: one row per prompt with its floors and verdict plus the (macro) mean row, the line naming the macro and the
  pooled τ of the run (:func:`tau_kinds_line`), one row per category (mean, median, 95 % CI, per DDTree budget too),
  the line on the ``--baseline`` comparison, and at temperature > 0 the line of the mean over samples;
- every CI is printed with its method (:func:`ci_name`: ``95 % CI (Hall t over prompts)``);
- per-position acceptance and the multi-turn conversations;
- hidden-state drift, the drift budget's ladder and its gate;
- one small table per registered measurement."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from dflash_eval.common.number_text import MISSING, ci_text, fmt, is_number, percent_list, verdict_text
from dflash_eval.metrics.acceptance_rates import (
    acceptance_block,
    acceptance_table,
    pooled_means,
    position_rates,
    row_histograms,
)
from dflash_eval.metrics.near_tie import Divergence
from dflash_eval.metrics.stats import ddtree_budgets
from dflash_eval.metrics.verdict import BASELINE, row_outcome, stored_verdict
from dflash_eval.report.tables import TextTable

__all__ = ["tau_rows", "category_rows", "baseline_line", "budgets", "acceptance_rows", "conversation_rows",
           "drift_rows", "ladder_rows", "gate_rows", "budget_line", "measurement_tables", "sampled_line", "ci_name",
           "category_ci_name", "tau_kinds_line", "near_tie_rows", "NEAR_TIE_NOTE", "MEAN_ROW"]

#: The first cell of the τ table's row of the means over prompts (macro means).
MEAN_ROW = "MEAN (macro)"
#: The method of an interval that eval.json does not name: one written before the methods were recorded.
_UNNAMED_CI = "percentile bootstrap"


#: What a near tie means, under its table and in the verdict block.
NEAR_TIE_NOTE = ("a near tie: the run's completion left what it was compared with where the target's own two best "
                 "tokens lie within rounding of each other (the margin below the dtype's near-tie band); not a "
                 "failure, and the completion tokens after it are not compared")


def near_tie_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per near tie of eval.json's ``near_ties``: the prompt, what it was compared with, the completion
    token where it parted, both tokens, the target's margin there and the band."""
    header = ["prompt", "compared with", "completion token", "expected", "this run", "margin", "near-tie band"]
    rows = []
    for raw in data.get("near_ties") or []:
        d = Divergence.from_dict(raw)
        rows.append([d.prompt_id, d.against, str(d.position), f"{d.expected} {d.expected_text}".strip(),
                     f"{d.got} {d.got_text}".strip(), d.margin_text, f"{d.band:g} ({d.dtype})"])
    return header, rows


def budgets(data: dict[str, Any]) -> list[str]:
    """The DDTree budgets the run's prompts were measured with (as eval.json's keys)."""
    return ddtree_budgets(data.get("prompts", {}))


def _ci(s: dict[str, Any] | None) -> str:
    """``lo–hi``; ``-`` without an interval (fewer than 2 prompts)."""
    if not s or not s.get("ci95") or not any(is_number(x) for x in s["ci95"]):
        return fmt(None)
    return ci_text(s["ci95"][0], s["ci95"][1], 2)


def ci_name(block: dict[str, Any] | None) -> str:
    """``95 % CI (Hall t over prompts)``: the level and the method of the interval of an eval.json block with ``ci95``
    (its ``ci_method``; an eval.json written before methods were recorded used the percentile bootstrap)."""
    return f"95 % CI ({(block or {}).get('ci_method') or _UNNAMED_CI})"


def category_ci_name(data: dict[str, Any]) -> str:
    """The CI name of the per-category table (its ``all`` row's chain interval; every row uses the same method)."""
    return ci_name(((data.get("categories") or {}).get("all") or {}).get("chain"))

def category_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-category table: n, chain τ (macro mean over the category's prompts) / median /
    95 % CI, the same per DDTree budget, floors (chain/DDTree-N... in one cell), verdict; the overall ("all") row
    last. The title names the CI's method (:func:`category_ci_name`)."""
    cats = data.get("categories") or {}
    bs = budgets(data)
    header = ["category", "n", "chain τ", "median", "CI95"]
    for b in bs:
        header += [f"DDTree-{b} τ", "median", "CI95"]
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
    """Header and rows of the τ table (prompt, chain τ, DDTree-N τ..., floor, verdict) plus the row of the macro
    means (:data:`MEAN_ROW`; the pooled τ are in :func:`tau_kinds_line`)."""
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
        rows.append([MEAN_ROW, fmt(data.get("mean_tau"))] + [fmt(data.get("mean_ddtree", {}).get(b)) for b in bs]
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
    part = stored_verdict(data).part(BASELINE)  # the baseline's part of the run's verdict
    ok = verdict_text(None if part is None else part.passed)
    return (f"baseline {b['path']}: mean chain τ (macro) {fmt(b['mean_baseline'])} -> {fmt(b['mean_run'])} over "
            f"{b['n']} paired prompts, Δ {fmt(b['mean_diff'], 3, '+f')} ({ci_name(b)} "
            f"{ci_text(lo, hi, 3, '+f', sep='..')}), "
            f"{_percent(b['rel_change'])} % (allowed -{_percent(b['drop_tol'], 'g')} % .. "
            f"+{_percent(b['rise_tol'], 'g')} %): {ok}"
            + (f"; {len(b['missing'])} prompt(s) not in the baseline" if b["missing"] else ""))


def tau_kinds_line(data: dict[str, Any]) -> str | None:
    """The run's two τ, named: macro (the mean row: mean over prompts of each prompt's τ; z-lab's DFlash
    benchmark) and pooled (accepted tokens / verification rounds over every round: SGLang's ``spec_accept_length``,
    SpecForge's benchmark), chain and each DDTree budget (None without τ)."""
    if "mean_tau" not in data:
        return None
    prompts = data.get("prompts", {})
    if "mean_tau_pooled" in data:
        pooled, pooled_dd = data.get("mean_tau_pooled"), data.get("mean_ddtree_pooled") or {}
    else:  # an eval.json written before the pooled τ was recorded
        pooled, pooled_dd = pooled_means(prompts)
    rounds = sum(r.get("rounds") or 0 for r in prompts.values())
    macro = ", ".join([f"chain {fmt(data.get('mean_tau'))}"]
                      + [f"DDTree-{b} {fmt(v)}" for b, v in (data.get("mean_ddtree") or {}).items()])
    pool = ", ".join([f"chain {fmt(pooled)}"] + [f"DDTree-{b} {fmt(v)}" for b, v in pooled_dd.items()])
    return (f"τ over the {len(prompts)} prompts — macro (mean over prompts of each prompt's τ, the {MEAN_ROW} row; "
            f"z-lab's DFlash benchmark): {macro}; pooled (accepted tokens / verification rounds over all {rounds} "
            f"chain rounds; SGLang's spec_accept_length, SpecForge's benchmark): {pool}")


# --------------------------------------------------------------------------------------------------------------
# Rows of the per-position acceptance table and the multi-turn conversation table (terminal and eval.md alike).
#
# Acceptance: one row per prompt, per category and for the whole run (``all``), per source that counted rounds
# (offline ``chain``, ``online`` with ``--online-tau``, ``server`` when an SGLang server reported a histogram): rounds,
# τ of those rounds, the per-position acceptance rates (slot k accepted, % of rounds, k = 1..B-1) and the
# acceptance-length histogram (% of rounds, lengths 1..B). Conversations: each conversation's τ per turn and over all
# its rounds, then the mean over conversations of each turn.


def _row(scope: str, source: str, block: dict[str, Any]) -> list[str]:
    hist = block.get("histogram", [])
    rounds = block.get("rounds", sum(hist))
    shares = [c / rounds for c in hist] if rounds else [math.nan] * len(hist)
    rates = block.get("position_rates") or position_rates(hist)
    return [scope, source, str(rounds), fmt(block.get("tau")), percent_list(rates), percent_list(shares)]


def acceptance_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the acceptance table (module docstring); no rows when no prompt has a histogram."""
    header = ["scope", "source", "rounds", "pooled τ", "slot k accepted, % of rounds (k=1..B-1)",
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
    header = ["conversation", "category", "τ per turn", "conversation τ (pooled)", "rounds"]
    rows = [[cid, str(c.get("category", "-")), " / ".join(fmt(t) for t in c.get("turn_tau", [])),
             fmt(c.get("tau")), str(c.get("rounds", "-"))] for cid, c in convs.items()]
    for k, t in (data.get("turns") or {}).items():
        ch = t.get("chain", {})
        lo, hi = (ch.get("ci95") or [None, None])[:2]
        rows.append([f"turn {k} (mean of {ch.get('n', 0)})", "",
                     f"{fmt(ch.get('mean'))} ({ci_name(ch)} {ci_text(lo, hi)})",
                     fmt(t.get("acceptance", {}).get("tau")), str(t.get("acceptance", {}).get("rounds", "-"))])
    return header, rows


# --------------------------------------------------------------------------------------------------------------
# Rows of the drift tables (terminal and eval.md alike): the hidden-state drift regression check per comparison and
# layer, the drift budget's ladder of injected errors, the drift gate (measured drift against the budget), and the
# line on the budget. Every number reads through :func:`dflash_eval.common.number_text.fmt`.


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


def budget_ci_text(b: dict[str, Any]) -> str:
    """``>= 4.20e-01 (90 % CI 3.50e-01–inf)``: the budget with its CI (an open end, null in strict JSON, as inf)."""
    lo, hi = b.get("ci") or [None, None]
    level = fmt(100 * b.get("ci_level", 0.9), 0)
    return (f"{'>= ' if b.get('lower_bound') else ''}{_sci(b['budget'])} ({level} % CI "
            f"{ci_text(lo, math.inf if hi is None else hi, 2, 'e')})")  # strict JSON wrote an open end as null


def budget_line(data: dict[str, Any]) -> str | None:
    """One line on the drafter's drift budget, the axis it was read along, its CI, the secondary (isotropic) axis's
    own budget and the gate's rule (None when the budget was not measured)."""
    b = data.get("drift_budget")
    if not b:
        return None
    tol = fmt(b["tol"], 6, "g")
    why = {"not_reached": f"the fitted drop stays below {tol} over the whole ladder: a lower bound",
           "below_range": f"the fitted drop exceeds {tol} already at the smallest level",
           "no_prompts": "no prompt had a speculative round"}.get(b.get("status", ""), "")
    axis = f" {b['axis_text']}" if b.get("axis_text") else ""
    second = b.get("secondary")
    beside = (f"; isotropic noise and rounding alone (not gated): {budget_ci_text(second)}" if second else "")
    return (f"drift budget of drafter {str(b['drafter'])[:12]}: {budget_ci_text(b)} relative feature error{axis} "
            f"(where the monotone fit of the mean τ drop over {b.get('n_measured', b['n_prompts'])} prompts reaches "
            f"{tol}; {b['base']} features, mean τ {fmt(b['base_mean_tau'])}{'; ' + why if why else ''}){beside}; "
            f"gate: measured drift x {fmt(b['safety'], 6, 'g')} passes below the CI's lower end, fails above its "
            "upper end"
            + ("; inside it is decided on the estimate (--drift-budget-conclusive)" if b.get("conclusive") else
               "; inside it is inconclusive")
            + _budget_prompts_note(b))


def _budget_prompts_note(b: dict[str, Any]) -> str:
    """Where the budget's prompts came from (a selection smaller than --drift-budget-min-prompts is extended)."""
    n, sel = b["n_prompts"], b.get("selected_prompts")
    return f"; measured on the {n} first prompts of --prompts ({sel} selected)" if sel is not None and n > sel else ""


def ladder_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The drift budget's ladder: one row per perturbation, the main axis's levels first (the budget's fit), then the
    secondary axis's, each in order of injected error: mean τ, the mean τ drop (signed: below 0 τ rose) with its
    CI, its axis's monotone fit there, and the largest |Δτ| of a prompt."""
    header = ["axis", "perturbation", "injected rel err", "mean τ", "mean drop", "CI95", "fitted drop", "max |Δτ|"]
    b = data.get("drift_budget") or {}
    main = b.get("axis") or "isotropic"
    names = {"drift": "drift direction", "isotropic": "isotropic"}

    def axis_of(lv: dict[str, Any]) -> str:
        return lv.get("axis") or ("drift" if lv.get("kind") == "drift" else "isotropic")

    levels = sorted(b.get("levels", []), key=lambda lv: (axis_of(lv) != main, _order(lv["injected_rel_err"])))
    rows = [[("main: " if axis_of(lv) == main else "secondary: ") + names.get(axis_of(lv), axis_of(lv)), lv["label"],
             _sci(lv["injected_rel_err"]), fmt(lv["mean_tau"]), fmt(lv["mean_drop"], 3, "+f"),
             ci_text(lv["drop_ci95"][0], lv["drop_ci95"][1]), fmt(lv["fitted_drop"]), fmt(lv["max_abs_dtau"])]
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
    header = ["comparison", "layer", "max rel_err", "worst prompt", "x safety", "budget", "budget CI", "margin",
              "verdict"]
    rows = []
    for g in data.get("drift_gate", []):
        err = g.get("max_rel_err")
        scaled = None if err is None else err * g["safety"]
        lo, hi = g.get("budget_ci") or [None, None]
        rows.append([g["comparison"], str(g["layer"]), _sci(err), g.get("worst_prompt", "-"), _sci(scaled),
                     (">= " if g.get("lower_bound") else "") + _sci(g["budget"]),
                     ci_text(lo, math.inf if hi is None else hi, 3, "g"), _margin(g),
                     row_outcome(g).upper() + (" (estimate)" if g.get("decided_on") == "estimate" else "")])
    return header, rows


# --------------------------------------------------------------------------------------------------------------
# The rows of the measurements registered by plugins (eval.json's ``measurements``: ``{name: {"summary": {...},
# "rows": [[label, value], ...]}}``): one small table per measurement, its summary as the caption, for the terminal
# and eval.md (:mod:`.render`). Nothing when the run has none.


def _cell(value: object) -> str:
    return fmt(value, 4, "g") if is_number(value) else "-" if value is None else str(value)


def _summary(block: dict[str, Any]) -> str | None:
    summary = block.get("summary") or {}
    return "; ".join(f"{k} {_cell(v)}" for k, v in summary.items()) or None


def measurement_tables(data: dict[str, Any]) -> list[TextTable]:
    """One table per measurement with rows: its label and value columns (extra cells kept), titled by its name."""
    out = []
    for name, block in (data.get("measurements") or {}).items():
        rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in (block or {}).get("rows") or []]
        if not rows:
            continue
        width = max(len(r) for r in rows)
        header = ["label", "value"] + [f"value {i}" for i in range(2, width)] if width >= 2 else ["label"]
        cells = [[_cell(c) for c in r] + [""] * (len(header) - len(r)) for r in rows]
        out.append(TextTable(header, cells, title=f"measurement: {name}", caption=_summary(block),
                             left=frozenset({"label"})))
    return out


# --------------------------------------------------------------------------------------------------------------
# The line of a run at temperature > 0 in the terminal summary and eval.md: the macro mean τ over prompts of each
# prompt's mean over samples with its 95 % CI (t over the prompt means: the per-category table's "all" row holds the
# same interval) and the two stages of the spread (eval.json's ``sampled`` block,
# :func:`dflash_eval.metrics.sampled_ci.sampled_summary`); None for a greedy run.


def _part(label: str, s: dict[str, Any]) -> str:
    lo, hi = s["ci95"]
    return f"{label} {fmt(s['mean'])} ({ci_text(lo, hi, sep='..')})"


def sampled_line(data: dict[str, Any]) -> str | None:
    """``sampled at T=0.6: 8 prompts x 4 samples; macro mean τ over prompts of each prompt's mean over its samples,
    95 % CI (Hall t over prompts): chain ...; spread of chain τ: sd between prompts ..., within a prompt ...``."""
    s = data.get("sampled")
    if not s:
        return None
    temp = (data.get("settings") or {}).get("temperature")
    parts = [_part("chain", s["chain"])] + [_part(f"DDTree-{b}", v) for b, v in s.get("ddtree", {}).items()]
    if s.get("online"):
        parts.append(_part("online", s["online"]))
    per = s["samples"] / s["prompts"] if s["prompts"] else 0
    ch = s["chain"]
    name = ci_name(ch) if "ci_method" in ch else "nested 95 % CI over prompts and samples"  # an older eval.json
    spread = (f"; spread of chain τ: sd between prompts {fmt(ch['sd_between'])}, within a prompt "
              f"{fmt(ch['sd_within'])}" if "sd_within" in ch else "")
    return (f"sampled at T={temp}: {s['prompts']} prompts x {per:g} samples; macro mean τ over prompts of each "
            f"prompt's mean over its samples, {name}: " + ", ".join(parts) + spread)
