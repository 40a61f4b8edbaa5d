"""Benchmark of the eval suite itself: cold vs warm cache, and -n 0 vs -n 2 (same verdicts?).

Runs ``pytest tests_eval -k tau`` as subprocesses on the bundled fixtures (or the paths given):

1. cold: a fresh cache dir (completions generated, features extracted: target forwards);
2. warm: the same cache dir again (everything read from the cache);
3. a full ``pytest tests_eval`` with ``-n 0`` and with ``-n 2``, each on a fresh cache, comparing verdicts.

Prints wall times, the warm/cold ratio (target: >= 5x), the cold run's time split (target load, generation,
feature forwards, drafting, rest) from reports/eval.json, and whether -n 0 and -n 2 agree.

Run::

    .venv/bin/python benchmarks/bench_suite.py                    # bundled fixtures
    .venv/bin/python benchmarks/bench_suite.py --skip-xdist -- --target-model DIR --drafter DIR --prompts F
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], cache: Path, report: Path, extra: list[str]) -> tuple[float, int, dict, str]:
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "--cache-dir", str(cache),
           "--report-dir", str(report), *args, *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    data = json.loads((report / "eval.json").read_text()) if (report / "eval.json").is_file() else {}
    return wall, p.returncode, data, p.stdout[-3000:] + p.stderr[-2000:]


def outcomes(data: dict) -> dict[str, str]:
    return data.get("tests", {}).get("outcomes", {})


def split(data: dict, wall: float) -> str:
    s = data.get("timings", {}).get("sum", {})
    parts = {"target load": s.get("target_load", 0.0), "generation (target decode)": s.get("generation", 0.0),
             "feature forwards": s.get("target_forward", 0.0), "drafting (draft_table)": s.get("drafting", 0.0)}
    forwards = parts["generation (target decode)"] + parts["feature forwards"]
    rest = max(0.0, wall - sum(parts.values()))
    lines = [f"    {k:28s} {v:7.2f} s  ({100 * v / wall:4.1f} %)" for k, v in parts.items()]
    lines.append(f"    {'rest (pytest, imports, io)':28s} {rest:7.2f} s  ({100 * rest / wall:4.1f} %)")
    lines.append(f"    target forwards (decode + features): {forwards:.2f} s = {100 * forwards / wall:.1f} % of wall")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-xdist", action="store_true", help="only the cold/warm comparison")
    ap.add_argument("extra", nargs="*", help="extra pytest arguments (after --)")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    print(f"work dir {tmp}")
    wall_c, rc_c, data_c, out_c = run(["-k", "tau"], tmp / "cache", tmp / "cold", a.extra)
    print(f"cold  -k tau: {wall_c:7.2f} s  rc={rc_c}")
    print(split(data_c, wall_c))
    wall_w, rc_w, data_w, _ = run(["-k", "tau"], tmp / "cache", tmp / "warm", a.extra)
    print(f"warm  -k tau: {wall_w:7.2f} s  rc={rc_w}")
    print(split(data_w, wall_w))
    print(f"cold / warm = {wall_c / wall_w:.1f}x (target >= 5x); same verdicts: {outcomes(data_c) == outcomes(data_w)}")
    ok = outcomes(data_c) == outcomes(data_w) and rc_c == rc_w
    if not a.skip_xdist:
        w0, r0, d0, _ = run(["-n", "0"], tmp / "cache-n0", tmp / "n0", a.extra)
        w2, r2, d2, _ = run(["-n", "2"], tmp / "cache-n2", tmp / "n2", a.extra)
        same = outcomes(d0) == outcomes(d2) and r0 == r2
        taus0 = {p: r["tau"] for p, r in d0.get("prompts", {}).items()}
        taus2 = {p: r["tau"] for p, r in d2.get("prompts", {}).items()}
        print(f"full -n 0: {w0:7.2f} s rc={r0} | full -n 2: {w2:7.2f} s rc={r2} | ratio {w0 / w2:.2f}x")
        print(f"-n 0 vs -n 2: same verdicts {same}, same τ {taus0 == taus2} "
              f"({len(outcomes(d0))} tests, {sum(v == 'passed' for v in outcomes(d0).values())} passed)")
        ok = ok and same
    if rc_c not in (0, 1):
        print(out_c)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
