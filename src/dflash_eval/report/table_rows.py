"""The rows of every table of the reports (terminal and eval.md alike), built from the run's typed result
(:class:`~dflash_eval.session.run_result.RunResult`: its fields, not eval.json's dict); every number reads through
:func:`dflash_eval.common.number_text.fmt`, :mod:`.render` writes them through one table type.

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

from dflash_eval.common.number_text import MISSING, ci_text, ends, fmt, is_number, percent_list, verdict_text
from dflash_eval.metrics.acceptance_rates import acceptance_block, position_rates
from dflash_eval.metrics.drift_checks import DriftStat, GateCheck
from dflash_eval.metrics.verdict import BASELINE
from dflash_eval.report.tables import TextTable
from dflash_eval.session.blocks import BudgetLevel, DriftAcceptRow, DriftBudgetBlock, SampledStat, SecondaryAxis
from dflash_eval.session.rows import Acceptance, PromptRow, Stat
from dflash_eval.session.run_result import RunResult

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


def near_tie_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """One row per near tie of the result's ``near_ties``: the prompt, what it was compared with, the completion
    token where it parted, both tokens, the target's margin there and the band."""
    header = ["prompt", "compared with", "completion token", "expected", "this run", "margin", "near-tie band"]
    rows = [[d.prompt_id, d.against, str(d.position), f"{d.expected} {d.expected_text}".strip(),
             f"{d.got} {d.got_text}".strip(), d.margin_text, f"{d.band:g} ({d.dtype})"] for d in result.near_ties or []]
    return header, rows


def budgets(result: RunResult) -> list[str]:
    """The DDTree budgets the run's prompts were measured with (as eval.json's keys), ascending."""
    return sorted({b for r in result.prompts.values() for b in r.ddtree}, key=int)


def _ci(s: Stat | None) -> str:
    """``lo–hi``; ``-`` without an interval (fewer than 2 prompts)."""
    if s is None or not s.ci95 or not any(is_number(x) for x in s.ci95):
        return fmt(None)
    return ci_text(s.ci95[0], s.ci95[1], 2)


def ci_name(method: str | None) -> str:
    """``95 % CI (Hall t over prompts)``: the level and the method (``ci_method``) of an interval (an eval.json
    written before methods were recorded used the percentile bootstrap)."""
    return f"95 % CI ({method or _UNNAMED_CI})"


def category_ci_name(result: RunResult) -> str:
    """The CI name of the per-category table (its ``all`` row's chain interval; every row uses the same method)."""
    row = (result.categories or {}).get("all")
    return ci_name(None if row is None else row.chain.ci_method)


def category_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-category table: n, chain τ (macro mean over the category's prompts) / median /
    95 % CI, the same per DDTree budget, floors (chain/DDTree-N... in one cell), verdict; the overall ("all") row
    last. The title names the CI's method (:func:`category_ci_name`)."""
    cats = result.categories or {}
    bs = budgets(result)
    header = ["category", "n", "chain τ", "median", "CI95"]
    for b in bs:
        header += [f"DDTree-{b} τ", "median", "CI95"]
    header += ["floors", "verdict"]  # "chain/DDTree-N..." floors in one cell (keeps the table within 120 columns)
    rows = []
    for c in sorted(cats, key=lambda k: (k == "all", k)):
        r = cats[c]
        row = [c, str(r.n), fmt(r.chain.mean), fmt(r.chain.median), _ci(r.chain)]
        for b in bs:
            s = r.ddtree.get(b)
            row += [fmt(None if s is None else s.mean), fmt(None if s is None else s.median), _ci(s)]
        row.append("/".join([fmt(r.floor)] + [fmt(r.ddtree_floor.get(b)) for b in bs]))
        row.append(verdict_text(r.passed))
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


def tau_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the τ table (prompt, chain τ, DDTree-N τ..., floor, verdict) plus the row of the macro
    means (:data:`MEAN_ROW`; the pooled τ are in :func:`tau_kinds_line`)."""
    bs = budgets(result)
    prompts = result.prompts
    header = ["prompt", "chain τ"] + [f"DDTree-{b} τ" for b in bs] + ["floor"] + [f"DDTree-{b} floor" for b in bs] \
        + ["rounds", "verdict"]
    rows = []
    for pid, r in prompts.items():
        rows.append([pid, fmt(r.tau)] + [fmt(r.ddtree[b]) for b in bs] + [fmt(r.floor)]
                    + [fmt(r.ddtree_floor.get(b)) for b in bs] + [str(r.rounds), verdict_text(r.passed)])
    tau = result.tau
    if tau is not None:
        rows.append([MEAN_ROW, fmt(tau.mean_tau)] + [fmt(tau.mean_ddtree.get(b)) for b in bs]
                    + [fmt(tau.mean_floor)] + [fmt(tau.mean_ddtree_floor.get(b)) for b in bs]
                    + ["", verdict_text(bool(result.mean_passed))])
    # Columns shown by the fields' presence (a NaN τ is null in eval.json: the same table from the file and the run)
    if any(r.online for r in prompts.values()):  # the real speculative loop's τ (--online-tau)
        _insert_column(header, rows, "online τ", [None if r.online is None else r.online.tau
                                                  for r in prompts.values()])
    if any(r.server_accept_length is not None for r in prompts.values()):  # the SGLang server's own accept length
        _insert_column(header, rows, "server accept len", [r.server_accept_length for r in prompts.values()])
    base = result.baseline
    if base is not None:  # per-prompt baseline τ and delta beside this run's
        header[2:2] = ["baseline τ", "Δτ"]
        pairs = {pid: (p.baseline, p.delta) for pid, p in base.prompts.items()}
        means = (base.mean_baseline, base.mean_diff)  # the mean row's, after the prompts'
        for row, (b, delta) in zip(rows, [pairs.get(pid, (None, None)) for pid in prompts] + [means]):
            row[2:2] = [fmt(b), fmt(delta, 3, "+f")]
    return header, rows


def _percent(x: object, style: str = "+f") -> str:
    return fmt(100 * x if is_number(x) else None, 2 if style == "+f" else 6, style)


def baseline_line(result: RunResult) -> str | None:
    """One line on the --baseline comparison (None without one)."""
    b = result.baseline
    if b is None:
        return None
    lo, hi = b.ci95
    part = result.final_verdict().part(BASELINE)  # the baseline's part of the run's verdict
    ok = verdict_text(None if part is None else part.passed)
    return (f"baseline {b.path}: mean chain τ (macro) {fmt(b.mean_baseline)} -> {fmt(b.mean_run)} over "
            f"{b.n} paired prompts, Δ {fmt(b.mean_diff, 3, '+f')} ({ci_name(b.ci_method)} "
            f"{ci_text(lo, hi, 3, '+f', sep='..')}), "
            f"{_percent(b.rel_change)} % (allowed -{_percent(b.drop_tol, 'g')} % .. "
            f"+{_percent(b.rise_tol, 'g')} %): {ok}"
            + (f"; {len(b.missing)} prompt(s) not in the baseline" if b.missing else ""))


def tau_kinds_line(result: RunResult) -> str | None:
    """The run's two τ, named: macro (the mean row: mean over prompts of each prompt's τ; z-lab's DFlash
    benchmark) and pooled (accepted tokens / verification rounds over every round: SGLang's ``spec_accept_length``,
    SpecForge's benchmark), chain and each DDTree budget (None without τ)."""
    tau = result.tau
    if tau is None:
        return None
    prompts = result.prompts
    rounds = sum(r.rounds or 0 for r in prompts.values())
    macro = ", ".join([f"chain {fmt(tau.mean_tau)}"] + [f"DDTree-{b} {fmt(v)}" for b, v in tau.mean_ddtree.items()])
    pool = ", ".join([f"chain {fmt(tau.mean_tau_pooled)}"]
                     + [f"DDTree-{b} {fmt(v)}" for b, v in tau.mean_ddtree_pooled.items()])
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


def _row(scope: str, source: str, block: Acceptance) -> list[str]:
    hist = block.histogram
    rounds = block.rounds
    shares = [c / rounds for c in hist] if rounds else [math.nan] * len(hist)
    rates = block.position_rates or position_rates(hist)
    return [scope, source, str(rounds), fmt(block.tau), percent_list(rates), percent_list(shares)]


def _histograms(r: PromptRow) -> dict[str, list[int]]:
    """The histograms a prompt row carries, by source (offline chain, online loop, SGLang server)."""
    out = {"chain": list(r.histogram)}
    if r.online is not None:
        out["online"] = list(r.online.histogram)
    if r.server_histogram is not None:
        out["server"] = list(r.server_histogram)
    return out


def acceptance_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the acceptance table (module docstring); no rows without prompts."""
    header = ["scope", "source", "rounds", "pooled τ", "slot k accepted, % of rounds (k=1..B-1)",
              "accept length, % of rounds (1..B)"]
    rows = []
    for pid, r in result.prompts.items():
        for src, h in _histograms(r).items():
            rows.append(_row(pid, src, Acceptance(**acceptance_block(h))))
    cats = result.categories or {}
    for c in sorted(cats, key=lambda k: (k == "all", k)):
        for src, block in cats[c].acceptance.items():
            rows.append(_row(f"category {c}" if c != "all" else "all prompts", src, block))
    return header, rows


def conversation_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the multi-turn table; no rows without conversations."""
    header = ["conversation", "category", "τ per turn", "conversation τ (pooled)", "rounds"]
    rows = [[cid, c.category, " / ".join(fmt(t) for t in c.turn_tau), fmt(c.tau), str(c.rounds)]
            for cid, c in (result.conversations or {}).items()]
    for k, t in (result.turns or {}).items():
        ch = t.chain
        lo, hi = ends(ch.ci95)
        rows.append([f"turn {k} (mean of {ch.n})", "", f"{fmt(ch.mean)} ({ci_name(ch.ci_method)} {ci_text(lo, hi)})",
                     fmt(t.acceptance.tau), str(t.acceptance.rounds)])
    return header, rows


# --------------------------------------------------------------------------------------------------------------
# Rows of the drift tables (terminal and eval.md alike): the hidden-state drift regression check per comparison and
# layer, the drift budget's ladder of injected errors, the drift gate (measured drift against the budget), and the
# line on the budget. Every number reads through :func:`dflash_eval.common.number_text.fmt`.


def _sci(x: object) -> str:
    return fmt(x, 2, "e")


def drift_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """One row per comparison x layer: worst rel_err / cos over prompts against tolerance, τ difference."""
    header = ["comparison", "layer", "max rel_err", "rel tol", "min cos", "cos tol", "max |Δτ|", "Δτ tol", "verdict"]
    groups: dict[tuple[str, int], list[DriftStat]] = defaultdict(list)
    for r in result.drift:
        groups[(r.comparison, r.layer)].append(r)
    acc: dict[str, list[DriftAcceptRow]] = defaultdict(list)
    for a in result.drift_accept:
        acc[a.comparison].append(a)
    rows = []
    for (comp, layer), rs in groups.items():
        accepts = acc.get(comp, [])
        dmax = max((x.diff for x in accepts if x.diff is not None and not math.isnan(x.diff)), default=None)
        ok = all(x.passed for x in rs) and all(x.passed for x in accepts)
        rows.append([comp, str(layer), _sci(max(x.rel_err for x in rs)), fmt(rs[0].rel_tol, 1, "e"),
                     fmt(min(x.cos for x in rs), 6), fmt(rs[0].cos_tol, 12, "g"), fmt(dmax),
                     fmt(accepts[0].tol) if accepts else fmt(None), verdict_text(ok)])
    return header, rows


def _order(x: float | None) -> float:
    """Sort key of a number that strict JSON may have turned into null (NaN: last)."""
    return float("inf") if x is None else x


def budget_ci_text(b: DriftBudgetBlock | SecondaryAxis) -> str:
    """``>= 4.20e-01 (90 % CI 3.50e-01–inf)``: the budget with its CI (an open end, null in strict JSON, as inf)."""
    lo, hi = ends(b.ci)
    level = fmt(100 * b.ci_level, 0)
    return (f"{'>= ' if b.lower_bound else ''}{_sci(b.budget)} ({level} % CI "
            f"{ci_text(lo, math.inf if hi is None else hi, 2, 'e')})")  # strict JSON wrote an open end as null


def budget_line(result: RunResult) -> str | None:
    """One line on the drafter's drift budget, the axis it was read along, its CI, the secondary (isotropic) axis's
    own budget and the gate's rule (None when the budget was not measured)."""
    b = result.drift_budget
    if b is None:
        return None
    tol = fmt(b.tol, 6, "g")
    why = {"not_reached": f"the fitted drop stays below {tol} over the whole ladder: a lower bound",
           "below_range": f"the fitted drop exceeds {tol} already at the smallest level",
           "no_prompts": "no prompt had a speculative round"}.get(b.status, "")
    axis = f" {b.axis_text}" if b.axis_text else ""
    second = b.secondary
    beside = (f"; isotropic noise and rounding alone (not gated): {budget_ci_text(second)}" if second else "")
    return (f"drift budget of drafter {str(b.drafter)[:12]}: {budget_ci_text(b)} relative feature error{axis} "
            f"(where the monotone fit of the mean τ drop over {b.n_measured} prompts reaches "
            f"{tol}; {b.base} features, mean τ {fmt(b.base_mean_tau)}{'; ' + why if why else ''}){beside}; "
            f"gate: measured drift x {fmt(b.safety, 6, 'g')} passes below the CI's lower end, fails above its "
            "upper end"
            + ("; inside it is decided on the estimate (--drift-budget-conclusive)" if b.conclusive else
               "; inside it is inconclusive")
            + _budget_prompts_note(b))


def _budget_prompts_note(b: DriftBudgetBlock) -> str:
    """Where the budget's prompts came from (a selection smaller than --drift-budget-min-prompts is extended)."""
    n, sel = b.n_prompts, b.selected_prompts
    return f"; measured on the {n} first prompts of --prompts ({sel} selected)" if sel is not None and n > sel else ""


def ladder_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """The drift budget's ladder: one row per perturbation, the main axis's levels first (the budget's fit), then the
    secondary axis's, each in order of injected error: mean τ, the mean τ drop (signed: below 0 τ rose) with its
    CI, its axis's monotone fit there, and the largest |Δτ| of a prompt."""
    header = ["axis", "perturbation", "injected rel err", "mean τ", "mean drop", "CI95", "fitted drop", "max |Δτ|"]
    b = result.drift_budget
    if b is None:
        return header, []
    main = b.axis or "isotropic"
    names = {"drift": "drift direction", "isotropic": "isotropic"}

    def axis_of(lv: BudgetLevel) -> str:
        return lv.axis or ("drift" if lv.kind == "drift" else "isotropic")

    levels = sorted(b.levels, key=lambda lv: (axis_of(lv) != main, _order(lv.injected_rel_err)))
    rows = [[("main: " if axis_of(lv) == main else "secondary: ") + names.get(axis_of(lv), axis_of(lv)), lv.label,
             _sci(lv.injected_rel_err), fmt(lv.mean_tau), fmt(lv.mean_drop, 3, "+f"),
             ci_text(lv.drop_ci95[0], lv.drop_ci95[1]), fmt(lv.fitted_drop), fmt(lv.max_abs_dtau)]
            for lv in levels]
    return header, rows


def _margin(g: GateCheck) -> str:
    """budget / drift as ``12.3x``; ``inf`` for no drift at all."""
    if not is_number(g.max_rel_err):
        return MISSING
    text = fmt(g.margin, 3, "g")
    return text if text in ("inf", MISSING) else text + "x"


def gate_rows(result: RunResult) -> tuple[list[str], list[list[str]]]:
    """The drift gate: per comparison and layer, the worst prompt's drift against the budget, and the margin
    (budget / drift; the gate needs at least the safety factor)."""
    header = ["comparison", "layer", "max rel_err", "worst prompt", "x safety", "budget", "budget CI", "margin",
              "verdict"]
    rows = []
    for g in result.drift_gate or []:
        rows.append([g.comparison, str(g.layer), _sci(g.max_rel_err), g.worst_prompt, _sci(g.scaled),
                     (">= " if g.lower_bound else "") + _sci(g.budget),
                     ci_text(g.budget_low, g.budget_high, 3, "g"), _margin(g),
                     g.outcome.upper() + (" (estimate)" if g.decided_on == "estimate" else "")])
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


def measurement_tables(result: RunResult) -> list[TextTable]:
    """One table per measurement with rows: its label and value columns (extra cells kept), titled by its name."""
    out = []
    for name, block in (result.measurements or {}).items():
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


def _part(label: str, s: SampledStat) -> str:
    lo, hi = s.ci95
    return f"{label} {fmt(s.mean)} ({ci_text(lo, hi, sep='..')})"


def sampled_line(result: RunResult) -> str | None:
    """``sampled at T=0.6: 8 prompts x 4 samples; macro mean τ over prompts of each prompt's mean over its samples,
    95 % CI (Hall t over prompts): chain ...; spread of chain τ: sd between prompts ..., within a prompt ...``."""
    s = result.sampled
    if s is None:
        return None
    temp = (result.settings or {}).get("temperature")
    parts = [_part("chain", s.chain)] + [_part(f"DDTree-{b}", v) for b, v in s.ddtree.items()]
    if s.online is not None:
        parts.append(_part("online", s.online))
    per = s.samples / s.prompts if s.prompts else 0
    ch = s.chain
    # an eval.json written before the method was recorded: the nested interval
    name = ci_name(ch.ci_method) if ch.ci_method is not None else "nested 95 % CI over prompts and samples"
    spread = (f"; spread of chain τ: sd between prompts {fmt(ch.sd_between)}, within a prompt "
              f"{fmt(ch.sd_within)}" if ch.sd_within is not None else "")
    return (f"sampled at T={temp}: {s.prompts} prompts x {per:g} samples; macro mean τ over prompts of each "
            f"prompt's mean over its samples, {name}: " + ", ".join(parts) + spread)
