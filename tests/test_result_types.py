"""The typed result: :class:`~dflash_eval.session.eval_result.EvalResult` is dataclasses all the way down (no field
is a bare dict or a list of dicts, except the blocks whose layout another part of the suite owns), its ``to_dict``
is eval.json's fragment with its keys in eval.json's order and reads back through ``from_dict``; the registered
measurements travel into the merged eval.json and its tables; the verdict is composed in one place.

Run: ``pytest tests/test_result_types.py -p no:cacheprovider``
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from result_rows import judged_run, kernel_change, means

from dflash_eval import report
from dflash_eval.errors import ResultKeyError
from dflash_eval.metrics.baseline import BaselineComparison
from dflash_eval.metrics.drift_checks import DriftStat, GateCheck
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.verdict import (
    Part,
    Threshold,
    Verdict,
    checkpoint_verdict,
    compose,
    notice,
    plateau_part,
    regression_part,
    run_verdict,
)
from dflash_eval.session.blocks import DrafterBlock, DriftBudgetBlock, FingerprintBlock
from dflash_eval.session.eval_result import EvalResult, TauSummary
from dflash_eval.session.rows import PromptRow, Row
from dflash_eval.session.run_result import RunResult

NAN = float("nan")

#: EvalResult's blocks carried as eval.json holds them (their layout belongs to another part of the suite).
OPAQUE = {"settings", "cache", "sglang", "measurements"}
#: Row fields of that kind: the drafter's config (DrafterConfig.to_dict) and the reference drafter's block; the
#: kernel probe's probes and a change's shape (target.kernel_registry's layout), the witness's checks.
OPAQUE_ROW_FIELDS = {("DrafterBlock", "config"), ("DrafterBlock", "reference"),
                     ("FingerprintBlock", "versions"), ("FingerprintBlock", "kernel_probe"),
                     ("KernelProbeBlock", "probes"), ("KernelChange", "shape"), ("KernelChange", "witness"),
                     ("ProvenanceBlock", "witness")}


def _bare(hint: Any) -> bool:
    """A dict whose values are untyped (Any) or dicts, or a list of dicts (at any depth of containers)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_bare(a) for a in args)
    if hint is dict or origin is dict and (not args or args[1] is Any or typing.get_origin(args[1]) is dict):
        return True
    if origin is list and args and (args[0] is dict or typing.get_origin(args[0]) is dict):
        return True
    return any(_bare(a) for a in args) if origin in (dict, list) else False


def _rows(hint: Any) -> set[type]:
    """The row classes a type mentions."""
    if isinstance(hint, type) and issubclass(hint, Row):
        return {hint}
    return {r for a in typing.get_args(hint) for r in _rows(a)}


def test_eval_result_has_no_bare_dicts_left():
    hints = typing.get_type_hints(EvalResult)
    bare = [n for n, h in hints.items() if n not in OPAQUE and _bare(h)]
    assert not bare, f"EvalResult fields still untyped dicts: {bare}"
    seen, todo, found = set(), set().union(*(_rows(h) for h in hints.values())), []
    todo |= _rows(typing.get_type_hints(TauSummary)["prompts"]) | _rows(typing.get_type_hints(TauSummary)["categories"])
    todo |= {r for n in ("conversations", "turns") for r in _rows(typing.get_type_hints(TauSummary)[n])}
    while todo:
        cls = todo.pop()
        seen.add(cls)
        for name, h in typing.get_type_hints(cls).items():
            if (cls.__name__, name) not in OPAQUE_ROW_FIELDS and _bare(h):
                found.append(f"{cls.__name__}.{name}")
            todo |= _rows(h) - seen
    assert not found, f"row fields still untyped dicts: {found}"
    assert {c.__name__ for c in seen} >= {"PromptRow", "OnlineRow", "CategoryRow", "Stat", "Acceptance",
                                          "ConversationRow", "TurnRow", "DrafterBlock", "Refusal",
                                          "DriftAcceptRow", "DriftBudgetBlock", "BudgetLevel", "FingerprintBlock",
                                          "LayerFingerprint"}
    assert hints["drift"] == list[DriftStat] | None and hints["drift_gate"] == list[GateCheck] | None  # the checks
    assert _bare(dict[str, Any]) and _bare(list[dict[str, float]]) and not _bare(dict[str, list[float]])


def _stat(mean: float) -> dict[str, Any]:
    return {"n": 2, "mean": mean, "median": mean, "ci95": [mean - 0.1, mean + 0.1]}


def _acceptance(tau: float) -> dict[str, Any]:
    return {"rounds": 3, "tau": tau, "histogram": [1, 1, 1], "position_rates": [2 / 3, 1 / 3]}


def _prompt(tau: float, **extra: Any) -> dict[str, Any]:
    return {"category": "chat", "tau": tau, "rounds": 3, "accept_lengths": [1, 2, 3], "histogram": [1, 1, 1],
            "position_rates": [2 / 3, 1 / 3], "ddtree": {"8": tau + 0.5}, "ddtree_accept_lengths": {"8": [2, 2]},
            "floor": 1.5, "ddtree_floor": {"8": None}, "prompt_tokens": 5, "completion_tokens": 7,
            "passed": None, **extra}


def fragment() -> dict[str, Any]:
    """A representative fragment: a sampled, online, multi-turn run against an SGLang server, with drift, its budget
    and gate, a refused drafter, the fingerprint and a measurement; NaN where eval.json may hold one."""
    online = {**_acceptance(2.0), "accept_lengths": [1, 2, 3], "tokens": 6, "matches_reference": False,
              "first_divergence": 4, "samples": 2, "sample_tau": [1.5, 2.5]}
    sampled = {"samples": 2, "sample_tau": [1.5, 2.5], "sample_ci95": [1.0, 3.0], "ddtree_sample_tau": {"8": [2, 3]}}
    return {
        "worker": "gw0", "settings": {"max_new_tokens": 8}, "timings": {"tau": 1.5}, "counts": {"prompts": 2},
        "cache": {"hits": 1}, "errors": ["e"], "spans": [["tau", 0.0, 1.5]], "sglang": {"url": "http://h"},
        "target": {"path": "/t", "identity": "i"}, "provenance": {"backend": "torch"},
        "drafter": {"path": "/d", "fingerprint": "f", "config": {"block_size": 4},
                    "refused": [{"check": "vocab", "message": "m"}], "reference": {"path": "/r"}, "step": 3},
        "context": {"target": "i"},
        "prompts": {"c-t1": _prompt(2.0, **sampled, server_accept_length=2.5, server_histogram=[0, 1, 2],
                                    server_position_rates=[1.0, 2 / 3], conversation="c", turn=1, online=online,
                                    baseline_tau=1.75),
                    "p": _prompt(NAN, passed=False)},
        "mean_tau": 2.0, "mean_ddtree": {"8": 2.5}, "mean_floor": None, "mean_ddtree_floor": {"8": None},
        "categories": {c: {"n": 2, "chain": _stat(2.0), "ddtree": {"8": _stat(2.5)},
                           "acceptance": {"chain": _acceptance(2.0), "server": _acceptance(2.5)}, "floor": None,
                           "ddtree_floor": {"8": None}, "passed": None} for c in ("chat", "all")},
        "conversations": {"c": {"category": "chat", "turns": ["c-t1"], "turn_tau": [2.0], **_acceptance(2.0)}},
        "turns": {"1": {"chain": _stat(2.0), "acceptance": _acceptance(2.0)}},
        "drift": [{"comparison": "c1", "prompt_id": "p", "layer": 0, "rel_err": NAN, "cos": 0.99, "max_abs": 0.1,
                   "rel_tol": 5e-3, "cos_tol": 0.999, "passed": False}],
        "drift_accept": [{"comparison": "c1", "prompt_id": "p", "tau_a": 2.0, "tau_b": 2.1, "diff": 0.1, "tol": 0.5,
                          "passed": True, "a": "torch/float32", "b": "torch-recurrent/float32"}],
        "drift_budget": {"drafter": "f", "base": "torch/float32", "n_prompts": 1, "prompt_ids": ["p"],
                         "base_mean_tau": 2.0, "base_tau": {"p": 2.0}, "tol": 0.05, "safety": 2.0, "seed": 0,
                         "ladder": "0.01", "budget": 0.01, "ci": [0.01, float("inf")], "ci_level": 0.9,
                         "status": "not_reached", "lower_bound": True, "gate_limit": 0.005, "skipped": [],
                         "min_prompts": 1, "n_measured": 1, "selected_prompts": None, "conclusive": False,
                         "rule": "r", "fit": {"method": "m", "points": [{"injected_rel_err": 0.01, "mean_drop": 0.0,
                                                                         "fitted_drop": 0.0}],
                                              "status": "not_reached", "n_prompts": 1, "ci_level": 0.9,
                                              "resamples": 2000, "crossed_share": 0.0},
                         "levels": [{"kind": "noise", "label": "noise 1e-2", "nominal": 0.01, "injected_rel_err": 0.01,
                                     "mean_tau": 2.0, "mean_drop": 0.0, "drop_ci95": [0.0, 0.0], "fitted_drop": 0.0,
                                     "mean_abs_dtau": 0.0, "max_abs_dtau": NAN, "within": True, "drop": {"p": 0.0}}]},
        "drift_gate": [{"comparison": "c1", "layer": 0, "max_rel_err": 1e-3, "mean_rel_err": 1e-3, "worst_prompt": "p",
                        "budget": 0.01, "budget_ci": [0.01, float("inf")], "safety": 2.0, "margin": 10.0,
                        "lower_bound": True, "passed": True, "outcome": "pass", "decided_on": "ci"}],
        "fingerprint": {"target": "i", "text": "t", "tokens": "k", "n_tokens": 3, "backend": "torch",
                        "kernel_fault": None, "dtype": "float32", "device_kind": "cpu",
                        "layers": {"0": {"mean": 0.0, "std": 1.0, "rms": 1.0, "absmax": 2.0, "row_norm_mean": 3.0,
                                         "sketch": [0.5]}}, "versions": {"torch": "2"}, "kernel_probe": {"k": "d"}},
        "measurements": {"m": {"summary": {"ok": 1}, "rows": [["a", 1.0]]}},
    }


def _json(x: Any) -> str:
    return json.dumps(x, allow_nan=True)  # key order counts: it is visible in eval.json


def test_to_dict_round_trips_a_representative_result():
    frag = fragment()
    result = EvalResult.from_dict(frag)
    assert result.tau is not None and result.drafter is not None
    assert math.isnan(result.tau.prompts["p"].tau) and result.tau.prompts["c-t1"].online.first_divergence == 4
    assert result.tau.prompts["c-t1"].tau == 2.0 and result.tau.categories["all"].chain.mean == 2.0
    assert result.tau.prompts["p"].online is None and result.tau.conversations["c"].turns == ["c-t1"]
    assert result.drafter.refused[0].check == "vocab" and result.drift_budget.levels[0].within
    assert result.fingerprint.layers["0"].sketch == [0.5] and result.drift_gate[0].outcome == "pass"
    out = result.to_dict()
    order = ["worker", "settings", "timings", "counts", "cache", "errors", "spans", "sglang", "target", "provenance",
             "drafter", "context", "prompts", "mean_tau", "mean_ddtree", "mean_floor", "mean_ddtree_floor",
             "categories", "conversations", "turns", "drift", "drift_accept", "drift_budget", "drift_gate",
             "fingerprint", "measurements"]
    assert list(out) == order
    assert _json(out) == _json({k: frag[k] for k in order})  # every key, in eval.json's order, NaN as it was
    assert _json(EvalResult.from_dict(json.loads(_json(out))).to_dict()) == _json(out)


def test_optional_members_are_left_out_while_unset():
    greedy = {k: v for k, v in fragment().items() if k not in ("drift_budget", "drift_gate", "measurements",
                                                                 "conversations", "turns")}
    greedy["prompts"] = {"p": _prompt(2.0)}
    greedy["drafter"] = {"path": "/d", "fingerprint": "f", "config": {}}
    result = EvalResult.from_dict(greedy)
    row = result.to_dict()["prompts"]["p"]
    assert list(row) == list(_prompt(2.0))  # no sample, server, conversation, online or baseline keys
    assert result.to_dict()["drafter"] == greedy["drafter"]
    assert "drift_budget" not in result.to_dict() and "measurements" not in result.to_dict()


def test_in_process_api_is_attribute_access():
    tau = TauSummary.from_dict(fragment())
    assert tau.prompts["c-t1"].tau == 2.0 and tau.prompts["c-t1"].server_histogram == [0, 1, 2]
    assert tau.categories["chat"].acceptance["server"].tau == 2.5 and tau.turns["1"].acceptance.rounds == 3
    assert isinstance(EvalResult.from_dict(fragment()).drift_budget, DriftBudgetBlock)
    assert dataclasses.is_dataclass(DrafterBlock) and dataclasses.is_dataclass(FingerprintBlock)


def test_measurements_reach_the_merged_report_and_its_tables(tmp_path):
    frags = [fragment(), {**fragment(), "worker": "gw1", "measurements": {"m": {"summary": {"ok": 2}, "rows": []},
                                                                          "n": {}, "o": {"rows": [["x", "y"]]}}}]
    frags[0]["measurements"]["n"] = {}
    run = report.merge([EvalResult.from_dict(f) for f in frags], wall_s=1.0)
    assert run.measurements == {"m": {"summary": {"ok": 1}, "rows": [["a", 1.0]]}, "o": {"rows": [["x", "y"]]}}
    without = report.merge([EvalResult.from_dict({k: v for k, v in fragment().items() if k != "measurements"})])
    assert "measurements" not in without.to_dict()
    md = report.write_reports(run, tmp_path)["md"].read_text()
    assert "### Measurement: m" in md and "| a | 1 |" in md and "ok 1" in md and "### Measurement: o" in md
    text = report.render_terminal(run)
    assert "measurement: m" in text and "measurement: o" in text
    assert "measurement:" not in report.render_terminal(without)


def two_workers() -> list[dict[str, Any]]:
    """Two workers' fragments as they send them: the same prompts and drift rows measured by both (de-duplicated), a
    prompt and a drift row only the second measured, each one's kernel probe (a probe both ran, a change only the
    second noticed), compilation, timings and spans, a near tie each, the drafter refused only in the second's."""
    gw0 = {**fragment(), "drafter": {"path": "/d", "fingerprint": "f", "config": {"block_size": 4}}}
    gw0["provenance"] = {"backend": "torch", "kernel_probe": {"seconds": 0.5, "changed": [], "probes": [
        {"backend": "torch", "dtype": "float32", "shape": {"tokens": 8}, "digest": "d0", "seconds": 0.5}]}}
    gw0["compile"] = {"seconds": 1.5, "by_stage": {"tau": 1.5}, "kernels_compiled": 3, "kernels_loaded": 1,
                      "kernel_cache": None}
    gw0["near_ties"] = [{"prompt_id": "p", "against": "golden", "position": 3, "absolute": 8, "expected": 5,
                         "got": 6, "expected_text": "a", "got_text": "b", "margin": 0.01, "margin_bound": None,
                         "band": 0.05, "dtype": "float32", "near_tie": True}]
    gw1 = json.loads(_json(fragment()))
    gw1.update(worker="gw1", timings={"tau": 2.0, "features": 0.25}, spans=[["features", 0.0, 0.25]],
               counts={"prompts": 3}, cache={"hits": 2})
    gw1["prompts"]["q"] = _prompt(3.0)
    gw1["drift"].append({**gw1["drift"][0], "prompt_id": "q", "rel_err": 1e-3, "cos": 0.9999, "passed": True})
    gw1["provenance"] = {"backend": "torch", "witness": {"checks": []}, "kernel_probe": {
        "seconds": 0.75, "changed": [kernel_change("torch/float32")], "probes": [
            {"backend": "torch", "dtype": "float32", "shape": {"tokens": 8}, "digest": "d0", "seconds": 0.7},
            {"backend": "torch", "dtype": "bfloat16", "shape": {"tokens": 8}, "digest": "d1", "seconds": 0.05}]}}
    gw1["compile"] = {"seconds": 0.5, "by_stage": {"features": 0.5}, "kernels_compiled": 1, "kernels_loaded": 0,
                      "kernel_cache": {"path": "/c/triton", "source": "--cache-dir"}}
    gw1["near_ties"] = [{**gw0["near_ties"][0], "prompt_id": "c-t1", "against": "teacher-forced"}]
    return [gw0, gw1]


#: What the merge of eval.json fragment dicts (before the merge read typed results) made of :func:`two_workers`
#: (``created`` left out), kept to show the typed merge gives eval.json's data back key for key.
TWO_WORKERS_MERGED = Path(__file__).parent / "data" / "merged_two_workers.json"


def test_a_fragment_with_an_unknown_key_is_refused_naming_it():
    with pytest.raises(ResultKeyError, match=r"unknown key 'bogus'"):
        EvalResult.from_dict({**fragment(), "bogus": 1})
    with pytest.raises(ResultKeyError, match=r"unknown key 'provenance\.bogus'"):
        EvalResult.from_dict({**fragment(), "provenance": {"backend": "torch", "bogus": 1}})
    with pytest.raises(ResultKeyError, match=r"unknown key 'prompts\.p\.bogus'"):
        EvalResult.from_dict({**fragment(), "prompts": {"p": _prompt(2.0, bogus=1)}})
    with pytest.raises(ResultKeyError, match=r"missing key 'timings'"):
        EvalResult.from_dict({k: v for k, v in fragment().items() if k != "timings"})
    with pytest.raises(ResultKeyError, match=r"missing key 'mean_tau'"):  # τ is read whole or not at all
        EvalResult.from_dict({k: v for k, v in fragment().items() if k != "mean_tau"})


def test_a_workers_bad_result_fails_the_reports_naming_the_worker_and_the_key():
    """The controller reads each worker's JSON once; a result it cannot read is kept as why, and the reports fail
    with it (one line naming the worker and the key), never an internal error of the test run."""
    from dflash_eval.pytest_plugin.run_report import (
        REPORT_FAILED,
        WORKEROUTPUT_KEY,
        gather_worker_result,
        write_run_reports,
    )
    from dflash_eval.pytest_plugin.state import FRAGMENTS, MESSAGES

    config = SimpleNamespace(stash=pytest.Stash(), pluginmanager=SimpleNamespace(has_plugin=lambda name: True))
    config.stash[FRAGMENTS] = []
    good, bad = (SimpleNamespace(config=config, workerinput={"workerid": w},
                                 workeroutput={WORKEROUTPUT_KEY: _json(f)})
                 for w, f in (("gw0", two_workers()[0]), ("gw1", {**two_workers()[1], "bogus": 1})))
    gather_worker_result(good)
    gather_worker_result(bad)
    assert [f.worker for f in config.stash[FRAGMENTS]] == ["gw0"]
    write_run_reports(config, failed_tests=0, exitstatus=0)  # type: ignore[arg-type]  # what it reads of a config
    why = config.stash[REPORT_FAILED]
    assert "worker gw1's result: unknown key 'bogus'" in why
    assert config.stash[MESSAGES] == [f"dflash-eval: {why}; the run fails"]


def test_the_typed_merge_gives_what_the_merge_of_dicts_gave():
    """Two workers' results merged: eval.json's data equals, key for key (NaN as NaN), what the merge of the
    fragments' dicts made of them; and read back as the run's result, it is eval.json's data again."""
    frags = [EvalResult.from_dict(json.loads(_json(f))) for f in two_workers()]  # as the controller reads them
    run = report.merge(frags, outcomes={"t.py::a": "passed", "t.py::b": "skipped"},
                       skipped={"t.py::b": "no GPU"}, wall_s=2.5)
    got = {k: v for k, v in run.to_dict().items() if k != "created"}
    want = json.loads(TWO_WORKERS_MERGED.read_text())
    assert json.dumps(got, allow_nan=True, sort_keys=True) == json.dumps(want, allow_nan=True, sort_keys=True)
    assert _json(RunResult.from_dict({**want, "created": run.created}).to_dict()) == _json(run.to_dict())
    assert [p for p in run.prompts] == ["c-t1", "p", "q"] and len(run.drift) == 2
    assert run.provenance is not None and run.provenance.kernel_probe is not None
    assert run.provenance.kernel_probe.per_worker == {"gw0": 0.5, "gw1": 0.75}


def judged_rows(rows: dict[str, dict[str, Any]]) -> dict[str, PromptRow]:
    """Typed prompt rows (what a checkpoint's verdict reads) of a few fields."""
    base = _prompt(2.0)
    return {p: PromptRow.from_dict({**base, "rounds": 3, **r}) for p, r in rows.items()}


def test_the_verdict_is_composed_from_its_parts():
    assert compose() == Verdict() and compose().label == "unjudged" and compose(None).parts == ()
    floors, baseline = Part("floors", True), Part("baseline", False, ("dropped",))
    assert compose(floors).label == "pass" and compose(Part("floors", None)).passed is None
    both = compose(Part("floors", False, ("below",)), baseline)
    assert (both.passed, both.reasons) == (False, ["below", "dropped"])
    trend = compose(floors, regression_part("regressed"), plateau_part("flat"))
    assert (trend.passed, trend.reasons, trend.notices) == (False, ["regressed"], ["flat"])
    flat = compose(Part("floors", None), regression_part(None), plateau_part("flat"))
    assert (flat.passed, flat.reasons, flat.notices) == (None, [], ["flat"])  # a notice neither passes nor fails
    assert compose(floors, regression_part("regressed")).label == "fail"
    # a part of any name joins the verdict: its reasons and notices are the verdict's, in order
    near = compose(floors, notice("near_ties", "2 completions at a near tie"), Part("compile", False, ("slow",)))
    assert (near.reasons, near.notices, near.outcome("near_ties")) == (["slow"], ["2 completions at a near tie"],
                                                                        "unjudged")
    assert Verdict.from_dict(near.to_dict()) == near and near.to_dict()["label"] == "fail"
    gate = compose(Part("drift_gate", True, outcome="inconclusive"))
    assert gate.passed is True and gate.outcome("drift_gate") == "inconclusive"
    assert Verdict.from_dict(gate.to_dict()) == gate
    prompts = judged_rows({"a": {"tau": 2.0, "floor": 1.0, "ddtree_floor": {}, "passed": True}})
    none = Floors()
    cmp = BaselineComparison("b.json", {"a": (3.0, 2.0)}, [], drop_tol=0.02, rise_tol=0.25)
    assert checkpoint_verdict(prompts, [Threshold("chain", 2.0, None)], none, None,
                              floors_required=False).passed is None  # no floors, no baseline: unjudged
    assert checkpoint_verdict(prompts, [Threshold("chain", 2.0, None)], none, None).reasons == [
        "no mean chain floor"]  # the gate requires floors
    dropped = checkpoint_verdict(prompts, [], none, cmp, floors_required=False)
    assert dropped.passed is False and dropped.reasons[0].startswith("τ dropped against the baseline: -33.33 %")
    ok = checkpoint_verdict(prompts, [Threshold("chain", 2.0, 1.5)], Floors(mean_override=1.5), None)
    assert ok == Verdict((Part("floors", True),))


def test_floors_that_judge_nothing_are_said_so():
    """τ >= 1 for any drafter: a verdict whose every floor is <= 1 passes any drafter, and its notice says so; one
    floor above 1 (a prompt's, a DDTree budget's, the mean's) judges something."""
    rows = {"a": {"tau": 1.0, "floor": 1.0, "ddtree_floor": {"8": 1.0}, "passed": True},
            "b": {"tau": 1.0, "floor": None, "ddtree_floor": {}, "passed": None}}
    prompts = judged_rows(rows)
    vacuous = checkpoint_verdict(prompts, [Threshold("chain", 1.0, 1.0), Threshold("DDTree-8", 1.0, 1.0)],
                                 Floors(mean_override=1.0), None)
    assert vacuous.passed is True and vacuous.reasons == []
    assert len(vacuous.notices) == 1 and "judge nothing" in vacuous.notices[0] and "--tau-floor" in vacuous.notices[0]
    for floors in ({"floor": 1.2}, {"ddtree_floor": {"8": 1.01}}):
        judged = judged_rows({**rows, "a": {**rows["a"], **floors}})
        assert checkpoint_verdict(judged, [Threshold("chain", 1.0, 1.0)], Floors(mean_override=1.0), None,
                                  floors_required=False).notices == []
    assert checkpoint_verdict(prompts, [Threshold("chain", 1.0, 0.5)], Floors(mean_override=0.5), None).notices
    assert checkpoint_verdict(prompts, [], Floors(), None, floors_required=False).notices == []  # unjudged


@pytest.mark.parametrize(("run", "kw", "passed", "reasons"), [
    (judged_run(tau=means(2.0, 1.0), mean_passed=True), {}, True, []),
    (judged_run(tau=means(2.0, 3.0), mean_passed=False), {"failed_tests": 2}, False,
     ["τ below its floors", "2 tests failed"]),
    (judged_run(drift_gate=[SimpleNamespace(outcome="fail")],
                drafter=SimpleNamespace(path="d", refused=[SimpleNamespace(check="vocab", message="m")])), {}, False,
     ["the drafter was refused by vocab", "drift over budget"]),
    (judged_run(), {"exitstatus": 2}, False, ["pytest exit status 2"]),
])
def test_the_run_verdict(run, kw, passed, reasons):
    v = run_verdict(run, **kw)
    assert (v.passed, v.reasons) == (passed, reasons)
    empty = report.merge([EvalResult.from_dict({"worker": "master", "settings": {}, "timings": {}, "counts": {},
                                                "cache": {}})])  # the head line says the verdict it is given
    head = report.verdict_lines(empty, report_dir=None, verdict=v)[0]
    assert head.startswith("dflash-eval: " + ("PASS" if passed else "FAIL")) and all(r in head for r in reasons)
