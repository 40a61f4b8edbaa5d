"""Unit tests of dflash_eval.report (merging xdist fragments, tables, files, re-judging against rewritten floors)
and option resolution."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from result_rows import drafter_block, prompt_row
from result_rows import fragment as read_fragment

from dflash_eval import report
from dflash_eval.errors import ConfigError
from dflash_eval.options.settings import OPTIONS, OPTIONS_BY_NAME, EvalSettings
from dflash_eval.pytest_plugin import safe_id, settings_from_config
from dflash_eval.session.run_result import RunResult


def fragment(worker, prompts, drift=()):
    return {
        "worker": worker, "settings": {"max_new_tokens": 8}, "target": {"path": "/t", "identity": "i" * 64},
        "drafter": drafter_block(),
        "prompts": {p: prompt_row(category="c", tau=tau, rounds=3, accept_lengths=[1, 2, 3], histogram=[1, 1, 1],
                                  ddtree={"8": tau + 0.5}, floor=1.5, ddtree_floor={"8": 2.0}, passed=tau >= 1.5)
                    for p, tau in prompts.items()},
        "mean_tau": 2.0, "mean_floor": 1.5, "mean_ddtree": {"8": 2.5}, "mean_ddtree_floor": {"8": 2.0},
        "drift": [{"comparison": "c1", "prompt_id": p, "layer": 0, "rel_err": 1e-3, "cos": 0.9999, "max_abs": 0.1,
                   "rel_tol": 5e-3, "cos_tol": 0.999, "passed": True} for p in drift],
        "drift_accept": [{"comparison": "c1", "prompt_id": p, "tau_a": 2.0, "tau_b": 2.1, "diff": 0.1, "tol": 0.5,
                          "passed": True, "a": "torch/float32", "b": "torch-recurrent/float32"} for p in drift],
        "timings": {"generation": 1.0}, "cache": {"hits": 1},
    }


def merged(frags: list[dict], **kw) -> dict:
    """eval.json's data merged of ``frags``, each read as a process's result (``kw``: the merge's)."""
    return report.merge([read_fragment(**f) for f in frags], **kw).to_dict()


def test_merge_dedupes_workers_and_sums_timings():
    data = merged([fragment("gw0", {"a": 2.0, "b": 1.0}, drift=["a"]),
                         fragment("gw1", {"a": 2.0, "b": 1.0}, drift=["a", "b"])],
                        outcomes={"x::t1": "passed", "x::t2": "failed"}, wall_s=3.0)
    assert list(data["prompts"]) == ["a", "b"] and len(data["drift"]) == 2 and len(data["drift_accept"]) == 2
    assert data["timings"]["sum"]["generation"] == 2.0 and set(data["timings"]["per_worker"]) == {"gw0", "gw1"}
    assert data["tests"]["counts"] == {"passed": 1, "failed": 1}
    assert data["mean_passed"] is True


def test_render_and_write(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    data = merged([fragment("master", {"a": 2.0, "b": 1.0}, drift=["a"])])
    text = report.render_terminal(RunResult.from_dict(data))
    assert "DDTree-8 τ" in text and "FAIL" in text and "PASS" in text and "c1" in text
    paths = report.write_reports(RunResult.from_dict(data), tmp_path / "reports")
    assert json.loads(paths["json"].read_text())["prompts"]["b"]["passed"] is False
    md = paths["md"].read_text()
    assert "| a | 2.000 | 2.500 | 1.500 |" in md and "Hidden-state drift" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary.read_text() == md + "\n"


def test_a_plot_is_drawn_once_for_the_same_numbers(tmp_path, monkeypatch):
    """A warm run (the same numbers, other timings) keeps the plot it finds drawn from them; other numbers redraw it."""
    from dflash_eval.report import plot

    data = merged([fragment("master", {"a": 2.0, "b": 1.0})])
    path = tmp_path / "eval.png"
    assert report.write_plot(RunResult.from_dict(data), path) == path
    first = path.read_bytes()
    drawn: list[str] = []
    monkeypatch.setattr(plot, "save_png", lambda fig, p, stamp=None: drawn.append(stamp) or p)
    again = {**data, "timings": {**data["timings"], "wall_s": 99.0}, "created": "later"}
    assert report.write_plot(RunResult.from_dict(again), path) == path and not drawn and path.read_bytes() == first
    changed = merged([fragment("master", {"a": 2.5, "b": 1.0})])
    assert report.write_plot(RunResult.from_dict(changed), path) == path and len(drawn) == 1 and drawn[0] != \
        plot.plot_stamp(data, plot.eval_figure)


def test_a_new_report_folder_copies_the_plot_from_the_cache_folders_store(tmp_path, monkeypatch):
    """A warm run writing to a new report folder (a CI job that restores the cache, not the reports) copies each plot
    drawn from the same numbers out of the cache folder's store; other numbers are drawn and stored too; a store that
    cannot be written only means drawing; the store keeps its newest plots."""
    from dflash_eval.report import plot

    store = tmp_path / "cache" / "plots"
    data = {**merged([fragment("master", {"a": 2.0, "b": 1.0})]), "settings": {"report_dir": "one"}}
    first = report.write_reports(RunResult.from_dict(data), tmp_path / "one", plot_store=store)
    stamp = plot.plot_stamp(data, plot.eval_figure)
    assert (store / f"{stamp}.png").read_bytes() == first["png"].read_bytes()

    drawn: list[str] = []
    real_save = plot.save_png
    monkeypatch.setattr(plot, "save_png", lambda fig, p, stamp=None: drawn.append(stamp) or real_save(fig, p, stamp))
    later = RunResult.from_dict({**data, "created": "later", "settings": {"report_dir": "two"}})
    again = report.write_reports(later, tmp_path / "two",
                                 plot_store=store)  # a warm run's eval.json: the same numbers, another folder
    assert not drawn and again["png"].read_bytes() == first["png"].read_bytes()
    timed, read = ({**data, "speedup": {"best": "chain", "cached": c}} for c in (False, True))  # cold, warm costs
    assert plot.plot_stamp(timed, plot.eval_figure) == plot.plot_stamp(read, plot.eval_figure) != plot.plot_stamp(
        {**read, "speedup": {"best": "ddtree-8", "cached": True}}, plot.eval_figure)
    (store / f"{stamp}.png").write_bytes(b"not a png")  # a damaged stored plot is drawn again, not copied
    assert report.write_plot(RunResult.from_dict(data), tmp_path / "three" / "eval.png", store) is not None
    assert drawn == [stamp]
    assert plot._stamp_of(store / f"{stamp}.png") == stamp

    changed = merged([fragment("master", {"a": 2.5, "b": 1.0})])
    (tmp_path / "blocked").write_text("a file where the store's folder would be")
    assert report.write_plot(RunResult.from_dict(changed), tmp_path / "five" / "eval.png",
                             tmp_path / "blocked" / "plots") is not None

    monkeypatch.setattr(plot, "PLOT_STORE_KEEP", 2)
    for a in (3.0, 3.5, 4.0):
        report.write_plot(RunResult.from_dict(merged([fragment("master", {"a": a, "b": 1.0})])),
                          tmp_path / f"p{a}.png", store)
    assert len(list(store.glob("*.png"))) == 2


def test_safe_id_never_contains_tau():
    assert "tau" not in safe_id("restaurant-Tau-3").lower()
    assert safe_id("humaneval-3") == "humaneval-3"


def fake_config(tmp_path, cli=None, ini=None):
    cli, ini = cli or {}, ini or {}
    (tmp_path / "root").mkdir(exist_ok=True)
    (tmp_path / "root" / "pyproject.toml").write_text('[project]\nname = "dflash-eval"\n')  # a checkout: its defaults
    return SimpleNamespace(
        invocation_params=SimpleNamespace(dir=tmp_path / "cwd"), rootpath=tmp_path / "root",
        inipath=tmp_path / "root" / "pyproject.toml",
        getoption=lambda name, default=None: cli.get(name),
        getini=lambda name: ini.get(name, ""),
    )


def test_precedence_cli_env_ini_default(tmp_path, monkeypatch):
    monkeypatch.delenv("DFLASH_EVAL_MAX_NEW_TOKENS", raising=False)
    s = settings_from_config(fake_config(tmp_path))
    assert s.max_new_tokens == 128 and s.target_model == tmp_path / "root" / "fixtures" / "target"
    assert s.origins["max_new_tokens"] == "default"
    s = settings_from_config(fake_config(tmp_path, ini={"dflash_max_new_tokens": "64", "dflash_prompts": "p.jsonl"}))
    assert s.max_new_tokens == 64 and s.prompts == str(tmp_path / "root" / "p.jsonl") and s.origins["prompts"] == "ini"
    monkeypatch.setenv("DFLASH_EVAL_MAX_NEW_TOKENS", "32")
    monkeypatch.setenv("DFLASH_EVAL_DDTREE_BUDGET", "4,8")
    s = settings_from_config(fake_config(tmp_path, ini={"dflash_max_new_tokens": "64"}))
    assert s.max_new_tokens == 32 and s.ddtree_budget == (4, 8) and s.origins["max_new_tokens"] == "env"
    s = settings_from_config(fake_config(tmp_path, cli={"max_new_tokens": "16", "ddtree_budget": ["2", "3,2"],
                                                        "target_model": "t"}))
    assert s.max_new_tokens == 16 and s.ddtree_budget == (2, 3) and s.target_model == tmp_path / "cwd" / "t"
    assert s.prompts == f"humaneval:16,{tmp_path / 'root' / 'fixtures' / 'prompts.jsonl'}"  # default: rootdir
    s = settings_from_config(fake_config(tmp_path, cli={"prompts": "humaneval:3, sub/p.jsonl,/abs/q.jsonl"}))
    assert s.prompts == f"humaneval:3,{tmp_path / 'cwd' / 'sub' / 'p.jsonl'},/abs/q.jsonl"
    assert s.chat_template == "auto"


@pytest.mark.parametrize("values, needle", [
    ({"hidden_state_backend": "nope"}, "unknown backend 'nope'"),
    ({"reference_backend": "cuda"}, "unknown backend 'cuda'"),
    ({"max_new_tokens": "0"}, "--max-new-tokens must be >= 1"),
    ({"ddtree_budget": "x"}, "--ddtree-budget: expected integers"),
    ({"completions": "sglang"}, "needs --sglang-url"),
    ({"dtype": "int8"}, "unknown dtype"),
])
def test_bad_settings_are_clear_errors(values, needle):
    with pytest.raises(ConfigError, match=needle):
        EvalSettings.from_mapping(values)


def test_every_option_has_help_env_and_ini():
    for o in OPTIONS:
        assert o.help and o.env.startswith("DFLASH_EVAL_") and o.ini.startswith("dflash_")
    # the options with "tau" in their flag, listed on purpose (a new one is added here deliberately)
    assert {o.name for o in OPTIONS if "tau" in o.flag} == {"tau_floor", "tau_floor_prompt", "update_tau_floors",
                                                            "tau_margin", "tau_margin_sigmas", "online_tau"}
    for name in ("tau_floor_prompt", "allow_settings_mismatch", "baseline", "baseline_drop_tol", "baseline_rise_tol"):
        assert name in OPTIONS_BY_NAME, name
    assert Path(EvalSettings.from_mapping({}).cache_dir) == Path(".dflash_cache")


def test_category_tables_and_floors(tmp_path):
    from dflash_eval.golden.writer import write_floors
    from dflash_eval.metrics.floors import load_floors, make_floors

    frag = fragment("master", {"a": 2.0, "b": 1.0, "c": 4.0})
    frag["prompts"]["c"]["category"] = "code"
    data = merged([frag])
    cats = data["categories"]
    assert set(cats) == {"c", "code", "all"} and cats["c"]["n"] == 2 and cats["all"]["n"] == 3
    assert cats["c"]["chain"]["mean"] == 1.5 and cats["c"]["chain"]["median"] == 1.5
    lo, hi = cats["c"]["chain"]["ci95"]  # 2 prompts: no skewness, Student's t: 1.5 ± t(0.975, 1) 0.5 = 12.7062 x 0.5
    assert (lo, hi) == pytest.approx((1.5 - 12.706205 * 0.5, 1.5 + 12.706205 * 0.5))
    assert cats["c"]["chain"]["ci_method"] == "Hall t over prompts"
    assert all(math.isnan(x) for x in cats["code"]["chain"]["ci95"])  # one prompt: no interval
    assert cats["c"]["ddtree"]["8"]["mean"] == 2.0 and cats["c"]["passed"] is None
    header, rows = report.category_rows(RunResult.from_dict(data))
    assert header[:5] == ["category", "n", "chain τ", "median", "CI95"]
    assert [r[0] for r in rows] == ["c", "code", "all"]
    result = RunResult.from_dict(data)
    assert "τ per category" in report.render_terminal(result) and "### τ per category" in report.render_markdown(result)
    # category floors: the mean of the per-prompt floors of the category's prompts in the run
    doc = make_floors({"a": 1.75, "b": 1.25, "c": 4.25}, {8: {"a": 2.25, "b": 1.75, "c": 4.75}}, margin=0.25,
                      context={"max_new_tokens": 8}, previous={"chain": {"old": 3.0}})
    assert doc["chain"] == {"a": 1.5, "b": 1.0, "c": 4.0, "old": 3.0}
    assert doc["ddtree"] == {"8": {"a": 2.0, "b": 1.5, "c": 4.5}} and "categories" not in doc
    path = tmp_path / "floors.json"
    write_floors(path, doc)
    fl = load_floors(path).select({p: r["category"] for p, r in data["prompts"].items()})
    assert fl.for_category("code") == 4.0 and fl.for_category("c", 8) == 1.75 and fl.for_category("x") is None
    assert load_floors(path, prompt_override=1.1).select({"y": "x"}).for_category("x", 8) == 1.1
    assert load_floors(path, mean_override=1.1).select({"y": "x"}).for_category("x", 8) is None
    judged = RunResult.from_dict(data).judged(load_floors(path))  # selects the run's prompts itself
    cats = judged.categories
    assert cats["c"].floor == 1.25 and cats["c"].passed is True and cats["code"].passed is True
    assert cats["all"].floor == pytest.approx(6.5 / 3) and cats["all"].passed is True
    assert judged.tau.mean_floor == pytest.approx(6.5 / 3)

def test_prompt_spec_resolution(tmp_path):
    from dflash_eval.options.settings import resolve_prompt_spec

    (tmp_path / "here.jsonl").write_text('{"text": "x"}\n')
    assert resolve_prompt_spec("humaneval:2, here.jsonl", tmp_path) == f"humaneval:2,{tmp_path / 'here.jsonl'}"
    assert resolve_prompt_spec("nope", tmp_path) == "nope"  # an unknown set name stays a name (clear error later)
    assert resolve_prompt_spec("mbpp:3", tmp_path) == "mbpp:3"  # a built-in set name too
    assert resolve_prompt_spec("d/p.jsonl", None) == "d/p.jsonl"
    # local data NAME=PATH[:FIELD][:N] and set definition files: the path is made absolute, the rest kept
    assert resolve_prompt_spec("gsm8k=data/g:question:5, sets.yaml", tmp_path) == \
        f"gsm8k={tmp_path / 'data/g'}:question:5,{tmp_path / 'sets.yaml'}"
    with pytest.raises(ConfigError, match="unknown prompt set 'nope'"):
        from dflash_eval.prompts import load_prompt_spec

        load_prompt_spec("nope")


def budget_fragment(worker, gate_err):
    f = fragment(worker, {"a": 2.0}, drift=["a"])
    levels = [{"kind": "noise", "label": f"noise {e:g}", "nominal": e, "injected_rel_err": e, "mean_tau": 2.0 - d,
               "mean_drop": d, "drop_ci95": [d / 2, d * 2], "fitted_drop": d, "mean_abs_dtau": d,
               "max_abs_dtau": 2 * d, "within": d < 0.1, "drop": {"a": d}}
              for e, d in ((1e-3, 0.0), (1e-1, 0.05), (3e-1, 0.4))]
    levels.append({"kind": "round", "label": "round fp8", "nominal": "fp8", "injected_rel_err": 2.6e-2,
                   "mean_tau": 2.0, "mean_drop": 0.0, "drop_ci95": [0.0, 0.0], "fitted_drop": 0.0,
                   "mean_abs_dtau": 0.0, "max_abs_dtau": 0.0, "within": True, "drop": {"a": 0.0}})
    f["drift_budget"] = {"drafter": "f" * 64, "base": "torch/float32", "n_prompts": 1, "prompt_ids": ["a"],
                         "base_mean_tau": 2.0, "base_tau": {"a": 2.0}, "tol": 0.1, "safety": 10.0, "seed": 0,
                         "ladder": "1e-3,1e-1,3e-1,fp8", "budget": 0.1, "ci": [0.05, 0.2], "ci_level": 0.9,
                         "status": "crossed", "lower_bound": False, "gate_limit": 0.01, "skipped": [],
                         "min_prompts": 1, "n_measured": 1, "selected_prompts": None, "conclusive": False,
                         "rule": "...",
                         "fit": {"method": "isotonic", "status": "crossed", "n_prompts": 1, "ci_level": 0.9,
                                 "resamples": 0, "crossed_share": 1.0, "points": [
                             {"injected_rel_err": lv["injected_rel_err"], "mean_drop": lv["mean_drop"],
                              "fitted_drop": lv["fitted_drop"]} for lv in levels]}, "levels": levels}
    outcome = "pass" if gate_err * 10 <= 0.05 else "fail" if gate_err * 10 > 0.2 else "inconclusive"
    f["drift_gate"] = [{"comparison": "c1", "layer": 0, "max_rel_err": gate_err, "mean_rel_err": gate_err,
                        "worst_prompt": "a", "budget": 0.1, "budget_ci": [0.05, 0.2], "safety": 10.0,
                        "margin": 0.1 / gate_err, "lower_bound": False, "passed": outcome == "pass",
                        "outcome": outcome, "decided_on": "ci"}]
    return f


def test_drift_budget_in_the_reports(tmp_path):
    data = merged([budget_fragment("gw0", 1e-3), budget_fragment("gw1", 1e-3)])
    assert data["drift_budget"]["budget"] == 0.1 and len(data["drift_gate"]) == 1  # de-duplicated across workers
    text = report.render_terminal(RunResult.from_dict(data))
    assert "drift budget: τ against injected feature error" in text and "round fp8" in text
    assert "drift gate" in text and "100x" in text and "PASS" in text
    assert "drift budget of drafter ffffffffffff: 1.00e-01 (90 % CI 5.00e-02–2.00e-01)" in text
    md = report.render_markdown(RunResult.from_dict(data))
    assert "### Drift budget and gate" in md
    assert "| c1 | 0 | 1.00e-03 | a | 1.00e-02 | 1.00e-01 | 0.05–0.2 | 100x | PASS |" in md
    paths = report.write_reports(RunResult.from_dict(data), tmp_path / "r")
    assert paths["budget_png"] == tmp_path / "r" / "drift_budget.png"
    assert paths["budget_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    over = merged([budget_fragment("master", 3e-2)])
    assert "| c1 | 0 | 3.00e-02 | a | 3.00e-01 | 1.00e-01 | 0.05–0.2 | 3.33x | FAIL |" in \
        report.render_markdown(RunResult.from_dict(over))
    assert report.measured_drifts(RunResult.from_dict(over)) == {"c1": 3e-2}
    inside = merged([budget_fragment("master", 1e-2)])
    assert "| 10x | INCONCLUSIVE |" in report.render_markdown(RunResult.from_dict(inside))
    plain = report.write_reports(RunResult.from_dict(merged([fragment("master", {"a": 2.0})])),
                                 tmp_path / "plain")
    assert "budget_png" not in plain and not (tmp_path / "plain" / "drift_budget.png").exists()


def test_drift_budget_fields_are_strict_json_and_valid(tmp_path):
    """A gate row with zero drift (margin inf) and a level without any round (NaN) become null in eval.json; the
    schema accepts them and the tables and plot still render."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    from importlib import resources

    f = budget_fragment("master", 1e-3)
    f["drift_gate"].append({**f["drift_gate"][0], "layer": 1, "max_rel_err": 0.0, "margin": float("inf")})
    f["drift_budget"]["levels"].append({**f["drift_budget"]["levels"][0], "label": "noise 1", "nominal": 1.0,
                                        "mean_tau": float("nan"), "mean_drop": float("nan"),
                                        "drop_ci95": [float("nan")] * 2, "max_abs_dtau": float("nan"),
                                        "within": False})
    paths = report.write_reports(RunResult.from_dict(merged([f])), tmp_path / "r")
    data = json.loads(paths["json"].read_text())
    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    assert data["drift_gate"][1]["margin"] is None and data["drift_budget"]["levels"][-1]["mean_tau"] is None
    text = report.render_terminal(RunResult.from_dict(data))
    assert "| c1 | 1 | 0.00e+00 | a | 0.00e+00 | 1.00e-01 | 0.05–0.2 | inf | PASS |" in \
        report.render_markdown(RunResult.from_dict(data))
    assert "noise 1" in text and paths["budget_png"].is_file()
    bad = {**data, "drift_gate": [{"comparison": "c1", "layer": "one", "max_rel_err": 1e-3, "budget": 0.1,
                                   "safety": 5.0, "passed": True}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid(bad)
