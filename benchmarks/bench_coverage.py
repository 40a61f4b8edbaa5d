"""Benchmark: how often each confidence interval of a mean τ over prompts holds the true mean, side by side.

Models calibrated to real runs of the bundled target and drafters (``tests/data/ci_calibration.json``; module
docstring of :mod:`dflash_eval.testing.ci_coverage`): per-prompt τ of a greedy run (resampled, and a Pearson III of
the same mean, sd and skew), per-sample τ of runs at T = 0.6 and T = 1.0 (two levels: prompts, then samples of a
prompt; resampled, and Pearson III at both levels), and the per-prompt differences of two drafters' τ (a paired
difference: resampled, and Pearson III). For each model and n = 8, 12, 37 prompts, ``--reps`` runs are drawn and
every interval computed on each; printed: the share that held the true mean (%, with its Monte Carlo standard
error) and the median width; then, for Student's t and the suite's interval, how often the interval lay wholly
below the true mean and wholly above it (a verdict reads one end: a regression is an upper end below 0). The
suite's interval is ``Hall t (now)`` (:func:`dflash_eval.metrics.stats.hall_t_interval`: Student's t corrected for
skewness; at T > 0 :func:`dflash_eval.metrics.stats.sampled_hall_t_interval`, its skewness and kurtosis-matched
degrees of freedom from the samples as well); ``percentile (before)``, ``nested (before)`` and ``Hall t, prompt
means (before)`` are the ones it used before; ``Hall t, skew from samples`` and ``Hall t, Box df`` are the two parts
of the sampled interval alone, ``Hall t, ANOVA Satterthwaite`` the variance of a prompt mean from the one-way ANOVA
(between-prompt part truncated at 0) with Satterthwaite's degrees of freedom, ``Hall t, bootstrap q`` Hall t with a
bootstrap-calibrated quantile; Student's t, BCa and the studentized bootstrap are the other candidates. Every
interval sees the same draws (one seed per model and n). The per-prompt τ of the second drafter (a weaker drafter,
its τ far more skewed) is a stress model beyond the bundled runs.

Run (a few minutes on a 2-core CPU; ``--reps 500`` for a quick look)::

    .venv/bin/python benchmarks/bench_coverage.py [--reps 2000] [--t-reps 20000] [--samples 8]

Recording the calibration again from runs' eval.json (the commands that made the bundled one are in the file)::

    .venv/bin/python benchmarks/bench_coverage.py --record --greedy G/eval.json --t06 A/eval.json \\
        --t10 B/eval.json [--t06-reference C/eval.json]

``--greedy``: a greedy run with ``--reference-drafter`` (its ``drafter.reference.prompts`` are the second drafter's
τ); ``--t06`` / ``--t10``: runs at ``--temperature 0.6`` / ``1.0`` (their rows' ``sample_tau``);
``--t06-reference``: a run at T = 0.6 with ``--reference-drafter``, for paired differences at T > 0.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dflash_eval.testing import ci_coverage as cc  # noqa: E402

CALIBRATION = ROOT / "tests" / "data" / "ci_calibration.json"
SIZES = (8, 12, 37)
#: closed-form intervals: more runs for a smaller Monte Carlo error
_CHEAP = ("t", "Hall t, prompt means (before)", "Hall t, skew from samples", "Hall t, Box df",
          "Hall t, ANOVA Satterthwaite", "Hall t (now)")
_SIDES = ("t", "Hall t, prompt means (before)", "Hall t (now)")  # printed one side at a time


def _eval(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("prompts"), dict):
        raise SystemExit(f"{path}: not a reports/eval.json with prompts")
    return data


def _samples(path: Path) -> dict[str, list[float]]:
    rows = _eval(path)["prompts"]
    out = {p: [float(v) for v in r["sample_tau"]] for p, r in rows.items() if r.get("sample_tau")}
    if not out:
        raise SystemExit(f"{path}: no sample_tau in its prompt rows (a run at --temperature > 0?)")
    return out


def _reference(data: dict[str, Any], path: Path) -> dict[str, float]:
    ref = (data.get("drafter") or {}).get("reference")
    if not ref:
        raise SystemExit(f"{path}: no drafter.reference (run with --reference-drafter and the yardstick test)")
    return {p: float(t) for p, t in ref["prompts"].items() if t is not None}


def record(args: argparse.Namespace) -> None:
    """Write the calibration file from runs' eval.json."""
    greedy = _eval(args.greedy)
    out: dict[str, Any] = {
        "note": "per-prompt τ of runs of the bundled target (fixtures/) for benchmarks/bench_coverage.py and "
                "tests/test_ci_coverage.py; recorded with benchmarks/bench_coverage.py --record",
        "commands": args.commands or [],
        "greedy": {p: r["tau"] for p, r in greedy["prompts"].items() if r.get("tau") is not None},
        "greedy_reference": _reference(greedy, args.greedy),
        "t0.6": _samples(args.t06), "t1.0": _samples(args.t10)}
    if args.t06_reference:
        data = _eval(args.t06_reference)
        out["t0.6_prompt_means"] = {p: r["tau"] for p, r in data["prompts"].items() if r.get("tau") is not None}
        out["t0.6_reference"] = _reference(data, args.t06_reference)
    args.calibration.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.calibration}")


def _differences(a: dict[str, float], b: dict[str, float]) -> list[float]:
    return [a[p] - b[p] for p in a if p in b and not math.isnan(a[p]) and not math.isnan(b[p])]


def models(cal: dict[str, Any], samples: int) -> tuple[list[cc.Model], list[cc.Model]]:
    """The single-mean models and the paired-difference models of the calibration."""
    greedy = list(cal["greedy"].values())
    m, sd, skew = cc.moments(greedy)
    single = [cc.resampled("T=0 greedy, resampled", greedy), cc.pearson3("T=0 greedy, Pearson III", m, sd, skew)]
    weak = list(cal["greedy_reference"].values())
    single += [cc.resampled("T=0 2nd drafter, resampled", weak),
               cc.pearson3("T=0 2nd drafter, Pearson III", *cc.moments(weak))]
    for key in ("t0.6", "t1.0"):
        groups = cal[key]
        f = cc.within_between(list(groups.values()))
        single += [cc.two_level(f"T={key[1:]} S={samples}, resampled", groups, samples),
                   cc.two_level_pearson3(f"T={key[1:]} S={samples}, Pearson III", f["mean"], f["sd_between"],
                                         f["skew_between"], f["sd_within"], f["skew_within"], samples)]
    d = _differences(cal["greedy"], cal["greedy_reference"])
    dm, dsd, dskew = cc.moments(d)
    paired = [cc.resampled("T=0 drafter - 2nd drafter, resampled", d),
              cc.pearson3("T=0 drafter - 2nd drafter, Pearson III", dm, dsd, dskew)]
    if "t0.6_reference" in cal:
        d6 = _differences(cal["t0.6_prompt_means"], cal["t0.6_reference"])
        paired.append(cc.resampled("T=0.6 drafter - 2nd drafter, resampled", d6))
    return single, paired


def describe(cal: dict[str, Any]) -> list[str]:
    """The calibration's fitted parameters, one line each."""
    lines = []
    m, sd, skew = cc.moments(list(cal["greedy"].values()))
    lines.append(f"T=0 greedy: {len(cal['greedy'])} prompts, mean {m:.3f}, sd {sd:.3f}, skew {skew:+.2f}")
    m, sd, skew = cc.moments(list(cal["greedy_reference"].values()))
    lines.append(f"T=0 2nd drafter: {len(cal['greedy_reference'])} prompts, mean {m:.3f}, sd {sd:.3f}, "
                 f"skew {skew:+.2f}")
    for key in ("t0.6", "t1.0"):
        f = cc.within_between(list(cal[key].values()))
        lines.append(f"T={key[1:]}: {len(cal[key])} prompts x {f['samples']:g} samples, mean {f['mean']:.3f}, "
                     f"sd between {f['sd_between']:.3f} (skew of prompt means {f['skew_between']:+.2f}), "
                     f"sd within {f['sd_within']:.3f} (skew {f['skew_within']:+.2f})")
    d = _differences(cal["greedy"], cal["greedy_reference"])
    dm, dsd, dskew = cc.moments(d)
    lines.append(f"T=0 drafter - 2nd drafter: {len(d)} prompts, mean {dm:+.3f}, sd {dsd:.3f}, skew {dskew:+.2f}")
    if "t0.6_reference" in cal:
        d6 = _differences(cal["t0.6_prompt_means"], cal["t0.6_reference"])
        dm, dsd, dskew = cc.moments(d6)
        lines.append(f"T=0.6 drafter - 2nd drafter: {len(d6)} prompts, mean {dm:+.3f}, sd {dsd:.3f}, "
                     f"skew {dskew:+.2f}")
    return lines


def table(title: str, ms: list[cc.Model], intervals: list[str], reps: int, t_reps: int, seed: int) -> None:
    """One block: per model and n, every interval's coverage (%) and median width."""
    print(f"\n{title}: coverage % (Monte Carlo s.e.) / median width; {reps} runs per cell, closed-form intervals "
          f"(t, Hall t): {t_reps}")
    widths = [max(22, len(name)) for name in intervals]
    head = f"{'model':42} {'n':>3}  " + "  ".join(f"{name:>{w}}" for name, w in zip(intervals, widths))
    print(head)
    print("-" * len(head))
    for k, model in enumerate(ms):
        for n in SIZES:
            cells = []
            for name, w in zip(intervals, widths):
                if name == "nested (before)" and model.samples == 1:
                    cells.append(f"{'(= percentile)':>{w}}")
                    continue
                c = cc.coverage(model, cc.INTERVALS[name], n, t_reps if name in _CHEAP else reps,
                                seed + 1000 * k + n)
                cells.append(f"{100 * c.covered:5.1f} ({100 * c.standard_error:.1f}) / {c.median_width:6.3f}".rjust(w))
            print(f"{model.name:42} {n:3d}  " + "  ".join(cells), flush=True)


def sides(title: str, ms: list[cc.Model], reps: int, seed: int) -> None:
    """Per model and n: how often Student's t and the suite's interval lay wholly below / above the true mean."""
    names = [n for n in _SIDES if n in cc.INTERVALS]
    print(f"\n{title}: % of runs whose interval lay wholly below / wholly above the true mean (2.5 / 2.5 nominal); "
          f"{reps} runs per cell")
    widths = [max(16, len(name)) for name in names]
    head = f"{'model':42} {'n':>3}  " + "  ".join(f"{name:>{w}}" for name, w in zip(names, widths))
    print(head)
    print("-" * len(head))
    for k, model in enumerate(ms):
        for n in SIZES:
            cells = [cc.coverage(model, cc.INTERVALS[name], n, reps, seed + 1000 * k + n) for name in names]
            print(f"{model.name:42} {n:3d}  " + "  ".join(f"{100 * c.below:6.1f} / {100 * c.above:5.1f}".rjust(w)
                                                          for c, w in zip(cells, widths)), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000, help="runs drawn per model and n for the bootstrap intervals")
    ap.add_argument("--t-reps", type=int, default=20000, help="runs drawn per model and n for the closed-form "
                    "intervals (cheap: more runs, a smaller Monte Carlo error)")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt of the T > 0 models (default: the "
                    "suite's --samples-per-prompt)")
    ap.add_argument("--seed", type=int, default=0, help="the seed of the first model's draws")
    ap.add_argument("--intervals", nargs="+", default=list(cc.INTERVALS), choices=list(cc.INTERVALS),
                    help="the intervals to compare")
    ap.add_argument("--calibration", type=Path, default=CALIBRATION, help="the calibration file (JSON)")
    ap.add_argument("--record", action="store_true", help="write --calibration from the runs given below and stop")
    ap.add_argument("--greedy", type=Path, help="--record: eval.json of a greedy run with --reference-drafter")
    ap.add_argument("--t06", type=Path, help="--record: eval.json of a run at --temperature 0.6")
    ap.add_argument("--t10", type=Path, help="--record: eval.json of a run at --temperature 1.0")
    ap.add_argument("--t06-reference", type=Path, help="--record: eval.json of a run at --temperature 0.6 with "
                    "--reference-drafter (paired differences at T > 0)")
    ap.add_argument("--commands", nargs="*", help="--record: the commands that made the runs (kept in the file)")
    args = ap.parse_args(argv)
    if args.record:
        if not (args.greedy and args.t06 and args.t10):
            ap.error("--record needs --greedy, --t06 and --t10")
        record(args)
        return 0
    cal = json.loads(args.calibration.read_text())
    print("calibration:", args.calibration.relative_to(ROOT) if args.calibration.is_relative_to(ROOT)
          else args.calibration)
    for line in describe(cal):
        print("  " + line)
    single, paired = models(cal, args.samples)
    start = time.perf_counter()
    table("mean over prompts", single, args.intervals, args.reps, args.t_reps, args.seed)
    table("paired difference over prompts (each interval on the per-prompt differences)", paired,
          [i for i in args.intervals if i != "nested (before)"], args.reps, args.t_reps, args.seed + 7)
    sides("mean over prompts, one side at a time", single, args.t_reps, args.seed)
    sides("paired difference, one side at a time", paired, args.t_reps, args.seed + 7)
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
