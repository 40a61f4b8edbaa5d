"""How long ``--help`` takes for both entry points, measured side by side with the costs it must not pay.

Each command runs ``--repeat`` times (alternating, from an empty temporary folder) and the median wall time is
printed, with ``import torch`` and pytest's own ``--help`` (plugin disabled) as references. The plugin's options
are registered without importing torch, so ``pytest --help`` costs about what pytest alone costs.

Run: ``python benchmarks/bench_help.py [--repeat 7]`` (with the package importable: installed, or
``PYTHONPATH=src``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

PLUGIN = "dflash_eval.pytest_plugin"
COMMANDS = {
    "pytest --help (plugin loaded)": [sys.executable, "-m", "pytest", "-p", PLUGIN, "--help"],
    "pytest --help (plugin disabled)": [sys.executable, "-m", "pytest", "-p", f"no:{PLUGIN}", "--help"],
    "dflash-eval --help": [sys.executable, "-m", "dflash_eval", "--help"],
    "dflash-eval gate --help": [sys.executable, "-m", "dflash_eval", "gate", "--help"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs per command (median reported)")
    ns = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(ns.repeat):
            for name, cmd in COMMANDS.items():
                t0 = time.perf_counter()
                p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=300)
                times[name].append(time.perf_counter() - t0)
                if p.returncode != 0:
                    raise SystemExit(f"{name}: exit {p.returncode}: {p.stderr.decode()[-2000:]}")
    base = statistics.median(times["pytest --help (plugin disabled)"])
    torch_s = statistics.median(times["python -c 'import torch'"])
    print(f"median of {ns.repeat} runs (s); load average {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:34s} {m:6.2f}   x{m / base:4.2f} pytest alone   x{m / torch_s:4.2f} import torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
