"""Writing a run's reports (eval.json, eval.md, eval.png, drift_budget.png, $GITHUB_STEP_SUMMARY) and applying the
golden-update options at the end of a run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.golden import writer as golden
from dflash_eval.metrics.floors import load_floors
from dflash_eval.metrics.verdict import judge_run
from dflash_eval.report.budget_plot import write_budget_plot
from dflash_eval.report.plot import write_plot
from dflash_eval.report.render import render_markdown
from dflash_eval.report.step_summary import append_step_summary
from dflash_eval.report.strict_json import dumps_strict

if TYPE_CHECKING:  # imports torch: kept out of the report's own import
    from dflash_eval.options.settings import EvalSettings

__all__ = ["write_reports", "finish"]


def write_reports(data: dict[str, Any], report_dir: Path) -> dict[str, Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": report_dir / "eval.json", "md": report_dir / "eval.md"}
    atomic_write_text(paths["json"], dumps_strict(data) + "\n")  # NaN -> null (schema: eval.schema.json)
    md = render_markdown(data)
    atomic_write_text(paths["md"], md)
    for key, name, plot in (("png", "eval.png", write_plot), ("budget_png", "drift_budget.png", write_budget_plot)):
        written = plot(data, report_dir / name)
        if written is not None:
            paths[key] = written
        else:  # nothing to plot this run: a plot left by an earlier run would be read as this one's
            (report_dir / name).unlink(missing_ok=True)
    append_step_summary(md)
    return paths


def finish(data: dict[str, Any], settings: EvalSettings) -> list[str]:
    """Apply the update options (through :mod:`dflash_eval.golden.writer`), write the reports; returns lines for the
    terminal (what was written besides the reports)."""
    msgs = []
    if settings.update_tau_floors and data.get("prompts"):
        path = golden.update_floors(data, settings)
        judge_run(data, load_floors(path, mean_override=settings.tau_floor, prompt_override=settings.tau_floor_prompt))
        msgs.append(f"τ floors written to {settings.floors_file} (measured - {settings.tau_margin})")
    if settings.update_fingerprints and data.get("fingerprint"):
        fp = golden.update_fingerprint(data["fingerprint"], settings.golden_dir)
        msgs.append(f"feature fingerprint written to {fp}")
    write_reports(data, settings.report_dir)  # the verdict printed last names them (report.summary)
    for change in ((data.get("provenance") or {}).get("kernel_probe") or {}).get("changed", []):
        msgs.append(f"kernel probe: {change['message']}; re-extracted with the live kernels")
    return msgs
