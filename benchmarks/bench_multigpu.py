"""Does ``pytest -n 2`` (one GPU per xdist worker) scale, and what does ``--device-map`` cost? Side by side in one run.

For one workload, after a warm-up run (kernel compilation and autotuning are not charged to either side), runs the
suite cold (a fresh cache each time) with ``-n 0`` and with ``-n 2``, and optionally
``-n 0 --device-map auto`` (one target spread over the GPUs) and ``-n 2`` with torch's default thread count in
every worker (``--oversubscribed``), and prints wall time, the ratio, each worker's stage
split from eval.json (``timings.per_worker``), when each worker ran each stage (``timings.spans``) and waited on
another's lock (``cache.<worker>.lock_wait_s``), each process's time line, what each worker produced
(``produce.log``), and whether the verdicts agree; ``--profile-stage drift_budget`` adds each process's cProfile
of that stage. Workloads:

- ``bundled``: the bundled fixtures, full suite (fla in fp32 on a GPU): must never be slower with ``-n 2``;
- ``wide``: a random Qwen3.5 target at Qwen3.6-27B widths (hidden 5120, ``--wide-layers`` layers, built here) with a
  random drafter, ``-k tau`` over ``--num-prompts`` prompts: target forwards (generation, features) dominate.

Run (on a machine with 2 GPUs and fla)::

    python benchmarks/bench_multigpu.py --workload bundled --profile-stage drift_budget --oversubscribed \
        --out /tmp/b.json
    python benchmarks/bench_multigpu.py --workload wide --wide-layers 16 --num-prompts 32 --device-map \
        --out /tmp/mg.json

On a CPU-only machine it runs too (``-n 2`` then means two CPU workers), e.g. ``--workload wide --wide-hidden 64``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def build_wide(out: Path, hidden: int, layers: int) -> tuple[Path, Path]:
    """A random target at Qwen3.6-27B widths (scaled by hidden/5120) and a random drafter for it."""
    import torch

    from dflash_eval.drafter import DFlashDrafter, save_drafter
    from dflash_eval.testing.tiny import build_random_target, random_drafter_config

    scale = hidden / 5120
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        target = build_random_target(
            out / "target", vocab_size=4096, dtype=torch.bfloat16, hidden_size=hidden, num_hidden_layers=layers,
            intermediate_size=max(8, int(17408 * scale)), num_attention_heads=max(1, int(24 * scale)),
            num_key_value_heads=max(1, int(4 * scale)), head_dim=256 if hidden >= 1024 else 16,
            linear_num_key_heads=max(1, int(16 * scale)), linear_num_value_heads=max(1, int(48 * scale)),
            linear_key_head_dim=128 if hidden >= 1024 else 16, linear_value_head_dim=128 if hidden >= 1024 else 16)
    torch.manual_seed(1)
    drafter = DFlashDrafter(random_drafter_config(target)).to(torch.bfloat16)
    save_drafter(drafter, out / "drafter")
    return target, out / "drafter"


def run_suite(args: list[str], cache: Path, report: Path, timeout: float, profile: str = "") -> dict[str, Any]:
    """One suite run; with the time line of each of its processes (``benchmarks/timeline_plugin.py``) and, for the
    stages named in ``profile`` (comma list), each process's cProfile report of them."""
    from timeline_plugin import stage_windows, summarize

    timeline = report.parent / f"timeline_{report.name}.jsonl"
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "-p", "timeline_plugin",
           "--cache-dir", str(cache), "--report-dir", str(report), *args]
    t_start = time.time()
    env = {**os.environ, "DFLASH_EVAL_PROGRESS": "0", "TIMELINE_FILE": str(timeline), "TIMELINE_T0": str(t_start),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")])),
           "STAGE_PROFILE": profile, "STAGE_PROFILE_DIR": str(report / "stage_profiles")}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    data = json.loads((report / "eval.json").read_text()) if (report / "eval.json").is_file() else {}
    log = cache / "v1" / "produce.log"
    made = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
    per_worker = Counter((m["worker"], m["kind"]) for m in made)
    return {"cmd": " ".join(cmd), "rc": p.returncode, "wall_s": round(wall, 2),
            "summary": p.stdout.strip().splitlines()[-1:], "timings": data.get("timings", {}),
            "verdicts": {k: r.get("passed") for k, r in data.get("prompts", {}).items()},
            "mean_tau": data.get("mean_tau"), "timeline": summarize(timeline),
            "stage_windows": stage_windows(data.get("timings", {}).get("spans", {}), t_start),
            "lock_wait_s": {w: c.get("lock_wait_s") for w, c in data.get("cache", {}).items()},
            "produced": {f"{w}/{k}": n for (w, k), n in sorted(per_worker.items())},
            "produce_seconds": {w: round(sum(m["seconds"] or 0 for m in made if m["worker"] == w), 2)
                                for w in {m["worker"] for m in made}},
            "stage_profiles": {f.stem: f.read_text() for f in sorted((report / "stage_profiles").glob("*.txt"))}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("bundled", "wide"), default="bundled")
    ap.add_argument("--wide-hidden", type=int, default=5120, help="hidden size of the wide random target")
    ap.add_argument("--wide-layers", type=int, default=16, help="layers of the wide random target")
    ap.add_argument("--num-prompts", type=int, default=32, help="prompts of the wide workload")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="completion length of the wide workload")
    ap.add_argument("--device-map", action="store_true", help="also run -n 0 with --device-map auto")
    ap.add_argument("--oversubscribed", action="store_true",
                    help="also run -n 2 with torch's default thread count (one per physical core) in every worker, "
                         "as GPU runs had before workers shared the threads: the cost of oversubscribing the cores")
    ap.add_argument("--no-warmup", action="store_true", help="skip the warm-up run (kernels known compiled)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per suite run (a hang guard)")
    ap.add_argument("--profile-stage", default="", help="comma list of metered stages (e.g. drift_budget) to run under "
                                                        "cProfile in every process of the compared runs")
    ap.add_argument("--out", type=Path, help="write the measurements as JSON here")
    ns = ap.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    default_threads = torch.get_num_threads()  # torch's default here: one per physical core
    work = Path(tempfile.mkdtemp(prefix="bench_multigpu_"))
    if ns.workload == "bundled":
        base = ["--dtype", "fp32", "--allow-settings-mismatch"] + (
            ["--hidden-state-backend", "fla", "--reference-backend", "torch"] if gpu else [])
    else:
        t0 = time.perf_counter()
        target, drafter = build_wide(work, ns.wide_hidden, ns.wide_layers)
        print(f"built the wide target in {time.perf_counter() - t0:.1f} s", flush=True)
        base = ["-k", "tau", "--target-model", str(target), "--drafter", str(drafter), "--tau-floor", "1.0",
                "--prompts", f"humaneval:{ns.num_prompts}", "--max-new-tokens", str(ns.max_new_tokens),
                "--floors-file", str(work / "no_floors.json")] + (
            ["--hidden-state-backend", "fla", "--reference-backend", "torch", "--dtype", "bf16"] if gpu else [])
    # Warm-up: the whole -n 0 run once on a throwaway cache. Triton compiles fla's kernels once per machine and fla
    # caches its autotuning results on disk (per shape); neither may be charged to whichever run comes first.
    if not ns.no_warmup:
        warm = run_suite(base + ["-n", "0"], work / "cache_warmup", work / "reports_warmup", ns.timeout)
        print(f"warm-up     rc {warm['rc']}  wall {warm['wall_s']:8.2f} s (not compared)", flush=True)
    runs = {}
    for name, extra in [("n0", ["-n", "0"]), ("n2", ["-n", "2"])] + (
            [("device_map", ["-n", "0", "--device-map", "auto"])] if ns.device_map else []) + (
            [("n2_oversubscribed", ["-n", "2", "--torch-threads", str(default_threads)])] if ns.oversubscribed else []):
        runs[name] = run_suite(base + extra, work / f"cache_{name}", work / f"reports_{name}", ns.timeout,
                               ns.profile_stage)
        print(f"{name:11s} rc {runs[name]['rc']}  wall {runs[name]['wall_s']:8.2f} s  {runs[name]['summary']}",
              flush=True)
    n0, n2 = runs["n0"], runs["n2"]
    print(f"-n 2 vs -n 0: {n0['wall_s'] / n2['wall_s']:.2f}x faster; "
          f"verdicts equal: {n0['verdicts'] == n2['verdicts']}; "
          f"mean τ {n0['mean_tau']} vs {n2['mean_tau']}")
    if "device_map" in runs:
        dm = runs["device_map"]
        print(f"--device-map auto vs one GPU: {dm['wall_s'] / n0['wall_s']:.2f}x the time; "
              f"verdicts equal: {dm['verdicts'] == n0['verdicts']}")
    if "n2_oversubscribed" in runs:
        ov = runs["n2_oversubscribed"]
        print(f"-n 2 with {default_threads} threads per worker (oversubscribed) vs shared threads: "
              f"{ov['wall_s'] / n2['wall_s']:.2f}x the time; verdicts equal: {ov['verdicts'] == n2['verdicts']}")
    for name, r in runs.items():
        print(f"[{name}] per-worker stage seconds: {json.dumps(r['timings'].get('per_worker', {}))}")
        print(f"[{name}] produced: {r['produced']}; production seconds per worker: {r['produce_seconds']}")
        print(f"[{name}] time line (s from start): {json.dumps(r['timeline'])}")
        print(f"[{name}] stage windows (first start, last end, seconds): {json.dumps(r['stage_windows'])}")
        print(f"[{name}] lock waits (s): {json.dumps(r['lock_wait_s'])}")
        for stem, text in r["stage_profiles"].items():  # the head of the own-time table of each process
            print(f"[{name}] cProfile of {stem}:\n" + "\n".join(text.splitlines()[:30]))
    if ns.out:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps({"workload": ns.workload, "gpus": torch.cuda.device_count(), "args": vars(ns) | {
            "out": str(ns.out)}, "runs": runs}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
