"""Benchmark: the per-checkpoint cost of evaluating a training run's checkpoints, three ways, side by side.

On the bundled target and prompts (``fixtures/prompts.jsonl``), with N new checkpoints (the bundled drafter's
weights scaled a little, one factor per checkpoint, so that no τ is memoised for any of them):

1. ``Evaluator.evaluate(module)`` in a loop, in one process (the live module; the Evaluator made once, its first
   call on another drafter excluded): what a training loop pays per evaluation;
2. ``dflash-eval gate DIR`` of the same checkpoints saved to disk, one process (wall time / N, process start,
   imports and the target head included);
3. one ``pytest tests_eval -k tau --drafter CKPT`` run per checkpoint (wall time of each run).

Every side starts from the same warm cache (completions and features of the prompts cached by a warm-up run), on
its own copy of it. Run (about 5 minutes on an idle 2-core CPU)::

    .venv/bin/python benchmarks/bench_training_loop.py [--checkpoints 3] [--num-prompts N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def scaled(factor: float):
    from dflash_eval.drafter import build_drafter, read_checkpoint

    m = build_drafter(read_checkpoint(ROOT / "fixtures" / "drafter"), dtype="fp32")
    import torch

    with torch.no_grad():
        m.fc.weight.mul_(factor)
    return m.train()


def options(a: argparse.Namespace, cache: Path, reports: Path) -> dict[str, str]:
    out = {"target_model": str(ROOT / "fixtures" / "target"), "prompts": str(ROOT / "fixtures" / "prompts.jsonl"),
           "cache_dir": str(cache), "report_dir": str(reports), "tau_floor": "1.0"}
    if a.num_prompts:
        out["num_prompts"] = str(a.num_prompts)
    return out


def flags(opts: dict[str, str]) -> list[str]:
    return [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}={v}",)]


def in_process(a: argparse.Namespace, work: Path, factors: list[float]) -> list[float]:
    from dflash_eval import Evaluator

    ev = Evaluator(options(a, work / "cache-api", work / "rep-api"))
    ev.evaluate(ROOT / "fixtures" / "drafter")  # the Evaluator's first call: inputs into memory
    out = []
    for f in factors:
        m = scaled(f)
        t0 = time.perf_counter()
        ev.evaluate(m, step=int(f * 1000))
        out.append(time.perf_counter() - t0)
    return out


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(
        ROOT / "src")}, timeout=1800)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd[:4]} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument("--keep", default=None, help="work folder (kept); default: a temporary one, deleted")
    a = ap.parse_args()
    work = Path(a.keep or tempfile.mkdtemp(prefix="bench_training_loop-"))
    work.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    factors = [1.0 + 0.001 * (k + 1) for k in range(a.checkpoints)]
    warm = work / "cache-warm"
    run([py, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "-k", "tau", "-n", "0",
         *flags(options(a, warm, work / "rep-warm"))])
    for side in ("api", "gate", "pytest"):
        shutil.copytree(warm, work / f"cache-{side}", dirs_exist_ok=True)
    from dflash_eval.drafter import save_drafter

    for f in factors:
        save_drafter(scaled(f), work / "run" / f"step_{int(f * 1000)}")
    api = in_process(a, work, factors)
    gate = run([py, "-m", "dflash_eval", "gate", str(work / "run"), "--quiet",
                *flags(options(a, work / "cache-gate", work / "rep-gate"))])
    pyt = [run([py, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "-k", "tau", "-n", "0",
                f"--drafter={work / 'run' / f'step_{int(f * 1000)}'}",
                *flags(options(a, work / "cache-pytest", work / f"rep-pytest-{f}"))]) for f in factors]
    res = {"checkpoints": a.checkpoints, "prompts": a.num_prompts or "all (21)", "load": os.getloadavg()[0],
           "evaluate_module_s": api, "evaluate_module_median_s": statistics.median(api), "gate_total_s": gate,
           "gate_per_checkpoint_s": gate / a.checkpoints, "pytest_runs_s": pyt,
           "pytest_median_s": statistics.median(pyt)}
    print(json.dumps(res, indent=1))
    print(f"| way | per checkpoint (s) |\n|---|---|\n| Evaluator.evaluate(module), in-process | "
          f"{res['evaluate_module_median_s']:.2f} (median of {a.checkpoints}) |\n| dflash-eval gate DIR, one process "
          f"| {res['gate_per_checkpoint_s']:.2f} ({gate:.1f} s / {a.checkpoints}) |\n| pytest tests_eval -k tau, one "
          f"run each | {res['pytest_median_s']:.2f} (median of {a.checkpoints}) |")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
