"""The installed suite run from a repository of a user's own (a plain ini, no junit_family: pytest's default
xunit2): no PytestWarning, the junit XML holds the run's mean τ and verdict and every prompt's τ as test-suite
properties and no test-case properties (invalid under xunit2); under xunit1 the τ tests also carry theirs. The
same run's eval.json names the repository's git commit and dirty flag and the host, and the terminal ends with the
verdict.

Run: ``pytest tests/test_junit_families.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _git(folder: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True, env=env,
                          timeout=60).stdout.strip()


def _run(pytester, tmp_path, name: str, *extra: str):
    xml = tmp_path / f"{name}.xml"
    res = pytester.runpytest_subprocess(  # the suite as installed (--pyargs), not this checkout's ini
        "-p", "dflash_eval.pytest_plugin", "-p", "no:cacheprovider", "--pyargs", "dflash_eval.tests_eval",
        "-k", "tau", f"--target-model={ROOT / 'fixtures' / 'target'}", f"--drafter={ROOT / 'fixtures' / 'drafter'}",
        f"--prompts={ROOT / 'fixtures' / 'prompts.jsonl'}", "--num-prompts=2", "--max-new-tokens=24",
        f"--floors-file={tmp_path / 'none.json'}", "--tau-floor=1.0", "--tau-floor-prompt=1.0",
        f"--cache-dir={tmp_path / 'cache'}", f"--report-dir={tmp_path / name}", f"--junitxml={xml}", *extra,
        timeout=600)
    out = res.stdout.str() + res.stderr.str()
    assert res.ret == 0, out
    return res, out, ET.parse(xml).getroot()


def _suite_properties(root: ET.Element) -> dict[str, str]:
    return {p.get("name"): p.get("value") for suite in root.iter("testsuite")
            for props in suite.findall("properties") for p in props.iter("property")}


def test_default_xunit2_has_no_warning_and_suite_properties(pytester, monkeypatch, tmp_path):
    for k in [k for k in os.environ if k.startswith("DFLASH_EVAL_")]:
        monkeypatch.delenv(k)
    pytester.makeini("[pytest]\n")  # a user's repository: junit_family not set
    has_git = shutil.which("git") is not None
    if has_git:
        _git(pytester.path, "init", "-q")
        (pytester.path / "README").write_text("mine\n")
        _git(pytester.path, "add", "README")
        _git(pytester.path, "commit", "-q", "-m", "mine")
    res, out, root = _run(pytester, tmp_path, "x2")
    assert "PytestWarning" not in out and "incompatible with junit_family" not in out, out
    assert "warning" not in res.parseoutcomes(), out
    props = _suite_properties(root)
    data = json.loads((tmp_path / "x2" / "eval.json").read_text())
    assert props["dflash_eval.verdict"] == "PASS" and props["dflash_eval.prompts"] == "2"
    assert float(props["dflash_eval.mean_tau"]) == pytest.approx(data["mean_tau"], abs=1e-4)
    assert len(data["prompts"]) == 2
    for pid, r in data["prompts"].items():  # τ of every τ test, per prompt
        assert float(props[f"dflash_eval.prompt.{pid}.tau"]) == pytest.approx(r["tau"], abs=1e-4)
        assert float(props[f"dflash_eval.prompt.{pid}.ddtree8.tau"]) == pytest.approx(r["ddtree"]["8"], abs=1e-4)
        assert props[f"dflash_eval.prompt.{pid}.floor"] == "1.0"
        assert props[f"dflash_eval.prompt.{pid}.verdict"] == "PASS"
    cases = list(root.iter("testcase"))
    assert len(cases) == 8 and not [c for c in cases if c.find("properties") is not None]  # valid xunit2

    prov = data["provenance"]
    assert prov["host"] == socket.gethostname()
    if has_git:  # the run's working directory is the user's repository
        assert prov["git"] == {"commit": _git(pytester.path, "rev-parse", "HEAD"), "dirty": False,
                               "root": str(pytester.path.resolve())}
    assert data["target"]["dtype"] == "float32"
    tail = [line for line in res.stdout.lines if line.strip()]
    verdict = next(i for i, line in enumerate(tail) if line.startswith("dflash-eval: "))
    assert tail[verdict].startswith("dflash-eval: PASS — mean chain τ") and "over 2 prompts" in tail[verdict]
    assert "reports:" in tail[verdict + 2] + tail[verdict + 3]  # the verdict block, then pytest's own summary
    assert tail[-1].lstrip("= ").startswith("6 passed, 2 skipped")

    res, out, root = _run(pytester, tmp_path, "x1", "-o", "junit_family=xunit1")  # warm: the same cache
    assert "PytestWarning" not in out, out
    case_props = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
                  for c in root.iter("testcase")}
    first = next(iter(data["prompts"]))
    assert float(case_props[f"test_tau[{first}]"]["tau"]) == pytest.approx(data["prompts"][first]["tau"], abs=1e-4)
    assert case_props["test_mean_tau"]["verdict"] == "PASS"
    assert _suite_properties(root)["dflash_eval.verdict"] == "PASS"
