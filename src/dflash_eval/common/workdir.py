"""Where a run happened: the host name and, when the working directory is inside a git repository, its commit and
whether tracked files differ from it (eval.json ``provenance.host`` and ``provenance.git``).

``git`` runs as a subprocess with a timeout and ``GIT_OPTIONAL_LOCKS=0`` (``git status`` then takes no index lock,
so a run never blocks a commit made at the same time). No git, a folder outside any repository, a repository without
a commit or a git that does not answer in time: no ``git`` block (or ``dirty`` None), never a failed run.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["GIT_TIMEOUT_S", "git_state", "host_name", "run_location"]

#: Seconds one git command may take (``git status`` on a very large tree can be slow: then ``dirty`` is None).
GIT_TIMEOUT_S = 5.0


def _git(folder: Path, *args: str) -> str | None:
    """stdout of ``git -C folder args`` (stripped), None when git is missing, fails or times out."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(folder: Path) -> dict[str, Any] | None:
    """``{"commit", "dirty", "root"}`` of the git repository holding ``folder`` (None when it is in none, or its
    HEAD has no commit). ``dirty``: tracked files differ from the commit (untracked files do not count); None when
    git status could not tell."""
    root = _git(folder, "rev-parse", "--show-toplevel")
    commit = _git(folder, "rev-parse", "--verify", "--quiet", "HEAD") if root else None
    if not root or not commit:
        return None
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status), "root": str(Path(root).resolve())}


def host_name() -> str:
    """This machine's host name."""
    return socket.gethostname()


def run_location(folder: Path | None = None) -> dict[str, Any]:
    """``{"host", "git"?}`` for eval.json's provenance: the host, and the git state of ``folder`` (default: the
    current directory) when it is in a repository."""
    out: dict[str, Any] = {"host": host_name()}
    git = git_state(Path(folder if folder is not None else Path.cwd()).resolve())
    if git is not None:
        out["git"] = git
    return out
