"""Exception types of dflash-eval: each names the file, key, shape or URL at fault and the likely cause."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["json_problem", "DFlashEvalError", "ConfigError", "CheckpointError", "ArchitectureMismatch",
           "DrafterRefused", "BackendError", "CacheError", "EvalError", "PluginError", "ResultRejected", "StorageError",
           "ResultKeyError"]


class DFlashEvalError(Exception):
    """Base class of every error raised on purpose by dflash-eval."""


class ConfigError(DFlashEvalError, ValueError):
    """A config file or option is missing, malformed or inconsistent."""


class CheckpointError(DFlashEvalError):
    """A drafter checkpoint cannot be read or has the wrong keys."""


class ArchitectureMismatch(DFlashEvalError):
    """The drafter does not fit the target (shapes, layer ids, vocabulary)."""


class DrafterRefused(ArchitectureMismatch):
    """The drafter failed architecture checks and was not built; ``checks``: (name, message) of each failed one."""

    def __init__(self, message: str, checks: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.checks = list(checks)


class BackendError(DFlashEvalError):
    """A linear-attention backend was asked for where it cannot run."""


class CacheError(DFlashEvalError):
    """A cache entry is missing (with --cache-only), truncated or corrupted."""


class StorageError(DFlashEvalError, OSError):
    """A file or folder the run writes cannot be written: no space left, a quota, a read-only file system, no
    permission, a file where a folder should be. ``path``: the file or folder named; ``errno``: the operating system's
    error number (an ``OSError``, so code that catches those still does)."""

    def __init__(self, message: str, path: object, errno: int | None = None) -> None:
        super().__init__(errno, message)
        self.message, self.path = message, path

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[StorageError], tuple[str, object, int | None]]:
        return (type(self), (self.message, self.path, self.errno))


class EvalError(DFlashEvalError):
    """An evaluation input is unusable (empty completion, unreachable server, ...)."""


class ResultKeyError(EvalError):
    """A result's mapping has a key its row does not know (``problem`` ``unknown``) or lacks one it needs
    (``missing``), or a record's value is not a mapping at all (``not-object``; ``got``: what it is instead);
    ``key``: the key's path (dots between the keys, ``[i]`` for a list's item; empty: the record itself), ``source``:
    the file it was read from (None: not read from a file)."""

    def __init__(self, problem: str, key: str, source: str | None = None, got: str = "") -> None:
        self.problem, self.key, self.source, self.got = problem, key, source, got
        where = f"{source}: " if source else ""
        if problem == "not-object":
            text = f"{where}key {key!r} holds {got}, where an object is expected" if key else \
                f"{where}{got} where an object is expected"
        elif problem == "unknown":
            text = f"{where}unknown key {key!r} (not a key of this result's schema)"
        else:
            text = f"{where}missing key {key!r} (it is required)"
        super().__init__(text)

    def under(self, parent: str | int) -> ResultKeyError:
        """The same problem with the key's path under ``parent`` (a key, or a list's index)."""
        head = f"[{parent}]" if isinstance(parent, int) else str(parent)
        sep = "" if not self.key or self.key.startswith("[") else "."
        return ResultKeyError(self.problem, f"{head}{sep}{self.key}", self.source, self.got)

    def in_file(self, source: object) -> ResultKeyError:
        """The same problem, naming the file it was read from."""
        return ResultKeyError(self.problem, self.key, str(source), self.got)

    @classmethod
    def check(cls, data: Mapping[str, Any], keys: Collection[str], optional: Collection[str] = ()) -> None:
        """A record's mapping holds exactly ``keys``, less any of ``optional`` it leaves out: the first key it does not
        know (``unknown``), else the first one it lacks (``missing``), is the error. A record that reads itself from
        eval.json (a drift row, a prediction, a verdict) checks its keys with it before it reads them. A ``data``
        that is not a mapping (null, a number, a list) is the ``not-object`` problem."""
        if not isinstance(data, Mapping):
            raise cls("not-object", "", got=_json_kind(data))
        unknown = next((k for k in data if k not in keys), None)
        if unknown is not None:
            raise cls("unknown", str(unknown))
        missing = next((k for k in keys if k not in data and k not in optional), None)
        if missing is not None:
            raise cls("missing", missing)

    def __reduce__(self) -> tuple[type[ResultKeyError], tuple[str, str, str | None, str]]:
        return (type(self), (self.problem, self.key, self.source, self.got))


def _json_kind(value: object) -> str:
    """What a JSON value is, in words (an error's): null, a list, a string, a number, a boolean."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list | tuple) else f"a {type(value).__name__}"


class PluginError(DFlashEvalError):
    """A plugin's hook implementation did what its hook does not allow (e.g. changed an existing eval.json key)."""


class ResultRejected(DFlashEvalError):
    """A plugin's ``pytest_dflash_eval_result_ready`` rejected the result; ``plugin`` and ``reason``: who and why."""

    def __init__(self, plugin: str, reason: str) -> None:
        super().__init__(f"plugin {plugin!r} rejected the result: {reason}")
        self.plugin, self.reason = plugin, reason


def json_problem(exc: json.JSONDecodeError) -> str:
    """What is wrong with a JSON text, in words, without the position json puts in its message twice: ``Unterminated
    string starting at column 21`` (not ``... starting at at column 21``; the line is the caller's to name)."""
    return f"{exc.msg.removesuffix(' at')} at column {exc.colno}"
