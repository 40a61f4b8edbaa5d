"""Reports of an eval run: merged results, terminal table, ``reports/eval.json``, ``eval.md``, ``eval.png``.

Inputs are the JSON fragments of :meth:`dflash_eval.session.EvalSession.fragment` (one per process: the
controller's and every xdist worker's), merged by :func:`merge`. :func:`finish` writes the files, appends the
markdown to ``$GITHUB_STEP_SUMMARY`` when set, and applies ``--update-tau-floors`` / ``--update-fingerprints``.

eval.json (schema 1; documented in README.md)::

    {"schema": 1, "created": ISO time, "settings": {...},
     "target": {"path", "identity", "num_layers", "hidden_size", "vocab_size", "layer_types", "dtype", "device"},
     "drafter": {"path", "fingerprint", "config"}, "provenance": {"backend", "dtype", "device", "versions", ...},
     "prompts": {id: {"category", "tau", "rounds", "accept_lengths", "histogram", "ddtree": {budget: tau},
                      "ddtree_accept_lengths", "floor", "ddtree_floor": {budget: floor}, "prompt_tokens",
                      "completion_tokens", "passed"}},
     "mean_tau", "mean_floor", "mean_passed", "mean_ddtree": {budget: tau}, "mean_ddtree_floor": {budget: floor},
     "categories": {category | "all": {"n", "chain": {"n", "mean", "median", "ci95": [lo, hi]},
                    "ddtree": {budget: {...same...}}, "floor", "ddtree_floor": {budget: floor}, "passed"}},
     "drift": [{"comparison", "prompt_id", "layer", "rel_err", "cos", "max_abs", "rel_tol", "cos_tol", "passed"}],
     "drift_accept": [{"comparison", "prompt_id", "tau_a", "tau_b", "diff", "tol", "passed", "a", "b"}],
     "fingerprint": {...} (when computed), "timings": {"wall_s", "sum": {stage: s}, "per_worker": {w: {...}}},
     "cache": {worker: {"hits", "misses", "produced", "corrupted", ...}},
     "tests": {"counts": {outcome: n}, "outcomes": {nodeid: outcome}}}
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from dflash_eval.atomic import atomic_write_text, atomic_write_with

__all__ = ["merge", "finish", "render_terminal", "render_markdown", "write_plot", "write_reports", "category_stats",
           "category_rows"]

SCHEMA = 1


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def merge(fragments: list[dict[str, Any]], *, outcomes: dict[str, str] | None = None,
          wall_s: float | None = None) -> dict[str, Any]:
    """Merge per-process fragments (identical measurements from several workers are de-duplicated)."""
    out: dict[str, Any] = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for key in ("settings", "target", "drafter", "provenance", "fingerprint", "sglang"):
        for f in fragments:
            if f.get(key):
                out[key] = f[key]
                break
    prompts: dict[str, Any] = {}
    for f in fragments:
        prompts.update(f.get("prompts", {}))
    order = [p for f in fragments for p in f.get("prompts", {})]
    out["prompts"] = {p: prompts[p] for p in dict.fromkeys(order)}
    for key in ("mean_tau", "mean_floor", "mean_ddtree", "mean_ddtree_floor"):
        for f in fragments:
            if key in f:
                out[key] = f[key]
                break
    if "mean_tau" in out:
        floor = out.get("mean_floor")
        mt = out["mean_tau"]
        out["mean_passed"] = floor is not None and mt is not None and not math.isnan(mt) and mt >= floor and all(
            out.get("mean_ddtree_floor", {}).get(b) is not None and v >= out["mean_ddtree_floor"][b]
            for b, v in out.get("mean_ddtree", {}).items())
    cats = next((f["categories"] for f in fragments if f.get("categories")), None)
    if cats is None and out["prompts"]:
        cats = category_stats(out["prompts"])
    if cats is not None:
        out["categories"] = cats
    drift: dict[tuple, Any] = {}
    accept: dict[tuple, Any] = {}
    for f in fragments:
        for r in f.get("drift", []):
            drift[(r["comparison"], r["prompt_id"], r["layer"])] = r
        for r in f.get("drift_accept", []):
            accept[(r["comparison"], r["prompt_id"])] = r
    out["drift"] = list(drift.values())
    out["drift_accept"] = list(accept.values())
    total: dict[str, float] = defaultdict(float)
    for f in fragments:
        for k, v in f.get("timings", {}).items():
            total[k] += v
    out["timings"] = {"wall_s": None if wall_s is None else round(wall_s, 3),
                      "sum": {k: round(v, 3) for k, v in sorted(total.items())},
                      "per_worker": {f.get("worker", "?"): f.get("timings", {}) for f in fragments}}
    out["counts"] = {f.get("worker", "?"): f.get("counts", {}) for f in fragments}
    out["cache"] = {f.get("worker", "?"): f.get("cache", {}) for f in fragments}
    oc = dict(outcomes or {})
    out["tests"] = {"counts": dict(Counter(oc.values())), "outcomes": oc}
    return out


def category_stats(prompts: dict[str, dict[str, Any]], floors: Any = None) -> dict[str, Any]:
    """Per category (and ``"all"``): n, mean / median / bootstrap 95 % CI of chain τ and of each DDTree budget's τ,
    floors (``floors.for_category``; ``for_mean`` for "all") and the verdict (mean >= floor for chain and every
    budget; None without floors). ``prompts`` is eval.json's ``prompts`` mapping."""
    from dflash_eval.stats import by_category

    cat = {p: r.get("category", "prompt") for p, r in prompts.items()}
    chain = by_category({p: r["tau"] for p, r in prompts.items() if _num(r.get("tau")) is not None}, cat)
    bs = sorted({b for r in prompts.values() for b in r.get("ddtree", {})}, key=int)
    dd = {b: by_category({p: r["ddtree"][b] for p, r in prompts.items()
                          if _num(r.get("ddtree", {}).get(b)) is not None}, cat) for b in bs}
    out: dict[str, Any] = {}
    for c, summ in chain.items():
        row: dict[str, Any] = {"n": summ.n, "chain": summ.to_dict(),
                               "ddtree": {b: dd[b][c].to_dict() for b in bs if c in dd[b]}}
        if floors is not None:
            if c == "all":
                row["floor"] = floors.for_mean()
                row["ddtree_floor"] = {b: floors.for_mean(int(b)) for b in bs}
            else:
                row["floor"] = floors.for_category(c)
                row["ddtree_floor"] = {b: floors.for_category(c, int(b)) for b in bs}
            row["passed"] = bool(row["floor"] is not None and summ.mean >= row["floor"] and all(
                f is not None and b in row["ddtree"] and row["ddtree"][b]["mean"] >= f
                for b, f in row["ddtree_floor"].items()))
        else:
            row.update(floor=None, ddtree_floor={b: None for b in bs}, passed=None)
        out[c] = row
    return out


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
        row.append("-" if r.get("passed") is None else "PASS" if r["passed"] else "FAIL")
        rows.append(row)
    return header, rows


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{nd}f}"
    return str(x)


def _budgets(data: dict[str, Any]) -> list[str]:
    bs: list[str] = []
    for r in data.get("prompts", {}).values():
        for b in r.get("ddtree", {}):
            if b not in bs:
                bs.append(b)
    return sorted(bs, key=int)


def tau_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the τ table (prompt, chain τ, DDTree-N τ..., floor, verdict) plus a mean row."""
    bs = _budgets(data)
    header = ["prompt", "chain τ"] + [f"DDTree-{b} τ" for b in bs] + ["floor"] + [f"DDTree-{b} floor" for b in bs] \
        + ["rounds", "verdict"]
    rows = []
    for pid, r in data.get("prompts", {}).items():
        rows.append([pid, _fmt(r.get("tau"))] + [_fmt(r["ddtree"].get(b)) for b in bs] + [_fmt(r.get("floor"))]
                    + [_fmt(r.get("ddtree_floor", {}).get(b)) for b in bs] + [str(r.get("rounds", "-")),
                                                                              "PASS" if r.get("passed") else "FAIL"])
    if "mean_tau" in data:
        rows.append(["MEAN", _fmt(data.get("mean_tau"))] + [_fmt(data.get("mean_ddtree", {}).get(b)) for b in bs]
                    + [_fmt(data.get("mean_floor"))] + [_fmt(data.get("mean_ddtree_floor", {}).get(b)) for b in bs]
                    + ["", "PASS" if data.get("mean_passed") else "FAIL"])
    server = [r.get("server_accept_length") for r in data.get("prompts", {}).values()]
    if any(v is not None for v in server):  # the SGLang server ran the drafter: its accept length beside offline τ
        known = [v for v in server if v is not None]
        header.insert(2, "server accept len")
        for row, v in zip(rows, server + [sum(known) / len(known)]):
            row.insert(2, _fmt(v))
    return header, rows


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


def render_terminal(data: dict[str, Any], *, width: int = 120) -> str:
    """The τ table and the drift summary as text (rich tables, no colour codes)."""
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=max(120, width), force_terminal=False, color_system=None, highlight=False)
    header, rows = tau_rows(data)
    if rows:
        t = Table(title=_title(data), show_lines=False)
        for h in header:
            t.add_column(h, justify="left" if h == "prompt" else "right")
        for r in rows:
            t.add_row(*r)
        console.print(t)
    ch, crows = category_rows(data)
    if crows:
        t = Table(title="τ per category (mean over prompts, bootstrap 95 % CI of the mean; floors chain/"
                  + "/".join(f"DDTree-{b}" for b in _budgets(data)) + ")")
        for h in ch:
            t.add_column(h, justify="left" if h == "category" else "right", no_wrap=True)
        for r in crows:
            t.add_row(*r)
        console.print(t)
    dh, drows = drift_rows(data)
    if drows:
        t = Table(title="hidden-state drift (worst prompt per layer)")
        for h in dh:
            t.add_column(h, justify="left" if h == "comparison" else "right")
        for r in drows:
            t.add_row(*r)
        console.print(t)
    tm = data.get("timings", {}).get("sum", {})
    if tm:
        console.print("timings (s, summed over processes): " + ", ".join(f"{k} {v:.2f}" for k, v in tm.items()))
    return buf.getvalue()


def _title(data: dict[str, Any]) -> str:
    t = data.get("target", {})
    d = data.get("drafter", {})
    return (f"τ per prompt — target {Path(t.get('path', '?')).name} ({str(t.get('identity', '?'))[:12]}), "
            f"drafter {Path(d.get('path', '?')).name} ({str(d.get('fingerprint', '?'))[:12]})")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(data: dict[str, Any]) -> str:
    parts = ["## DFlash drafter evaluation", ""]
    t, d, p = data.get("target", {}), data.get("drafter", {}), data.get("provenance", {})
    parts.append(f"- target: `{t.get('path', '?')}` identity `{str(t.get('identity', '?'))[:16]}`, "
                 f"{t.get('num_layers', '?')} layers, dtype {t.get('dtype', '?')}, device {t.get('device', '?')}")
    parts.append(f"- drafter: `{d.get('path', '?')}` fingerprint `{str(d.get('fingerprint', '?'))[:16]}`")
    parts.append(f"- backend {p.get('backend', '?')}, versions {p.get('versions', {})}")
    tc = data.get("tests", {}).get("counts", {})
    if tc:
        parts.append("- tests: " + ", ".join(f"{k} {v}" for k, v in sorted(tc.items())))
    header, rows = tau_rows(data)
    if rows:
        parts += ["", "### τ per prompt", "", _md_table(header, rows)]
    ch, crows = category_rows(data)
    if crows:
        parts += ["", "### τ per category (mean, median, bootstrap 95 % CI of the mean; floors chain/"
                  + "/".join(f"DDTree-{b}" for b in _budgets(data)) + ")", "", _md_table(ch, crows)]
    dh, drows = drift_rows(data)
    if drows:
        parts += ["", "### Hidden-state drift", "", _md_table(dh, drows)]
    tm = data.get("timings", {})
    if tm.get("sum"):
        parts += ["", "### Timings (s)", "", f"wall {tm.get('wall_s')}; summed over processes: "
                  + ", ".join(f"{k} {v}" for k, v in tm["sum"].items())]
    return "\n".join(parts) + "\n"


def write_plot(data: dict[str, Any], path: Path) -> Path | None:
    """τ per prompt against floors, and the acceptance-length histogram (matplotlib Agg)."""
    prompts = data.get("prompts", {})
    if not prompts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = list(prompts)
    bs = _budgets(data)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 0.5 * len(ids) + 6), 4.5))
    x = range(len(ids))
    width = 0.8 / (1 + len(bs))
    ax1.bar([i - 0.4 + width / 2 for i in x], [_num(prompts[p]["tau"]) or 0 for p in ids], width, label="chain τ")
    for k, b in enumerate(bs):
        ax1.bar([i - 0.4 + width * (k + 1.5) for i in x], [_num(prompts[p]["ddtree"].get(b)) or 0 for p in ids],
                width, label=f"DDTree-{b} τ")
    fl = [prompts[p].get("floor") for p in ids]
    if any(f is not None for f in fl):
        ax1.scatter([i - 0.4 + width / 2 for i in x], [f if f is not None else float("nan") for f in fl], marker="_",
                    s=200, color="red", label="floor", zorder=3)
    for k, b in enumerate(bs):
        dfl = [prompts[p].get("ddtree_floor", {}).get(b) for p in ids]
        if any(f is not None for f in dfl):
            ax1.scatter([i - 0.4 + width * (k + 1.5) for i in x], [f if f is not None else float("nan") for f in dfl],
                        marker="_", s=200, color="red", zorder=3)
    ax1.set_xticks(list(x))
    ax1.set_xticklabels(ids, rotation=60, ha="right", fontsize=7)
    ax1.set_ylabel("τ (mean acceptance length)")
    ax1.legend(fontsize=7)
    hist: list[int] = []
    for r in prompts.values():
        h = r.get("histogram", [])
        hist += [0] * (len(h) - len(hist))
        for i, c in enumerate(h):
            hist[i] += c
    ax2.bar(range(1, len(hist) + 1), hist)
    ax2.set_xlabel("acceptance length (chain)")
    ax2.set_ylabel("rounds")
    ax2.set_title("acceptance histogram, all prompts")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda p: fig.savefig(p, format="png", dpi=100))
    plt.close(fig)
    return path


def write_reports(data: dict[str, Any], report_dir: Path) -> dict[str, Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": report_dir / "eval.json", "md": report_dir / "eval.md"}
    atomic_write_text(paths["json"], json.dumps(data, indent=1, default=str, allow_nan=True) + "\n")
    md = render_markdown(data)
    atomic_write_text(paths["md"], md)
    png = write_plot(data, report_dir / "eval.png")
    if png is not None:
        paths["png"] = png
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(md + "\n")
    return paths


def apply_floors(data: dict[str, Any], floors: Any) -> None:
    """Recompute every floor and verdict of merged ``data`` from a :class:`dflash_eval.floors.Floors`."""
    for pid, r in data.get("prompts", {}).items():
        r["floor"] = floors.for_prompt(pid)
        r["ddtree_floor"] = {b: floors.for_prompt(pid, int(b)) for b in r.get("ddtree", {})}
        r["passed"] = bool(r["floor"] is not None and r["tau"] >= r["floor"] and all(
            f is not None and r["ddtree"][b] >= f for b, f in r["ddtree_floor"].items()))
    if "mean_tau" in data:
        data["mean_floor"] = floors.for_mean()
        data["mean_ddtree_floor"] = {b: floors.for_mean(int(b)) for b in data.get("mean_ddtree", {})}
        mt = data["mean_tau"]
        data["mean_passed"] = bool(data["mean_floor"] is not None and mt is not None and mt >= data["mean_floor"]
                                   and all(f is not None and data["mean_ddtree"][b] >= f
                                           for b, f in data["mean_ddtree_floor"].items()))
    if data.get("prompts"):
        data["categories"] = category_stats(data["prompts"], floors)


def finish(data: dict[str, Any], settings: Any) -> list[str]:
    """Apply the update options, write reports; returns lines for the terminal."""
    msgs = []
    if settings.update_tau_floors and data.get("prompts"):
        from dflash_eval.floors import load_floors, make_floors, write_floors

        prev = load_floors(settings.floors_file).raw
        pr = data["prompts"]
        cats = data.get("categories") or category_stats(pr)
        doc = make_floors(
            {p: r["tau"] for p, r in pr.items()},
            {int(b): {p: r["ddtree"][b] for p, r in pr.items() if b in r["ddtree"]} for b in _budgets(data)},
            data.get("mean_tau", float("nan")),
            {int(b): v for b, v in data.get("mean_ddtree", {}).items()},
            margin=settings.tau_margin,
            category_chain={c: r["chain"]["mean"] for c, r in cats.items() if c != "all"},
            category_ddtree={int(b): {c: r["ddtree"][b]["mean"] for c, r in cats.items()
                                      if c != "all" and b in r.get("ddtree", {})} for b in _budgets(data)},
            context={"target": data.get("target", {}).get("identity"),
                     "drafter": data.get("drafter", {}).get("fingerprint"),
                     "settings": {k: data.get("settings", {}).get(k) for k in
                                  ("max_new_tokens", "max_blocks", "num_prompts", "dtype", "hidden_state_backend")}},
            previous=prev,
        )
        write_floors(settings.floors_file, doc)
        apply_floors(data, load_floors(settings.floors_file, override=settings.tau_floor))
        msgs.append(f"τ floors written to {settings.floors_file} (measured - {settings.tau_margin})")
    if settings.update_fingerprints and data.get("fingerprint"):
        fp = Path(settings.golden_dir) / "feature_fingerprint.json"
        atomic_write_text(fp, json.dumps(data["fingerprint"], indent=1, sort_keys=True) + "\n")
        msgs.append(f"feature fingerprint written to {fp}")
    paths = write_reports(data, settings.report_dir)
    msgs.insert(0, "reports: " + ", ".join(str(p) for p in paths.values()))
    return msgs
