"""Time to the first bad-input message, before and after the torch-free checks, side by side in one run.

"Before" is the source tree of ``--before`` (default: the last commit before :mod:`dflash_eval.options.preflight`),
taken out of git into a temporary folder (``git archive``: nothing in the working tree or the repository changes);
"after" is this working tree. Each case runs as a fresh interpreter with ``PYTHONPATH`` set to one tree's ``src/``
(the suite's modules copied in as ``dflash_eval/tests_eval``), from an empty temporary folder, alternating before
and after ``--repeat`` times; the medians of the time until the expected message appears on stderr and of the time
to exit are printed with the exit codes (they must be equal) and the load average. The cases: ``dflash-eval run
--dtype fp33``, plain ``pytest --pyargs dflash_eval.tests_eval --target-model missing``, ``dflash-eval gate`` with a
JSONL prompt file holding a bad line, and ``--prompts humaneval:0``.

Run: ``python benchmarks/bench_bad_input.py [--repeat 3] [--before REV]`` (from the repository, with the
environment's torch and transformers importable).
"""

from __future__ import annotations

import argparse
import io
import os
import selectors
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "b527096"  # the last commit before the torch-free checks (dflash_eval.options.preflight)
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"


def cases(work: Path) -> dict[str, tuple[list[str], int, str]]:
    """name -> (arguments after the interpreter, expected exit code, text the message contains)."""
    run = ["-m", "dflash_eval", "run", "-p", "no:cacheprovider", "--target-model", str(TARGET), "--drafter",
           str(DRAFTER)]
    return {
        "dflash-eval run --dtype fp33": ([*run, "--dtype", "fp33"], 4, "unknown dtype 'fp33'"),
        "pytest --pyargs ... --target-model missing": (
            ["-m", "pytest", "--pyargs", "dflash_eval.tests_eval", "-p", "no:cacheprovider", "--target-model=missing",
             f"--drafter={DRAFTER}"], 4, f"{work}/missing: not found"),
        "dflash-eval gate --prompts bad.jsonl": (
            ["-m", "dflash_eval", "gate", "--drafter", str(DRAFTER), "--target-model", str(TARGET), "--prompts",
             "bad.jsonl", "--quiet"], 2, "bad.jsonl:2: not valid JSON"),
        "dflash-eval run --prompts humaneval:0": ([*run, "--prompts", "humaneval:0"], 4, "the count must be >= 1"),
    }


def tree(rev: str | None, dest: Path) -> Path:
    """``src/`` of ``rev`` (a git revision; None: the working tree) with the suite's modules as its tests_eval."""
    out = dest / "src"
    if rev is None:
        shutil.copytree(ROOT / "src" / "dflash_eval", out / "dflash_eval",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "tests_eval", out / "dflash_eval" / "tests_eval",
                        ignore=shutil.ignore_patterns("__pycache__"))
        return out
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src/dflash_eval", "tests_eval"],
                          capture_output=True, check=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    shutil.move(str(dest / "tests_eval"), str(out / "dflash_eval" / "tests_eval"))
    return out


def measure(argv: list[str], src: Path, cwd: Path, needle: str) -> tuple[float, float, int, str]:
    """(seconds to the stderr line holding ``needle``, seconds to exit, exit code, that line)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}
    env["PYTHONPATH"] = str(src)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(p.stderr, selectors.EVENT_READ)
    t_msg, line, deadline = float("nan"), "", t0 + 600
    while time.perf_counter() < deadline:  # every wait has a timeout
        if not sel.select(timeout=max(0.0, deadline - time.perf_counter())):
            break
        got = p.stderr.readline()
        if not got:
            break
        if needle in got and not line:
            t_msg, line = time.perf_counter() - t0, got.strip()
    rc = p.wait(timeout=max(1.0, deadline - time.perf_counter()))
    return t_msg, time.perf_counter() - t0, rc, line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case and side (medians printed)")
    ap.add_argument("--before", default=BEFORE, help=f"git revision of the 'before' side (default {BEFORE})")
    ns = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        sides = {"before": tree(ns.before, tmp_path / "before"), "after": tree(None, tmp_path / "after")}
        work = tmp_path / "work"
        work.mkdir()
        (work / "bad.jsonl").write_text('{"id": "a", "category": "c", "text": "x"}\n{"id": "b", "text": \n')
        load = os.getloadavg()[0]
        results: dict[tuple[str, str], list[tuple[float, float, int, str]]] = {}
        for _ in range(ns.repeat):
            for name, (args, _, needle) in cases(work).items():
                for side, src in sides.items():
                    results.setdefault((name, side), []).append(measure(args, src, work, needle))
    print(f"time to the first bad-input message, median of {ns.repeat} runs each (s); before = {ns.before}, after = "
          f"this working tree; load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(f"  {'case':44s} {'exit':>9s} {'message before':>15s} {'after':>7s} {'exit before':>12s} {'after':>7s}")
    failed = False
    for name, (_, want, _) in cases(Path("/")).items():
        b, a = results[(name, "before")], results[(name, "after")]
        codes = f"{b[0][2]} / {a[0][2]}"
        med = [statistics.median(r[i] for r in rs) for rs in (b, a) for i in (0, 1)]
        print(f"  {name:44s} {codes:>9s} {med[0]:15.2f} {med[2]:7.2f} {med[1]:12.2f} {med[3]:7.2f}")
        failed |= any(r[2] != want for r in b + a)
    for name in cases(Path("/")):
        print(f"  {name}:\n    before: {results[(name, 'before')][0][3]}\n    after:  {results[(name, 'after')][0][3]}")
    if failed:
        print("an exit code differs from the expected one (4 under pytest, 2 for the gate)", file=sys.stderr)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
