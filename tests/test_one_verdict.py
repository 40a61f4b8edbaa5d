"""One verdict, built once and shown whole: :mod:`dflash_eval.metrics.verdict` is the only module that decides a part
of a verdict (the floors, the baseline, the drift gate, the speed-up floor, a regression or plateau across steps, a
refused drafter, a plugin's rejection, failed tests) or composes one, and every writer shows the verdict it is
given, never one of its own.

Three checks: the source (no module outside ``metrics/verdict/`` makes a :class:`~dflash_eval.metrics.verdict.Part`
or a :class:`~dflash_eval.metrics.verdict.Verdict`, the writers import nothing from it that judges, and no module
outside it compares a measured τ, drift, budget or speed-up with its floor, tolerance, budget or band: the
comparison check, shown to fail on a planted module, ``tests/data/judges_again.py``), and the behaviour (a
verdict that contradicts the numbers it was composed from, planted where eval.json and a history record keep it, is
what the terminal, eval.md, eval.html, the junit properties, gate.json, gate.md, history.md and the trackers show,
and what pytest's exit status follows: had one of them judged a part again, it would show the numbers' verdict
instead).

Run: ``pytest tests/test_one_verdict.py -p no:cacheprovider``
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from result_rows import costs_block, fragment, prediction, speedup_block
from test_run_summary import budget

from dflash_eval import report
from dflash_eval.cli.gate_run import record_row
from dflash_eval.metrics.verdict import (
    BASELINE,
    DRIFT_GATE,
    FLOORS,
    REFUSAL,
    REGRESSION,
    SPEEDUP_FLOOR,
    Part,
    Verdict,
    compose,
    notice,
    stored_verdict,
)
from dflash_eval.pytest_plugin.junit import junit_properties
from dflash_eval.pytest_plugin.run_report import fail_a_refused_run
from dflash_eval.pytest_plugin.state import RESULT
from dflash_eval.report.gate import gate_data, gate_row, render_gate_markdown
from dflash_eval.report.html_report import html_verdict_lines, render_html
from dflash_eval.report.speedup_report import speedup_lines, verdict_line
from dflash_eval.session.run_result import RunResult
from dflash_eval.training_loop.history import CheckpointRecord
from dflash_eval.training_loop.trackers import tracker_scalars, verdict_text
from dflash_eval.training_loop.trend_table import trend_table

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "dflash_eval"
VERDICT = PACKAGE / "metrics" / "verdict"

#: The modules that show a verdict: they may read it (its types, the part names, the verdict eval.json holds, a
#: drift gate row's stored outcome), never judge a part of it.
WRITERS = ("report/summary.py", "report/render.py", "report/html_report.py", "report/speedup_report.py",
           "report/table_rows.py", "report/gate.py", "report/plot.py", "report/budget_plot.py",
           "report/run_end.py", "pytest_plugin/junit.py", "training_loop/trackers.py",
           "training_loop/trend_table.py", "training_loop/trend_plot.py", "cli/main.py")
#: What a writer may import from metrics/verdict/ (``refused``: the refusals eval.json lists; ``against``: a τ and
#: its floor in words, the sign the rule's; ``gating_pass``: the gate's aggregate).
READERS = frozenset({"Verdict", "Part", "stored_verdict", "row_outcome", "refused", "against", "gating_pass",
                     "FLOORS", "BASELINE", "SPEEDUP_FLOOR", "REGRESSION", "PLATEAU", "DRIFT_GATE", "REFUSAL", "PLUGINS",
                     "TESTS", "EXIT_STATUS", "REPORTS", "CHECKPOINT", "PASS", "FAIL", "INCONCLUSIVE"})


def _modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts]


def _outside_the_verdict() -> list[Path]:
    return [p for p in _modules() if VERDICT not in p.parents]


def test_only_the_verdict_module_makes_a_part_or_a_verdict():
    made = []
    for path in _outside_the_verdict():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else \
                    node.func.attr if isinstance(node.func, ast.Attribute) else None
                if name in ("Part", "Verdict"):
                    made.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}(...)")
    assert not made, "a part or a verdict made outside metrics/verdict/ (add a function there):\n" + "\n".join(made)


# ------------------------------------------------------------------------------------------------ judged once
#: Names of a measured number: τ, drift (a relative error, a cosine), a drift budget's scaled drift or fitted drop,
#: a speed-up, a change against a baseline, a near tie's margin, or a plain ``value``.
MEASURED = re.compile(r"(^|_)(tau|drift|rel_err|cos|speedup|scaled|rel_change|margin|value|fitted|drop)(_|s?$)")
#: Names of what such a number is judged against.
THRESHOLD = re.compile(r"(^|_)(floor|tol|tolerance|band|budget|safety)(_|s?$)")


def _names(node: ast.AST) -> set[str]:
    """Every name, attribute and string key an expression mentions."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
    return out


def _measured(node: ast.AST) -> bool:
    """The expression names a measured number, or is a distance (``abs(a - b)``)."""
    return any(MEASURED.search(n) for n in _names(node)) or any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "abs" for n in ast.walk(node))


def judgements(path: Path) -> list[str]:
    """The ordering comparisons (<, <=, >, >=) in ``path`` of a measured number (:data:`MEASURED`) with a threshold
    (:data:`THRESHOLD`), as ``line: source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE))
                                                        for op in node.ops):
            continue
        sides = [node.left, *node.comparators]
        for a, b in zip(sides, sides[1:]):
            if (_measured(a) and any(THRESHOLD.search(n) for n in _names(b))) or (
                    _measured(b) and any(THRESHOLD.search(n) for n in _names(a))):
                found.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
                break
    return [text for _, text in sorted(found)]


def test_no_module_outside_the_verdict_judges_a_measured_number():
    """A τ, drift, budget or speed-up compared with its floor, tolerance, budget or band is a verdict: it is made by
    a rule of metrics/verdict/ (``rules.py``) and read everywhere else, the suite's own tests included."""
    found = [f"{p.relative_to(ROOT)}:{hit}" for p in _outside_the_verdict() + sorted((ROOT / "tests_eval").glob("*.py"))
             for hit in judgements(p)]
    assert not found, "a measured number judged outside metrics/verdict/ (add a rule to rules.py):\n" + "\n".join(
        found)


def test_the_comparison_check_finds_a_planted_judgement():
    """The check can fail: a module that compares τ, drift, a τ difference, a speed-up and a scaled drift with their
    thresholds is caught on each line, and its comparisons of counts are not."""
    found = judgements(ROOT / "tests" / "data" / "judges_again.py")
    assert [h.split(": ", 1)[1] for h in found] == [
        "row['tau'] >= row['floor']", "rel_err <= rel_tol", "abs(a - b) <= accept_tol", "speedup < floor",
        "scaled <= budget"]


def test_the_verdict_rules_are_what_the_check_would_find():
    """The rules themselves are such comparisons (else the check would be looking for the wrong thing)."""
    assert len(judgements(VERDICT / "rules.py")) >= 8


def test_writers_read_the_verdict_and_never_judge():
    found = []
    for rel in WRITERS:
        path = PACKAGE / rel
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "dflash_eval.metrics.verdict":
                found += [f"{rel}:{node.lineno}: {a.name}" for a in node.names if a.name not in READERS]
            if isinstance(node, ast.Constant) and node.value in ("drop_passed", "rise_passed"):  # the baseline part
                found.append(f"{rel}:{node.lineno}: reads {node.value!r}")
    assert not found, "a writer judges a part of the verdict itself:\n" + "\n".join(found)
    assert (PACKAGE / "report" / "speedup_report.py").read_text().count("floor_reason") == 0


# ------------------------------------------------------------------------------------------------ a run
def _run(tau: float) -> dict:
    """Merged eval.json data of a 3-prompt run at ``tau`` (floors 2.0), a drift gate row that passes, a baseline that
    holds and a speed-up block with a floor of 1.0."""
    prompts = {f"p{i}": {"category": "code", "tau": tau, "rounds": 3, "accept_lengths": [1, 2, 3],
                         "histogram": [1, 1, 1], "position_rates": [0.5], "ddtree": {"8": tau},
                         "ddtree_accept_lengths": {"8": [1, 2, 3]}, "floor": 2.0, "ddtree_floor": {"8": 2.0},
                         "prompt_tokens": 4, "completion_tokens": 7, "passed": tau >= 2.0} for i in range(3)}
    frag = {"worker": "master", "settings": {"max_new_tokens": 8}, "prompts": prompts, "mean_tau": tau,
            "mean_floor": 2.0, "mean_ddtree": {"8": tau}, "mean_ddtree_floor": {"8": 2.0},
            "baseline": {"path": "b.json", "n": 3, "missing": [], "mean_baseline": tau, "mean_run": tau,
                         "mean_diff": 0.0, "ci95": [0.0, 0.0], "ci_method": "t", "rel_change": 0.0, "drop_tol": 0.02,
                         "rise_tol": 0.25, "drop_passed": True, "rise_passed": True, "prompts": {}},
            **budget("pass"),
            "speedup": speedup_block(floor=1.0, passed=True, best="chain", costs=costs_block(),
                                     strategies={"chain": prediction(tau=tau, tau_ci=[tau, tau], speedup_ci=[1.8, 2.2],
                                                                     tokens_per_s_ci=[180.0, 220.0])})}
    return report.merge([fragment(**frag)], outcomes={"t.py::test_tau[p0]": "passed"}).to_dict()


PLANTED_FAIL = compose(Part(FLOORS, False, ("planted: τ below its floors",)),
                       Part(BASELINE, False, ("planted: τ dropped",)),
                       Part(DRIFT_GATE, False, ("planted: drift over budget",), outcome="fail"),
                       Part(SPEEDUP_FLOOR, False, ("planted: too slow",)),
                       notice("near_ties", "planted: 2 completions at a near tie"))
PLANTED_PASS = compose(Part(FLOORS, True), Part(BASELINE, True), Part(DRIFT_GATE, True, outcome="pass"),
                       Part(SPEEDUP_FLOOR, True))


def _shown(data: dict) -> dict[str, str]:
    """Every surface of a run's verdict, as text."""
    result = RunResult.from_dict(data)
    term = "\n".join(report.verdict_lines(result, report_dir=None))
    return {"terminal": term, "eval.md": report.render_markdown(result),
            "eval.html": render_html(result, html_verdict_lines(result)),
            "junit": json.dumps(junit_properties(result), ensure_ascii=False),
            "speed-up": "\n".join(speedup_lines(result.speedup, stored_verdict(result))
                                   + [verdict_line(result.speedup, stored_verdict(result)) or ""]),
            "baseline": report.baseline_line(result) or ""}


def _exit_status(data: dict) -> pytest.ExitCode:
    """pytest's exit status after a run whose tests all passed and whose merged eval.json data is ``data``."""
    stash = pytest.Stash()
    if data:
        stash[RESULT] = RunResult.from_dict(data)
    session = SimpleNamespace(config=SimpleNamespace(stash=stash), exitstatus=pytest.ExitCode.OK)
    fail_a_refused_run(session)  # type: ignore[arg-type]  # what it reads of a session
    return session.exitstatus


def test_a_run_shows_the_verdict_eval_json_holds_not_its_own():
    data = _run(3.0)  # every number passes
    data["verdict"] = PLANTED_FAIL.to_dict()
    shown = _shown(data)
    head = shown["terminal"].splitlines()[0]
    assert head.startswith("dflash-eval: FAIL (planted: τ below its floors; planted: τ dropped; planted: drift over "
                           "budget; planted: too slow)"), head
    assert "drift gate FAIL" in head and "drift gate: FAIL" in shown["terminal"]
    for surface in ("terminal", "eval.md", "eval.html"):  # a part's notice reaches every writer untouched
        assert "planted: 2 completions at a near tie" in shown[surface], surface
        assert "planted: too slow" in shown[surface], surface
    assert '<div class="verdict fail"' in shown["eval.html"]
    props = junit_properties(RunResult.from_dict(data))
    assert props["dflash_eval.verdict"] == "FAIL" and props["dflash_eval.drift_gate"] == "FAIL"
    assert props["dflash_eval.floors"] == "FAIL"
    assert "--speedup-floor 1 (the server-style loop's chain): FAIL: planted: too slow" in shown["speed-up"]
    assert "floor 1 FAIL" in shown["speed-up"]
    assert shown["baseline"].endswith(": FAIL")

    data = _run(1.0)  # every number fails
    data["verdict"] = PLANTED_PASS.to_dict()
    shown = _shown(data)
    assert shown["terminal"].startswith("dflash-eval: PASS — ") and "drift gate PASS" in shown["terminal"]
    assert '<div class="verdict pass"' in shown["eval.html"] and "**dflash-eval: PASS — " in shown["eval.md"]
    props = junit_properties(RunResult.from_dict(data))
    assert props["dflash_eval.verdict"] == "PASS" and props["dflash_eval.floors"] == "PASS"
    assert "--speedup-floor 1 (the server-style loop's chain): PASS" in shown["speed-up"]
    assert shown["baseline"].endswith(": PASS")


def test_pytests_exit_status_reads_the_stored_verdict():
    """The parts no test asserts (a refused drafter, a plugin's rejection, the reports) decide the exit status from
    the stored verdict, not from the data they were composed of; the parts a test asserts are left to that test."""
    data = _run(3.0)  # nothing refused, every number passes
    data["verdict"] = compose(Part(FLOORS, True), Part(REFUSAL, False, ("planted: refused",))).to_dict()
    assert _exit_status(data) == pytest.ExitCode.TESTS_FAILED
    refused = _run(3.0)
    refused["drafter"] = {"path": "d", "fingerprint": "f", "config": {}, "refused": [{"check": "c", "message": "m"}]}
    assert _exit_status(refused) == pytest.ExitCode.TESTS_FAILED  # no stored verdict: judged from the data, once
    refused["verdict"] = PLANTED_PASS.to_dict()
    assert _exit_status(refused) == pytest.ExitCode.OK  # the data says refused, the stored verdict does not
    data["verdict"] = PLANTED_FAIL.to_dict()  # floors, baseline, drift gate, speed-up: their tests' own outcomes
    assert _exit_status(data) == pytest.ExitCode.OK
    assert _exit_status({}) == pytest.ExitCode.OK


def test_the_written_reports_carry_the_stored_verdict(tmp_path, monkeypatch):
    """The files of a run (eval.json, eval.md, eval.html) and the CI step summary carry the planted verdict, not the
    numbers' own."""
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    data = _run(3.0)  # every number passes
    data["verdict"] = PLANTED_FAIL.to_dict()
    report.write_reports(RunResult.from_dict(data), tmp_path / "reports")
    written = json.loads((tmp_path / "reports" / "eval.json").read_text(encoding="utf-8"))
    assert written["verdict"] == PLANTED_FAIL.to_dict()
    for text in [(tmp_path / "reports" / name).read_text(encoding="utf-8") for name in ("eval.md", "eval.html")] + [
            summary.read_text(encoding="utf-8")]:
        assert "planted: τ below its floors" in text and "planted: 2 completions at a near tie" in text


def test_data_without_a_stored_verdict_is_judged_from_its_own_numbers():
    """An eval.json of an earlier version (no ``verdict``): the reports judge what it holds, once, the same way."""
    assert report.verdict_lines(RunResult.from_dict(_run(3.0)), report_dir=None)[0].startswith("dflash-eval: PASS")
    failing = report.verdict_lines(RunResult.from_dict(_run(1.0)), report_dir=None)[0]
    assert failing.startswith("dflash-eval: FAIL (τ below its floors") and "drift gate PASS" in failing


# ------------------------------------------------------------------------------------------------ a checkpoint
def _record(verdict: Verdict) -> CheckpointRecord:
    """A record whose fields say it passed, its verdict ``verdict``."""
    return CheckpointRecord(step=3, time="2026-01-01T00:00:00+00:00", drafter="run/step_3", fingerprint="f",
                            settings_digest="d", mean_tau=4.0, mean_tau_ci95=[3.8, 4.2], mean_ddtree={"8": 4.5},
                            mean_ddtree_ci95={"8": [4.3, 4.7]}, mean_floor=2.0, categories={},
                            prompts={"a": 4.0, "b": 4.0}, passed=True, reasons=[], parts=verdict.parts)


def test_a_checkpoint_shows_the_verdict_its_record_holds():
    planted = compose(Part(FLOORS, True), Part(SPEEDUP_FLOOR, False, ("planted: too slow",)),
                      Part(REGRESSION, False, ("planted: below the run's level",)), notice("plateau", "planted: flat"))
    rec = CheckpointRecord.from_json(json.loads(json.dumps(_record(planted).to_json())))  # as history.jsonl keeps it
    assert rec.judgement == planted and rec.verdict == "fail"
    table = trend_table([rec])
    assert "| FAIL | planted: too slow; planted: below the run's level; planted: flat |" in table
    scalars = tracker_scalars(rec)
    assert (scalars["verdict/pass"], scalars["verdict/floor_missed"], scalars["verdict/regression"],
            scalars["verdict/plateau"]) == (0.0, 0.0, 1.0, 1.0)
    assert verdict_text(rec).startswith("FAIL: ") and "planted: too slow" in verdict_text(rec)
    row = record_row(rec)  # gate --latest: a checkpoint judged from its record
    assert not row.passed and row.reasons == ["planted: too slow", "planted: below the run's level"]
    assert row.notices[1:] == ["planted: flat"] and row.notices[0].startswith("judged from its history record")
    md = render_gate_markdown([row], {"target_model": "/t", "prompts": "p"}, [8])
    assert "FAIL: planted: too slow; planted: below the run's level" in md and "planted: flat" in md


def test_a_gate_row_shows_the_verdict_it_is_given(tmp_path):
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.eval_result import TauSummary

    summary = TauSummary.from_dict(_run(1.0))  # every prompt below its floor
    row = gate_row(summary, PLANTED_PASS, drafter=str(tmp_path / "step_1"), fingerprint="f")
    assert row.passed and row.reasons == []
    failed = gate_row(TauSummary.from_dict(_run(3.0)), PLANTED_FAIL, drafter=str(tmp_path / "step_2"), fingerprint="f")
    settings = EvalSettings.from_mapping({"report_dir": str(tmp_path)}, base=tmp_path)
    data = gate_data([row, failed], settings)
    assert [c["passed"] for c in data["checkpoints"]] == [True, False] and data["passed"] is False
    assert data["checkpoints"][1]["reasons"] == PLANTED_FAIL.reasons
    assert data["checkpoints"][1]["notices"] == ["planted: 2 completions at a near tie"]
    assert data["checkpoints"][1]["verdict"] == PLANTED_FAIL.to_dict()


@pytest.mark.parametrize("name", ["near_ties", "compile"])
def test_a_new_part_reaches_every_writer_without_touching_it(name):
    """A part a later version adds (a notice, or a reason that fails) is shown by writers that do not know it."""
    data = _run(3.0)
    data["verdict"] = compose(Part(FLOORS, True), Part(name, name == "near_ties", (f"{name} failed",)
                                                       if name != "near_ties" else (), (f"{name} said",))).to_dict()
    shown = _shown(data)
    for surface in ("terminal", "eval.md", "eval.html"):
        assert f"{name} said" in shown[surface]
        assert (f"{name} failed" in shown[surface]) == (name != "near_ties")
