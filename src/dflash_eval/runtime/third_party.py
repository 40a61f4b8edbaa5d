"""The output of the libraries the suite runs on, handled alike in every dflash-eval command: transformers' log
warnings (the ``causal_conv1d`` fallback notes of a linear-attention target on a CPU) and progress bars (loading a
model's weights) are left out, as pytest's capture leaves them out of ``dflash-eval run``; a Python warning is one
line, ``<command>: warning: <message> (<category>)``, instead of a source line quoted under it.

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
from typing import TextIO

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
def one_line_warnings(command: str, stream: TextIO | None = None) -> Iterator[None]:
    """Within: a Python warning is one line on ``stream`` (default stderr), ``<command>: warning: <message>
    (<category>)``, each once."""
    out = sys.stderr if stream is None else stream
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # each once per place, as Python's default

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
            print(f"{command}: warning: {message} ({category.__name__})", file=out, flush=True)

        warnings.showwarning = show
        yield
