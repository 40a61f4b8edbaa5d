"""``history.png``: τ over the training steps and the paired differences the verdicts across steps judge
(matplotlib; a Figure of its own, the Agg canvas, so a training process's pyplot state and backend are left alone).

Top panel, τ against the training step:

- mean chain τ over the prompts with its 95 % CI as a band (the record's ``ci_method``: the prompts' noise of one
  checkpoint, not the noise between checkpoints), and each DDTree budget's mean τ (dashed);
- each category's mean chain τ (thin lines) when there is more than one category;
- the mean chain floor (black dotted) and the reference drafter's mean chain τ (a horizontal line) when known;
- a distinct mark for each verdict: a floor missed (red ×), a regression across steps (purple ▼), a plateau notice
  (orange ◇, hollow).

Bottom panel, the regression verdict's own numbers (:func:`regression_deltas`: the
:class:`~dflash_eval.training_loop.trend.RegressionTest` the verdict was decided by): each checkpoint's paired Δ
against the run's recent level (the per-prompt mean of the checkpoints before it), with the one-sided bar up to the
verdict's limit Δ + c·σ: a bar whose top stays below 0 is a regression.
Checkpoints with fewer than three earlier ones (σ not yet measured) show Δ alone, hollow.

Evaluations without a step (a released checkpoint evaluated beside the run, ``gate --drafter``) are not placed on
the step axis: they get panels of their own on the right, one labelled column each, in the order written. The
legend sits outside the data area. One settings digest per plot (the latest record's), the one the verdicts
compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.common.atomic import atomic_write_with
from dflash_eval.training_loop.history import CheckpointRecord
from dflash_eval.training_loop.trend import ALPHA_REGRESSION, RegressionTest, earlier_than, regression_test, step_order

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["regression_deltas", "trend_figure", "write_trend_plot"]

BLUE, GREEN, ORANGE, RED, PURPLE = "#4c72b0", "#55a868", "#dd8452", "#c44e52", "#8172b3"


def regression_deltas(records: Sequence[CheckpointRecord]) -> list[RegressionTest | None]:
    """The regression verdict's own numbers (:func:`~dflash_eval.training_loop.trend.regression_test`) for each
    record, in the order given (the order written), against the records of its settings digest written before it,
    as the history judged it."""
    out = []
    for i, r in enumerate(records):
        mine = [e for e in records[:i] if e.settings_digest == r.settings_digest]
        out.append(regression_test(r, earlier_than(r, mine)))
    return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _label(r: CheckpointRecord) -> str:
    return Path(r.drafter).name or r.drafter


def _tau_panel(ax: Axes, x: list[float], rows: list[CheckpointRecord], *, lines: bool) -> None:
    """τ of ``rows`` at ``x``: the mean chain τ and its CI, DDTree and category τ, the verdict marks."""
    style = "o-" if lines else "o"
    mean = [r.mean_tau for r in rows]
    lo, hi = [_nan(r.mean_tau_ci95[0]) for r in rows], [_nan(r.mean_tau_ci95[1]) for r in rows]
    methods = {r.ci_method or "percentile bootstrap" for r in rows}
    ci = f"95 % CI of mean τ ({methods.pop() if len(methods) == 1 else 'methods differ'}: the prompts' noise)"
    if lines:
        ax.fill_between(x, lo, hi, color=BLUE, alpha=0.2, linewidth=0, label=ci)
    else:
        ax.errorbar(x, mean, yerr=[[m - a for m, a in zip(mean, lo)], [b - m for m, b in zip(mean, hi)]],
                    fmt="none", ecolor=BLUE, alpha=0.5, capsize=4, label=ci)
    ax.plot(x, mean, style, color=BLUE, label="mean chain τ (macro)")
    for b in sorted({b for r in rows for b in r.mean_ddtree}, key=int):
        ax.plot(x, [_nan(r.mean_ddtree.get(b)) for r in rows], "s--" if lines else "s", color=GREEN, markersize=4,
                label=f"mean DDTree-{b} τ")
    cats = sorted({c for r in rows for c in r.categories if c != "all"})
    if len(cats) > 1:
        for c in cats:
            ax.plot(x, [_nan(r.categories.get(c, {}).get("tau")) for r in rows], "-" if lines else "_",
                    linewidth=1, markersize=12, alpha=0.8, label=f"{c} (chain)")
    marks: list[tuple[str, Callable[[CheckpointRecord], bool], dict[str, Any]]] = [
        ("floor missed", lambda r: r.passed is False, dict(marker="x", color=RED, markersize=10, mew=2.2)),
        ("regression across steps", lambda r: bool(r.regression), dict(marker="v", color=PURPLE, markersize=12)),
        ("plateau (a notice)", lambda r: bool(r.plateau),
         dict(marker="D", markerfacecolor="none", markeredgecolor=ORANGE, markersize=13, mew=1.8))]
    for label, hit, kw in marks:
        pts = [(xx, r.mean_tau) for xx, r in zip(x, rows) if hit(r)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="none", label=label, zorder=4, **kw)


def _delta_panel(ax: Axes, x: list[float], deltas: list[RegressionTest | None]) -> None:
    """Δ against the run's recent level at ``x``, with the verdict's one-sided limit."""
    ax.axhline(0.0, color="black", linewidth=0.8)
    judged = [(xx, d) for xx, d in zip(x, deltas) if d is not None and d.upper is not None]
    early = [(xx, d) for xx, d in zip(x, deltas) if d is not None and d.upper is None]
    if judged:
        ok = [(xx, d) for xx, d in judged if not d.regression]
        bad = [(xx, d) for xx, d in judged if d.regression]
        label = (f"paired Δ vs the run's recent level, bar to its {100 * (1 - ALPHA_REGRESSION):g} % limit Δ + c·σ "
                 "(regression: below 0)")
        for pts, color, marker, lab in ((ok, BLUE, "o", label), (bad, PURPLE, "v", "regression: limit below 0")):
            if pts:
                ax.errorbar([p[0] for p in pts], [d.delta.mean for _, d in pts],
                            yerr=[[0.0] * len(pts), [_nan(d.upper) - d.delta.mean for _, d in pts]],
                            fmt=marker, color=color, ecolor=color, capsize=4, label=lab)
    if early:
        ax.plot([p[0] for p in early], [d.delta.mean for _, d in early], "o", markerfacecolor="none",
                markeredgecolor="grey", linestyle="none",
                label="paired Δ, not judged yet (fewer than 3 earlier checkpoints)")


def _categorical(ax: Axes, rows: list[CheckpointRecord]) -> list[float]:
    x = [float(i) for i in range(len(rows))]
    ax.set_xticks(x, [_label(r) for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    return x


def _reference_and_floor(ax: Axes, rows: list[CheckpointRecord]) -> None:
    floor = next((r.mean_floor for r in reversed(rows) if r.mean_floor is not None), None)
    if floor is not None:
        ax.axhline(floor, color="black", linestyle=":", linewidth=1.2, label=f"mean floor {floor:.2f}")
    ref = next((r.reference for r in reversed(rows) if r.reference), None)
    if ref is not None:
        ax.axhline(ref["mean_tau"], color=ORANGE, linewidth=1.5,
                   label=f"reference {Path(ref['path']).name} {ref['mean_tau']:.2f}")


def trend_figure(records: Sequence[CheckpointRecord]) -> Figure:
    """The figure of ``records`` (in the order written, at least one; the latest record's settings digest) with
    the panels of the module docstring: the step axis's on the left (their axes' labels ``steps tau`` and ``steps
    delta``), those of the records without a step on the right (``named tau``, ``named delta``)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    digest = records[-1].settings_digest
    mine = [r for r in records if r.settings_digest == digest]
    deltas = dict(zip(map(id, mine), regression_deltas(mine)))
    stepped = step_order([r for r in mine if r.step is not None])
    named = [r for r in mine if r.step is None]
    cols = [c for c, rows in (("steps", stepped), ("named", named)) if rows]
    fig = Figure(figsize=(11 if len(cols) == 1 else 13, 9), dpi=100, layout="constrained")
    grid = fig.add_gridspec(2, len(cols), height_ratios=[3, 2],
                            width_ratios=[3.0, max(1.0, 0.35 * len(named))] if len(cols) == 2 else [1.0])
    first: dict[str, Axes] = {}
    for j, col in enumerate(cols):
        rows = stepped if col == "steps" else named
        top = fig.add_subplot(grid[0, j], sharey=first.get("top"), label=f"{col} tau")
        bottom = fig.add_subplot(grid[1, j], sharex=top, sharey=first.get("bottom"), label=f"{col} delta")
        first.setdefault("top", top)
        first.setdefault("bottom", bottom)
        x = [float(r.step) for r in rows] if col == "steps" else _categorical(bottom, rows)  # type: ignore[arg-type]
        _tau_panel(top, x, rows, lines=col == "steps")
        _reference_and_floor(top, mine)
        _delta_panel(bottom, x, [deltas[id(r)] for r in rows])
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.tick_params(labelbottom=False)
        if col == "steps":
            top.set_ylabel("τ (mean accepted tokens per round)")
            bottom.set_ylabel("paired Δτ vs recent level")
            bottom.set_xlabel("training step")
            bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
        else:
            top.set_title("evaluations without a step", fontsize=9)
            bottom.set_xlabel("checkpoint (no step)")
    fig.suptitle(f"τ over training steps: {len(mine)} checkpoint(s), settings {digest}")
    seen: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=2, fontsize=8)
    return fig


def write_trend_plot(records: Sequence[CheckpointRecord], path: Path) -> Path | None:
    """Write the plot of ``records`` (:func:`trend_figure`) to ``path`` as PNG, atomically (a reader sees the old
    file or the new one); None without records."""
    if not records:
        return None
    fig = trend_figure(records)
    atomic_write_with(path, lambda p: fig.savefig(p, format="png"))
    return path
