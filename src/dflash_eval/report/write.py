"""Writing a run's reports (eval.json, eval.md, eval.png, drift_budget.png, speedup.png, samples.jsonl, eval.html,
$GITHUB_STEP_SUMMARY) and applying the golden-update options at the end of a run.

A report that cannot be written (no space left, a read-only file system, no permission, a regular file where the
folder should be) is one :class:`~dflash_eval.errors.StorageError` naming the file and the cause, and the reports of
the set left by an earlier run are removed: a folder never holds this run's eval.md beside an earlier run's
eval.json, nor an earlier run's eval.json a CI step would take for this one's. The callers fail the run on it (the
pytest plugin: a non-zero exit; ``dflash-eval gate``: exit 1)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.common.paths import storage_error
from dflash_eval.golden import writer as golden
from dflash_eval.metrics.floors import load_floors
from dflash_eval.metrics.verdict import run_verdict
from dflash_eval.report.budget_plot import write_budget_plot
from dflash_eval.report.html_report import HTML_NAME, write_html
from dflash_eval.report.plot import plot_source, write_plot
from dflash_eval.report.render import render_markdown
from dflash_eval.report.samples import SAMPLES_NAME, write_samples
from dflash_eval.report.speedup_report import SPEEDUP_PLOT, write_speedup_plot
from dflash_eval.report.step_summary import append_step_summary
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.run_result import RunResult

if TYPE_CHECKING:  # imports torch: kept out of the report's own import
    from dflash_eval.options.settings import EvalSettings

__all__ = ["REPORT_NAMES", "write_reports", "Concluded", "conclude", "finish"]

#: The cache folder's store of drawn plots (``<cache-dir>/plots``): a new report folder copies them from there.
PLOT_STORE = "plots"

#: The files of one run's report set, in the order they are written.
REPORT_NAMES = ("eval.json", "eval.md", "eval.png", "drift_budget.png", SPEEDUP_PLOT, SAMPLES_NAME, HTML_NAME)


def write_reports(result: RunResult, report_dir: Path, *, recorded: bool = False,
                  plot_store: Path | None = None) -> dict[str, Path]:
    """eval.json (``result``'s data: :meth:`~dflash_eval.session.run_result.RunResult.to_dict`), eval.md, the plots,
    samples.jsonl and eval.html under ``report_dir`` (each atomically), then eval.md appended to the CI step summary;
    ``{kind: path}`` of what was written (``recorded``: this run wrote the τ floors it is judged against, which
    eval.html's verdict says; ``plot_store``: the cache folder's plots, drawn once:
    :func:`dflash_eval.report.plot.draw_once`). StorageError naming the file that could not be written (the reports
    of an earlier run removed: see the module docstring)."""
    report_dir = Path(report_dir)
    try:
        paths, md = _write_reports(result, report_dir, recorded, plot_store)
    except OSError as exc:
        for name in REPORT_NAMES:  # best effort: the failure raised below is the message
            try:
                (report_dir / name).unlink(missing_ok=True)
            except OSError:
                pass
        raise storage_error(report_dir, exc, "cannot write the reports to", "--report-dir") from None
    append_step_summary(md)  # its own error names $GITHUB_STEP_SUMMARY's file
    return paths


def _write_reports(result: RunResult, report_dir: Path, recorded: bool,
                   plot_store: Path | None) -> tuple[dict[str, Path], str]:
    report_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": report_dir / "eval.json", "md": report_dir / "eval.md"}
    data = result.to_dict()
    atomic_write_text(paths["json"], dumps_strict(data) + "\n")  # NaN -> null (schema: eval.schema.json)
    md = render_markdown(result)
    atomic_write_text(paths["md"], md)
    source = plot_source(data)  # what every plot is drawn from, made once
    plots: tuple[tuple[str, str, Callable[[Path], Path | None]], ...] = (
        ("png", "eval.png", lambda out: write_plot(result, out, plot_store, source=source)),
        ("budget_png", "drift_budget.png", lambda out: write_budget_plot(result, out, plot_store, source=source)),
        ("speedup_png", SPEEDUP_PLOT, lambda out: write_speedup_plot(result, out, plot_store, source=source)))
    for key, name, plot in plots:
        written = plot(report_dir / name)
        if written is not None:
            paths[key] = written
        else:  # nothing to plot this run: a plot left by an earlier run would be read as this one's
            (report_dir / name).unlink(missing_ok=True)
    samples = write_samples(result, report_dir / SAMPLES_NAME)  # None (an earlier one removed): no references in data
    if samples is not None:
        paths["samples"] = samples
    paths["html"] = write_html(result, report_dir / HTML_NAME, recorded=recorded)  # last: links the rest
    return paths, md


@dataclass(frozen=True)
class Concluded:
    """A run's result as every writer, the junit properties, the terminal and the exit status read it (its verdict
    composed), and the lines for the terminal that say what the update options wrote."""

    result: RunResult
    messages: list[str]


def conclude(run: RunResult, settings: EvalSettings, *, failed_tests: int = 0, exitstatus: int = 0) -> Concluded:
    """Apply the update options to the merged ``run`` (through :mod:`dflash_eval.golden.writer`: the τ floors
    rewritten and the run judged against them; the feature fingerprint) and compose its verdict (eval.json's
    ``verdict``: :func:`dflash_eval.metrics.verdict.run_verdict`, with the run's ``failed_tests`` and pytest's
    ``exitstatus``): the result every report, the junit properties, the terminal and the exit status read."""
    msgs = []
    if settings.update_tau_floors and run.prompts:
        path = golden.update_floors(run, settings)
        floors = load_floors(path, mean_override=settings.tau_floor, prompt_override=settings.tau_floor_prompt)
        msgs.append(f"τ floors written to {settings.floors_file} (measured - {settings.tau_margin})")
        run = run.judged(floors)  # judged against the floors just written
    run = dataclasses.replace(run, verdict=run_verdict(run, failed_tests=failed_tests, exitstatus=exitstatus))
    if settings.update_fingerprints and run.fingerprint is not None:
        fp = golden.update_fingerprint(run.fingerprint, settings.golden_dir)
        msgs.append(f"feature fingerprint written to {fp}")
    return Concluded(run, msgs)


def finish(result: RunResult, settings: EvalSettings) -> list[str]:
    """Write the reports of the run's ``result`` (its verdict composed: :func:`conclude`) under ``--report-dir``;
    returns lines for the terminal (what the kernel probe changed)."""
    write_reports(result, settings.report_dir, recorded=bool(settings.update_tau_floors),  # the verdict names them
                  plot_store=settings.cache_dir / PLOT_STORE)
    msgs = []
    for change in result.kernel_changes:  # the witness's message says what the run did
        msgs.append(f"kernel probe: {change.message}" + ("" if change.by_witness else "; made again with the live "
                                                                                     "kernels"))
    return msgs
