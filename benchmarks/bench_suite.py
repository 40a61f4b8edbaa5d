"""Benchmark of the eval suite itself: a cold ``scripts/eval`` run and its time split, warm vs cold, -n 0 vs -n 2.

Runs ``pytest tests_eval`` (what ``scripts/eval`` runs; ``--k EXPR`` selects like ``pytest -k``) as subprocesses
on the bundled fixtures (or the paths given after ``--``):

1. cold: a fresh cache dir (completions generated, features extracted, every drafter simulation run);
2. warm: the same cache dir again (everything read from the cache);
3. unless ``--skip-xdist``: ``-n 0`` and ``-n 2``, each on a fresh cache, comparing verdicts and τ.

Prints wall times and pytest's own test time, the warm/cold ratio (with ``--warm-repeat``, also the import
floor: a fresh interpreter importing torch and the target's modeling code, measured between the warm runs, plainly
and as the suite imports them, with the garbage collector paused, and each side's warm wall time above each; on a
CUDA machine also the CUDA floor: the plain one, then CUDA started, one cuBLAS matmul and the exit with a context), the
cold run's time split from its reports/eval.json (target load, tokenization, reference generation, feature forwards,
drafting, the rest: pytest, imports, cache io), and whether -n 0 and -n 2 agree.

``--before DIR`` first runs the same cold suite from another checkout (its ``src`` and ``tests_eval``), for a
before/after ratio measured side by side; ``--warm-repeat N`` then alternates N warm runs of both (medians; without
``--before``, N warm runs of this code), each round followed by its floors, and after each round prints the rounds so
far paired: the median of now minus before, and of each side minus its own round's floor (a host whose speed drifts
between rounds moves both sides of a round alike).

Run::

    .venv/bin/python benchmarks/bench_suite.py --skip-xdist               # bundled fixtures, full suite
    mkdir /tmp/old && git archive OLD_COMMIT | tar -x -C /tmp/old
    .venv/bin/python benchmarks/bench_suite.py --skip-xdist --before /tmp/old --warm-repeat 3
    .venv/bin/python benchmarks/bench_suite.py --k tau --skip-xdist -- --target-model DIR --drafter DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Leaf stages of reports/eval.json timings (completions and features contain generation and target_forward).
STAGES = {"target load": "target_load", "tokenize prompts": "tokenize", "generation (target decode)": "generation",
          "feature forwards": "target_forward", "drafting (τ simulations)": "drafting",
          "drift budget (ladder sims)": "drift_budget"}


def run(args: list[str], cache: Path, report: Path, extra: list[str],
        tree: Path = ROOT) -> tuple[float, float | None, int, dict, str]:
    """(wall s, pytest's own seconds, exit code, eval.json, output tail) of one pytest run of ``tree``'s suite."""
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "--cache-dir", str(cache),
           "--report-dir", str(report), *args, *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's runs: modules compiled once, bytecode reused
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    data = json.loads((report / "eval.json").read_text()) if (report / "eval.json").is_file() else {}
    found = re.findall(r" in ([0-9.]+)s", p.stdout)
    return wall, float(found[-1]) if found else None, p.returncode, data, p.stdout[-3000:] + p.stderr[-2000:]


FLOOR_IMPORT = "import torch, transformers.models.qwen3_5.modeling_qwen3_5"
#: The same imports as the suite makes them (dflash_eval.common.heap): the garbage collector paused, the heap frozen.
FLOOR_IMPORT_PAUSED = f"import gc; gc.disable(); {FLOOR_IMPORT}; gc.freeze(); gc.enable()"
#: The plain floor, then what any process that computes on a card pays once: CUDA's start (driver, context), cuBLAS's
#: first matmul (its handle and kernels), the result read back, and the process's exit with a CUDA context.
FLOOR_CUDA = (f"{FLOOR_IMPORT}; x = torch.ones(256, 256, device='cuda', dtype=torch.bfloat16); "
              "float((x @ x).sum())")


def import_floor(code: str = FLOOR_IMPORT) -> float:
    """Wall seconds of a fresh interpreter that only imports torch and the target's modeling code: the part of a
    warm run no change to the suite can remove (the kernel probe runs the target's own modeling code). ``code``:
    :data:`FLOOR_IMPORT` (a plain interpreter) or :data:`FLOOR_IMPORT_PAUSED` (as the suite imports them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    return time.perf_counter() - t0


def has_cuda() -> bool:
    """Whether torch sees a CUDA device here (asked in a fresh interpreter: this process does not import torch)."""
    p = subprocess.run([sys.executable, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                       capture_output=True, text=True, timeout=600)
    return p.returncode == 0 and p.stdout.strip() == "1"


def outcomes(data: dict) -> dict[str, str]:
    return data.get("tests", {}).get("outcomes", {})


def split(data: dict, wall: float) -> str:
    s = data.get("timings", {}).get("sum", {})
    parts = {label: float(s.get(key, 0.0)) for label, key in STAGES.items()}
    rest = max(0.0, wall - sum(parts.values()))
    lines = [f"    {k:28s} {v:7.2f} s  ({100 * v / wall:4.1f} %)" for k, v in parts.items()]
    lines.append(f"    {'rest (pytest, imports, io)':28s} {rest:7.2f} s  ({100 * rest / wall:4.1f} %)")
    counts = data.get("counts", {})
    lines.append("    counts: " + json.dumps(counts.get("master", counts), sort_keys=True))
    return "\n".join(lines)


def paired(warm: dict[str, list[tuple[float, float]]], floors: list[float], cuda: list[float] | None = None) -> str:
    """The rounds so far, each side against the other (with a ``before`` side) and against the floor of its own round
    (medians of the per-round differences): a host whose speed drifts between rounds moves both sides of a pair
    alike, and a run cut short by a time limit still ends with a summary. ``cuda``: each round's :data:`FLOOR_CUDA`
    too (on a GPU)."""
    walls = {k: [w for w, _ in v] for k, v in warm.items()}
    sides = [k for k in ("before", "now") if k in walls]
    line = f"paired, {len(floors)} round(s): "
    if len(sides) == 2:
        diff = statistics.median(n - b for n, b in zip(walls["now"], walls["before"], strict=True))
        line += f"now - before wall, median {diff:+.2f} s; "
    line += "above the same round's plain floor, median: " + ", ".join(
        f"{k} {statistics.median(w - f for w, f in zip(walls[k], floors, strict=True)):.2f} s" for k in sides)
    if cuda:
        start = statistics.median(c - f for c, f in zip(cuda, floors, strict=True))
        line += (f"; CUDA floor above the plain one, median {start:.2f} s; above the CUDA floor, median: " + ", ".join(
            f"{k} {statistics.median(w - c for w, c in zip(walls[k], cuda, strict=True)):.2f} s" for k in sides))
    return line


def load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cpus"
    except OSError:
        return "load average unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default=None, help="pytest -k expression (default: the whole suite, as scripts/eval)")
    ap.add_argument("--skip-xdist", action="store_true", help="only the cold/warm comparison")
    ap.add_argument("--before", type=Path, default=None, help="a checkout of earlier code (e.g. git archive of an "
                                                              "older commit): its cold run goes first, for a ratio")
    ap.add_argument("--warm-repeat", type=int, default=0, help="this many warm runs of this code (with --before: "
                                                                 "alternating with the earlier code's), each round "
                                                                 "with its floors (medians printed)")
    ap.add_argument("extra", nargs="*", help="extra pytest arguments (after --)")
    a = ap.parse_args(argv)
    sel = ["-k", a.k] if a.k else []
    what = f"-k {a.k}" if a.k else "(all, as scripts/eval)"
    tmp = Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    print(f"work dir {tmp}; {load()}")
    if a.before:
        wall_b, test_b, rc_b, data_b, _ = run(sel, tmp / "cache-before", tmp / "before", a.extra, a.before.resolve())
        print(f"cold  pytest tests_eval {what} of {a.before}: wall {wall_b:7.2f} s, pytest {test_b} s, rc={rc_b}; "
              f"{load()}")
        print(split(data_b, wall_b))
    wall_c, test_c, rc_c, data_c, out_c = run(sel, tmp / "cache", tmp / "cold", a.extra)
    print(f"cold  pytest tests_eval {what}: wall {wall_c:7.2f} s, pytest {test_c} s, rc={rc_c}; {load()}")
    print(split(data_c, wall_c))
    if a.before:
        same = {p: r["accept_lengths"] for p, r in data_b.get("prompts", {}).items()} == \
            {p: r["accept_lengths"] for p, r in data_c.get("prompts", {}).items()}
        print(f"before / now (cold wall) = {wall_b / wall_c:.2f}x; same outcomes "
              f"{outcomes(data_b) == outcomes(data_c)}, same acceptance lengths {same}")
    wall_w, test_w, rc_w, data_w, _ = run(sel, tmp / "cache", tmp / "warm", a.extra)
    print(f"warm  pytest tests_eval {what}: wall {wall_w:7.2f} s, pytest {test_w} s, rc={rc_w}")
    print(f"cold / warm = {wall_c / wall_w:.1f}x; same verdicts: {outcomes(data_c) == outcomes(data_w)} "
          f"({len(outcomes(data_c))} tests, {sum(v == 'passed' for v in outcomes(data_c).values())} passed)")
    ok = outcomes(data_c) == outcomes(data_w) and rc_c == rc_w
    if a.warm_repeat > 0:
        sides = ([("before", a.before.resolve(), tmp / "cache-before")] if a.before else []) + \
            [("now", ROOT, tmp / "cache")]
        warm: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in sides}
        floors, paused, cuda = [], [], []
        on_card = has_cuda()
        for i in range(a.warm_repeat):  # alternating, each on the cache its own cold run filled
            for label, tree, cache in sides:
                w, t, rc, _, _ = run(sel, cache, tmp / f"warm-{label}-{i}", a.extra, tree)
                warm[label].append((w, float("nan") if t is None else t))
                print(f"warm  {label:6s} round {i + 1}: wall {w:7.2f} s, pytest {t} s, rc={rc}")
            floors.append(import_floor())
            print(f"import floor round {i + 1}: {floors[-1]:.2f} s (python -c {FLOOR_IMPORT!r})")
            paused.append(import_floor(FLOOR_IMPORT_PAUSED))
            print(f"import floor, collector paused, round {i + 1}: {paused[-1]:.2f} s")
            if on_card:
                cuda.append(import_floor(FLOOR_CUDA))
                print(f"CUDA floor round {i + 1}: {cuda[-1]:.2f} s (the plain floor, a bf16 matmul on the card, "
                      "its result read back)")
            print(paired(warm, floors, cuda))
        med = {k: (statistics.median(w for w, _ in v), statistics.median(t for _, t in v)) for k, v in warm.items()}
        print(f"warm  median of {a.warm_repeat}: " + " | ".join(
            f"{k} wall {m[0]:.2f} s, pytest {m[1]:.2f} s" for k, m in med.items()) + f"; {load()}")
        for name, values in (("import floor", floors),
                             ("import floor with the collector paused (the suite's own imports)", paused),
                             ("CUDA floor", cuda)):
            if values:
                floor = statistics.median(values)
                print(f"{name} median {floor:.2f} s; warm wall above it: " + ", ".join(
                    f"{k} {m[0] - floor:.2f} s" for k, m in med.items()))
    if not a.skip_xdist:
        w0, _, r0, d0, _ = run(["-n", "0", *sel], tmp / "cache-n0", tmp / "n0", a.extra)
        w2, _, r2, d2, _ = run(["-n", "2", *sel], tmp / "cache-n2", tmp / "n2", a.extra)
        same = outcomes(d0) == outcomes(d2) and r0 == r2
        taus0 = {p: r["tau"] for p, r in d0.get("prompts", {}).items()}
        taus2 = {p: r["tau"] for p, r in d2.get("prompts", {}).items()}
        print(f"cold -n 0: {w0:7.2f} s rc={r0} | cold -n 2: {w2:7.2f} s rc={r2} | ratio {w0 / w2:.2f}x")
        print(f"-n 0 vs -n 2: same verdicts {same}, same τ {taus0 == taus2}")
        ok = ok and same
    if rc_c not in (0, 1):
        print(out_c)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
