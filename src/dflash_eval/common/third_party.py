"""The output of the libraries the suite runs on, handled alike in every dflash-eval command: transformers' log
warnings (the ``causal_conv1d`` fallback notes of a linear-attention target on a CPU) and progress bars (loading a
model's weights) are left out, as pytest's capture leaves them out of ``dflash-eval run``; a Python warning is one
line, ``<command>: warning: <message> (<category>)``, instead of a source line quoted under it (Python's own
choice of which warnings to show, and where, is kept).

:func:`quiet_libraries` sets the environment the libraries read when they are imported (an explicit setting of the
user's is kept) and, where transformers is imported already, its logging; :func:`one_line_warnings` is a context
for a command's own run.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

__all__ = ["QUIET_ENVIRONMENT", "quiet_libraries", "one_line_warnings"]

#: What the libraries read when they are imported: transformers' log level, Hugging Face's progress bars.
QUIET_ENVIRONMENT = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def quiet_libraries(environ: MutableMapping[str, str] | None = None) -> None:
    """transformers' log warnings and the weight-loading bars left out of this process's output (``environ``: the
    process's environment; a value the user set is kept)."""
    env = os.environ if environ is None else environ
    for key, value in QUIET_ENVIRONMENT.items():
        env.setdefault(key, value)
    if "transformers" in sys.modules and env is os.environ:  # imported already: its logging is set up
        from transformers.utils import logging as hf_logging  # imported already (no cost): set what it read

        if os.environ["TRANSFORMERS_VERBOSITY"] == "error":
            hf_logging.set_verbosity_error()
        if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
            hf_logging.disable_progress_bar()


@contextmanager
def one_line_warnings(command: str) -> Iterator[None]:
    """Within: a Python warning shown is one line, ``<command>: warning: <message> (<category>)``, instead of its
    source line quoted under it. Only how a warning reads changes: which are shown, and where, stays Python's (a
    caller recording them, as ``pytest.warns`` does, still records them)."""
    before = warnings.formatwarning

    def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 line: str | None = None) -> str:
        return f"{command}: warning: {message} ({category.__name__})\n"

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = before
