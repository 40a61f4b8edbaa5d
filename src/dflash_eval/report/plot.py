"""eval.png: a fixed-size figure (1400 x 760 px) that reads the same at 10 and at 500 prompts (matplotlib, Agg).

- left: the prompts that need a look, up to 25: failing prompts first, then the smallest margin τ - floor (the
  lowest τ where there is no floor); chain τ bars (red: below its floor, grey: not gated), the floor as a black
  tick and each DDTree-N τ as a marker, the prompt ids written out;
- top right: the distribution of per-prompt chain τ (and DDTree-N τ) with the mean and the mean floor;
- right, below it: the acceptance-length histogram and the per-position acceptance rates of every source (offline
  chain, online loop, SGLang server; per category for the chain), over all prompts.

The title gives the counts: prompts, failing prompts, mean τ against its floor.

Every report plot is drawn once (:func:`draw_once`): its PNG carries a stamp of what it was drawn from (the plot,
matplotlib's version and eval.json's data but for its timings, cache counters, provenance and creation time), and a
run whose report folder holds the plot with the same stamp (a warm run: the same numbers) keeps it instead of drawing
it again, without importing matplotlib. A run whose report folder is new (a CI job that restores the cache folder
but not the reports) finds the PNG in the cache folder's plot store instead (``<cache-dir>/plots/<stamp>.png``, the
newest :data:`PLOT_STORE_KEEP` kept) and copies it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dflash_eval.common.atomic import atomic_write_with
from dflash_eval.common.number_text import fmt
from dflash_eval.session.rows import PromptRow
from dflash_eval.session.run_result import RunResult

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["write_plot", "eval_figure", "save_png", "draw_once", "plot_stamp", "plot_source", "worst_rows",
           "WORST_SHOWN", "STAMP_KEY"]

#: The PNG text key of a plot's stamp (:func:`plot_stamp`).
STAMP_KEY = "dflash-eval drawn from"
#: eval.json's fields that differ between runs of the same numbers (their seconds, counters, the kernel probe's and
#: the witness's timings): no plot reads them.
_VOLATILE = ("created", "timings", "cache", "counts", "provenance")

WORST_SHOWN = 25
_COLORS = {True: "#4c72b0", False: "#c44e52", None: "#9a9a9a"}  # passed / failed / not gated


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _worst_first(tau: float | None, floor: float | None, passed: bool | None) -> tuple[int, float, float]:
    """The order of the prompts to look at (:func:`worst_rows`): failing first, then by margin τ - floor."""
    tau, floor = _num(tau), _num(floor)
    margin = (tau if tau is not None else -math.inf) - (floor or 0.0)
    return (0 if passed is False else 1, round(margin, 2), -math.inf if tau is None else tau)


def worst_rows(prompts: Mapping[str, PromptRow], k: int = WORST_SHOWN) -> list[str]:
    """Up to ``k`` prompt ids of a result's prompt rows, failing first, then by margin τ - floor (τ alone without a
    floor), smallest first; margins equal to two decimals (floors recorded as measured τ minus one margin) by τ,
    lowest first."""
    return sorted(prompts, key=lambda p: _worst_first(prompts[p].tau, prompts[p].floor, prompts[p].passed))[:k]


def _worst_panel(ax: Axes, prompts: Mapping[str, PromptRow], budgets: list[str]) -> None:
    ids = worst_rows(prompts)
    y = list(range(len(ids)))[::-1]  # the worst at the top
    taus = [_num(prompts[p].tau) or 0.0 for p in ids]
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory

    ax.barh(y, taus, height=0.7, color=[_COLORS[prompts[p].passed] for p in ids])
    right = blended_transform_factory(ax.transAxes, ax.transData)
    for yy, p, t in zip(y, ids, taus):  # "τ / floor" beside the axes: readable without hunting for the tick
        f = _num(prompts[p].floor)
        ax.text(1.01, yy, f"{fmt(t, 2)} / {fmt(f, 2)}", transform=right, fontsize=7,
                va="center", color=_COLORS[prompts[p].passed])
    floors = [(yy, _num(prompts[p].floor)) for yy, p in zip(y, ids)]
    floors = [(yy, f) for yy, f in floors if f is not None]
    if floors:
        ax.scatter(cast("list[float]", [f for _, f in floors]), [yy for yy, _ in floors],  # None left out above
                   marker="|", s=260, color="black", zorder=3, label="floor (chain)")
    for k, b in enumerate(budgets):
        vals = [(yy, _num(prompts[p].ddtree.get(b))) for yy, p in zip(y, ids)]
        vals = [(yy, v) for yy, v in vals if v is not None]
        ax.scatter(cast("list[float]", [v for _, v in vals]), [yy for yy, _ in vals], marker="D", s=18, zorder=4,
                   color=["#dd8452", "#55a868", "#8172b3", "#937860"][k % 4], label=f"DDTree-{b} τ")
    handles, _ = ax.get_legend_handles_labels()
    handles = [Patch(color=_COLORS[True], label="chain τ >= floor"),
               Patch(color=_COLORS[False], label="chain τ < floor"),
               Patch(color=_COLORS[None], label="chain τ, no floor")] + handles
    ax.set_yticks(y)
    ax.set_yticklabels([p if len(p) <= 28 else p[:25] + "..." for p in ids], fontsize=8)
    ax.set_ylim(-0.7, max(len(ids), 8) - 0.3)  # a short list keeps its bar height
    ax.set_xlabel("τ (mean acceptance length)")
    ax.set_title(f"prompts to look at: {len(ids)} of {len(prompts)}, failing first, then smallest τ - floor "
                 "(right: τ / floor)", fontsize=9, pad=22)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles),
              frameon=False, handlelength=1.2, columnspacing=1.0)


def _distribution_panel(ax: Axes, result: RunResult, budgets: list[str]) -> None:
    prompts = result.prompts
    chain = [v for v in (_num(r.tau) for r in prompts.values()) if v is not None]
    series = [("chain τ", chain)] + [(f"DDTree-{b} τ", [v for v in (_num(r.ddtree.get(b)) for r in prompts.values())
                                                       if v is not None])
                                     for b in budgets]
    allv = [v for _, s in series for v in s]
    if not allv:
        ax.text(0.5, 0.5, "no τ", ha="center", va="center", transform=ax.transAxes)
        return
    lo, hi = min(allv), max(allv)
    bins = max(5, min(40, int(math.sqrt(len(chain))) * 2 or 5))
    edges = [lo + (hi - lo + 1e-9) * i / bins for i in range(bins + 1)]
    ax.hist(chain, bins=edges, color=_COLORS[True], alpha=0.75, label=series[0][0])
    failing = [v for v in (_num(r.tau) for r in prompts.values() if r.passed is False) if v is not None]
    if failing:
        ax.hist(failing, bins=edges, color=_COLORS[False], alpha=0.9, label=f"chain τ below floor ({len(failing)})")
    for (label, vals), color in zip(series[1:], ["#dd8452", "#55a868", "#8172b3", "#937860"]):
        ax.hist(vals, bins=edges, histtype="step", linewidth=1.5, color=color, label=label)
    mean, floor = _means(result)
    mean, floor = _num(mean), _num(floor)
    if mean is not None:
        ax.axvline(mean, color="black", linewidth=1.2, label=f"mean {fmt(mean)}")
    if floor is not None:
        ax.axvline(floor, color=_COLORS[False], linestyle="--", linewidth=1.2, label=f"mean floor {fmt(floor)}")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("τ per prompt")
    ax.set_ylabel("prompts")
    ax.set_title(f"τ distribution over {len(chain)} prompts", fontsize=9)
    ax.legend(fontsize=7, loc="best")


def _means(result: RunResult) -> tuple[float | None, float | None]:
    """The mean chain τ and its floor (None: the run measured no τ)."""
    return (None, None) if result.tau is None else (result.tau.mean_tau, result.tau.mean_floor)


def eval_figure(result: RunResult) -> Figure | None:
    """eval.png's figure for the run's ``result`` (None when it has no prompts)."""
    prompts = result.prompts
    if not prompts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({b for r in prompts.values() for b in r.ddtree}, key=int)
    fig = plt.figure(figsize=(14, 7.6))
    grid = fig.add_gridspec(3, 2, width_ratios=[1.15, 1])
    _worst_panel(fig.add_subplot(grid[:, 0]), prompts, budgets)
    _distribution_panel(fig.add_subplot(grid[0, 1]), result, budgets)
    _acceptance_panels(result, fig.add_subplot(grid[1, 1]), fig.add_subplot(grid[2, 1]))
    mean, floor = _means(result)
    failing = sum(1 for r in prompts.values() if r.passed is False)
    mean_judged = "" if result.mean_passed is None else (" PASS" if result.mean_passed else " FAIL")
    fig.suptitle(f"{len(prompts)} prompts, {failing} below their floor; mean chain τ "
                 f"{fmt(mean)} (floor {fmt(floor)}){mean_judged}",
                 fontsize=11)
    fig.tight_layout()
    return fig


def write_plot(result: RunResult, path: Path, store: Path | None = None, *, source: str | None = None) -> Path | None:
    """Write eval.png for the run's ``result`` (None when it has no prompts), drawn once (:func:`draw_once`,
    ``store``: the cache folder's plots; ``source``: the result's :func:`plot_source`, made already)."""
    return draw_once(path, result, eval_figure, store, source=source)


def plot_source(data: dict[str, Any]) -> str:
    """What every plot of a run is drawn from, as text: eval.json's ``data`` without its volatile fields
    (:data:`_VOLATILE`), the report folder it is written to and whether the speed-up's costs were read from the cache
    (a warm run's numbers are a cold run's). Made once per run for all of its plots (:func:`draw_once`)."""
    drawn = {k: v for k, v in data.items() if k not in _VOLATILE}
    if isinstance(drawn.get("settings"), dict):  # the same numbers written to another folder: the same plot
        drawn["settings"] = {k: v for k, v in drawn["settings"].items() if k != "report_dir"}
    if isinstance(drawn.get("speedup"), dict):
        drawn["speedup"] = {k: v for k, v in drawn["speedup"].items() if k != "cached"}
    return json.dumps(drawn, sort_keys=True, default=str)


def plot_stamp(data: dict[str, Any], build: Callable[[Any], Figure | None], *, source: str | None = None) -> str:
    """What a plot is drawn from: the figure's builder, matplotlib's version and :func:`plot_source` of ``data``
    (``source``: that text, made already), as a sha256."""
    try:
        version = metadata.version("matplotlib")
    except metadata.PackageNotFoundError:
        version = "?"
    body = plot_source(data) if source is None else source
    return hashlib.sha256(f"{build.__module__}.{build.__qualname__}\n{version}\n{body}".encode()).hexdigest()


def _stamp_of(path: Path) -> str | None:
    """The stamp a PNG was written with (None: no file, not a PNG, no stamp)."""
    if not path.is_file():
        return None
    try:
        from PIL import Image

        with Image.open(path) as image:
            text = getattr(image, "text", {}) or {}
            return str(text[STAMP_KEY]) if STAMP_KEY in text else None
    except Exception:  # noqa: BLE001 - an unreadable PNG is one to draw again
        return None


#: Plots the store in the cache folder keeps (the newest by use): a few runs' worth of each report plot.
PLOT_STORE_KEEP = 48


def draw_once(path: Path, result: RunResult, build: Callable[[RunResult], Figure | None],
              store: Path | None = None, *, source: str | None = None) -> Path | None:
    """The plot ``build(result)`` at ``path``: kept as it is when ``path`` holds the plot drawn from the same data
    (:func:`plot_stamp` of the result's eval.json data; ``source``: its :func:`plot_source`, made once for the run's
    plots), else copied from ``store`` (a folder of plots by stamp, in the cache folder) when it holds that plot, else
    drawn and written with that stamp, and kept in ``store`` too (None: nothing to plot)."""
    stamp = plot_stamp({}, build, source=plot_source(result.to_dict()) if source is None else source)
    if _stamp_of(path) == stamp:
        return path
    kept = None if store is None else store / f"{stamp}.png"
    if kept is not None and _stamp_of(kept) == stamp:
        atomic_write_with(path, lambda p: _copy(kept, p))
        _touch(kept)
        return path
    fig = build(result)
    if fig is None:
        return None
    save_png(fig, path, stamp)
    if kept is not None:
        _keep(path, kept)
    return path


def _copy(source: Path, dest: Path) -> None:
    shutil.copyfile(source, dest)


def _touch(path: Path) -> None:
    """Mark a stored plot as used (its modification time orders the store's pruning); best effort."""
    try:
        os.utime(path)
    except OSError:
        pass


def _keep(drawn: Path, kept: Path) -> None:
    """Copy a drawn plot into the store and prune the store to its newest :data:`PLOT_STORE_KEEP` plots. Best
    effort: the report is written either way, and a cache folder that cannot be written (``--cache-only`` on a
    read-only folder) only means the next new report folder draws the plot again."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_with(kept, lambda p: _copy(drawn, p))
        plots = sorted(kept.parent.glob("*.png"), key=lambda f: f.stat().st_mtime, reverse=True)
        for old in plots[PLOT_STORE_KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def save_png(fig: Figure, path: Path, stamp: str | None = None) -> Path:
    """Write ``fig`` to ``path`` as a 100-dpi PNG, atomically (its folder made), with ``stamp`` in its text
    (:data:`STAMP_KEY`), and close it: every report plot."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {STAMP_KEY: stamp} if stamp else None
    atomic_write_with(path, lambda p: fig.savefig(p, format="png", dpi=100, metadata=meta))
    plt.close(fig)
    return path


#: Line2D keyword arguments of each acceptance source (matplotlib types them as Any).
_STYLE: dict[str, dict[str, Any]] = {"chain": {"marker": "o"}, "online": {"marker": "s", "linestyle": ":"},
                                     "server": {"marker": "^", "linestyle": "-."}}


def _acceptance_panels(result: RunResult, ax_hist: Axes, ax_rates: Axes) -> None:
    """Share of rounds per acceptance length, and rate per draft position, for every source (all prompts), plus the
    chain rates of each category (each category's pooled rounds, as the result's categories hold them)."""
    cats = {c: row.acceptance for c, row in (result.categories or {}).items()}
    run = cats.get("all") or {}
    n = max(1, len(run))
    width = 0.8 / n
    for k, (src, block) in enumerate(run.items()):
        hist, rounds = block.histogram, block.rounds or 1
        ax_hist.bar([i + 1 - 0.4 + width * (k + 0.5) for i in range(len(hist))], [c / rounds for c in hist], width,
                    label=f"{src} ({block.rounds} rounds)")
        rates = block.position_rates
        ax_rates.plot(range(1, len(rates) + 1), rates, linewidth=2, label=f"{src}, all prompts",
                      **_STYLE.get(src, {}))
    for c, by in sorted(cats.items()):
        if c != "all" and "chain" in by and len(cats) > 2:
            rates = by["chain"].position_rates
            ax_rates.plot(range(1, len(rates) + 1), rates, linestyle="--", linewidth=1, label=f"chain, {c}")
    ax_hist.set_xlabel("acceptance length")
    ax_hist.set_ylabel("share of rounds")
    ax_hist.set_title("acceptance-length histogram")
    ax_rates.set_xlabel("draft slot k")
    ax_rates.set_ylabel("accepted, share of rounds")
    ax_rates.set_ylim(0, 1.02)
    ax_rates.set_title("per-position acceptance")
    for ax in (ax_hist, ax_rates):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
