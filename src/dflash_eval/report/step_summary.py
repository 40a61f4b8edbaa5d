"""The CI step summary: a report's markdown (eval.md, gate.md) appended to the file that ``$GITHUB_STEP_SUMMARY``
names, when it is set (GitHub Actions shows the file on the run's page). Appended, not replaced: several reports of
one CI step each add theirs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["STEP_SUMMARY_ENV", "append_step_summary"]

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def append_step_summary(markdown: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append ``markdown`` and a blank line to the step summary file; returns its path (None when
    ``$GITHUB_STEP_SUMMARY`` is not set). ``environ``: the environment to read (default: this process's)."""
    name = (os.environ if environ is None else environ).get(STEP_SUMMARY_ENV)
    if not name:
        return None
    path = Path(name)
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(markdown + "\n")
    except OSError as exc:
        raise OSError(f"${STEP_SUMMARY_ENV} names {path}, which cannot be appended to ({exc.strerror or exc}); "
                      "unset it or point it at a writable file") from exc
    return path
