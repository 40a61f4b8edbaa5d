"""Compiled GPU kernels as part of the run's cache, and their compilation timed apart from the work.

On a CUDA machine the target's Gated DeltaNet layers run fla's Triton kernels. Triton compiles each kernel
specialisation on first use and keeps the binary in its cache folder; fla's kernels are autotuned (Triton times
every candidate configuration and keeps the fastest), and with Triton >= 3.4 fla keeps the tuning results in that
folder too (``cache_results``). A process that finds both there compiles and tunes nothing; a fresh CI runner, whose
home folder is empty, pays for all of it (about 50 s for the suite on an H200) and, worse, tunes by timing: its
kernel configurations, and so the bits of a bf16 forward, are those this machine's timings picked.

So, unless the user set ``TRITON_CACHE_DIR``, :func:`use_kernel_cache` points Triton's cache at
``<--cache-dir>/triton`` (:data:`SUBDIR`): a CI job that restores its cache folder restores the compiled kernels and
the configurations the cached features were made with. Under ``--cache-only`` a cache folder that cannot be written
leaves Triton's own default in place (compiling into a read-only folder would fail the run), and says so.

:func:`watch_compilation` listens to Triton's compilations (its public ``triton.knobs.compilation.listener``, chained
with any listener already set) once fla's kernels are first used (:func:`dflash_eval.target.backends.use_backend`),
and hands each one's seconds (and whether it came from the cache) to every registered sink: the run's
:class:`~dflash_eval.common.progress.Meter` attributes them to the stage that was running, so eval.json's timings
show compilation apart from the work. Autotuning's timing runs of each candidate are not compilation and stay in the
stage's own time.

Every kernel Triton looks up, in memory or in its cache folder, is keyed by a hash of Triton's own installation
(``triton.runtime.cache.triton_key``: its compiler sources and its whole ``libtriton`` shared library, 416 MB in
Triton 3.6), computed once per process at the first lookup: on an H100 host about 0.5 s, which a warm run would
spend inside the kernel probe's first fla call. Reading and hashing a file release the interpreter lock, so the
kernel probe computes it in a thread (:func:`hash_installation`) while the main thread imports the target's
modeling code and builds the probe's model, and waits for it before its first kernel: the value is Triton's own,
only when it is computed moves. Two things keep the thread from slowing either side:

- The main thread imports Triton itself, first (``import_triton``; the modeling code imports fla's kernels and with
  them Triton, so nothing is imported that would not be): the thread only hashes. When the thread imported Triton
  while the main thread imported the modeling code, that import took longer by more than the hashing had cost
  (transformers' module scan, ``fetch__all__``, sampled on an H100: 1.31 s against 0.55 s in the recording before;
  one recording each): two threads of Python work share one interpreter lock.
- While the thread runs, the process's switch interval is :data:`SWITCH_INTERVAL_S` (``sys.setswitchinterval``; the
  thread puts the previous one back as it ends). The thread gives the lock back at every megabyte it reads or
  hashes, and takes it again only when the main thread, busy in Python, lets go of it: at CPython's default of 5 ms
  a wait per megabyte, which on an H100 host made the thread take 0.95 s against 0.53 s alone, and 0.62 s at the
  shorter interval (``benchmarks/bench_key_thread.py``).

With both, a warm run sampled on an H100 no longer waits for the thread (1.2 s before; docs/benchmarks.md, "The warm
run on a GPU against its import floor").

The thread lives inside that one call (a test phase of the suite): Triton's key walks its own packages, importing
those not imported yet, and no thread but the main one may import while pytest moves between test phases.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.common.heap import importing

__all__ = ["ENV", "SUBDIR", "KernelCacheDir", "use_kernel_cache", "watch_compilation", "add_sink",
           "compilation_event", "hash_installation", "KEY_WAIT_S", "SWITCH_INTERVAL_S"]

#: The variable through which Triton (and every process started from this one) finds its cache folder.
ENV = "TRITON_CACHE_DIR"
#: Triton's cache folder under ``--cache-dir``.
SUBDIR = "triton"

_lock = threading.Lock()
_set_by_us: str | None = None  # the value this process gave ENV (another run in the process may move it)
_sinks: list[weakref.WeakMethod[Callable[[float, bool], None]]] = []
_watching = False
_key_thread: threading.Thread | None = None
#: The longest the kernel probe waits for :func:`hash_installation`'s thread (seconds); past it the first kernel
#: lookup computes the key itself, as it would without the thread.
KEY_WAIT_S = 60.0
#: The interpreter's switch interval (seconds) while :func:`hash_installation`'s thread runs (module docstring): the
#: longest the thread waits for the interpreter lock after each chunk it read or hashed.
SWITCH_INTERVAL_S = 2e-4


@dataclass(frozen=True)
class KernelCacheDir:
    """Where Triton keeps compiled kernels (and fla's tuning results) in this run, and why there: ``source`` is
    ``--cache-dir``, ``TRITON_CACHE_DIR`` (the user's) or ``triton default`` (``why``: the cache folder cannot be
    written)."""

    path: Path | None
    source: str
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": None if self.path is None else str(self.path), "source": self.source,
                **({"why": self.why} if self.why else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelCacheDir:
        path = data.get("path")
        return cls(None if path is None else Path(path), str(data.get("source", "")), str(data.get("why", "")))


def use_kernel_cache(cache_root: Path, problem: Callable[[Path], str | None] | None = None) -> KernelCacheDir:
    """Point Triton's cache folder at ``<cache_root>/triton`` unless the user set ``TRITON_CACHE_DIR`` (module
    docstring). ``problem``: why a folder cannot be written (None: it can); given, an unwritable folder leaves
    Triton's default in place."""
    global _set_by_us
    with _lock:
        env = os.environ.get(ENV)
        if env and env != _set_by_us:
            return KernelCacheDir(Path(env), ENV)
        path = Path(cache_root) / SUBDIR
        why = problem(path) if problem is not None else None
        if why is not None:
            if env == _set_by_us and env is not None:  # an earlier run of this process set it: not ours to keep
                del os.environ[ENV]
                _set_by_us = None
            return KernelCacheDir(None, "triton default", f"{path}: {why}")
        os.environ[ENV] = _set_by_us = str(path)
        return KernelCacheDir(path, "--cache-dir")


def add_sink(sink: Callable[[float, bool], None]) -> None:
    """Have ``sink(seconds, cache_hit)`` called for every Triton compilation of this process from now on (a bound
    method, held weakly: a finished run's meter stops receiving)."""
    with _lock:
        _sinks.append(weakref.WeakMethod(sink))  # bound methods only


def compilation_event(seconds: float, cache_hit: bool) -> None:
    """One compilation (``cache_hit``: loaded from the cache folder instead) handed to every live sink."""
    with _lock:
        live = [s for ref in _sinks if (s := ref()) is not None]
        _sinks[:] = [weakref.WeakMethod(s) for s in live]
    for sink in live:
        sink(seconds, cache_hit)


def hash_installation(import_triton: bool = False) -> threading.Thread | None:
    """Start computing Triton's installation key in a thread (module docstring), once per process, and return the
    thread for the caller to join (for at most :data:`KEY_WAIT_S`) before its first kernel. ``import_triton``: import
    Triton's cache module first, in the calling thread, where Triton is installed (the caller is about to import
    code that imports Triton; else nothing is imported here). Only where Triton is imported and its key is memoised
    (``functools.lru_cache``: the thread's result is the one every later lookup reads); None where nothing was
    started. Until the thread ends the switch interval is at most :data:`SWITCH_INTERVAL_S`."""
    global _key_thread
    if import_triton and "triton.runtime.cache" not in sys.modules:
        try:
            with importing():
                import triton.runtime.cache  # noqa: F401 - read from sys.modules below
        except ImportError:
            return None
    key = getattr(sys.modules.get("triton.runtime.cache"), "triton_key", None)
    if key is None or not hasattr(key, "cache_info"):
        return None
    with _lock:
        if _key_thread is not None:
            return None
        previous = sys.getswitchinterval()
        if previous > SWITCH_INTERVAL_S:  # (setting a value back may round it: the interpreter keeps microseconds)
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        shortened = sys.getswitchinterval()
        _key_thread = threading.Thread(target=_compute_key, args=(key, previous, shortened), name="triton-key",
                                       daemon=True)
        try:
            _key_thread.start()
        except BaseException:
            sys.setswitchinterval(previous)
            raise
        return _key_thread


def _compute_key(key: Callable[[], object], previous: float, shortened: float) -> None:
    try:
        key()
    except Exception:  # noqa: BLE001 - not memoised then: the first kernel lookup computes it and raises it there
        pass
    finally:
        if shortened != previous and sys.getswitchinterval() == shortened:  # shortened here, and not set since
            sys.setswitchinterval(previous)


def watch_compilation() -> bool:
    """Listen to Triton's compilations (once per process; module docstring). False where Triton is not installed or
    has no compilation listener (Triton < 3.4)."""
    global _watching
    with _lock:
        if _watching:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        compilation = getattr(knobs, "compilation", None)
        if compilation is None or not hasattr(compilation, "listener"):
            return False
        previous = compilation.listener

        def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
            if previous is not None:
                previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)
            compilation_event(float(getattr(times, "total", 0)) / 1e6, bool(cache_hit))  # microseconds

        compilation.listener = listener
        _watching = True
        return True
