"""Benchmark: what the witness (:mod:`dflash_eval.features.witness`) costs a warm run, and how far two clean
extractions of the same prompts differ (the reproducibility bound the witness compares within off a CPU).

Cost: a cold session fills a temporary cache with the bundled target's features of ``--num-prompts`` prompts (every
side the run compares), then warm sessions read them with ``--witness-prompts`` 0 and each of ``--witness``; per
side the witness's seconds per witnessed prompt (its forward through the layers the drafter reads and the
comparison), the target's load for it (paid once per warm process with the witness, never without), the whole
witness (cache reads, registry, lock, load included) and the warm session's wall time. Each warm session runs in a
fresh process (``--processes`` of each), as a warm run does.

Reproducibility (``--repro``): ``--processes`` fresh processes each extract the features of the same prompts with
clean kernels (every side that runs on the device); the largest relative L2 error of any prompt and target layer
between any two of them, per side. 0 on a CPU (the witness compares bit for bit there); on a GPU this is the
number behind :data:`dflash_eval.features.witness.GPU_BOUND`.

Threads (``--threads 1 2 4``): the same, one fresh process per torch thread count (``--repro`` compares processes
with the same count): whether a CPU extraction depends on ``--torch-threads`` (the witness's cache may have been
filled by a run with another count).

Run::

    .venv/bin/python benchmarks/bench_witness.py [--num-prompts 4] [--witness 1 4] [--processes 2] [--out F]
    .venv/bin/python benchmarks/bench_witness.py --repro --device cuda --backends fla torch --dtypes bf16 fp32
    .venv/bin/python benchmarks/bench_witness.py --repro --threads 1 2 4 --backends torch torch-recurrent \
        --dtypes fp32 bf16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _settings(cache: str, device: str, num_prompts: int, witness: int, extra: dict):
    from dflash_eval.options.settings import EvalSettings

    return EvalSettings.from_mapping({
        "target_model": ROOT / "fixtures" / "target", "drafter": ROOT / "fixtures" / "drafter",
        "prompts": ROOT / "fixtures" / "prompts.jsonl", "num_prompts": num_prompts, "cache_dir": cache,
        "device": device, "witness_prompts": witness, **extra})


def _sides(session) -> list:
    return sorted({session.inputs.eval_side} | {s for c in session.inputs.comparisons if not c.skip_reason
                                                for s in (c.a, c.b)}, key=lambda s: s.label)


def child_session(cache: str, device: str, num_prompts: int, witness: int) -> dict:
    """One session in this process: every side's features of the selection read (or made)."""
    import torch

    from dflash_eval.session.eval_session import EvalSession

    t0 = time.perf_counter()
    sess = EvalSession(_settings(cache, device, num_prompts, witness, {}), worker=("master", 0, 1), progress=None)
    for side in _sides(sess):
        feats = sess.evaluation.features(side)
        for pid in feats:
            feats[pid]  # read, as the consumers do
    m = sess.inputs.meter
    return {"wall_s": time.perf_counter() - t0, "witness_s": m.timings.get("witness", 0.0),
            "probe_s": m.timings.get("kernel_probe", 0.0), "target_load_s": m.timings.get("target_load", 0.0),
            "witnessed": m.counts.get("witness_prompts", 0), "produced": sess.inputs.cache.stats.produced,
            "checks": sess.store.witness.to_json()["checks"], "threads": torch.get_num_threads()}


def child_repro(device: str, num_prompts: int, backends: list[str], dtypes: list[str], out: str,
                threads: int = 0) -> dict:
    """Extract the selection's features on every (backend, dtype) here, with clean kernels, into ``out`` (.pt), with
    ``threads`` torch threads (0: torch's default)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from dflash_eval.common.dtypes import parse_dtype
    from dflash_eval.metrics.drift import Side
    from dflash_eval.session.eval_session import EvalSession

    with tempfile.TemporaryDirectory() as cache:
        sess = EvalSession(_settings(cache, device, num_prompts, 0, {}), worker=("master", 0, 1), progress=None)
        feats = {}
        for b in backends:
            for d in dtypes:
                side = Side(b, parse_dtype(d))
                fm = sess.evaluation.features(side)
                feats[side.label] = {pid: {i: t.cpu() for i, t in fm[pid].items()} for pid in fm}
    torch.save(feats, out)
    return {"sides": sorted(feats)}


def _repro(args: argparse.Namespace) -> list[dict]:
    import torch

    from dflash_eval.metrics.drift import layer_drift

    with tempfile.TemporaryDirectory() as tmp:
        outs = []
        runs = [(k, t) for t in (args.threads or [0]) for k in range(1 if args.threads else args.processes)]
        for k, t in runs:
            path = str(Path(tmp) / f"f{k}-{t}.pt")
            _run(["--child-repro", args.device, str(args.num_prompts), ",".join(args.backends), ",".join(args.dtypes),
                  path, str(t)])
            outs.append(torch.load(path))
        rows = []
        for side in outs[0]:
            worst, equal = 0.0, True
            for other in outs[1:]:
                for pid, layers in outs[0][side].items():
                    for i, t in layers.items():
                        u = other[side][pid][i]
                        equal = equal and torch.equal(t, u)
                        worst = max(worst, layer_drift(u, t).rel_err)
            rows.append({"side": side, "device": args.device, "processes": len(outs),
                         "threads": args.threads or "default",
                         "prompts": args.num_prompts, "bit_for_bit": equal, "max_rel_err": worst})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _run(argv: list[str]) -> dict:
    p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"{argv}: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-prompts", type=int, default=4, help="prompts of fixtures/prompts.jsonl")
    ap.add_argument("--witness", nargs="+", type=int, default=[1, 4], help="--witness-prompts values to time")
    ap.add_argument("--processes", type=int, default=2, help="fresh processes per case")
    ap.add_argument("--repro", action="store_true", help="measure the reproducibility of clean extractions instead")
    ap.add_argument("--backends", nargs="+", default=["torch"], help="--repro: backends to extract with")
    ap.add_argument("--dtypes", nargs="+", default=["fp32"], help="--repro: dtypes to extract in")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    ap.add_argument("--child-session", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--threads", nargs="+", type=int, help="--repro: one process per torch thread count")
    ap.add_argument("--child-repro", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_session:
        cache, dev, n, w = args.child_session
        print(json.dumps(child_session(cache, dev, int(n), int(w))))
        return
    if args.child_repro:
        dev, n, b, d, out, t = args.child_repro
        print(json.dumps(child_repro(dev, int(n), b.split(","), d.split(","), out, int(t))))
        return
    if args.repro:
        rows = _repro(args)
    else:
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            cold = _run(["--child-session", tmp, args.device, str(args.num_prompts), "0"])
            print(json.dumps({"cold_wall_s": round(cold["wall_s"], 2), "produced": cold["produced"]}), flush=True)
            for w in [0, *args.witness]:
                runs = [_run(["--child-session", tmp, args.device, str(args.num_prompts), str(w)])
                        for _ in range(args.processes)]
                per_side = {c["side"]: [] for r in runs for c in r["checks"]}
                for r in runs:
                    for c in r["checks"]:
                        if c["prompts"]:
                            per_side[c["side"]].append(c["seconds"] / len(c["prompts"]))
                row = {"witness_prompts": w, "device": args.device, "prompts": args.num_prompts,
                       "wall_s": [round(r["wall_s"], 2) for r in runs],
                       "witnessed": [r["witnessed"] for r in runs], "produced": [r["produced"] for r in runs],
                       "target_load_s": [round(r["target_load_s"], 3) for r in runs],
                       "witness_s": [round(r["witness_s"], 3) for r in runs],
                       "probe_s": [round(r["probe_s"], 3) for r in runs],
                       "s_per_witnessed_prompt": {s: round(statistics.median(v), 3) for s, v in per_side.items()
                                                  if v},
                       "witness_load_s": [round(sum(c["load_seconds"] for c in r["checks"]), 3) for r in runs],
                       "mismatches": sum(len(c["mismatches"]) for r in runs for c in r["checks"])}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
