"""The one rendering layer (dflash_eval.common.number_text / tables / step_summary): a number reads the same in the
terminal tables, eval.md, gate.md and the gate's terminal table, NaN included; a report rendered during the run and
one rendered again from eval.json (strict JSON: NaN as null) are the same text; gate rows come from the typed τ
summary."""

from __future__ import annotations

import json
import math
import re

import pytest
from result_rows import drafter_block, fragment, prompt_row

from dflash_eval import report
from dflash_eval.common.number_text import MISSING, ci_text, fmt, percent_list
from dflash_eval.metrics.baseline import BaselineComparison
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.verdict import Part, compose, judge_prompts
from dflash_eval.report.gate import GateRow, error_row, gate_row, gate_table, render_gate_markdown
from dflash_eval.report.step_summary import STEP_SUMMARY_ENV, append_step_summary
from dflash_eval.report.table_rows import MEAN_ROW
from dflash_eval.report.tables import TextTable, markdown_table, rich_table, terminal_text
from dflash_eval.session.run_result import RunResult

NAN = float("nan")
VALUES = [NAN, None, 1.23456, 2, math.inf]


@pytest.mark.parametrize(("args", "text"), [
    ((4.31435,), "4.314"), ((2,), "2.000"), ((NAN,), MISSING), ((None,), MISSING), (("4.3",), MISSING),
    ((True,), MISSING), ((math.inf,), "inf"), ((-math.inf, 2, "e"), "-inf"), ((1e-3, 2, "e"), "1.00e-03"),
    ((0.05, 3, "+f"), "+0.050"), ((-0.05, 3, "+f"), "-0.050"), ((NAN, 3, "+f"), MISSING), ((0.9999, 12, "g"), "0.9999"),
    ((12.345, 3, "g"), "12.3"), ((7.4, 0), "7"),
])
def test_one_number_formatter(args, text):
    assert fmt(*args) == text


def test_spans_and_percentages_use_the_same_convention():
    assert ci_text(0.1, NAN, 2) == f"0.10–{MISSING}" and ci_text(None, 2.0) == f"{MISSING}–2.000"
    assert ci_text(1.5, None, 2, unit="x", brackets=True) == f"[1.50x, {MISSING}]"
    assert ci_text(-0.01, 0.02, 3, "+f", sep="..") == "-0.010..+0.020"
    assert percent_list([0.934, NAN, None, 1.0]) == f"93 {MISSING} {MISSING} 100"


def _cells(text: str, key: str) -> list[str]:
    """The cells of the row whose first cell is ``key``, from markdown (``|``) or a rich table (``│``)."""
    for line in text.splitlines():
        sep = "│" if "│" in line else "|"
        parts = [c.strip() for c in re.split(r"(?<!\\)" + re.escape(sep), line)[1:-1]]
        if parts and parts[0] == key:
            return parts
    raise AssertionError(f"no row {key!r} in:\n{text}")


def _run(tau: object) -> dict:
    prompts = {"a": prompt_row(category="c", tau=tau, rounds=3, accept_lengths=[1, 2, 3], histogram=[1, 1, 1],
                               ddtree={"8": tau}, floor=1.5, ddtree_floor={"8": 2.0}, passed=False),
               "b": prompt_row(category="c", tau=2.5, rounds=2, accept_lengths=[2, 3], histogram=[0, 1, 1],
                               ddtree={"8": 3.0}, floor=1.5, ddtree_floor={"8": 2.0}, passed=True)}
    frag = {"worker": "master", "settings": {}, "target": {"path": "/t", "identity": "i" * 64},
            "drafter": drafter_block(), "prompts": prompts, "mean_tau": tau,
            "mean_floor": 1.5, "mean_ddtree": {"8": tau}, "mean_ddtree_floor": {"8": 2.0}, "timings": {"x": 1.0}}
    return report.merge([fragment(**frag)]).to_dict()


@pytest.mark.parametrize("tau", VALUES, ids=["nan", "none", "float", "int", "inf"])
def test_a_value_reads_the_same_on_every_surface(tau, tmp_path):
    """The terminal's τ table, eval.md's and the gate's tables (gate.md and the terminal) show the same text for
    one τ: the formatter's; the verdict lines too."""
    data = _run(tau)
    want = fmt(tau)
    result = RunResult.from_dict(data)
    term, md = report.render_terminal(result), report.render_markdown(result)
    assert _cells(term, "a") == _cells(md, "a") and _cells(term, "a")[1:3] == [want, want]
    assert _cells(term, MEAN_ROW) == _cells(md, MEAN_ROW) and _cells(md, MEAN_ROW)[1] == want
    assert f"mean chain τ (macro) {want} " in report.verdict_lines(RunResult.from_dict(data), report_dir=None)[0]
    row = GateRow(drafter=str(tmp_path / "ckpt"), verdict=compose(Part("floors", False, ("x",))), mean_tau=tau,
                  mean_ddtree={"8": tau}, mean_floor=1.5, worst_prompt="a", worst_tau=tau, worst_floor=1.5,
                  seconds=0.5)
    gate_md = render_gate_markdown([row], {"target_model": "/t", "prompts": "p"}, [8])
    gate_term = terminal_text([gate_table([row], [8], terminal=True)], width=200)
    assert _cells(gate_md, "ckpt")[1:3] == [want, want] == _cells(gate_term, "ckpt")[1:3]  # by name in both
    assert str(tmp_path) not in gate_term
    assert f"a ({want} / 1.500)" in _cells(gate_md, "ckpt") and f"a ({want} / 1.500)" in gate_term
    assert "nan" not in (term + md + gate_md + gate_term).lower()


def test_a_report_rendered_again_from_eval_json_is_the_same_text(tmp_path):
    """eval.json writes NaN as null; the convention makes eval.md of the run and eval.md rendered from the file
    the same, as the terminal's tables."""
    data = _run(NAN)
    data["prompts"]["b"]["online"] = {"tau": NAN, "rounds": 0, "histogram": [], "position_rates": [],
                                      "accept_lengths": [], "tokens": 0, "matches_reference": False,
                                      "first_divergence": None}
    paths = report.write_reports(RunResult.from_dict(data), tmp_path / "r")
    back = json.loads(paths["json"].read_text())
    assert back["prompts"]["a"]["tau"] is None
    again, result = RunResult.from_dict(back), RunResult.from_dict(data)
    assert report.render_markdown(again) == paths["md"].read_text() == report.render_markdown(result)
    assert report.render_terminal(again) == report.render_terminal(result)


def test_tables_check_their_rows_and_escape_pipes():
    with pytest.raises(ValueError, match=r"table 'widths': row 1 has 1 cells for 2 columns"):
        TextTable(["k", "v"], [["a", "1"], ["b"]], title="widths")
    t = TextTable(["scope", "max |Δτ|"], [["a|b", fmt(NAN)]], left=frozenset({"scope"}))
    assert markdown_table(t) == "| scope | max \\|Δτ\\| |\n|---|---|\n| a\\|b | - |"
    assert not TextTable(["k"], [])
    assert "[red]" in terminal_text([TextTable(["k"], [["[red]x"]])])  # cell text is never read as rich markup


def test_the_verdict_colour_changes_no_text():
    from io import StringIO

    from rich.console import Console

    t = TextTable(["checkpoint", "verdict"], [["a", "PASS"], ["b", "FAIL: 2 prompt(s) below floor"],
                                               ["c", "ERROR ConfigError: x"]], left=frozenset({"checkpoint"}))
    buf = StringIO()
    Console(file=buf, width=120, force_terminal=True, color_system="standard").print(rich_table(t))
    coloured = buf.getvalue()
    assert "\x1b[32mPASS" in coloured and "\x1b[31mFAIL" in coloured and "\x1b[31mERROR" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == terminal_text([t])


def test_step_summary_appends_and_names_a_bad_path(tmp_path):
    path = tmp_path / "summary.md"
    env = {STEP_SUMMARY_ENV: str(path)}
    assert append_step_summary("## one", env) == path and append_step_summary("## two", env) == path
    assert path.read_text() == "## one\n## two\n"
    assert append_step_summary("## three", {}) is None
    bad = tmp_path / "missing" / "summary.md"
    with pytest.raises(OSError, match=r"\$GITHUB_STEP_SUMMARY names .*missing/summary.md, which cannot be appended"):
        append_step_summary("x", {STEP_SUMMARY_ENV: str(bad)})


def _summary(taus: dict[str, float], floors: Floors, baseline: BaselineComparison | None = None):
    from dflash_eval.session.eval_result import TauSummary
    from dflash_eval.session.rows import PromptRow, rows_from_dict

    rows = {p: {"category": "c", "tau": t, "rounds": 1, "accept_lengths": [1], "histogram": [1],
                "position_rates": [], "ddtree": {"8": t + 0.5}, "ddtree_accept_lengths": {"8": [1]}, "floor": None,
                "ddtree_floor": {}, "prompt_tokens": 1, "completion_tokens": 1, "passed": False}
            for p, t in taus.items()}
    typed = rows_from_dict(PromptRow, rows)
    judge_prompts(typed, floors)
    mean = sum(taus.values()) / len(taus)
    return TauSummary(typed, mean, {"8": mean + 0.5}, floors.for_mean(),
                      {"8": floors.for_mean(8)}, {}, baseline)


def test_gate_rows_come_from_the_typed_summary(tmp_path):
    floors = Floors(chain={"a": 2.0, "b": 1.0}, ddtree={8: {"a": 2.0, "b": 1.0}}, selection={"a": "c", "b": "c"})
    high = _summary({"a": 2.5, "b": 1.5}, floors)
    row = gate_row(high, high.verdict(floors), drafter=str(tmp_path / "ck"), fingerprint="f1")
    assert row.passed and row.reasons == [] and (row.worst_prompt, row.worst_tau, row.worst_floor) == ("b", 1.5, 1.0)
    assert list(row.to_json()) == ["drafter", "fingerprint", "mean_tau", "mean_ddtree", "mean_tau_pooled",
                                   "mean_ddtree_pooled", "mean_floor", "worst_prompt", "worst_tau", "worst_floor",
                                   "passed", "reasons", "baseline", "prompts", "seconds", "step", "gating",
                                   "notices", "reference", "speedup", "verdict"]
    assert row.to_json()["prompts"]["a"] == {"tau": 2.5, "ddtree": {"8": 3.0}, "floor": 2.0, "passed": True}
    low_tau = _summary({"a": 1.9, "b": 1.5}, floors)
    low = gate_row(low_tau, low_tau.verdict(floors), drafter="x", fingerprint="f")
    assert not low.passed and low.reasons == ["1 prompt(s) below floor"]
    cmp = BaselineComparison("base.json", {"a": (3.0, 1.9), "b": (3.0, 1.5)}, [], drop_tol=0.02, rise_tol=0.25)
    dropped_tau = _summary({"a": 1.9, "b": 1.5}, floors, cmp)
    dropped = gate_row(dropped_tau, dropped_tau.verdict(floors), drafter="x", fingerprint="f")
    assert dropped.reasons[-1] == "τ dropped against the baseline: -43.33 % (allowed -2 %)"  # 1.7 against 3.0
    assert dropped.to_json()["baseline"] == cmp.to_json()
    err = error_row(str(tmp_path / "gone"), FileNotFoundError("no such checkpoint"))
    assert err.to_json() == {"drafter": str(tmp_path / "gone"), "passed": False,
                             "error": "FileNotFoundError: no such checkpoint", "seconds": None, "step": None,
                             "gating": True}
    md = render_gate_markdown([row, low, err], {"target_model": "/t", "prompts": "p"}, [8])
    assert "1/3 checkpoint(s) passed" in md and "| gone | - | - | - | - | - | ERROR FileNotFoundError" in md
    assert "| a | 2.000 | 2.500 | 1.900 FAIL |" in md and "(2 of 2 prompts, worst first)" in md
    assert row.name == "ck"
