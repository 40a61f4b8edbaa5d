"""What a profiled run does beyond its import floor: the functions of a run's cProfile stats by their own time above
the same functions' own time in a profile of the floor alone (``import torch, transformers.models.qwen3_5...``),
and that excess summed per package.

Own time, not cumulative: a module's import is one ``<module>`` entry whose cumulative time holds every import it
triggered, and which module triggers a shared import (``torch.distributed``, through transformers) can differ
between two processes, so cumulative entries of imports do not subtract; own times do. Functions are matched by
their path below ``site-packages`` (or the folder the GPU lane installs into, or ``src``; else their full path),
line and name, so a floor profiled in another environment of the same versions still matches. Under cProfile every
call costs more, so read the figures as shares, not as seconds of an unprofiled run; a garbage collection the real
run avoids can also show here (pytest's full collections at its end run on a frozen heap only in a process started
as ``pytest``).

Used on ``scripts/gpu_lane.sh warmfloor``'s ``warm.prof`` and ``floor.prof``::

    python benchmarks/profile_excess.py warm.prof floor.prof --top 30
"""

from __future__ import annotations

import argparse
import pstats
from collections import defaultdict

Key = tuple[str, int, str]


def _key(file: str, line: int, name: str) -> Key:
    for marker in ("site-packages/", "dist-packages/", "/site/", "/src/"):  # /site/: scripts/gpu_lane.sh's --target
        if marker in file:
            return file.split(marker, 1)[1], line, name
    return file, line, name


def own_times(path: str) -> dict[Key, tuple[float, int]]:
    """Own seconds and primitive calls per function of a stats file, keys as :func:`_key` makes them."""
    out: dict[Key, tuple[float, int]] = {}
    for (file, line, name), (prim, _calls, own, _cum, _callers) in pstats.Stats(path).stats.items():  # type: ignore[attr-defined]
        k = _key(file, line, name)
        seconds, calls = out.get(k, (0.0, 0))
        out[k] = (seconds + own, calls + prim)
    return out


def package(file: str) -> str:
    """The top-level package of a file given relative to its package folder (as :func:`_key` leaves it, and as
    py-spy prints a frame's file): "built-ins" for cProfile's ``~``, "stdlib / frozen" for an absolute path (outside
    every package folder), a frozen module's ``<frozen ...>`` or no file at all."""
    if file == "~":
        return "built-ins"
    if not file or file.startswith(("/", "<")):
        return "stdlib / frozen"
    return file.split("/", 1)[0].removesuffix(".py")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="cProfile stats of the run (python -m cProfile -o FILE ...)")
    ap.add_argument("floor", help="cProfile stats of the import floor alone")
    ap.add_argument("--top", type=int, default=30, help="how many functions to list (default 30)")
    args = ap.parse_args()
    run, floor = own_times(args.run), own_times(args.floor)
    excess = {}  # key -> (own seconds above the floor's, calls in the run, calls in the floor)
    for k, (s, c) in run.items():
        floor_s, floor_c = floor.get(k, (0.0, 0))
        excess[k] = (s - floor_s, c, floor_c)
    total_run, total_floor = sum(s for s, _ in run.values()), sum(s for s, _ in floor.values())
    print(f"own time under the profiler: run {total_run:.2f} s, floor {total_floor:.2f} s, "
          f"excess {total_run - total_floor:.2f} s")
    by_package: dict[str, float] = defaultdict(float)
    for k, (s, _, _) in excess.items():
        by_package[package(k[0])] += s
    print("\nexcess own time per package (s):")
    for name, s in sorted(by_package.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {s:7.3f}  {name}")
    print(f"\nfunctions by excess own time (s; calls in the run / in the floor), top {args.top}:")
    for k, (s, c, fc) in sorted(excess.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  {s:7.3f}  {c:>7} / {fc:<7} {k[0]}:{k[1]}({k[2]})")


if __name__ == "__main__":
    main()
