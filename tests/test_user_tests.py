"""A user's own test file on the suite's fixtures (``docs/examples/test_own_checks.py``), run in a project of its own:
its outcomes are recorded in eval.json like the suite's, eval.json validates against the published schema, and the
junit XML carries the run's mean τ and verdict.

Run: ``pytest tests/test_user_tests.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "test_own_checks.py"
SCHEMA = ROOT / "src" / "dflash_eval" / "report" / "eval.schema.json"
pytestmark = pytest.mark.slow


def strict_load(path: Path) -> dict:
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path} holds {c}: not strict JSON"))


def test_own_test_file_is_recorded_like_the_suite(pytester, monkeypatch, tmp_path):
    for k in [k for k in os.environ if k.startswith("DFLASH_EVAL_")]:
        monkeypatch.delenv(k)
    shutil.copy(EXAMPLE, pytester.path / "test_own_checks.py")
    pytester.makeini("[pytest]\n")
    reports = tmp_path / "reports"
    res = pytester.runpytest_subprocess(  # not in-process: that would drop the transformers modules it imported
        "-p", "dflash_eval.pytest_plugin", "-p", "no:cacheprovider", f"--target-model={ROOT / 'fixtures' / 'target'}",
        f"--drafter={ROOT / 'fixtures' / 'drafter'}", f"--prompts={ROOT / 'fixtures' / 'prompts.jsonl'}",
        "--num-prompts=2", "--max-new-tokens=24", f"--floors-file={tmp_path / 'none.json'}", "--tau-floor=1.0",
        f"--cache-dir={tmp_path / 'cache'}", f"--report-dir={reports}", f"--junitxml={tmp_path / 'junit.xml'}",
        timeout=600)
    assert res.ret == 0, res.stdout.str()
    res.assert_outcomes(passed=3)
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in reports.iterdir()}
    assert modes and all(m == 0o666 & ~umask for m in modes.values()), (oct(umask), modes)  # readable by others
    data = strict_load(reports / "eval.json")
    assert data["tests"]["counts"] == {"passed": 3}
    assert sorted(data["tests"]["outcomes"]) == [
        "test_own_checks.py::test_completions_are_full_length",
        "test_own_checks.py::test_drafter_helps_on_every_prompt[code-bisect-0]",
        "test_own_checks.py::test_drafter_helps_on_every_prompt[code-bisect-1]"]
    assert set(data["prompts"]) == {"code-bisect-0", "code-bisect-1"} and data["mean_floor"] == 1.0

    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(data)

    props = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "junit.xml").getroot().iter("property")
             if p.get("name", "").startswith("dflash")}
    assert props["dflash_eval.verdict"] == "PASS" and props["dflash_eval.prompts"] == "2"
    assert float(props["dflash_eval.mean_tau"]) == pytest.approx(data["mean_tau"], abs=1e-4)
    assert props["dflash_eval.mean_floor"] == "1.0" and "dflash_eval.mean_ddtree8" in props
