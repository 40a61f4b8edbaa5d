"""The combined report of ``dflash-eval gate``: every checkpoint of one gate run in ``<report-dir>/gate.json`` and
``<report-dir>/gate.md`` (also appended to ``$GITHUB_STEP_SUMMARY`` when set).

gate.json (strict JSON, NaN written as null)::

    {"schema": 1, "created": ISO time, "wall_s", "passed": bool, "settings": {... every option but --drafter ...},
     "budgets": [N, ...],
     "checkpoints": [{"drafter", "fingerprint", "mean_tau", "mean_ddtree": {N: τ}, "mean_floor", "worst_prompt",
                      "worst_tau", "worst_floor", "passed", "reasons": [...], "baseline", "seconds",
                      "prompts": {id: {"tau", "ddtree", "floor", "passed"}}} | {"drafter", "passed": false,
                      "error", "seconds"}]}

gate.md: the comparison table (one row per checkpoint) and the prompts with the lowest chain τ (worst first, up to
20) with every checkpoint's τ side by side.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.report.strict_json import dumps_strict

__all__ = ["GATE_SCHEMA", "gate_data", "render_gate_markdown", "write_gate_report"]

GATE_SCHEMA = 1
WORST_SHOWN = 20


def gate_data(rows: list[dict[str, Any]], settings: Any, *, wall_s: float | None = None) -> dict[str, Any]:
    """gate.json's content from the gate's per-checkpoint rows."""
    opts = {k: v for k, v in settings.to_dict().items() if k != "drafter"}
    return {"schema": GATE_SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "wall_s": None if wall_s is None else round(wall_s, 3), "passed": all(r["passed"] for r in rows),
            "settings": opts, "budgets": list(settings.ddtree_budget), "checkpoints": rows}


def _fmt(x: Any) -> str:
    return "-" if not isinstance(x, (int, float)) or x != x else f"{x:.3f}"


def _name(row: dict[str, Any]) -> str:
    return Path(str(row["drafter"])).name or str(row["drafter"])


def render_gate_markdown(data: dict[str, Any]) -> str:
    rows, budgets = data["checkpoints"], [str(b) for b in data["budgets"]]
    ok = sum(r["passed"] for r in rows)
    parts = ["## dflash-eval gate", "", f"{ok}/{len(rows)} checkpoint(s) passed; target "
             f"`{data['settings'].get('target_model')}`, prompts `{data['settings'].get('prompts')}`", ""]
    header = (["checkpoint", "mean τ"] + [f"DDTree-{b} τ" for b in budgets]
              + ["mean floor", "worst prompt (τ / floor)", "verdict", "s"])
    parts += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        if "error" in r:
            cells = [_name(r), "-"] + ["-"] * len(budgets) + ["-", "-", f"ERROR {r['error']}", _fmt(r.get("seconds"))]
        else:
            worst = f"{r['worst_prompt']} ({_fmt(r['worst_tau'])} / {_fmt(r['worst_floor'])})" \
                if r.get("worst_prompt") is not None else "-"
            verdict = "PASS" if r["passed"] else "FAIL: " + "; ".join(r["reasons"])
            cells = [_name(r), _fmt(r["mean_tau"])] + [_fmt(r["mean_ddtree"].get(b)) for b in budgets] + [
                _fmt(r.get("mean_floor")), worst, verdict, _fmt(r.get("seconds"))]
        parts.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    evaluated = [r for r in rows if "prompts" in r]
    if evaluated:
        pids = list(dict.fromkeys(p for r in evaluated for p in r["prompts"]))

        def low(p: str) -> float:
            vals = [r["prompts"][p]["tau"] for r in evaluated if p in r["prompts"]]
            vals = [v for v in vals if isinstance(v, (int, float)) and v == v]
            return min(vals) if vals else float("-inf")

        worst = sorted(pids, key=low)[:WORST_SHOWN]
        parts += ["", f"### Lowest chain τ ({len(worst)} of {len(pids)} prompts, worst first)", "",
                  "| prompt | floor | " + " | ".join(_name(r) for r in evaluated) + " |",
                  "|---|---|" + "|".join("---" for _ in evaluated) + "|"]
        for p in worst:
            floor = next((r["prompts"][p]["floor"] for r in evaluated if p in r["prompts"]), None)
            cells = [_cell(r["prompts"].get(p)) for r in evaluated]
            parts.append(f"| {p} | {_fmt(floor)} | " + " | ".join(cells) + " |")
    return "\n".join(parts) + "\n"


def _cell(v: dict[str, Any] | None) -> str:
    if not v:
        return "-"
    mark = " FAIL" if v.get("passed") is False else ""
    return _fmt(v.get("tau")) + mark


def write_gate_report(rows: list[dict[str, Any]], settings: Any, *, wall_s: float | None = None) -> dict[str, Path]:
    """Write gate.json and gate.md under ``settings.report_dir`` (atomically); returns their paths."""
    data = gate_data(rows, settings, wall_s=wall_s)
    out = Path(settings.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "gate.json", "md": out / "gate.md"}
    atomic_write_text(paths["json"], dumps_strict(data) + "\n")
    md = render_gate_markdown(data)
    atomic_write_text(paths["md"], md)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(md + "\n")
    return paths
