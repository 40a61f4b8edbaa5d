"""The plugin's interrupt handler: on Ctrl-C pytest's exit work is cut (the interrupt's traceback shortened to the
entry pytest reports, unless --full-trace; the heap frozen so that the exit's full garbage collections walk only new
objects). Each case runs pytest in a subprocess on a test that raises KeyboardInterrupt; a conftest hook running
after the plugin's reports what pytest's terminal reporter is left to render.

Timings are measured by ``benchmarks/bench_interrupt.py``, not here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = '''
import gc
import pytest

pytest_plugins = ["dflash_eval.pytest_plugin"]

@pytest.hookimpl(trylast=True)
def pytest_keyboard_interrupt(excinfo):
    print(f"\\nPROBE traceback entries={len(excinfo.traceback)} frozen={gc.get_freeze_count()}")
'''

TEST = '''
def helper(depth):
    if depth == 0:
        raise KeyboardInterrupt("stop")
    helper(depth - 1)

def test_interrupted():
    helper(5)
'''


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text(TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_EVAL_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "pytest", "test_it.py", "-p", "no:cacheprovider", "-s", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


def probe(out: str) -> tuple[int, int]:
    line = next(x for x in out.splitlines() if x.startswith("PROBE"))
    fields = dict(part.split("=") for part in line.split()[2:])
    return int(fields["entries"]), int(fields["frozen"])


def test_interrupt_traceback_cut_and_heap_frozen(tmp_path: Path) -> None:
    proc = run(tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    entries, frozen = probe(proc.stdout)
    assert entries == 1 and frozen > 10_000, proc.stdout
    assert "KeyboardInterrupt: stop" in proc.stdout and "test_it.py:4: KeyboardInterrupt" in proc.stdout


def test_full_trace_keeps_the_whole_traceback(tmp_path: Path) -> None:
    proc = run(tmp_path, "--full-trace")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    entries, _ = probe(proc.stdout)
    assert entries > 10, proc.stdout
    assert "helper(depth - 1)" in proc.stdout  # the frames are rendered


def test_without_the_handler_pytest_renders_everything(tmp_path: Path) -> None:
    """The benchmark's baseline: ``-p no:dflash-eval-interrupt`` leaves pytest's own behaviour."""
    proc = run(tmp_path, "-p", "no:dflash-eval-interrupt")
    entries, frozen = probe(proc.stdout)
    assert entries > 10 and frozen == 0, proc.stdout
