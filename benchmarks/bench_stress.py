"""Stress benchmark: do repeated warm runs of an unchanged drafter always end the same way?

Runs the suite back to back ``--runs`` times per configuration (warm ``-k tau`` and the full suite, each under
``-n 0`` and ``-n 2``) on one warm cache (filled by an untimed first run), optionally while ``--load K`` processes
spin on the CPU, and compares every run's outcome (exit status and each test's outcome from its junit XML) with the
first run of its configuration. Any difference is a spurious failure (or pass) and is printed with the tests that
changed. Prints one row per configuration: runs, differing runs, median wall seconds. Run (about half an hour for
the defaults on a 2-core CPU)::

    .venv/bin/python benchmarks/bench_stress.py --runs 10 --load 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"tau-n0": ["-k", "tau", "-n", "0"], "tau-n2": ["-k", "tau", "-n", "2"], "full-n0": ["-n", "0"],
           "full-n2": ["-n", "2"]}  # warm `-k tau` and the full suite, each without and with two xdist workers


def outcomes(junit: Path) -> dict[str, str]:
    """Each test case's outcome in a junit XML file: passed, failed, error or skipped."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
        out[f"{case.get('classname')}::{case.get('name')}"] = (
            "failed" if "failure" in kinds else "error" if "error" in kinds else
            "skipped" if "skipped" in kinds else "passed")
    return out


def run(args: list[str], work: Path, tag: str, timeout: float) -> tuple[int, dict[str, str], float, str]:
    junit = work / f"{tag}.xml"
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "--cache-dir",
           str(work / "cache"), "--report-dir", str(work / f"report-{tag}"), f"--junitxml={junit}", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    return proc.returncode, outcomes(junit) if junit.is_file() else {}, wall, proc.stdout[-4000:] + proc.stderr[-2000:]


def _spin(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per configuration")
    ap.add_argument("--load", type=int, default=0, help="CPU-spinning processes running beside the suite")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of: {', '.join(CONFIGS)}")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one pytest run may take")
    args = ap.parse_args(argv)
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for p in spinners:
        p.start()
    total_diff = 0
    try:
        with tempfile.TemporaryDirectory(prefix="bench_stress-") as tmp:
            work = Path(tmp)
            rc, _, wall, _ = run([], work, "fill", args.timeout)
            print(f"cache filled: exit {rc}, {wall:.1f} s", flush=True)
            rows = []
            for name in [c.strip() for c in args.configs.split(",")]:
                first: tuple[int, dict[str, str]] | None = None
                walls, differing = [], 0
                for i in range(args.runs):
                    rc, outs, wall, tail = run(CONFIGS[name], work, f"{len(rows)}-{i}", args.timeout)
                    walls.append(wall)
                    if first is None:
                        first = (rc, outs)
                        print(f"[{name}] first run: exit {rc}, {len(outs)} tests, {wall:.1f} s", flush=True)
                        continue
                    changed = sorted(t for t in set(outs) | set(first[1]) if outs.get(t) != first[1].get(t))
                    if rc != first[0] or changed:
                        differing += 1
                        print(f"[{name}] run {i}: exit {rc} (first {first[0]}); changed: {changed[:10]}\n{tail}",
                              flush=True)
                rows.append((name, args.runs, differing, statistics.median(walls), os.getloadavg()[1]))
                total_diff += differing
            print(f"\nload: {args.load} spinning processes on {os.cpu_count()} CPUs")
            print("| configuration | runs | runs differing from the first | median wall s | load average (5 min) |\n"
                  "|---|---|---|---|---|")
            for name, n, d, w, load in rows:
                print(f"| {name} | {n} | {d} | {w:.1f} | {load:.1f} |")
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=10)
    return 1 if total_diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
