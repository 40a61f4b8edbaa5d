"""Benchmark: the main job on fresh runners: does every fresh runner give the same verdict, and what does its first
run cost with an empty and with a restored cache folder?

A fresh CI runner starts with nothing: no cached completions or features and, on a GPU, no compiled kernels and no
autotuning results (Triton picks fla's kernel configurations by timing its candidates, so a bf16 forward's bits are
those this runner's timings picked). Each run here is the main job as ``scripts/eval`` runs it (``pytest tests_eval``
in the auto settings: bf16 with fla on a CUDA machine, fp32 on a CPU) in a fresh process with its own empty
``--cache-dir`` (so an empty Triton cache too: it lives under the cache folder unless ``TRITON_CACHE_DIR`` is set,
which this benchmark unsets) and report folder:

1. ``--timed`` runs, one at a time: the fresh runner's first run, its wall time and the GPU kernel compilation in it
   (eval.json's ``timings.compile``);
2. ``--runs`` more fresh runs, ``--parallel`` at a time (on one GPU the concurrent autotuning makes the timing-based
   picks noisier: a stricter test of steadiness than one runner alone);
3. ``--restored`` runs, each in a fresh process on a copy of the first run's cache folder (what a CI job that
   restores its cache gets): the wall time with the compiled kernels and tuning results in place.

Then it compares the fresh runs: the verdict (exit status, pytest's summary counts, the dflash-eval verdict line), the
τ table (chain and DDTree τ per prompt) and the near ties each run named. Steady means: every run green with the
same verdict, and τ equal on every prompt except those with a named near tie of the target. It prints the table of
runs and writes ``fresh_runner.json`` (and each run's log) under ``--out``.

Run (on a CUDA machine with fla: ``scripts/gpu_lane.sh fresh``; on a CPU it checks the same on the fp32 suite)::

    python benchmarks/bench_fresh_runner.py --out /tmp/fresh --timed 1 --runs 10 --parallel 5 --restored 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).* in [0-9.]+s(?: \([0-9:]+\))?)\s*=*\s*$")


def run_main_job(name: str, cache: Path, out: Path, timeout: float, extra: list[str]) -> dict[str, Any]:
    """One main job in a fresh process on ``cache``: exit status, wall time, pytest's summary, the verdict line and
    eval.json's τ per prompt, near ties and compilation."""
    reports = out / f"{name}_reports"
    shutil.rmtree(reports, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-p", "no:cacheprovider", "-q", "--cache-dir", str(cache),
           "--report-dir", str(reports), *extra]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout} s"
    wall = time.perf_counter() - t0
    (out / f"{name}.log").write_text(text if isinstance(text, str) else text.decode(errors="replace"))
    lines = text.splitlines() if isinstance(text, str) else []
    summary = next((m[1] for line in reversed(lines) if (m := SUMMARY.match(line))), "?")
    verdict = next((line for line in lines if line.startswith("dflash-eval: ")), "?")
    row: dict[str, Any] = {"name": name, "rc": rc, "wall_s": round(wall, 1), "summary": summary, "verdict": verdict,
                           "counts": _counts(summary)}
    try:
        data = json.loads((reports / "eval.json").read_text())
    except (OSError, ValueError):
        return row
    row["tau"] = {p: [r.get("tau"), *[(r.get("ddtree") or {}).get(b) for b in sorted(r.get("ddtree") or {})]]
                  for p, r in data.get("prompts", {}).items()}
    row["near_ties"] = [{k: d.get(k) for k in ("prompt_id", "against", "position", "expected", "got", "margin")}
                        for d in data.get("near_ties") or []]
    comp = data.get("timings", {}).get("compile") or {}
    row["compile_s"], row["kernels_compiled"] = comp.get("seconds"), comp.get("kernels_compiled")
    row["kernels_loaded"], row["kernel_cache"] = comp.get("kernels_loaded"), comp.get("kernel_cache")
    row["pytest_s"] = data.get("timings", {}).get("wall_s")
    return row


def _counts(summary: str) -> dict[str, int]:
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}


def steadiness(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the fresh runs agree: every one green, one verdict, τ equal on every prompt but those with a named
    near tie (in any run); the prompts whose τ differs without one."""
    green = [r for r in rows if r["rc"] == 0]
    verdicts = {(r["rc"], json.dumps(r["counts"], sort_keys=True)) for r in rows}
    tied = {d["prompt_id"] for r in rows for d in r.get("near_ties") or [] if d["against"] == "golden"}
    differ: dict[str, list[Any]] = {}
    taus = [r["tau"] for r in rows if r.get("tau")]
    for pid in sorted(set().union(*taus)) if taus else []:
        values = {json.dumps(t.get(pid)) for t in taus}
        if len(values) > 1:
            differ[pid] = sorted(values)
    unexplained = sorted(set(differ) - tied)
    return {"runs": len(rows), "green": len(green), "one_verdict": len(verdicts) == 1,
            "verdicts": sorted(verdicts), "prompts_with_golden_near_tie": sorted(tied),
            "tau_differs": differ, "tau_differs_without_near_tie": unexplained,
            "steady": len(green) == len(rows) and len(verdicts) == 1 and not unexplained}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the logs, reports and fresh_runner.json")
    ap.add_argument("--work", type=Path, default=None, help="folder for the runs' cache folders (default: OUT/work)")
    ap.add_argument("--timed", type=int, default=1, help="fresh runs made one at a time first, timed (default 1)")
    ap.add_argument("--runs", type=int, default=10, help="more fresh runs, --parallel at a time (default 10)")
    ap.add_argument("--parallel", type=int, default=2, help="fresh runs at a time in the second step (default 2)")
    ap.add_argument("--restored", type=int, default=2,
                    help="runs on a copy of the first run's cache folder, one at a time (default 2)")
    ap.add_argument("--first-index", type=int, default=1, help="number of the first fresh run (to continue a series)")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds one run may take (default 420)")
    ap.add_argument("--combine", type=Path, nargs="+", default=None,
                    help="no runs: judge the fresh runs of these fresh_runner.json files together (a series made in "
                         "several calls) and write OUT/fresh_runner_all.json")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for every run's pytest (after --)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.combine:
        parts = [json.loads(p.read_text()) for p in a.combine]
        rows = [r for part in parts for r in part["fresh"]]
        combined = {"steadiness": steadiness(rows), "fresh": rows,
                    "restored": [r for part in parts for r in part["restored"]], "from": [str(p) for p in a.combine]}
        (a.out / "fresh_runner_all.json").write_text(json.dumps(combined, indent=1) + "\n")
        return _conclude(combined["steadiness"])
    work = a.work or a.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    def fresh(i: int) -> dict[str, Any]:
        return run_main_job(f"fresh{i:02d}", work / f"cache{i:02d}", a.out, a.timeout, a.pytest_args)

    rows: list[dict[str, Any]] = []
    n = a.first_index
    for _ in range(a.timed):
        rows.append({**fresh(n), "alone": True})
        n += 1
        _print(rows[-1])
    with ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
        for row in pool.map(fresh, range(n, n + a.runs)):
            rows.append({**row, "alone": a.parallel <= 1})
            _print(rows[-1])
    restored = []
    if rows and a.restored:
        source = work / f"cache{a.first_index:02d}"
        for k in range(a.restored):
            copy = work / f"restored{k}"
            shutil.copytree(source, copy)
            restored.append(run_main_job(f"restored{k}", copy, a.out, a.timeout, a.pytest_args))
            _print(restored[-1])
    report = {"steadiness": steadiness(rows), "fresh": rows, "restored": restored,
              "python": sys.version.split()[0], "argv": sys.argv[1:]}
    (a.out / "fresh_runner.json").write_text(json.dumps(report, indent=1) + "\n")
    return _conclude(report["steadiness"])


def _conclude(s: dict[str, Any]) -> int:
    print(f"fresh runs: {s['green']}/{s['runs']} green, one verdict: {s['one_verdict']} {s['verdicts']}; "
          f"prompts with a golden near tie: {s['prompts_with_golden_near_tie']}; τ differs on "
          f"{sorted(s['tau_differs'])} (without a near tie: {s['tau_differs_without_near_tie']}); "
          f"steady: {s['steady']}")
    return 0 if s["steady"] else 1


def _print(r: dict[str, Any]) -> None:
    ties = ", ".join(f"{d['prompt_id']}@{d['position']}({d['against']}, {d['margin']:.3g})"
                     for d in r.get("near_ties") or [] if d.get("margin") is not None)
    print(f"{r['name']}: rc {r['rc']} wall {r['wall_s']} s (pytest {r.get('pytest_s')} s), compile "
          f"{r.get('compile_s')} s ({r.get('kernels_compiled')} compiled, {r.get('kernels_loaded')} loaded); "
          f"{r['summary']}; near ties: {ties or 'none'}", flush=True)
    print(f"  {r['verdict'][:200]}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
