"""eval.png: τ per prompt against its floors, and the acceptance-length histogram (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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
