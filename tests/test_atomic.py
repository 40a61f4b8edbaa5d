"""Atomic writes leave no temporary file behind and give the file the mode an ordinary write would: 0666 less the
umask (0644 under the usual 022), not the 0600 of a temporary file, so reports are readable by others.

Run: ``pytest tests/test_atomic.py``
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_eval.common.atomic import atomic_write_text

WRITE = """
import os, sys
os.umask(int(sys.argv[2], 8))
from dflash_eval.common.atomic import atomic_write_text
atomic_write_text(__import__("pathlib").Path(sys.argv[1]), "x")
"""


@pytest.mark.parametrize(("umask", "mode"), [("022", 0o644), ("077", 0o600), ("002", 0o664)])
def test_written_file_honours_the_umask(tmp_path: Path, umask: str, mode: int) -> None:
    out = tmp_path / "sub" / "eval.json"
    subprocess.run([sys.executable, "-c", WRITE, str(out), umask], check=True, timeout=120)
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert [p.name for p in out.parent.iterdir()] == ["eval.json"]


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    from dflash_eval.common.atomic import atomic_write_with

    def broken(path: Path) -> None:
        path.write_text("half")
        raise RuntimeError("disk full")

    atomic_write_text(tmp_path / "eval.json", "old")
    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write_with(tmp_path / "eval.json", broken)
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"] and (tmp_path / "eval.json").read_text() == "old"


def test_a_write_that_is_not_durable_skips_only_the_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    atomic_write_text(tmp_path / "a.json", "durable")
    assert len(synced) == 1
    atomic_write_text(tmp_path / "b.json", "not durable", durable=False)
    assert len(synced) == 1 and (tmp_path / "b.json").read_text() == "not durable"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # renamed into place, no temp file
