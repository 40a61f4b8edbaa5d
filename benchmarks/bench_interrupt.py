"""Benchmark: how long an interrupted ``--sglang-launch`` run takes to stop its server and to exit after SIGINT.

Each round starts ``pytest tests_eval --completions sglang --sglang-launch <never-ready stand-in>`` on the bundled
fixtures (the protocol stand-in ``tests/sglang_standin.py``, NOT SGLang, which never becomes ready), waits until the
stand-in listens, sends SIGINT to pytest, and measures the time until the stand-in's process group is gone and until
pytest has exited. Rounds alternate between the plugin as it is and the plugin without its interrupt handler
(``-p no:dflash-eval-interrupt``: pytest's own traceback rendering and full garbage collections), so both sides see
the same machine. ``--load N`` runs N busy-looping processes beside it (a loaded machine).

Run (about 1-3 minutes per round on a loaded 2-core CPU)::

    .venv/bin/python benchmarks/bench_interrupt.py [--rounds 2] [--load 3]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dflash_eval.sglang.launch import group_members

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"plugin": [], "no handler": ["-p", "no:dflash-eval-interrupt"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_gone(pgid: int) -> bool:
    """No live (non-zombie) process is left in group ``pgid``."""
    return not group_members(pgid)


def one_round(work: Path, extra: list[str]) -> tuple[float, float]:
    """(seconds from SIGINT until the server group is gone, seconds until pytest exited)."""
    port = free_port()
    launch = shlex.join([sys.executable, "tests/sglang_standin.py", "--model-path", "fixtures/target", "--port",
                         str(port), "--mode", "never-ready"])
    argv = [sys.executable, "-m", "pytest", "tests_eval", "--completions", "sglang", "--prompts",
            "fixtures/prompts.jsonl", "--num-prompts", "3", "--tau-floor", "1.0", "--cache-dir", str(work / "cache"),
            "--report-dir", str(work / "reports"), "-k", "tau or reference_completion", "-p", "no:cacheprovider",
            "--torch-threads", "1", "-p", "no:xdist", "--sglang-launch", launch, "--sglang-url",
            f"http://127.0.0.1:{port}", "--sglang-timeout", "600", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_EVAL_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    log = work / "reports" / "sglang-server.log"
    log.unlink(missing_ok=True)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not (log.is_file() and "listening on" in log.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stand-in did not start (pytest rc {proc.returncode})")
            time.sleep(0.1)
        pid = int(log.read_text().split("pid=", 1)[1].split()[0].rstrip(","))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        gone = exited = None
        while gone is None or exited is None:
            now = time.monotonic() - t0
            if gone is None and group_gone(pid):
                gone = now
            if exited is None and proc.poll() is not None:
                exited = now
            if now > 600:
                raise RuntimeError("pytest did not exit within 600 s of SIGINT")
            time.sleep(0.02)
        return gone, exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds per variant (alternating)")
    p.add_argument("--load", type=int, default=0, help="busy-looping processes beside the runs")
    a = p.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    try:
        with tempfile.TemporaryDirectory(prefix="bench_interrupt_") as tmp:
            for r in range(a.rounds):
                for name, extra in VARIANTS.items():
                    gone, exited = one_round(Path(tmp) / name.replace(" ", "_"), extra)
                    results[name].append((gone, exited))
                    print(f"round {r + 1} {name:>10}: server gone {gone:6.2f} s, pytest exited {exited:6.2f} s "
                          "after SIGINT", flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    med = {n: (statistics.median(g for g, _ in v), statistics.median(e for _, e in v)) for n, v in results.items()}
    print(f"\nmedian over {a.rounds} rounds, {a.load} busy processes beside ({os.cpu_count()} CPUs):")
    for n, (g, e) in med.items():
        print(f"  {n:>10}: server gone {g:6.2f} s, pytest exited {e:6.2f} s")
    print(f"  exit time no handler / plugin = {med['no handler'][1] / med['plugin'][1]:.1f}x")


if __name__ == "__main__":
    main()
