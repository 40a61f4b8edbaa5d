"""Benchmark: how the drift budget and the gate depend on the number of prompts the budget is measured on.

For each N of ``--sizes``, ``pytest tests_eval -k within_budget --num-prompts N --drift-budget-min-prompts N`` (the
budget on the N selected prompts alone), then the same selections with the default minimum (the budget on at least
that many prompts of ``--prompts``). Prints, per run, the budget, its 90 % CI, where the fit reached the tolerance,
and each gate's outcome: side by side, how the budget's CI narrows with more prompts and what the gate makes of it.
``--weight-noise REL`` evaluates a copy of the drafter with REL x rms Gaussian noise on every weight (the noisy
drafter of docs/drift-budget.md). Run (a few minutes on a 2-core CPU; completions and features are cached in
``--cache``)::

    .venv/bin/python benchmarks/bench_budget_prompts.py --weight-noise 0.05 --sizes 6,24,32,37
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from bench_drift_budget import run_suite
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]


def noisy_drafter(src: Path, out: Path, rel: float, seed: int = 0) -> Path:
    """A copy of the drafter at ``src`` with ``rel`` x rms Gaussian noise added to each floating-point tensor."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_bytes((src / "config.json").read_bytes())
    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for k, v in load_file(src / "model.safetensors").items():
        if v.is_floating_point():
            v = (v.float() + rel * v.float().pow(2).mean().sqrt() * torch.randn(v.shape, generator=gen)).to(v.dtype)
        sd[k] = v.contiguous()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def row(label: str, data: dict) -> str:
    b = data["drift_budget"]
    lo, hi = b["ci"]
    gates = ", ".join(f"L{g['layer']} {g['outcome']}" for g in data["drift_gate"]
                      if g["comparison"] == "bf16-vs-fp32")
    worst = max((g["max_rel_err"] for g in data["drift_gate"] if g["comparison"] == "bf16-vs-fp32"), default=0.0)
    return (f"| {label} | {b['n_prompts']} | {b['base_mean_tau']:.3f} | {b['budget']:.3g} | {lo:.3g}–"
            f"{'inf' if hi is None else f'{hi:.3g}'} | {b['status']} | {worst:.2e} | {gates} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", type=Path, default=ROOT / "fixtures" / "drafter", help="the drafter directory")
    ap.add_argument("--weight-noise", type=float, default=0.0, help="relative Gaussian noise on the drafter's weights")
    ap.add_argument("--sizes", default="6,24,32,37", help="comma-separated selection sizes (--num-prompts)")
    ap.add_argument("--cache", type=Path, default=None, help="cache directory (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds each pytest run may take")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_budget_prompts-") as tmp:
        work = Path(tmp)
        drafter = (noisy_drafter(args.drafter, work / "drafter", args.weight_noise) if args.weight_noise
                   else args.drafter)
        cache = args.cache or work / "cache"
        print("| run | budget prompts | their mean τ | budget | 90 % CI | fit | worst bf16 drift | "
              "bf16-vs-fp32 gate |\n|---|---|---|---|---|---|---|---|")
        for n in [int(x) for x in args.sizes.split(",")]:
            for label, extra in ((f"{n} selected, budget on them", [f"--drift-budget-min-prompts={n}"]),
                                 (f"{n} selected, default minimum", [])):
                _, _, data = run_suite(cache, work / f"r{n}-{len(extra)}", ["-k", "within_budget", "--drafter",
                                                                            str(drafter), f"--num-prompts={n}", *extra],
                                       args.timeout)
                print(row(label, data), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
