"""The cyclic garbage collector around the suite's heavy imports: paused while torch, transformers and the target's
modeling code are imported, and, in a process that ends with its run, the heap they made frozen afterwards.

Importing torch and a transformers modeling module makes a few hundred thousand objects that live as long as the
process. CPython's cyclic collector walks every object it tracks at each full collection: several times during the
import itself (each time the tracked heap grew by a quarter) and again at each full collection while the run goes on.
On a 2-core machine that is about a third of the import's own time (docs/benchmarks.md, "The garbage collector
around the imports").

:func:`importing` pauses the collector for a block that imports (its objects are not garbage: collecting while they
are made finds nothing), and, where :func:`own_process` was declared (a process that ends with the suite's run:
``pytest``, an xdist worker, the ``dflash-eval`` command) and the block imported modules, moves everything the
process holds to the collector's permanent generation afterwards (:func:`gc.freeze`), so later collections walk only
what the run makes after it. Frozen objects are still freed by their reference counts; only a reference cycle among
them is never collected. So the heap is frozen only where modules were just imported (early in the run, when it
holds little else), and a program that goes on after the suite (a training loop calling
:class:`~dflash_eval.Evaluator`, a test session running the suite inside it) never declares it: there the collector
is only paused.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["importing", "own_process", "owned", "started_as", "freeze_at_exit", "freezes_at_exit", "COMMAND_ENTRIES"]

_OWNED = False

#: How the ``dflash-eval`` command starts a process: ``python -m dflash_eval`` or its console script.
COMMAND_ENTRIES = ("dflash_eval.__main__", "dflash-eval")


_FREEZE_AT_EXIT = False


def freeze_at_exit() -> None:
    """At the interpreter's exit, move every object to the collector's permanent generation first: its shutdown then
    runs its full collections over what is not frozen only (about 1 s of a suite run's exit on the bundled fixtures,
    0.4 s frozen; only cycles left at exit go uncollected, which the interpreter never promises). Registered once."""
    global _FREEZE_AT_EXIT
    if not _FREEZE_AT_EXIT:
        _FREEZE_AT_EXIT = True
        atexit.register(gc.freeze)


def freezes_at_exit() -> bool:
    """Whether :func:`freeze_at_exit` was registered in this process."""
    return _FREEZE_AT_EXIT


def own_process() -> None:
    """Declare that this process ends with the run it started: :func:`importing` freezes the heap after each block
    that imported, and the interpreter's exit finds it frozen (:func:`freeze_at_exit`)."""
    global _OWNED
    _OWNED = True
    freeze_at_exit()


def started_as(*entries: str) -> bool:
    """Whether the process was started as one of ``entries``: a module run with ``python -m`` (``pytest.__main__``)
    or a script's file name (``pytest``, ``dflash-eval``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    entry = spec.name if spec is not None else Path(getattr(main, "__file__", "") or "").name
    return entry in entries


def owned() -> bool:
    """Whether :func:`own_process` was declared in this process."""
    return _OWNED


@contextmanager
def importing() -> Iterator[None]:
    """The collector paused for the block (restored as it was after it, also after an error), the heap frozen after
    it in an owned process when the block imported modules (module docstring). Nested blocks pause once; the
    outermost one restores."""
    was_enabled = gc.isenabled()
    modules = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if _OWNED and len(sys.modules) > modules:
            gc.freeze()
        if was_enabled:
            gc.enable()
