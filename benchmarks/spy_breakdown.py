"""Where a run's wall time went, from py-spy's sampled stacks, beside its import floor sampled alike.

``py-spy record --nonblocking --idle --threads --format raw`` writes one line per distinct stack: ``thread (TID):
NAME;frame;...;frame COUNT`` with frames as ``function (file:line)``, outermost first. Unlike cProfile
(``benchmarks/profile_excess.py``) the samples hold every thread and the time spent waiting (on the card, a lock, the
disk), and the run is not slowed call by call. Record both files alike and with ``--nonblocking``: by default py-spy
pauses the process at each sample, which slows a process of many threads more than the floor's (a warm run on two
cores sampled 1.5-2.3 s above the floor so, 0.6-1.0 s without pausing); and compare differences, not totals: samples
start once py-spy has found the interpreter, so both totals miss the same first moments, and without pausing py-spy
drops the samples it read mid-change (its ``Errors`` count: 11-16 % in both files there), so every figure is short by
about that share. What this prints, per file:

- each thread's sampled seconds, the most first (the main thread's include its samples from before it was named);
- the main thread split into imports, by the top-level package whose module was executing when the sample was
  taken (the innermost module body in the stack: torch's own import work is torch's even when transformers asked
  for it), and the rest, by the innermost frame of the project's own code (``dflash_eval/...``), else by the package
  of the innermost frame (pytest's own work, a plugin's);
- with a floor file, each group's seconds in the run, in the floor and the difference, largest first: what the run
  does beyond importing torch and the target's modeling code.

With ``--under TEXT``, where inside a frame the run's time sits: of the main thread's samples whose stack holds a
frame containing ``TEXT`` (e.g. ``decode_forward``), the seconds per innermost frame (``function (file:line)``), the
line the samples were taken at.

Used on ``scripts/gpu_lane.sh warmspy``'s ``warm_spy.txt`` and ``floor_spy.txt``::

    python benchmarks/spy_breakdown.py warm_spy.txt --floor floor_spy.txt --rate 200 --top 25
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter
from dataclasses import dataclass, field

from profile_excess import package  # the same package names as the cProfile view

_THREAD = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")
OWN = "dflash_eval/"


@dataclass
class Samples:
    """Sample counts of one py-spy raw file: per thread (id -> name), and the main thread's stacks."""

    rate: float
    threads: Counter[str] = field(default_factory=Counter)
    main: Counter[tuple[str, ...]] = field(default_factory=Counter)

    def seconds(self, count: int) -> float:
        return count / self.rate


def _frame_file(frame: str) -> str:
    m = _FRAME.match(frame)
    return m.group(2) if m else ""


def read(path: str, rate: float) -> Samples:
    """Parse a raw file (gzip-compressed where its name ends in ``.gz``, as the GPU lane brings it back); the main
    thread is the id named ``MainThread`` (its unnamed samples included), or in a process that never imported
    ``threading`` its one unnamed thread."""
    per_thread: dict[str, Counter[tuple[str, ...]]] = {}
    names: dict[str, str] = {}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                raise ValueError(f"{path}:{number}: not a py-spy raw line (STACK COUNT): {line[:80]!r}")
            head, *frames = stack.split(";")
            m = _THREAD.match(head)
            if not m:
                raise ValueError(f"{path}:{number}: no 'thread (ID)' at the start of the stack: {head[:80]!r}")
            tid, name = m.group(1), (m.group(2) or "").strip()
            if name:
                names.setdefault(tid, name)
            per_thread.setdefault(tid, Counter())[tuple(frames)] += int(count)
    out = Samples(rate)
    main = next((tid for tid, name in names.items() if name == "MainThread"),  # else the busiest unnamed thread
                max((t for t in per_thread if t not in names), key=lambda t: sum(per_thread[t].values()), default=None))
    for tid, stacks in per_thread.items():
        label = f"{names.get(tid, '(unnamed)')} [{tid}]"
        out.threads[label] = sum(stacks.values())
        if tid == main:
            out.main = stacks
    return out


def group(frames: tuple[str, ...], own: str = OWN) -> str:
    """The group of one main-thread sample (module docstring); ``own``: how the project's files start."""
    importing = any(f.startswith("_find_and_load ") for f in frames)
    if importing:
        for f in reversed(frames):
            if f.startswith("<module> "):
                return "import " + package(_frame_file(f))
        return "import (machinery)"
    for f in reversed(frames):
        file = _frame_file(f)
        if file.startswith(own):
            return f.rsplit(" (", 1)[0] + " (" + file.split(":", 1)[0] + ")"
    return "other " + package(_frame_file(frames[-1])) if frames else "other (empty stack)"


def groups(s: Samples, own: str = OWN) -> Counter[str]:
    out: Counter[str] = Counter()
    for frames, n in s.main.items():
        out[group(frames, own)] += n
    return out


def report(run: Samples, floor: Samples | None, top: int, own: str = OWN) -> str:
    lines = [f"threads (sampled seconds at {run.rate:g} Hz):"]
    lines += [f"  {run.seconds(n):7.2f}  {label}" for label, n in run.threads.most_common()]
    g_run = groups(run, own)
    total = sum(g_run.values())
    imports = sum(n for k, n in g_run.items() if k.startswith("import "))
    lines.append(f"main thread: {run.seconds(total):.2f} s, of which imports {run.seconds(imports):.2f} s")
    if floor is None:
        lines.append(f"main thread by group, top {top}:")
        lines += [f"  {run.seconds(n):7.2f}  {k}" for k, n in g_run.most_common(top)]
        return "\n".join(lines)
    g_floor = groups(floor, own)
    f_total = sum(g_floor.values())
    f_imports = sum(n for k, n in g_floor.items() if k.startswith("import "))
    above = run.seconds(total) - floor.seconds(f_total)
    lines.append(f"floor main thread: {floor.seconds(f_total):.2f} s, of which imports "
                 f"{floor.seconds(f_imports):.2f} s; run above it {above:+.2f} s")
    diff = {k: run.seconds(g_run[k]) - floor.seconds(g_floor[k]) for k in set(g_run) | set(g_floor)}
    lines.append(f"main thread by group, run - floor (s), top {top} by size:")
    lines.append(f"  {'run':>7} {'floor':>7} {'excess':>7}  group")
    for k in sorted(diff, key=lambda k: (-abs(diff[k]), k))[:top]:  # ties by name: the same list every time
        lines.append(f"  {run.seconds(g_run[k]):7.2f} {floor.seconds(g_floor[k]):7.2f} {diff[k]:+7.2f}  {k}")
    return "\n".join(lines)


def under(s: Samples, text: str, top: int) -> str:
    """The ``--under`` view (module docstring) of one file."""
    leaves: Counter[str] = Counter()
    for frames, n in s.main.items():
        if any(text in f for f in frames):
            leaves[frames[-1]] += n
    lines = [f"main thread under {text!r}: {s.seconds(sum(leaves.values())):.2f} s, by innermost frame, top {top}:"]
    lines += [f"  {s.seconds(n):7.2f}  {leaf}" for leaf, n in leaves.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="py-spy raw output of the run (record --nonblocking --idle --threads --format raw)")
    ap.add_argument("--floor", help="py-spy raw output of the import floor, recorded alike")
    ap.add_argument("--rate", type=float, default=200.0, help="the --rate both were recorded at (default 200)")
    ap.add_argument("--top", type=int, default=25, help="how many groups to list (default 25)")
    ap.add_argument("--own", default=OWN, help=f"how the project's own files start in a frame (default {OWN})")
    ap.add_argument("--under", action="append", default=[], metavar="TEXT",
                    help="also list where the run's samples inside a frame containing TEXT sit, by innermost frame "
                         "(repeatable)")
    a = ap.parse_args()
    run = read(a.run, a.rate)
    print(report(run, read(a.floor, a.rate) if a.floor else None, a.top, a.own))
    for text in a.under:
        print(under(run, text, a.top))


if __name__ == "__main__":
    main()
