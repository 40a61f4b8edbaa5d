"""Exception types of dflash-eval: each names the file, key, shape or URL at fault and the likely cause."""

from __future__ import annotations

__all__ = ["DFlashEvalError", "ConfigError", "CheckpointError", "ArchitectureMismatch", "BackendError", "CacheError", "EvalError"]


class DFlashEvalError(Exception):
    """Base class of every error raised on purpose by dflash-eval."""


class ConfigError(DFlashEvalError, ValueError):
    """A config file or option is missing, malformed or inconsistent."""


class CheckpointError(DFlashEvalError):
    """A drafter checkpoint cannot be read or has the wrong keys."""


class ArchitectureMismatch(DFlashEvalError):
    """The drafter does not fit the target (shapes, layer ids, vocabulary)."""


class BackendError(DFlashEvalError):
    """A linear-attention backend was asked for where it cannot run."""


class CacheError(DFlashEvalError):
    """A cache entry is missing (with --cache-only), truncated or corrupted."""


class EvalError(DFlashEvalError):
    """An evaluation input is unusable (empty completion, unreachable server, ...)."""
