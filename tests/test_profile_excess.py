"""benchmarks/profile_excess.py: a run's own time above its import floor's, per function and per package, read from
two real cProfile stats files written by ``python -m cProfile`` in fresh interpreters.

Run: ``pytest tests/test_profile_excess.py``
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_excess.py"

FLOOR = "import json, email.parser\n"
RUN = FLOOR + """
def extra_work():
    total = 0
    for i in range(300_000):
        total += i * i
    return total

extra_work()
"""


def _profile(tmp_path: Path, name: str, source: str) -> Path:
    script, stats = tmp_path / f"{name}.py", tmp_path / f"{name}.prof"
    script.write_text(source)
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), str(script)], check=True, timeout=120)
    return stats


def test_the_runs_own_work_leads_and_the_shared_import_does_not_show(tmp_path):
    run, floor = _profile(tmp_path, "run", RUN), _profile(tmp_path, "floor", FLOOR)
    out = subprocess.run([sys.executable, str(SCRIPT), str(run), str(floor), "--top", "3"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    functions = out.split("functions by excess own time")[1].splitlines()[1:]
    assert len(functions) == 3
    assert functions[0].endswith("(extra_work)"), out  # the work only the run does comes first
    assert "1 / 0" in functions[0]  # called once in the run, never in the floor
    assert "excess own time per package" in out
    assert not any("email/parser.py" in line for line in functions), out  # imported by both: subtracted
