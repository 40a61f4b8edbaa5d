"""A write the file system refused stops the run at the first test it fails (one cause, one failure).

The cache, the reports and the golden records are written through :mod:`dflash_eval.common.atomic` and
:class:`dflash_eval.cache.store.Cache`, which raise one :class:`~dflash_eval.errors.StorageError` naming the file or
the cache entry's folder and the cause (no space left, a quota, a read-only file system, no permission). Every later
write would fail the same way, so instead of one error per remaining test the run stops: the test that met it fails
with the message, ``session.shouldfail`` names the cause once at the end and the exit status is non-zero (1; under
pytest-xdist each worker stops at its first such failure and the controller reports the first worker's cause as the
run's interruption, exit 2). A raw ``OSError`` whose errno says the file system is full or read-only
(:data:`~dflash_eval.common.paths.FULL_ERRNOS`) from code that does not name its path stops the run the same way.

The failure is found on the test's exception, through the exceptions it was raised from (the suite's fixtures turn a
:class:`~dflash_eval.errors.DFlashEvalError` into a plain failure raised while handling it), or on a parameter that
stands for an error met at collection (:class:`~dflash_eval.pytest_plugin.params.SetupError`).
"""

from __future__ import annotations

import pytest

from dflash_eval.common.paths import FULL_ERRNOS
from dflash_eval.errors import StorageError
from dflash_eval.pytest_plugin.params import SetupError

__all__ = ["storage_failure", "stop_at_storage_failure"]


def _chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, each once."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return out


def storage_failure(exc: BaseException | None, item: pytest.Item | None = None) -> str | None:
    """The storage failure behind ``exc`` (or behind a collection-time error ``item`` is parametrized with), as the
    run's one line, or None."""
    found = _chain(exc)
    params = getattr(getattr(item, "callspec", None), "params", {}) if item is not None else {}
    for value in params.values():
        if isinstance(value, SetupError):
            found += _chain(value.exc)
    for e in found:
        if isinstance(e, StorageError):
            return str(e)
    for e in found:
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return f"{type(e).__name__}: {e}"
    return None


def stop_at_storage_failure(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Stop the session after ``item`` when its phase failed on a refused write (the first cause is kept)."""
    if call.excinfo is None or item.session.shouldfail:
        return
    cause = storage_failure(call.excinfo.value, item)
    if cause is not None:
        item.session.shouldfail = (f"dflash-eval: stopped at the first write the file system refused: {cause} "
                                   "(every later write would fail the same way)")
