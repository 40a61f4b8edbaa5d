"""``history.png``: τ against the training step (matplotlib; a Figure of its own, the Agg canvas, so a training
process's pyplot state and backend are left alone).

- mean chain τ over the prompts with its bootstrap 95 % CI as a band, and each DDTree budget's mean τ (dashed);
- each category's mean chain τ (thin lines) when there is more than one category;
- the mean chain floor (black dotted) and the reference drafter's mean chain τ (a horizontal line) when known;
- failing checkpoints (a floor missed, or worse than the best so far beyond noise) as red crosses.

Records without a step are placed after the last step, in the order they were written; one settings digest per
plot (the latest record's), the one the trend verdicts compare.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from dflash_eval.common.atomic import atomic_write_with
from dflash_eval.training_loop.history import CheckpointRecord
from dflash_eval.training_loop.trend import step_order

__all__ = ["write_trend_plot", "x_positions"]


def x_positions(records: Sequence[CheckpointRecord]) -> list[float]:
    """The x of each record (in step order): its step; records without one after the last step, one apart."""
    last = max((r.step for r in records if r.step is not None), default=0)
    out, extra = [], 0
    for r in records:
        if r.step is not None:
            out.append(float(r.step))
        else:
            extra += 1
            out.append(float(last + extra))
    return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def write_trend_plot(records: Sequence[CheckpointRecord], path: Path) -> Path | None:
    """Write the plot of ``records`` (the latest record's settings digest) to ``path``; None without records."""
    if not records:
        return None
    from matplotlib.figure import Figure

    digest = records[-1].settings_digest
    rows = step_order([r for r in records if r.settings_digest == digest])
    x = x_positions(rows)
    fig = Figure(figsize=(10, 5.6), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    mean = [r.mean_tau for r in rows]
    lo, hi = [_nan(r.mean_tau_ci95[0]) for r in rows], [_nan(r.mean_tau_ci95[1]) for r in rows]
    ax.fill_between(x, lo, hi, color="#4c72b0", alpha=0.2, linewidth=0, label="chain τ 95% CI")
    ax.plot(x, mean, "o-", color="#4c72b0", label="mean chain τ")
    for b in sorted({b for r in rows for b in r.mean_ddtree}, key=int):
        ax.plot(x, [_nan(r.mean_ddtree.get(b)) for r in rows], "s--", color="#55a868", markersize=4,
                label=f"mean DDTree-{b} τ")
    cats = sorted({c for r in rows for c in r.categories if c != "all"})
    if len(cats) > 1:
        for c in cats:
            ax.plot(x, [_nan(r.categories.get(c, {}).get("tau")) for r in rows], "-", linewidth=1, alpha=0.8,
                    label=f"{c} (chain)")
    floor = next((r.mean_floor for r in reversed(rows) if r.mean_floor is not None), None)
    if floor is not None:
        ax.axhline(floor, color="black", linestyle=":", linewidth=1.2, label=f"mean floor {floor:.2f}")
    ref = next((r.reference for r in reversed(rows) if r.reference), None)
    if ref is not None:
        ax.axhline(ref["mean_tau"], color="#dd8452", linewidth=1.5,
                   label=f"reference {Path(ref['path']).name} {ref['mean_tau']:.2f}")
    bad = [(xx, r.mean_tau) for xx, r in zip(x, rows) if r.verdict == "fail"]
    if bad:
        ax.plot([b[0] for b in bad], [b[1] for b in bad], "x", color="#c44e52", markersize=9, mew=2,
                label="fail", linestyle="none")
    ax.set_xlabel("training step")
    ax.set_ylabel("τ (mean accepted tokens per round)")
    ax.set_title(f"τ over training steps: {len(rows)} checkpoint(s), settings {digest}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    atomic_write_with(path, lambda p: fig.savefig(p, format="png"))
    return path
