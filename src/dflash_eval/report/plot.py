"""eval.png: τ per prompt against its floors, the acceptance-length histogram and the per-position acceptance rates
(every source side by side: offline chain, online loop, SGLang server; per category for the chain), matplotlib Agg."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dflash_eval.acceptance import acceptance_table
from dflash_eval.atomic import atomic_write_with
from dflash_eval.stats import ddtree_budgets

__all__ = ["write_plot"]


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def write_plot(data: dict[str, Any], path: Path) -> Path | None:
    """τ per prompt against floors, and the acceptance-length histogram (matplotlib Agg)."""
    prompts = data.get("prompts", {})
    if not prompts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = list(prompts)
    bs = ddtree_budgets(prompts)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(max(12, 0.5 * len(ids) + 10), 4.5),
                                        gridspec_kw={"width_ratios": [max(2, len(ids) / 8), 1, 1]})
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
    _acceptance_panels(data, ax2, ax3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda p: fig.savefig(p, format="png", dpi=100))
    plt.close(fig)
    return path


_STYLE = {"chain": {"marker": "o"}, "online": {"marker": "s", "linestyle": ":"},
          "server": {"marker": "^", "linestyle": "-."}}


def _acceptance_panels(data: dict[str, Any], ax_hist: Any, ax_rates: Any) -> None:
    """Share of rounds per acceptance length, and rate per draft position, for every source (all prompts), plus the
    chain rates of each category."""
    cats = {c: v.get("acceptance") for c, v in (data.get("categories") or {}).items()}
    if not cats or any(v is None for v in cats.values()):
        cats = acceptance_table(data.get("prompts", {}))
    run = cats.get("all") or {}
    n = max(1, len(run))
    width = 0.8 / n
    for k, (src, block) in enumerate(run.items()):
        hist, rounds = block["histogram"], block["rounds"] or 1
        ax_hist.bar([i + 1 - 0.4 + width * (k + 0.5) for i in range(len(hist))], [c / rounds for c in hist], width,
                    label=f"{src} ({block['rounds']} rounds)")
        rates = block["position_rates"]
        ax_rates.plot(range(1, len(rates) + 1), rates, linewidth=2, label=f"{src}, all prompts",
                      **_STYLE.get(src, {}))
    for c, by in sorted(cats.items()):
        if c != "all" and "chain" in by and len(cats) > 2:
            rates = by["chain"]["position_rates"]
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
