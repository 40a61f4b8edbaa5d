"""The end of a run's terminal output and its reports, as a reader meets them: the verdict block printed last
(PASS/FAIL and why, mean τ against its floor, the lowest prompts, the drift gate, where the reports are), long
per-prompt tables collapsed in the terminal but complete in eval.md, eval.md's provenance as plain text (no Python
reprs, normalised paths, host and git commit), and drift_budget.png's title, legend and axes.

Run: ``pytest tests/test_run_summary.py -p no:cacheprovider``
"""

from __future__ import annotations

import re

import pytest
from result_rows import budget_block, drafter_block, gate_row, level_row, prompt_row
from result_rows import fragment as read_fragment

from dflash_eval import report
from dflash_eval.metrics.verdict import run_verdict
from dflash_eval.report.budget_plot import FONT_PT, budget_figure
from dflash_eval.report.render import TERMINAL_ROWS_FULL, TERMINAL_ROWS_SHOWN
from dflash_eval.session.run_result import RunResult


def fragment(n: int, *, low: str | None = None) -> dict:
    """A run of ``n`` prompts p0.. with τ 2.0 + i/10 and floors 0.25 below; ``low`` is below its floor."""
    prompts = {}
    for i in range(n):
        tau = 2.0 + i / 10
        prompts[f"p{i}"] = prompt_row(category="code", tau=tau, rounds=3, accept_lengths=[1, 2, 3],
                                      histogram=[1, 1, 1], ddtree={"8": tau + 0.5}, floor=tau - 0.25,
                                      ddtree_floor={"8": tau + 0.25}, passed=True)
    if low is not None:
        prompts[low].update(tau=1.0, floor=2.0, passed=False)
    return {"worker": "master", "settings": {"max_new_tokens": 8},
            "target": {"path": "/work/firstgate/../myrepo/models/t", "identity": "i" * 64, "num_layers": 2,
                       "dtype": "torch.bfloat16", "device": "cpu"},
            "drafter": drafter_block("/work/firstgate/../myrepo/ckpt/step_a.pt"),
            "provenance": {"backend": "torch", "dtype": "bfloat16", "device": "cpu", "device_kind": "cpu",
                           "versions": {"torch": "2.13.0", "transformers": "5.20.0", "fla": None,
                                        "python": "3.11.7"},
                           "host": "build-7", "git": {"commit": "ab" * 20, "dirty": True, "root": "/work/myrepo"}},
            "prompts": prompts, "mean_tau": sum(r["tau"] for r in prompts.values()) / n, "mean_floor": 1.5,
            "mean_ddtree": {"8": 3.0}, "mean_ddtree_floor": {"8": 2.0}, "timings": {"generation": 1.0}}


def merged(*frags: dict) -> RunResult:
    """The run's result of ``frags``, each read as a process's result."""
    return report.merge([read_fragment(**f) for f in frags])


def budget(outcome: str = "pass") -> dict:
    """A drift budget of 0.1 (90 % CI 0.08-0.12) and one gate row whose drift passes or fails it."""
    err = 0.004 if outcome == "pass" else 0.05
    levels = [level_row(kind="noise", label=f"noise {e:g}", nominal=e, injected_rel_err=e, mean_tau=4.31 - e,
                        mean_drop=e / 2, drop_ci95=[e / 4, e], fitted_drop=e / 2, mean_abs_dtau=e / 2,
                        max_abs_dtau=e, within=e / 2 < 0.1) for e in (0.001, 0.01, 0.1, 0.3)]
    levels.append(level_row(kind="round", label="round bf16", nominal=None, injected_rel_err=0.0017, mean_tau=4.31))
    points = [{"injected_rel_err": lv["injected_rel_err"], "mean_drop": lv["mean_drop"],
               "fitted_drop": lv["fitted_drop"]} for lv in sorted(levels, key=lambda x: x["injected_rel_err"])]
    return {"drift_budget": budget_block(n_prompts=37, base_mean_tau=4.31, fit={"points": points}, levels=levels),
            "drift_gate": [gate_row(comparison="bf16-vs-fp32", layer=3, max_rel_err=err, worst_prompt="p1",
                                    margin=0.1 / err, passed=outcome == "pass", outcome=outcome)]}


def test_verdict_block_of_a_passing_run(tmp_path):
    data = merged({**fragment(37), **budget("pass")}).to_dict()
    report.write_reports(RunResult.from_dict(data), tmp_path)
    lines = report.verdict_lines(RunResult.from_dict(data), report_dir=tmp_path)
    assert lines[0] == ("dflash-eval: PASS — mean chain τ (macro) 3.800 >= floor 1.500 over 37 prompts, none below its "
                        "floor; drift gate PASS")
    assert "mean DDTree-8 τ (macro) 3.000 >= floor 2.000; pooled τ" in lines[1]
    assert "lowest prompts (chain τ / floor): p0 2.000 / 1.750, p1 2.100 / 1.850, p2 2.200 / 1.950" in lines[1]
    assert lines[2].startswith("drift gate: PASS, 1 of 1 comparison layers pass (drift x safety 5 below the lower "
                               "end of the drift budget 1.00e-01 (90 % CI 8.00e-02–1.20e-01))")
    assert "bf16-vs-fp32 layer 3, drift 4.00e-03" in lines[2]
    assert lines[-1] == (f"reports: {tmp_path}/ (eval.md, eval.json, eval.html, eval.png, drift_budget.png; eval.md "
                         "holds every table in full)")
    recorded = report.verdict_lines(RunResult.from_dict(data), report_dir=tmp_path, recorded=True)[0]  # floors written
    assert "none below its floor (floors written by this run); drift gate PASS" in recorded


@pytest.mark.parametrize("case, head", [
    ("prompt", "dflash-eval: FAIL (τ below its floors) — mean chain τ"),
    ("gate", "dflash-eval: FAIL (drift over budget) — "),
    ("tests", "dflash-eval: FAIL (2 tests failed) — "),
    ("exit", "dflash-eval: FAIL (pytest exit status 2) — "),
])
def test_verdict_block_names_why_a_run_fails(case, head, tmp_path):
    data = merged({**fragment(5, low="p3" if case == "prompt" else None),
                   **budget("fail" if case == "gate" else "pass")}).to_dict()
    data["verdict"] = run_verdict(RunResult.from_dict(data), failed_tests=2 if case == "tests" else 0,
                                  exitstatus=2 if case == "exit" else 0).to_dict()  # as the run's end stores it
    lines = report.verdict_lines(RunResult.from_dict(data), report_dir=tmp_path)
    assert lines[0].startswith(head), lines
    if case == "prompt":  # the failing prompt is named first, marked
        assert "1 below its floor" in lines[0] and "lowest prompts (chain τ / floor): p3 1.000 / 2.000 FAIL" in lines[1]
    if case == "gate":
        assert lines[0].endswith("drift gate FAIL") and lines[2].startswith("drift gate: FAIL, 0 of 1")
    assert not any(line.startswith("reports:") for line in lines)  # nothing written in tmp_path


def test_verdict_block_without_tau_or_gate_and_with_a_named_cause():
    refused = [{"check": "fc_shape", "message": "too small"}]
    data = merged({"worker": "master", "drift": [], "drafter": drafter_block("/d", "f", refused=refused)}).to_dict()
    lines = report.verdict_lines(RunResult.from_dict(data), report_dir=None)
    assert lines[0] == ("dflash-eval: FAIL (the drafter was refused by fc_shape) — τ not measured in this selection; "
                        "drift gate not run")
    assert lines[1].startswith("cause: the drafter /d does not fit the target: refused by architecture check fc_shape")


def _prompt_rows(text: str, title: str) -> list[str]:
    """The prompt ids of the table whose title starts ``title`` in rich text output."""
    table = text[text.index(title):]
    table = table[:table.index("└")]
    return re.findall(r"^│ (p\d+) ", table, flags=re.M)


def test_long_tables_collapse_in_the_terminal_and_stay_whole_in_eval_md(tmp_path):
    n = 40
    data = merged(fragment(n, low="p20")).to_dict()
    text = report.render_terminal(RunResult.from_dict(data))
    shown = _prompt_rows(text, "τ per prompt")
    assert shown[0] == "p20" and len(shown) == TERMINAL_ROWS_SHOWN  # the failing prompt first
    assert shown[1:] == [f"p{i}" for i in range(TERMINAL_ROWS_SHOWN - 1)]  # then the lowest τ
    assert "│ MEAN" in text and f"{TERMINAL_ROWS_SHOWN} of {n} prompts" in text
    assert f"… {n - TERMINAL_ROWS_SHOWN} more in eval.md" in text
    assert _prompt_rows(text, "acceptance per draft position") == shown  # the same prompts, same order
    assert "category code" in text and "all prompts" in text
    full = report.render_terminal(RunResult.from_dict(data), max_rows=None)  # pytest -v
    assert len(_prompt_rows(full, "τ per prompt")) == n and "more in eval.md" not in full
    md = report.write_reports(RunResult.from_dict(data), tmp_path)["md"].read_text()
    assert all(f"| p{i} |" in md for i in range(n))
    small = report.render_terminal(merged(fragment(TERMINAL_ROWS_FULL)))
    assert len(_prompt_rows(small, "τ per prompt")) == TERMINAL_ROWS_FULL and "more in eval.md" not in small


def test_eval_md_provenance_is_plain_text_with_normalised_paths(tmp_path):
    md = report.render_markdown(merged(fragment(3)))
    assert "- target: `/work/myrepo/models/t`" in md and "`/work/myrepo/ckpt/step_a.pt`" in md
    assert "dtype bfloat16," in md and "torch." not in md
    assert "versions: torch 2.13.0, transformers 5.20.0, fla not installed, python 3.11.7" in md
    assert "{" not in md.split("### τ per prompt")[0]  # no dict repr in the header block
    assert f"- ran on host build-7, git commit {'ab' * 6} (uncommitted changes) in `/work/myrepo`" in md
    assert "drafter step_a.pt" in report.render_terminal(merged(fragment(3)))


def test_a_plot_of_an_earlier_run_is_not_left_behind(tmp_path):
    report.write_reports(merged({**fragment(3), **budget()}), tmp_path)
    assert (tmp_path / "drift_budget.png").is_file()
    paths = report.write_reports(merged(fragment(3)), tmp_path)  # no budget this time
    assert "budget_png" not in paths and not (tmp_path / "drift_budget.png").exists()
    assert (tmp_path / "eval.png").is_file()


@pytest.mark.parametrize("outcome, colour", [("pass", "#1b7837"), ("fail", "#b2182b")])
def test_drift_budget_plot_reads_without_the_docs(outcome, colour, tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    data = merged({**fragment(3), **budget(outcome)})
    fig = budget_figure(data)
    try:
        title = fig._suptitle
        err = 0.004 if outcome == "pass" else 0.05
        rel = "<=" if outcome == "pass" else ">"
        assert title.get_text() == (f"drift gate {outcome.upper()}: worst measured drift {err:.2g} (bf16-vs-fp32) x "
                                    f"safety 5 = {5 * err:.2g} {rel} budget 0.1 (90 % CI 0.08–0.12)")
        assert to_hex(title.get_color()) == colour
        assert any("budget = injected feature error at which the fitted mean τ drop reaches 0.1" in t.get_text()
                   for t in fig.texts)
        ax_d, ax_t = fig.axes
        assert ax_d.get_ylim()[0] <= 0.0 and ax_t.get_ylim()[0] == 1.0  # no axis cut to exaggerate a change
        legend = fig.legends[0]
        labels = [t.get_text() for t in legend.get_texts()]
        assert min(t.get_fontsize() for t in legend.get_texts()) >= FONT_PT >= 9
        assert "tolerance: mean τ drop 0.1" in labels and "monotone fit of the mean drop (isotonic)" in labels
        assert any(lb.startswith("budget's 90 % CI 0.08–0.12") for lb in labels)
        assert any(lb.startswith("measured drift x safety 5, bf16-vs-fp32") for lb in labels)
        assert min(t.get_fontsize() for t in ax_d.get_xticklabels()) >= FONT_PT
    finally:
        plt.close(fig)
    assert report.write_budget_plot(data, tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
