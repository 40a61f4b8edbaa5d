"""Normalised paths for what a run records and prints (option values, eval.json, eval.md, the terminal).

``/work/firstgate/../myrepo/ckpt/step_a.pt`` becomes ``/work/myrepo/ckpt/step_a.pt``. Only the part up to the last
``..`` is resolved against the file system (as the operating system does when it opens the path: a ``..`` after a
symbolic link leaves the link's target); the rest keeps its names, so a model folder that is a symbolic link keeps
its own name (golden snapshots are filed under the target folder's name).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["normal_path"]


def normal_path(path: str | os.PathLike[str]) -> Path:
    """``path`` without ``..`` components where it is absolute (a relative path is only tidied: its leading ``..``
    cannot be resolved without a base)."""
    p = Path(path)
    if not p.is_absolute() or ".." not in p.parts:
        return p
    last = max(i for i, part in enumerate(p.parts) if part == "..")
    head = Path(*p.parts[:last + 1])
    try:
        head = head.resolve()
    except (OSError, RuntimeError):  # a symbolic-link loop, an unreadable folder: the lexical answer
        head = Path(os.path.normpath(head))
    return head.joinpath(*p.parts[last + 1:])
