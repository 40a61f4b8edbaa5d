"""torch is not a hard dependency of the package (installing it must never pull a CPU or CUDA build the user did
not choose); this module turns its absence into one clear error naming how to install it."""

from __future__ import annotations

import importlib.util

from dflash_eval.errors import ConfigError

__all__ = ["require_torch", "TORCH_HINT"]

TORCH_HINT = ("install the torch build for this machine first: CPU `pip install torch --index-url "
              "https://download.pytorch.org/whl/cpu`, CUDA `pip install torch --index-url "
              "https://download.pytorch.org/whl/cu128` (or `pip install 'dflash-eval[torch]'` for pip's default "
              "build)")


def require_torch() -> None:
    """Raise ConfigError when torch is not importable (before any work)."""
    if importlib.util.find_spec("torch") is None:
        raise ConfigError("torch is not installed: " + TORCH_HINT)
