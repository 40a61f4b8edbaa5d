"""drift_budget.png: how much feature error the drafter tolerates, and where this run's measured drift lies.

Readable without docs/drift-budget.md: the title gives the drift gate's verdict and the numbers behind it (worst
measured drift x safety factor against the budget and its CI), a subtitle says what the budget is. Left, the main
panel: the mean τ drop over prompts (τ unperturbed - perturbed; below 0 τ rose) with its 95 % CI, the monotone fit
through it, the tolerance, the budget (where the fit reaches the tolerance) with its CI as a band, and each
comparison's worst measured drift x safety (left of the band: pass; right of it: fail; inside: inconclusive);
right: mean chain τ on an axis from 1 (the τ of a drafter that never helps), so a change of a few hundredths looks
as small as it is. The main axis (the run's measured drift direction amplified, whose fit is the budget) is a line
with CI bars; the secondary, isotropic axis (injected noise a line, rounding to a lower-precision dtype labelled
points) is drawn beside it with its own fit dotted; the title and subtitle name the axis the budget was read along.
One legend under both panels, fonts at 9-12 pt.
Written with matplotlib's Agg backend, atomically, next to eval.png.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_eval.common.number_text import ci_text, fmt
from dflash_eval.metrics.verdict import DRIFT_GATE
from dflash_eval.report.plot import draw_once
from dflash_eval.session.blocks import BudgetLevel, DriftBudgetBlock, FitPoint, SecondaryAxis
from dflash_eval.session.run_result import RunResult

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["write_budget_plot", "budget_figure", "measured_drifts", "budget_title", "FONT_PT"]

#: Font size (points) of the legend, tick labels and annotations; axis labels and titles are larger.
FONT_PT = 9
_VERDICT_COLOURS = {"pass": "#1b7837", "fail": "#b2182b", "inconclusive": "#d95f02", None: "#333333"}


def measured_drifts(result: RunResult) -> dict[str, float]:
    """Per drift comparison, the largest relative error over prompts and layers (from the result's drift gate rows,
    else its drift rows)."""
    out: dict[str, float] = {}
    rows = ([(g.comparison, g.max_rel_err) for g in result.drift_gate] if result.drift_gate else
            [(r.comparison, r.rel_err) for r in result.drift])
    for comparison, err in rows:
        if err is not None:  # (a row read back from eval.json holds a NaN where strict JSON wrote null)
            out[comparison] = max(out.get(comparison, 0.0), float(err))
    return out


def _g(x: object) -> str:
    return fmt(x, 2, "g")


def budget_title(result: RunResult) -> tuple[str, str]:
    """The plot's title (the gate's verdict and its numbers) and subtitle (what the budget is); the result holds a
    drift budget."""
    b = _budget(result)
    outcome = result.final_verdict().outcome(DRIFT_GATE)
    bound = ">= " if b.lower_bound else ""
    lo, hi = _ci(b)
    ci = f"{fmt(100 * b.ci_level, 0)} % CI {ci_text(lo, hi, 2, 'g')}"
    drifts = measured_drifts(result)
    if outcome is None:
        title = f"drift budget {bound}{_g(b.budget)} ({ci}): no drift was gated in this run"
    else:
        name, worst = max(drifts.items(), key=lambda kv: kv[1]) if drifts else ("-", float("nan"))
        rel = "<=" if outcome == "pass" else ">" if outcome == "fail" else "inside"
        title = (f"drift gate {outcome.upper()}: worst measured drift {_g(worst)} ({name}) x safety "
                 f"{fmt(b.safety, 6, 'g')} = {_g(worst * b.safety)} {rel} budget {bound}{_g(b.budget)} "
                 f"({ci})")
    axis = f" {b.axis_text}" if b.axis_text else ""
    second = b.secondary
    beside = ""
    if second:
        slo, shi = _ci(second)
        beside = f"; isotropic alone {'>= ' if second.lower_bound else ''}{_g(second.budget)} " \
                 f"({_g(slo)}–{_g(shi)}), not gated"
    sub = (f"budget = injected feature error{axis} at which the fitted mean τ drop reaches "
           f"{fmt(b.tol, 6, 'g')}\nmeasured on {b.n_measured} prompts from {b.base} "
           f"features; drafter {str(b.drafter)[:12]}{beside}")
    return title, sub


def _budget(result: RunResult) -> DriftBudgetBlock:
    if result.drift_budget is None:
        raise ValueError("the result holds no drift budget")
    return result.drift_budget


def _ci(b: DriftBudgetBlock | SecondaryAxis) -> tuple[float, float]:
    """The budget's CI (an open upper end, null in strict JSON, as inf)."""
    lo, hi = b.ci or [b.budget, b.budget]
    return (b.budget if lo is None else lo), (float("inf") if hi is None else hi)


def _levels(b: DriftBudgetBlock) -> list[BudgetLevel]:
    """The ladder's levels that have numbers (strict JSON writes NaN, no prompt with a round, as null), in order of
    injected error."""
    levels = [lv for lv in b.levels if None not in (lv.injected_rel_err, lv.mean_tau, lv.mean_drop, *lv.drop_ci95)]
    return sorted(levels, key=lambda lv: lv.injected_rel_err)


def write_budget_plot(result: RunResult, path: Path, store: Path | None = None, *,
                      source: str | None = None) -> Path | None:
    """Write the plot (None when the result holds no drift budget), drawn once
    (:func:`~dflash_eval.report.plot.draw_once`, ``store``: the cache folder's plots; ``source``: the result's
    :func:`~dflash_eval.report.plot.plot_source`, made already)."""
    return draw_once(path, result, budget_figure, store, source=source)


def _series(ax: Axes, key: str, levels: Sequence[BudgetLevel], *, main: bool, marker: str, color: str,
            label: str) -> None:
    """One axis's levels against their injected error: on the main panel points with the 95 % CI bars of the
    mean drop and ``label``, elsewhere a line."""
    xs, ys = [lv.injected_rel_err for lv in levels], [getattr(lv, key) for lv in levels]
    if not main:
        ax.plot(xs, ys, marker=marker, color=color)
        return
    err = [[max(0.0, getattr(lv, key) - lv.drop_ci95[0]) for lv in levels],
           [max(0.0, lv.drop_ci95[1] - getattr(lv, key)) for lv in levels]]
    ax.errorbar(xs, ys, yerr=err, marker=marker, capsize=3, color=color, linestyle="none", label=label)


def _noise_and_rounding(ax: Axes, key: str, levels: Sequence[BudgetLevel], floor: float, *, main: bool) -> None:
    """One panel's amplified-drift and injected-noise lines (with CI bars on the main panel) and rounding points
    (labelled there)."""
    drift = [lv for lv in levels if lv.kind == "drift"]
    noise = [lv for lv in levels if lv.kind == "noise"]
    rounds = [lv for lv in levels if lv.kind == "round"]
    if drift:
        _series(ax, key, drift, main=main, marker="D", color="C2",
                label=f"measured drift direction amplified, {drift[0].label.removeprefix('drift ')}.."
                      f"{drift[-1].label.removeprefix('drift ')} (main axis; bars: 95 % CI)")
        if main:
            for lv in drift:
                ax.annotate(lv.label.removeprefix("drift "), (lv.injected_rel_err, getattr(lv, key)),
                            textcoords="offset points", xytext=(4, -12), fontsize=FONT_PT - 1, color="C2")
    if noise:
        _series(ax, key, noise, main=main, marker="o", color="C0",
                label="injected Gaussian noise" + (" (secondary, isotropic axis" if drift else " (") +
                      "; bars: 95 % CI of the mean drop)")
    for k, lv in enumerate(rounds):
        x = max(lv.injected_rel_err, floor / 10)
        ax.scatter([x], [getattr(lv, key)], marker="s", color="C1", zorder=3,
                   label="rounding to a lower-precision dtype" if k == 0 and main else None)
        if main:  # labelled once (staggered: rounding levels lie close together)
            ax.annotate(lv.label, (x, getattr(lv, key)), textcoords="offset points", xytext=(4, 6 + 12 * (k % 2)),
                        fontsize=FONT_PT)


def _limits(ax: Axes, b: DriftBudgetBlock, drifts: dict[str, float], floor: float, *, main: bool) -> None:
    """The budget as a vertical line with its CI as a band, and each comparison's measured drift x safety as a
    dashed line (labelled on the main panel), the log x axis and its grid."""
    bound = ">= " if b.lower_bound else ""
    lo, hi = _ci(b)
    ax.axvline(b.budget, color="green", linewidth=2.2, label=f"drift budget {bound}{_g(b.budget)}" if main
               else None)
    top = max([lv.injected_rel_err for lv in b.levels if lv.injected_rel_err] + [b.budget]) * 3
    ax.axvspan(max(lo, floor / 10), min(hi, top), color="green", alpha=0.12, label=None if not main else
               f"budget's {fmt(100 * b.ci_level, 0)} % CI {ci_text(lo, hi, 2, 'g')} (drift x safety "
               "inside: inconclusive)")
    for k, (name, v) in enumerate(sorted(drifts.items())):
        ax.axvline(max(v * b.safety, floor / 10), color=f"C{k + 3}", linestyle="--", linewidth=1.8,
                   label=f"measured drift x safety {fmt(b.safety, 6, 'g')}, {name}: {_g(v * b.safety)}"
                   if main else None)
    ax.set_xscale("log")
    ax.set_xlabel("injected relative feature error ||f' - f|| / ||f||", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, which="major", alpha=0.3)


def _fitted(points: Sequence[FitPoint]) -> list[FitPoint]:
    return [p for p in points if p.fitted_drop is not None]


def _axes_ranges(ax_d: Axes, ax_t: Axes, b: DriftBudgetBlock, levels: Sequence[BudgetLevel]) -> None:
    """The tolerance band and the y ranges and labels of both panels."""
    tol = fmt(b.tol, 6, "g")
    top = max([b.tol * 2] + [lv.drop_ci95[1] for lv in levels])
    bottom = min([0.0] + [lv.drop_ci95[0] for lv in levels])
    pts = _fitted(b.fit.points)
    if pts:
        ax_d.plot([p.injected_rel_err for p in pts], [p.fitted_drop for p in pts], color="black",
                  linewidth=1.5, label="monotone fit of the mean drop (isotonic)"
                  + (", main axis: the budget" if b.secondary else ""))
    spts = _fitted(b.secondary.fit.points) if b.secondary else []
    if spts:
        ax_d.plot([p.injected_rel_err for p in spts], [p.fitted_drop for p in spts], color="gray",
                  linewidth=1.2, linestyle=":", label="monotone fit, isotropic axis (not gated)")
    ax_d.axhline(0, color="gray", linewidth=0.8)
    ax_d.axhline(b.tol, color="red", linewidth=1.5, label=f"tolerance: mean τ drop {tol}")
    ax_d.set_ylim(bottom * 1.08 - 0.02 * top, top * 1.08)
    ax_d.set_ylabel("mean τ drop over prompts (τ unperturbed - perturbed)", fontsize=FONT_PT + 1)
    ax_d.set_title("τ drop against injected error", fontsize=FONT_PT + 2)
    base = b.base_mean_tau
    ax_t.axhline(base, color="gray", linewidth=1)
    ax_t.axhspan(base - b.tol, base + b.tol, color="gray", alpha=0.15)
    ax_t.set_ylim(1.0, max(base, max(lv.mean_tau for lv in levels)) * 1.1)
    ax_t.set_ylabel("mean chain τ (from 1: a drafter that never helps)", fontsize=FONT_PT + 1)
    ax_t.set_title(f"τ itself: unperturbed {fmt(base)} (grey band ± {tol})", fontsize=FONT_PT + 2)


def _titles_and_legend(fig: Figure, ax_d: Axes, result: RunResult) -> None:
    """The verdict title (in the verdict's colour), the subtitle and one legend under both panels."""
    title, sub = budget_title(result)
    outcome = result.final_verdict().outcome(DRIFT_GATE)  # the drift gate's part of the run's verdict
    fig.suptitle(title, fontsize=FONT_PT + 4, fontweight="bold", color=_VERDICT_COLOURS[outcome])
    fig.text(0.5, 0.945, sub, ha="center", va="top", fontsize=FONT_PT + 1)
    handles, labels = ax_d.get_legend_handles_labels()
    rank = ("measured drift direction", "injected", "rounding", "monotone", "tolerance", "drift budget", "budget's",
            "measured")
    order = sorted(range(len(labels)), key=lambda i: next((r for r, w in enumerate(rank)
                                                           if labels[i].startswith(w)), len(rank)))
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=FONT_PT, frameon=False)
    fig.tight_layout(rect=(0, 0.05 + 0.035 * ((len(labels) + 1) // 2), 1, 0.87))


def budget_figure(result: RunResult) -> Figure | None:
    """The plot's matplotlib figure (None when the result holds no drift budget with numbers); the caller closes
    it."""
    b = result.drift_budget
    if b is None or not b.levels:
        return None
    levels = _levels(b)
    if not levels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drifts = measured_drifts(result)
    floor = min([lv.injected_rel_err for lv in levels if lv.injected_rel_err > 0] +
                [v for v in drifts.values() if v > 0] + [1e-3])
    fig, (ax_d, ax_t) = plt.subplots(1, 2, figsize=(13, 6.2), gridspec_kw={"width_ratios": [3, 2]})
    for ax, key in ((ax_d, "mean_drop"), (ax_t, "mean_tau")):
        _noise_and_rounding(ax, key, levels, floor, main=ax is ax_d)
        _limits(ax, b, drifts, floor, main=ax is ax_d)
    _axes_ranges(ax_d, ax_t, b, levels)
    _titles_and_legend(fig, ax_d, result)
    return fig
