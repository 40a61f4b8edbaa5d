"""benchmarks/spy_breakdown.py: a run's wall time above its import floor's, per group of the main thread's samples,
read from two real recordings of ``py-spy record --nonblocking --idle --threads --format raw`` of fresh interpreters.

Run: ``pytest tests/test_spy_breakdown.py``
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "spy_breakdown.py"
RATE = 250

FLOOR = """import json, email.parser, threading, time

def busy(seconds):
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        total += 1
    return total

def shared():
    busy(0.4)

shared()
"""
RUN = FLOOR + """
def own():
    busy(0.6)

def waits_on_a_thread():
    worker = threading.Thread(target=busy, args=(0.3,), name="helper")
    worker.start()
    worker.join(timeout=60)

own()
waits_on_a_thread()
"""


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).is_file():
        pytest.skip("py-spy is not installed (the test extra holds it): the parsing of real recordings not checked")
    return found


def _record(tmp_path: Path, name: str, source: str) -> Path:
    """py-spy's recording of ``source`` run as ``<name>/prog.py`` (one file name for both: their frames match)."""
    (tmp_path / name).mkdir()
    script, raw = tmp_path / name / "prog.py", tmp_path / f"{name}.txt"
    script.write_text(source)
    command = [_py_spy(), "record", "--nonblocking", "--rate", str(RATE), "--idle", "--threads", "--format", "raw",
               "-o", str(raw), "--", sys.executable, "prog.py"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path / name)
    if done.returncode != 0 and "ermission" in done.stderr + done.stdout:
        pytest.skip(f"py-spy may not trace a child process here ({done.stderr.strip()[-200:]}): recordings not checked")
    assert done.returncode == 0, done.stderr
    return raw


def _breakdown(*args: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--rate", str(RATE)], capture_output=True, text=True,
                          check=True, timeout=120).stdout


def test_the_runs_own_work_leads_the_excess_and_a_thread_is_counted_apart(tmp_path):
    run, floor = _record(tmp_path, "run", RUN), _record(tmp_path, "floor", FLOOR)
    out = _breakdown(str(run), "--floor", str(floor), "--own", "prog.py", "--top", "4")
    threads = out.split("threads (sampled seconds")[1].split("main thread:")[0]
    assert "MainThread" in threads and "helper" in threads, out
    rows = [r for r in out.split("run - floor (s), top 4 by size:")[1].splitlines()[2:] if r.strip()]
    assert 2 <= len(rows) <= 4, out  # busy and waits_on_a_thread, and the imports where a sample caught them
    first = rows[0].split()
    assert first[-2:] == ["busy", "(prog.py)"], out  # the innermost own frame: the busy loop, the run's and the floor's
    assert 0.25 < float(first[2]) < 1.2, out  # its 0.6 s more in the run, in wall time; the shared 0.4 s subtracted
    waiting = next(r for r in rows if r.endswith("waits_on_a_thread (prog.py)"))
    assert float(waiting.split()[2]) > 0.1, out  # time blocked on the helper thread (0.3 s) counts as wall time
    above = float(out.split("run above it")[1].split()[0])
    assert 0.4 < above < 3.0, out  # 0.9 s of wall time more than the floor
    packed = floor.with_name("floor.txt.gz")  # as the GPU lane brings recordings back
    packed.write_bytes(gzip.compress(floor.read_bytes()))
    assert _breakdown(str(run), "--floor", str(packed), "--own", "prog.py", "--top", "4") == out
    # where the samples inside own() sit: busy()'s loop lines, every one of them below own()
    inside = _breakdown(str(run), "--under", "own (prog.py", "--top", "3").split("main thread under 'own (prog.py'")[1]
    leaves = [r.split(maxsplit=1) for r in inside.splitlines()[1:] if r.strip()]
    assert leaves and all(leaf.startswith("busy (prog.py:") for _, leaf in leaves), inside
    assert 0.3 < sum(float(sec) for sec, _ in leaves) < 1.2, inside  # own() busies 0.6 s


def test_a_file_that_is_not_a_recording_is_named(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("thread (1): MainThread;f (a.py:1) 3\nthis is not a stack\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"{bad}:2" in done.stderr and "not a py-spy raw line" in done.stderr
