"""drift_budget.png: the drafter's τ against injected feature error, with this run's measured drift marked.

Left: mean chain τ per perturbation of the drift budget's ladder (noise as a line, rounding as labelled points);
right: mean |Δτ| with its bootstrap 95 % CI and the tolerance. Both mark the budget, the gate's limit
(budget / safety factor) and, per drift comparison, the worst measured relative error over prompts and layers.
Written with matplotlib's Agg backend, atomically, next to eval.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_eval.atomic import atomic_write_with

__all__ = ["write_budget_plot", "measured_drifts"]


def measured_drifts(data: dict[str, Any]) -> dict[str, float]:
    """Per drift comparison, the largest relative error over prompts and layers (from eval.json's ``drift_gate``,
    else ``drift``)."""
    out: dict[str, float] = {}
    rows = data.get("drift_gate") or [{"comparison": r["comparison"], "max_rel_err": r["rel_err"]}
                                      for r in data.get("drift", [])]
    for r in rows:
        if r.get("max_rel_err") is not None:  # strict JSON writes a NaN as null
            out[r["comparison"]] = max(out.get(r["comparison"], 0.0), float(r["max_rel_err"]))
    return out


def write_budget_plot(data: dict[str, Any], path: Path) -> Path | None:
    """Write the plot (None when eval.json holds no drift budget)."""
    b = data.get("drift_budget")
    if not b or not b.get("levels"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [lv for lv in b["levels"]  # strict JSON writes NaN (no prompt with a round) as null: not plotted
              if None not in (lv.get("injected_rel_err"), lv.get("mean_tau"), lv.get("mean_abs_dtau"), *lv["ci95"])]
    levels.sort(key=lambda lv: lv["injected_rel_err"])
    if not levels:
        return None
    noise = [lv for lv in levels if lv["kind"] == "noise"]
    rounds = [lv for lv in levels if lv["kind"] == "round"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    floor = min([lv["injected_rel_err"] for lv in levels if lv["injected_rel_err"] > 0] +
                [v for v in measured_drifts(data).values() if v > 0] + [1e-3])
    for ax, key in ((ax1, "mean_tau"), (ax2, "mean_abs_dtau")):
        if noise:
            ys = [lv[key] for lv in noise]
            xs = [lv["injected_rel_err"] for lv in noise]
            if key == "mean_abs_dtau":
                err = [[max(0.0, lv[key] - lv["ci95"][0]) for lv in noise],
                       [max(0.0, lv["ci95"][1] - lv[key]) for lv in noise]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="relative Gaussian noise (95 % CI)")
            else:
                ax.plot(xs, ys, marker="o", label="relative Gaussian noise")
        for lv in rounds:
            x = max(lv["injected_rel_err"], floor / 10)
            ax.scatter([x], [lv[key]], marker="s", zorder=3)
            ax.annotate(lv["label"], (x, lv[key]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axvline(b["budget"], color="green", linewidth=2,
                   label=f"budget {'>= ' if b['lower_bound'] else ''}{b['budget']:.2e}")
        ax.axvline(b["gate_limit"], color="green", linestyle=":", label=f"gate limit (budget / {b['safety']:g})")
        for k, (name, v) in enumerate(sorted(measured_drifts(data).items())):
            ax.axvline(max(v, floor / 10), color=f"C{k + 3}", linestyle="--", label=f"measured: {name} {v:.1e}")
        ax.set_xscale("log")
        ax.set_xlabel("injected relative feature error ||f' - f|| / ||f||")
    ax1.axhline(b["base_mean_tau"], color="gray", linewidth=1, label=f"unperturbed τ {b['base_mean_tau']:.3f}")
    ax1.axhspan(b["base_mean_tau"] - b["tol"], b["base_mean_tau"] + b["tol"], color="gray", alpha=0.12,
                label=f"± tolerance {b['tol']:g} (the rule judges the CI of mean |Δτ|, right)")
    ax1.set_ylabel("mean chain τ")
    ax1.set_title(f"drafter {str(b['drafter'])[:12]}: τ vs injected feature error", fontsize=9)
    ax2.axhline(b["tol"], color="red", linewidth=1, label=f"tolerance {b['tol']:g}")
    ax2.set_ylabel("mean |Δτ| over prompts")
    ax2.set_title(f"{b['n_prompts']} prompts, {b['base']} features, seed {b['seed']}", fontsize=9)
    for ax in (ax1, ax2):
        ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda p: fig.savefig(p, format="png", dpi=100))
    plt.close(fig)
    return path
