"""Writing a run's reports (eval.json, eval.md, eval.png, drift_budget.png, $GITHUB_STEP_SUMMARY) and applying the
golden-update options at the end of a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dflash_eval import golden
from dflash_eval.atomic import atomic_write_text
from dflash_eval.floors import load_floors
from dflash_eval.report.budget_plot import write_budget_plot
from dflash_eval.report.plot import write_plot
from dflash_eval.report.render import render_markdown
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.verdict import judge_run

__all__ = ["write_reports", "finish"]


def write_reports(data: dict[str, Any], report_dir: Path) -> dict[str, Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": report_dir / "eval.json", "md": report_dir / "eval.md"}
    atomic_write_text(paths["json"], dumps_strict(data) + "\n")  # NaN -> null (schema: eval.schema.json)
    md = render_markdown(data)
    atomic_write_text(paths["md"], md)
    png = write_plot(data, report_dir / "eval.png")
    if png is not None:
        paths["png"] = png
    budget_png = write_budget_plot(data, report_dir / "drift_budget.png")
    if budget_png is not None:
        paths["budget_png"] = budget_png
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(md + "\n")
    return paths


def finish(data: dict[str, Any], settings: Any) -> list[str]:
    """Apply the update options (through :mod:`dflash_eval.golden`), write the reports; returns lines for the
    terminal."""
    msgs = []
    if settings.update_tau_floors and data.get("prompts"):
        path = golden.update_floors(data, settings)
        judge_run(data, load_floors(path, mean_override=settings.tau_floor, prompt_override=settings.tau_floor_prompt))
        msgs.append(f"τ floors written to {settings.floors_file} (measured - {settings.tau_margin})")
    if settings.update_fingerprints and data.get("fingerprint"):
        fp = golden.update_fingerprint(data["fingerprint"], settings.golden_dir)
        msgs.append(f"feature fingerprint written to {fp}")
    paths = write_reports(data, settings.report_dir)
    msgs.insert(0, "reports: " + ", ".join(str(p) for p in paths.values()))
    for change in ((data.get("provenance") or {}).get("kernel_probe") or {}).get("changed", []):
        msgs.append(f"kernel probe: {change['message']}; re-extracted with the live kernels")
    return msgs
