"""Benchmark: the kernel probe on a device with its outputs folded in batches against each folded alone.

On a GPU the probe folds every output of every call it records into an exact integer fingerprint on the device
(:func:`dflash_eval.target.kernel_probe.fold`); the tape stages small outputs and folds them in batches
(:class:`dflash_eval.target.kernel_probe._Folds`). This runs, in one process on the bundled target, the probes a run
makes (the extraction probe of the first bucket, the generation probe of the run's batch), alternating two ways for
``--repeats`` timed rounds after a warm-up and a counted round: ``batched`` (the tape as it is) and ``alone`` (every
tensor folded by itself as it is recorded, as before batching: the tape's ``SMALL`` set below every size). It prints
the median probe time of each way, how many tensors the tape folded and how many operations its folding ran per probe
(ATen operators that are not views: on a GPU each one kernel launch or more; counted the same on any device, in a
round of their own after the warm-up, so the counting does not slow the timed rounds), and checks that both ways give
the same digests bit for bit.

On a CPU the probe hashes bytes instead; ``--device cpu`` runs the device tape on the CPU anyway (the fold's code is
the same), which shows the counts and the digests, not a GPU's launch costs (its times are the CPU's arithmetic).

Run::

    .venv/bin/python benchmarks/bench_probe_folds.py [--device cuda|cpu] [--dtype bf16] [--repeats 5] [--rows 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dflash_eval.common.dtypes import parse_dtype
from dflash_eval.target import kernel_probe as kp
from dflash_eval.target.loader import TargetDir

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where the probe runs")
    ap.add_argument("--dtype", default="bf16", help="the probe's dtype (bf16, fp32, ...)")
    ap.add_argument("--backend", default=None, help="the probe's backend (default: fla on CUDA, torch on a CPU)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds of both ways after the warm-up")
    ap.add_argument("--rows", type=int, default=4, help="the generation probe's batch (the run's --generation-batch)")
    ap.add_argument("--target", type=Path, default=ROOT / "fixtures" / "target", help="the target's folder")
    a = ap.parse_args(argv)
    dev, dt = torch.device(a.device), parse_dtype(a.dtype)
    backend = a.backend or ("fla" if dev.type == "cuda" else "torch")
    target = TargetDir(a.target)
    shapes = [kp.ProbeShape.for_sequence(300), kp.ProbeShape.for_generation(300, a.rows, 32)]
    tape_init = kp._Tape.__init__
    small = kp._Folds.SMALL
    added, calls, counting = [0], [0], [False]
    folds_add, folds_close = kp._Folds.add, kp._Folds.close

    class Calls(TorchDispatchMode):
        """Counts the ATen operators that are not views run while the tape folds."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            calls[0] += not func.is_view
            return func(*args, **(kwargs or {}))

    def on_device(self: kp._Tape, on_device: bool) -> None:  # the device tape on a CPU too
        tape_init(self, True)

    def counted_add(self: kp._Folds, t: torch.Tensor) -> int:
        if not counting[0]:
            return folds_add(self, t)
        added[0] += 1
        with Calls():
            return folds_add(self, t)

    def counted_close(self: kp._Folds) -> None:
        if not counting[0]:
            return folds_close(self)
        with Calls():
            folds_close(self)

    kp._Tape.__init__ = on_device  # type: ignore[method-assign]
    kp._Folds.add, kp._Folds.close = counted_add, counted_close  # type: ignore[method-assign]
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), {a.dtype}, "
          f"backend {backend}, torch {torch.__version__}")
    try:
        for shape in shapes:
            times: dict[str, list[float]] = {"batched": [], "alone": []}
            digests: dict[str, set[str]] = {"batched": set(), "alone": set()}
            per_probe: dict[str, int] = {}
            for r in range(a.repeats + 2):
                for way in ("batched", "alone"):
                    kp._Folds.SMALL = small if way == "batched" else -1
                    counting[0] = r == 1  # round 0 warms up, round 1 counts, the timed rounds run as a run does
                    if counting[0]:
                        added[0] = calls[0] = 0
                    t0 = time.perf_counter()
                    res = kp.probe(target, backend, dt, dev, shape)
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    if r > 1:  # round 0 warms up (the first probe imports and compiles), round 1 counts
                        times[way].append(time.perf_counter() - t0)
                    digests[way].add(res.digest)
                    if counting[0]:
                        per_probe[way] = calls[0]
            same = len(digests["batched"] | digests["alone"]) == 1
            print(f"{shape.label}: {added[0]} tensors folded per probe, by {per_probe['batched']} operations "
                  f"batched and {per_probe['alone']} alone; median of {a.repeats}: batched "
                  f"{statistics.median(times['batched']):.4f} s, alone {statistics.median(times['alone']):.4f} s; "
                  f"same digest both ways: {same}")
            if not same:
                return 1
    finally:
        kp._Folds.SMALL, counting[0] = small, False
        kp._Tape.__init__ = tape_init  # type: ignore[method-assign]
        kp._Folds.add, kp._Folds.close = folds_add, folds_close  # type: ignore[method-assign]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
