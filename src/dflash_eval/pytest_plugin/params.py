"""Parametrization helpers for the suite's test modules: test ids that keep ``-k tau`` exact, and errors met at
collection time turned into one failing test (instead of a collection error) whose message names the cause."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from dflash_eval.errors import DFlashEvalError
from dflash_eval.golden.node_ids import safe_id
from dflash_eval.pytest_plugin.state import get_session

if TYPE_CHECKING:
    from _pytest.mark.structures import ParameterSet

__all__ = ["SetupError", "setup_error_param", "safe_id", "collect", "prompt_ids"]


class SetupError:
    """Parametrize value standing for an error met while collecting (the test fails with it)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def fail(self) -> None:
        pytest.fail(f"{type(self.exc).__name__}: {self.exc}", pytrace=False)


def setup_error_param(exc: BaseException) -> ParameterSet:
    return pytest.param(SetupError(exc), id="setup-error")


def collect(config: pytest.Config, fn: Callable[[Any], Any]) -> tuple[Any, BaseException | None]:
    """Run ``fn(session)`` at collection; return (value, None) or (None, error)."""
    try:
        return fn(get_session(config)), None
    except (DFlashEvalError, OSError, ValueError) as exc:
        return None, exc


def prompt_ids(config: pytest.Config) -> list[Any]:
    """``pytest.param`` s of the run's prompt ids (test ids never containing "tau"), or one failing setup-error
    param: for ``metafunc.parametrize("prompt_id", prompt_ids(metafunc.config))`` in a test module of one's own."""
    ids, err = collect(config, lambda s: [p.id for p in s.inputs.prompts])
    return [setup_error_param(err)] if err else [pytest.param(i, id=safe_id(i)) for i in ids]
