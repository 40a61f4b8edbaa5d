"""torch's CPU thread count for a run, set once per process by the entry point (the pytest plugin when it makes
the process's session, ``dflash-eval gate``), never by a stage.

``--torch-threads``, else torch's own default (one per physical core) shared among the pytest-xdist workers. Shared
on a GPU run too: its CPU work (features read back from the cache and perturbed for the drift budget, drift
statistics) would otherwise run with one thread per core in every worker, twice as many threads as cores under
``-n 2``. The measured effect on the bundled fixtures is in docs/benchmarks.md.
"""

from __future__ import annotations

import torch

__all__ = ["set_torch_threads"]

_DEFAULT_THREADS: int | None = None


def _default_threads() -> int:
    """torch's intra-op thread count before this process first changed it (one per physical core)."""
    global _DEFAULT_THREADS
    if _DEFAULT_THREADS is None:
        _DEFAULT_THREADS = max(1, torch.get_num_threads())
    return _DEFAULT_THREADS


def set_torch_threads(torch_threads: int | None, worker_count: int) -> int:
    """Set torch's intra-op threads for this process (``torch_threads``, the ``--torch-threads`` value, else the
    default divided among ``worker_count`` workers, at least 1); returns the count."""
    n = torch_threads or max(1, _default_threads() // max(1, worker_count))
    torch.set_num_threads(n)
    return n
