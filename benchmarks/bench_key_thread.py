"""Triton's installation key hashed beside the kernel probe's model build: alone, in a thread at CPython's default
switch interval, and in the thread the probe starts (:func:`dflash_eval.target.kernel_cache.hash_installation`,
switch interval shortened while it runs), side by side, each in a fresh process::

    python benchmarks/bench_key_thread.py                  # Triton's own key where Triton imports, else a stand-in
    python benchmarks/bench_key_thread.py --standin-mib 512 --repeat 5

The thread reads and hashes Triton's shared library a megabyte at a time, giving the interpreter lock back at each
step; while the main thread runs Python, each step's return waits for the main thread to let go of the lock, at most
one switch interval. Here the main thread builds the probe's model (``kernel_probe.probe_model`` on the bundled target)
over and over until the key's thread is done (alone: for ``--busy-s`` seconds, after the key). Printed per way,
medians over ``--repeat`` processes: the key's own seconds (what a caller with less to do beside it waits for) and
the main thread's builds per second (what the shorter interval costs it). Where Triton cannot be imported (a CPU
machine) the key is a stand-in, named so in the output: an ``lru_cache``'d function hashing a file of
``--standin-mib`` MiB of random bytes in 1 MiB chunks, as Triton's key hashes its library.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("alone", "thread, default interval", "thread, hash_installation")


def _key_function(standin: Path | None) -> tuple[Any, str]:
    """The memoised key function the child times, and what it is."""
    if standin is None:
        try:
            import triton.runtime.cache as cache

            return cache.triton_key, f"Triton {getattr(sys.modules.get('triton'), '__version__', '?')}'s triton_key"
        except ImportError:
            raise SystemExit("bench_key_thread.py: Triton does not import here; pass --standin-mib") from None

    @functools.lru_cache
    def triton_key() -> str:
        digest = hashlib.sha256()
        with standin.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    size = standin.stat().st_size >> 20
    return triton_key, f"stand-in: sha256 of {size} MiB in 1 MiB chunks"


def _child(way: str, standin: Path | None, busy_s: float) -> dict[str, Any]:
    import torch

    from dflash_eval.target import kernel_cache
    from dflash_eval.target.kernel_probe import probe_model
    from dflash_eval.target.loader import TargetDir

    original, what = _key_function(standin)
    span: dict[str, float] = {}

    @functools.lru_cache
    def timed_key() -> object:
        span["start"] = time.perf_counter()
        try:
            return original()
        finally:
            span["end"] = time.perf_counter()

    module = sys.modules.get("triton.runtime.cache") or ModuleType("triton.runtime.cache")
    module.triton_key = timed_key  # type: ignore[attr-defined]
    sys.modules["triton.runtime.cache"] = module
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = TargetDir(ROOT / "fixtures" / "target")
    probe_model(target, dtype, device)  # first build apart: its one-off imports are the same for every way

    def builds_while(busy: Any) -> tuple[int, float]:
        n, t = 0, time.perf_counter()
        while n == 0 or busy(time.perf_counter() - t):
            probe_model(target, dtype, device)
            n += 1
        if device == "cuda":
            torch.cuda.synchronize()
        return n, time.perf_counter() - t

    interval = sys.getswitchinterval()
    if way == "alone":
        timed_key()
        n, main_s = builds_while(lambda s: s < busy_s)
    else:
        if way == "thread, default interval":
            thread = threading.Thread(target=timed_key, daemon=True)
            thread.start()
        else:
            started = kernel_cache.hash_installation()
            assert started is not None, "hash_installation started no thread"
            thread = started
        n, main_s = builds_while(lambda s: thread.is_alive())
        thread.join()
    return {"way": way, "key": what, "device": device, "key_s": span["end"] - span["start"],
            "builds_per_s": n / main_s, "interval_ms": interval * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="processes per way (medians printed)")
    ap.add_argument("--busy-s", type=float, default=1.0,
                    help="seconds of probe model builds timed alone (beside the key they run until it is done)")
    ap.add_argument("--standin-mib", type=int, default=0,
                    help="hash a stand-in file of this many MiB instead of Triton's key (default: Triton's own key "
                         "where it imports, else 400)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--standin", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.standin, args.busy_s)))
        return 0
    mib = args.standin_mib
    if not mib:
        probe = subprocess.run([sys.executable, "-c", "import triton.runtime.cache"], capture_output=True)
        mib = 0 if probe.returncode == 0 else 400
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-key-") as tmp:
        standin = None
        if mib:
            standin = Path(tmp) / "libtriton.standin"
            with standin.open("wb") as f:
                for _ in range(mib):
                    f.write(os.urandom(1 << 20))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        for _ in range(args.repeat):
            for way in WAYS:  # interleaved, so a slow moment of the machine falls on every way
                cmd = [sys.executable, __file__, "--child", way, "--busy-s", str(args.busy_s)]
                if standin is not None:
                    cmd += ["--standin", str(standin)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                if out.returncode:
                    raise SystemExit(f"bench_key_thread.py: the child for {way!r} failed:\n{out.stderr[-3000:]}")
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"key: {rows[0]['key']}; device {rows[0]['device']}; default switch interval {rows[0]['interval_ms']:g} ms;"
          f" medians of {args.repeat} processes per way")
    print(f"{'way':28} {'key s':>8} {'probe model builds/s (main thread)':>36}")
    for way in WAYS:
        mine = [r for r in rows if r["way"] == way]
        print(f"{way:28} {statistics.median(r['key_s'] for r in mine):8.3f} "
              f"{statistics.median(r['builds_per_s'] for r in mine):36.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
