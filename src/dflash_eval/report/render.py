"""eval.json's data as text: the τ table, the per-category table, the per-position acceptance table, the multi-turn
conversation table, the drift summary and the drift budget with its gate, for the terminal (rich) and as markdown
(eval.md, $GITHUB_STEP_SUMMARY). The row builders are shared by both and by the gate CLI."""

from __future__ import annotations

import io
import math
from collections import defaultdict
from typing import Any

from dflash_eval.common.paths import normal_path
from dflash_eval.metrics.stats import ddtree_budgets
from dflash_eval.report.acceptance_rows import acceptance_rows, conversation_rows
from dflash_eval.report.plot import worst_prompts
from dflash_eval.report.summary import row_outcome

__all__ = ["tau_rows", "category_rows", "drift_rows", "baseline_line", "budget_line", "ladder_rows", "gate_rows",
           "render_terminal", "render_markdown", "fmt", "TERMINAL_ROWS_FULL", "TERMINAL_ROWS_SHOWN", "plain_dtype",
           "plain_versions"]

#: The terminal prints every prompt's row up to this many prompts (conversations likewise) ...
TERMINAL_ROWS_FULL = 15
#: ... and beyond, only the rows of this many prompts with the least room above their floors (eval.md: all).
TERMINAL_ROWS_SHOWN = 10


def _ci(s: dict[str, Any] | None) -> str:
    if not s or not s.get("ci95"):
        return "-"
    lo, hi = s["ci95"]
    return f"{_fmt(lo, 2)}–{_fmt(hi, 2)}"


def category_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-category table: n, chain τ mean / median / 95 % CI, the same per DDTree budget,
    floors (chain/DDTree-N... in one cell), verdict; the overall ("all") row last."""
    cats = data.get("categories") or {}
    bs = _budgets(data)
    header = ["category", "n", "chain mean", "median", "CI95"]
    for b in bs:
        header += [f"DDTree-{b} mean", "median", "CI95"]
    header += ["floors", "verdict"]  # "chain/DDTree-N..." floors in one cell (keeps the table within 120 columns)
    rows = []
    for c in sorted(cats, key=lambda k: (k == "all", k)):
        r = cats[c]
        row = [c, str(r.get("n", "-")), _fmt(r["chain"]["mean"]), _fmt(r["chain"]["median"]), _ci(r["chain"])]
        for b in bs:
            s = r.get("ddtree", {}).get(b)
            row += [_fmt(s["mean"]) if s else "-", _fmt(s["median"]) if s else "-", _ci(s)]
        row.append("/".join([_fmt(r.get("floor"))] + [_fmt(r.get("ddtree_floor", {}).get(b)) for b in bs]))
        row.append(_verdict(r.get("passed")))
        rows.append(row)
    return header, rows


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{nd}f}"
    return str(x)


def _budgets(data: dict[str, Any]) -> list[str]:
    return ddtree_budgets(data.get("prompts", {}))


def tau_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the τ table (prompt, chain τ, DDTree-N τ..., floor, verdict) plus a mean row."""
    bs = _budgets(data)
    header = ["prompt", "chain τ"] + [f"DDTree-{b} τ" for b in bs] + ["floor"] + [f"DDTree-{b} floor" for b in bs] \
        + ["rounds", "verdict"]
    rows = []
    for pid, r in data.get("prompts", {}).items():
        rows.append([pid, _fmt(r.get("tau"))] + [_fmt(r["ddtree"].get(b)) for b in bs] + [_fmt(r.get("floor"))]
                    + [_fmt(r.get("ddtree_floor", {}).get(b)) for b in bs] + [str(r.get("rounds", "-")),
                                                                              _verdict(r.get("passed"))])
    if "mean_tau" in data:
        rows.append(["MEAN", _fmt(data.get("mean_tau"))] + [_fmt(data.get("mean_ddtree", {}).get(b)) for b in bs]
                    + [_fmt(data.get("mean_floor"))] + [_fmt(data.get("mean_ddtree_floor", {}).get(b)) for b in bs]
                    + ["", "PASS" if data.get("mean_passed") else "FAIL"])
    online = [(r.get("online") or {}).get("tau") for r in data.get("prompts", {}).values()]
    if any(v is not None for v in online):  # the real speculative loop's τ beside the offline one (--online-tau)
        known_o = [v for v in online if v is not None and not math.isnan(v)]
        header.insert(2, "online τ")
        for row, v in zip(rows, online + [sum(known_o) / len(known_o) if known_o else None]):
            row.insert(2, _fmt(v))
    server = [r.get("server_accept_length") for r in data.get("prompts", {}).values()]
    if any(v is not None for v in server):  # the SGLang server ran the drafter: its accept length beside offline τ
        known = [v for v in server if v is not None]
        header.insert(2, "server accept len")
        for row, v in zip(rows, server + [sum(known) / len(known)]):
            row.insert(2, _fmt(v))
    base = data.get("baseline")
    if base:  # per-prompt baseline τ and delta beside this run's
        header[2:2] = ["baseline τ", "Δτ"]
        for pid, row in zip(list(data.get("prompts", {})) + ["MEAN"], rows):
            b = base["prompts"].get(pid, {}) if pid != "MEAN" else {"baseline": base["mean_baseline"],
                                                                       "delta": base["mean_diff"]}
            row[2:2] = [_fmt(b.get("baseline")), "-" if b.get("delta") is None else f"{b['delta']:+.3f}"]
    return header, rows


def _verdict(passed: bool | None) -> str:
    return "-" if passed is None else "PASS" if passed else "FAIL"


def baseline_line(data: dict[str, Any]) -> str | None:
    """One line on the --baseline comparison (None without one)."""
    b = data.get("baseline")
    if not b:
        return None
    lo, hi = b["ci95"]
    ok = "PASS" if b["drop_passed"] and b["rise_passed"] else "FAIL"
    return (f"baseline {b['path']}: mean chain τ {_fmt(b['mean_baseline'])} -> {_fmt(b['mean_run'])} over {b['n']} "
            f"paired prompts, Δ {b['mean_diff']:+.3f} (95 % CI {lo:+.3f}..{hi:+.3f}), {100 * b['rel_change']:+.2f} % "
            f"(allowed -{100 * b['drop_tol']:g} % .. +{100 * b['rise_tol']:g} %): {ok}"
            + (f"; {len(b['missing'])} prompt(s) not in the baseline" if b["missing"] else ""))


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
        dmax = max((x["diff"] for x in a if not math.isnan(x["diff"])), default=None)
        ok = all(x["passed"] for x in rs) and all(x["passed"] for x in a)
        rows.append([comp, str(layer), f"{max(x['rel_err'] for x in rs):.2e}", f"{rs[0]['rel_tol']:.1e}",
                     f"{min(x['cos'] for x in rs):.6f}", f"{rs[0]['cos_tol']}", _fmt(dmax),
                     _fmt(a[0]["tol"]) if a else "-", "PASS" if ok else "FAIL"])
    return header, rows


def _sci(x: Any) -> str:
    return "-" if x is None else "inf" if x == float("inf") else f"{x:.2e}"


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
            f"(largest injected error whose mean |Δτ| over {b['n_prompts']} prompts stays <= {b['tol']:g}, upper end "
            f"of its 95 % CI; {b['base']} features, mean τ {_fmt(b['base_mean_tau'])}; {why}); gate: measured drift "
            f"x {b['safety']:g} <= budget, i.e. drift <= {_sci(b['gate_limit'])}" + _budget_prompts_note(b))


def _budget_prompts_note(b: dict[str, Any]) -> str:
    """Where the budget's prompts came from, and whether it is conclusive (fewer than the minimum: not)."""
    n, sel, least = b["n_prompts"], b.get("selected_prompts"), b.get("min_prompts")
    note = f"; measured on the {n} first prompts of --prompts ({sel} selected)" if sel is not None and n > sel else ""
    if b.get("conclusive") is False:
        harm = b.get("harm_level")
        note += (f"; fewer than --drift-budget-min-prompts {least}: over it a gate is inconclusive unless the drift x "
                 f"{b['safety']:g} reaches " + (f"{harm} ({_sci(b['harm'])}), the smallest level whose mean |Δτ| "
                                               f"exceeded {b['tol']:g}" if harm else
                                               f"a level whose mean |Δτ| exceeds {b['tol']:g} (none did)"))
    return note


def ladder_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The drift budget's ladder: one row per perturbation, in order of injected error."""
    header = ["perturbation", "injected rel err", "mean τ", "mean |Δτ|", "CI95", "max |Δτ|", "within"]
    b = data.get("drift_budget") or {}
    levels = sorted(b.get("levels", []), key=lambda lv: _order(lv["injected_rel_err"]))
    rows = [[lv["label"], _sci(lv["injected_rel_err"]), _fmt(lv["mean_tau"]), _fmt(lv["mean_abs_dtau"]),
             f"{_fmt(lv['ci95'][0])}–{_fmt(lv['ci95'][1])}", _fmt(lv["max_abs_dtau"]),
             "yes" if lv["within"] else "NO"] for lv in levels]
    return header, rows


def gate_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The drift gate: per comparison and layer, the worst prompt's drift against the budget, and the margin
    (budget / drift; the gate needs at least the safety factor)."""
    header = ["comparison", "layer", "max rel_err", "worst prompt", "x safety", "budget", "margin", "verdict"]
    rows = []
    for g in data.get("drift_gate", []):
        m, err = g.get("margin"), g.get("max_rel_err")
        margin = f"{m:.3g}x" if m is not None and m != float("inf") else "inf" if err == 0 or m else "-"
        scaled = None if err is None else err * g["safety"]
        rows.append([g["comparison"], str(g["layer"]), _sci(err), g.get("worst_prompt", "-"), _sci(scaled),
                     (">= " if g.get("lower_bound") else "") + _sci(g["budget"]), margin,
                     row_outcome(g).upper()])
    return header, rows


def _shown_prompts(data: dict[str, Any], limit: int | None) -> list[str] | None:
    """The prompts whose rows the terminal prints, worst first (:func:`worst_prompts`), or None for all of them:
    ``limit`` None, or at most :data:`TERMINAL_ROWS_FULL` prompts."""
    prompts = data.get("prompts", {})
    if limit is None or len(prompts) <= max(limit, TERMINAL_ROWS_FULL):
        return None
    return worst_prompts(prompts, limit)


def _collapse(rows: list[list[str]], keys: set[str], shown: list[str] | None) -> list[list[str]]:
    """The rows whose first cell is one of ``shown`` (in that order), then the rows that are not keyed by ``keys``
    (means, categories) in their order; every row when ``shown`` is None."""
    if shown is None:
        return rows
    order = {k: i for i, k in enumerate(shown)}
    keyed = sorted((r for r in rows if r[0] in order), key=lambda r: order[r[0]])  # stable: sources stay in order
    return keyed + [r for r in rows if r[0] not in keys]


def _collapsed_caption(what: str, shown: list[str] | None, total: int, order: str) -> str | None:
    if shown is None:
        return None
    return f"{len(shown)} of {total} {what} ({order}); … {total - len(shown)} more in eval.md, all here with pytest -v"


def render_terminal(data: dict[str, Any], *, width: int = 120, max_rows: int | None = TERMINAL_ROWS_SHOWN) -> str:
    """The τ tables, the drift summary and the drift budget as text (rich tables, no colour codes). Beyond
    :data:`TERMINAL_ROWS_FULL` prompts, the per-prompt tables keep only the ``max_rows`` prompts with the least room
    above their floors (conversations: the lowest τ) and say how many more eval.md holds; ``max_rows`` None: all."""
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=max(120, width), force_terminal=False, color_system=None, highlight=False)
    prompts = data.get("prompts", {})
    shown = _shown_prompts(data, max_rows)
    order = "failing first, then least room above the floor"
    header, rows = tau_rows(data)
    if rows:
        t = Table(title=_title(data), show_lines=False,
                  caption=_collapsed_caption("prompts", shown, len(prompts), order))
        for h in header:
            t.add_column(h, justify="left" if h == "prompt" else "right")
        for r in _collapse(rows, set(prompts), shown):
            t.add_row(*r)
        console.print(t)
    if baseline_line(data):
        console.print(baseline_line(data))
    ch, crows = category_rows(data)
    if crows:
        t = Table(title="τ per category (mean over prompts, bootstrap 95 % CI of the mean; floors chain/"
                  + "/".join(f"DDTree-{b}" for b in _budgets(data)) + ")")
        for h in ch:
            t.add_column(h, justify="left" if h == "category" else "right", no_wrap=True)
        for r in crows:
            t.add_row(*r)
        console.print(t)
    convs = data.get("conversations") or {}
    conv_shown = None if max_rows is None or len(convs) <= max(max_rows, TERMINAL_ROWS_FULL) else sorted(
        convs, key=lambda c: _order(convs[c].get("tau")))[:max_rows]
    for title, (ah, arows), keys, keep, caption in (
            (_ACCEPT_TITLE, acceptance_rows(data), set(prompts), shown,
             _collapsed_caption("prompts", shown, len(prompts), order)),
            (_CONV_TITLE, conversation_rows(data), set(convs), conv_shown,
             _collapsed_caption("conversations", conv_shown, len(convs), "lowest conversation τ first"))):
        if arows:
            t = Table(title=title, caption=caption)
            for h in ah:
                t.add_column(h, justify="left" if h in ("scope", "source", "conversation", "category") else "right")
            for r in _collapse(arows, keys, keep):
                t.add_row(*r)
            console.print(t)
    for title, (hh, rr) in (("hidden-state drift, regression check (worst prompt per layer)", drift_rows(data)),
                            ("drift budget: τ against injected feature error", ladder_rows(data)),
                            ("drift gate: measured drift against the drafter's drift budget", gate_rows(data))):
        if rr:
            t = Table(title=title)
            for h in hh:
                t.add_column(h, justify="left" if h in ("comparison", "perturbation", "worst prompt") else "right")
            for r in rr:
                t.add_row(*r)
            console.print(t)
    if budget_line(data):
        console.print(budget_line(data))
    tm = data.get("timings", {}).get("sum", {})
    if tm:
        console.print("timings (s, summed over processes): " + ", ".join(f"{k} {v:.2f}" for k, v in tm.items()))
    return buf.getvalue()


_ACCEPT_TITLE = ("acceptance per draft position (per prompt, category and run; sources: chain = offline simulation, "
                 "online = real speculative loop, server = SGLang's histogram)")
_CONV_TITLE = "multi-turn conversations (τ per turn; conversation τ over all its rounds)"


def _title(data: dict[str, Any]) -> str:
    t = data.get("target", {})
    d = data.get("drafter", {})
    return (f"τ per prompt — target {normal_path(t.get('path', '?')).name} ({str(t.get('identity', '?'))[:12]}), "
            f"drafter {normal_path(d.get('path', '?')).name} ({str(d.get('fingerprint', '?'))[:12]})")


def plain_dtype(dtype: Any) -> str:
    """A dtype as a reader writes it: ``float32`` (eval.json of older runs held ``torch.float32``)."""
    return "?" if dtype is None else str(dtype).removeprefix("torch.")


def plain_versions(versions: Any) -> str:
    """Library versions as text: ``torch 2.13.0, transformers 5.20.0, fla not installed, python 3.11.7``."""
    if not isinstance(versions, dict) or not versions:
        return "?"
    return ", ".join(f"{k} {v if v is not None else 'not installed'}" for k, v in versions.items())


def _git_text(p: dict[str, Any]) -> str:
    """``host h, git abc123def456 (dirty) in /repo`` for eval.md's provenance line ("" when neither is known)."""
    parts = [f"host {p['host']}"] if p.get("host") else []
    g = p.get("git")
    if g:
        state = {True: " (uncommitted changes)", False: "", None: " (state unknown)"}[g.get("dirty")]
        parts.append(f"git commit {str(g.get('commit'))[:12]}{state}" + (f" in `{g['root']}`" if g.get("root") else ""))
    return ", ".join(parts)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; a "|" inside a cell (|Δτ|) is escaped so it does not split the cell."""
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([row(header), "|" + "|".join("---" for _ in header) + "|", *(row(r) for r in rows)])


def render_markdown(data: dict[str, Any]) -> str:
    parts = ["## DFlash drafter evaluation", ""]
    if data.get("diagnoses"):  # named causes first: they explain the failures below
        parts += [f"**{line}**" for line in data["diagnoses"]] + [""]
    t, d, p = data.get("target", {}), data.get("drafter", {}), data.get("provenance", {})
    parts.append(f"- target: `{normal_path(t.get('path', '?'))}` identity `{str(t.get('identity', '?'))[:16]}`, "
                 f"{t.get('num_layers', '?')} layers, dtype {plain_dtype(t.get('dtype'))}, device "
                 f"{t.get('device', '?')}")
    parts.append(f"- drafter: `{normal_path(d.get('path', '?'))}` fingerprint `{str(d.get('fingerprint', '?'))[:16]}`")
    parts.append(f"- backend {p.get('backend', '?')}, versions: {plain_versions(p.get('versions'))}")
    if _git_text(p):
        parts.append(f"- ran on {_git_text(p)}")
    kp = p.get("kernel_probe") or {}
    if kp.get("probes"):
        parts.append("- kernel probe (" + f"{kp.get('seconds', 0.0) * 1e3:.0f} ms): " + ", ".join(
            f"{q.get('backend')}/{q.get('dtype')} `{str(q.get('digest'))[:12]}`" for q in kp["probes"]))
    parts += [f"- **{c.get('message')}**; re-extracted with the live kernels" for c in kp.get("changed", [])]
    tc = data.get("tests", {}).get("counts", {})
    if tc:
        parts.append("- tests: " + ", ".join(f"{k} {v}" for k, v in sorted(tc.items())))
    header, rows = tau_rows(data)
    if rows:
        parts += ["", "### τ per prompt", "", _md_table(header, rows)]
        if baseline_line(data):
            parts += ["", baseline_line(data)]
    ch, crows = category_rows(data)
    if crows:
        parts += ["", "### τ per category (mean, median, bootstrap 95 % CI of the mean; floors chain/"
                  + "/".join(f"DDTree-{b}" for b in _budgets(data)) + ")", "", _md_table(ch, crows)]
    for title, (ah, arows) in ((_ACCEPT_TITLE, acceptance_rows(data)), (_CONV_TITLE, conversation_rows(data))):
        if arows:
            parts += ["", f"### {title[0].upper()}{title[1:]}", "", _md_table(ah, arows)]
    dh, drows = drift_rows(data)
    if drows:
        parts += ["", "### Hidden-state drift (regression check)", "", _md_table(dh, drows)]
    if budget_line(data):
        parts += ["", "### Drift budget and gate", "", budget_line(data), "", _md_table(*ladder_rows(data))]
        gh, grows = gate_rows(data)
        if grows:
            parts += ["", _md_table(gh, grows)]
        parts += ["", "Plot: `drift_budget.png` (τ and mean |Δτ| against the injected feature error, this run's "
                  "measured drift marked)."]
    tm = data.get("timings", {})
    if tm.get("sum"):
        parts += ["", "### Timings (s)", "", f"wall {tm.get('wall_s')}; summed over processes: "
                  + ", ".join(f"{k} {v}" for k, v in tm["sum"].items())]
    return "\n".join(parts) + "\n"


fmt = _fmt
