"""Benchmark: what the drift budget adds to a warm ``pytest tests_eval`` run on the bundled fixtures.

Side by side, each repeat on a fresh copy of a warm cache (completions, features and τ cached; no budget yet),
after one untimed run that brings the copy up to date with this code (e.g. τ memoised anew after a change to the
drafting code):

1. ``pytest tests_eval -k "not within_budget"``: the suite without the drift gate (nothing measures the budget);
2. ``pytest tests_eval``: the first run with the gate, which measures the budget (one draft pass per ladder level)
   and caches it;
3. ``pytest tests_eval`` again: the budget is read from the cache.

Prints wall and CPU seconds (this process's children) of each, the ratios to (1) and the ``drift_budget`` stage
time from eval.json. Run (a few minutes on a 2-core CPU)::

    .venv/bin/python benchmarks/bench_drift_budget.py --cache .dflash_cache [--repeats 2] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_suite(cache: Path, report: Path, args: list[str], timeout: float) -> tuple[float, float, dict]:
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "--cache-dir", str(cache),
           "--report-dir", str(report), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    c0, t0 = _cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    print(f"  {' '.join(args) or '(all)'}: {wall:.1f} s wall, {cpu:.1f} s CPU; {tail}", flush=True)
    return wall, cpu, json.loads((report / "eval.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=ROOT / ".dflash_cache", help="a warm cache of the bundled fixtures "
                    "(copied; never written)")
    ap.add_argument("--repeats", type=int, default=1, help="repeats of the three runs")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds each pytest run may take")
    ap.add_argument("extra", nargs="*", help="extra pytest arguments for every run (after --)")
    a = ap.parse_args(argv)
    if not (a.cache / "v1").is_dir():
        raise SystemExit(f"--cache {a.cache}: no v1/ inside; warm one first with `pytest tests_eval --cache-dir "
                         f"{a.cache}`")
    suite_runs(a)
    return 0


def suite_runs(a: argparse.Namespace) -> None:
    """The three suite runs of the module docstring, ``a.repeats`` times, and their medians."""
    rows: dict[str, list[tuple[float, float]]] = {"no gate": [], "gate, budget measured": [],
                                                  "gate, budget cached": []}
    stage = []
    with tempfile.TemporaryDirectory(prefix="bench_budget_") as tmp:
        for k in range(a.repeats):
            print(f"repeat {k + 1}/{a.repeats}", flush=True)
            cache = Path(tmp) / f"cache{k}"
            shutil.copytree(a.cache, cache, ignore=shutil.ignore_patterns("drift_budget", "locks"))
            print("  warm-up (untimed):", flush=True)
            run_suite(cache, Path(tmp) / "rw", ["-k", "not within_budget", *a.extra], a.timeout)
            w, c, _ = run_suite(cache, Path(tmp) / "r0", ["-k", "not within_budget", *a.extra], a.timeout)
            rows["no gate"].append((w, c))
            w, c, data = run_suite(cache, Path(tmp) / "r1", list(a.extra), a.timeout)
            rows["gate, budget measured"].append((w, c))
            stage.append(data["timings"]["sum"].get("drift_budget", 0.0))
            levels, n = len(data["drift_budget"]["levels"]), data["drift_budget"]["n_prompts"]
            w, c, data = run_suite(cache, Path(tmp) / "r2", list(a.extra), a.timeout)
            rows["gate, budget cached"].append((w, c))
            shutil.rmtree(cache, ignore_errors=True)
    base_w = statistics.median(w for w, _ in rows["no gate"])
    base_c = statistics.median(c for _, c in rows["no gate"])
    print(f"\n{'run':<24}{'wall s':>10}{'CPU s':>10}{'wall/no gate':>14}{'CPU/no gate':>13}")
    for name, vals in rows.items():
        w, c = statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)
        print(f"{name:<24}{w:>10.1f}{c:>10.1f}{w / base_w:>13.2f}x{c / base_c:>12.2f}x")
    print(f"drift_budget stage (measuring {levels} ladder levels on {n} prompts): {statistics.median(stage):.1f} s; "
          f"gate on a cached budget adds {statistics.median(c for _, c in rows['gate, budget cached']) - base_c:+.1f}"
          " s CPU")


if __name__ == "__main__":
    raise SystemExit(main())
