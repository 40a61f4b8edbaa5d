"""Unit tests of dflash_eval.metrics.verdict: the floor rule, judging eval.json's prompt rows, means and categories
(their floors derived from the selected prompts' floors), explicit thresholds (--tau-floor: the mean only;
--tau-floor-prompt: every prompt), the gate's reasons, and re-judging a run against rewritten floors (no model)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
from result_rows import fragment, kernel_change, means, prompt_row

from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.stats import category_table
from dflash_eval.metrics.verdict import (
    KERNELS,
    Threshold,
    category_thresholds,
    gate_reasons,
    judge_categories,
    judge_mean,
    judge_prompts,
    mean_passed,
    mean_thresholds,
    overall,
    passes,
    prompt_thresholds,
    run_verdict,
)
from dflash_eval.session.merge import merge
from dflash_eval.session.rows import CategoryRow, PromptRow, rows_from_dict, rows_to_dict
from dflash_eval.session.run_result import RunResult, category_rows

NAN = float("nan")


def typed(rows: dict[str, PromptRow] | dict[str, dict]) -> dict[str, SimpleNamespace]:
    """Judged prompt rows (or a few fields of them) as a checkpoint's verdict reads them, ``rounds`` None (rows of
    no recorded rounds)."""
    return {p: SimpleNamespace(**{**(r if isinstance(r, dict) else r.to_dict()), "rounds": None})
            for p, r in rows.items()}


def result_of(provenance: dict) -> RunResult:
    """The result of a run that measured nothing, with ``provenance``."""
    return RunResult.from_dict({**merge([fragment()]).to_dict(), "provenance": provenance})


def row(tau: float, ddtree: dict[str, float], category: str = "code") -> PromptRow:
    return PromptRow.from_dict(prompt_row(category=category, tau=tau, ddtree=dict(ddtree), passed=False))


@pytest.mark.parametrize("value, floor, expected", [
    (2.0, None, False),  # a missing floor fails, never passes
    (None, 1.0, False),
    (NAN, 1.0, False),  # no speculative round: τ NaN fails
    (NAN, None, False),
    (1.5, 1.5, True),  # equality passes
    (1.4999, 1.5, False),
    (3.0, 1.0, True),
])
def test_passes(value, floor, expected):
    assert passes(value, floor) is expected
    t = Threshold("chain", value, floor)
    assert t.passed is expected and t.missing is (floor is None)
    assert t.required and t.gated  # required by default: a missing floor is gated (and fails)
    optional = Threshold("chain", value, floor, required=False)
    assert optional.gated is (floor is not None) and optional.passed is expected


def test_overall_judges_only_gated_thresholds():
    ok, low = Threshold("chain", 2.0, 1.0), Threshold("DDTree-8", 1.0, 2.0)
    free = Threshold("DDTree-4", 9.0, None, required=False)  # not gated: neither passes nor fails the whole
    assert overall([ok]) is True and overall([ok, low]) is False and overall([ok, free]) is True
    assert overall([low, free]) is False
    assert overall([free]) is None and overall([]) is None  # nothing gated: no verdict
    assert overall([ok, Threshold("DDTree-4", 9.0, None)]) is False  # a required missing floor fails


def test_thresholds_label_and_pick_their_floors():
    fl = Floors(chain={"a": 1.5, "b": 1.0}, ddtree={8: {"a": 2.0, "b": 1.5}}).select({"a": "code", "b": "code"})
    ts = prompt_thresholds("a", 2.0, {"8": 2.5, "4": 2.2}, fl)
    assert [(t.label, t.value, t.floor) for t in ts] == [("chain", 2.0, 1.5), ("DDTree-8", 2.5, 2.0),
                                                         ("DDTree-4", 2.2, None)]
    assert all(t.required for t in ts)
    assert [(t.label, t.floor) for t in mean_thresholds(2.0, {"8": 2.5}, fl)] == [("chain", 1.25), ("DDTree-8", 1.75)]
    assert [t.floor for t in category_thresholds("code", 2.0, {"8": 2.5}, fl)] == [1.25, 1.75]
    assert [t.floor for t in category_thresholds("all", 2.0, {"8": 2.5}, fl)] == [1.25, 1.75]  # "all": mean floors
    assert [t.floor for t in category_thresholds("chat", 2.0, {"8": 2.5}, fl)] == [None, None]
    assert [t.floor for t in mean_thresholds(2.0, {"8": 2.5}, fl.select({"a": "code"}))] == [1.5, 2.0]  # a subset

    per_prompt = Floors(prompt_override=1.3).select({"x": "chat"})  # --tau-floor-prompt
    assert {t.floor for t in prompt_thresholds("x", 2.0, {"8": 2.5}, per_prompt)} == {1.3}
    assert {t.floor for t in category_thresholds("chat", 2.0, {"8": 2.5}, per_prompt)} == {1.3}
    assert {t.floor for t in mean_thresholds(2.0, {"8": 2.5}, per_prompt)} == {1.3}  # the derived mean

    mean_only = Floors(mean_override=1.3).select({"x": "chat"})  # --tau-floor alone
    ts = prompt_thresholds("x", 2.0, {"8": 2.5}, mean_only)
    assert {t.floor for t in ts} == {None} and not any(t.required or t.gated for t in ts)
    ts = category_thresholds("chat", 2.0, {"8": 2.5}, mean_only)
    assert {t.floor for t in ts} == {None} and not any(t.gated for t in ts)
    ts = mean_thresholds(2.0, {"8": 2.5}, mean_only)
    assert {t.floor for t in ts} == {1.3} and all(t.gated and t.passed for t in ts)
    assert [t.floor for t in category_thresholds("all", 2.0, {"8": 2.5}, mean_only)] == [1.3, 1.3]


def test_judge_prompts_fills_floor_ddtree_floor_and_passed():
    fl = Floors(chain={"a": 1.5, "b": 1.5, "c": 1.5, "d": 1.5, "e": 1.5},
                ddtree={8: {"a": 2.0, "c": 2.0, "d": 2.0, "e": 2.0}})
    prompts = {"a": row(1.5, {"8": 2.0}),  # both exactly at their floor
               "b": row(3.0, {"8": 3.0}),  # no DDTree-8 floor
               "c": row(3.0, {"8": 1.9}),  # DDTree below its floor
               "d": row(1.4, {"8": 3.0}),  # chain below its floor
               "e": row(NAN, {"8": NAN}),  # no speculative round
               "f": row(3.0, {"8": 3.0})}  # no floor at all
    judge_prompts(prompts, fl)
    assert {p: r.passed for p, r in prompts.items()} == {"a": True, "b": False, "c": False, "d": False,
                                                           "e": False, "f": False}
    assert prompts["a"].floor == 1.5 and prompts["a"].ddtree_floor == {"8": 2.0}
    assert prompts["b"].ddtree_floor == {"8": None}
    assert prompts["f"].floor is None and prompts["f"].ddtree_floor == {"8": None}
    chain_only = {"g": row(2.0, {})}  # a row without DDTree budgets
    judge_prompts(chain_only, Floors(chain={"g": 2.0}))
    assert chain_only["g"].passed is True and chain_only["g"].ddtree_floor == {}


def test_judge_prompts_with_tau_floor_alone_gates_only_prompts_that_have_a_floor():
    fl = Floors(chain={"a": 1.5, "b": 1.5, "c": 1.5}, ddtree={8: {"a": 2.0, "c": 2.0}}, mean_override=1.0)
    prompts = {"a": row(2.0, {"8": 2.5}),  # has both floors: judged
               "b": row(2.0, {"8": 2.5}),  # chain floor only: judged on the chain, DDTree-8 not gated
               "c": row(1.0, {"8": 2.5}),  # below its chain floor: still fails
               "f": row(0.5, {"8": 0.5})}  # no floor at all: not gated, whatever its τ
    judge_prompts(prompts, fl)
    assert {p: r.passed for p, r in prompts.items()} == {"a": True, "b": True, "c": False, "f": None}
    assert prompts["f"].floor is None and prompts["f"].ddtree_floor == {"8": None}
    prompts = {"f": row(0.5, {"8": 0.5})}
    judge_prompts(prompts, Floors(mean_override=1.0, prompt_override=1.0))  # both: every prompt judged again
    assert prompts["f"].passed is False and prompts["f"].floor == 1.0


def _means(m) -> SimpleNamespace:
    """The means 2.0 (chain) and 2.5 (DDTree-8) with the floors ``m`` (:func:`judge_mean`'s) beside them."""
    return SimpleNamespace(mean_tau=2.0, mean_ddtree={"8": 2.5}, mean_floor=m.mean_floor,
                           mean_ddtree_floor=m.mean_ddtree_floor)


def test_judge_mean_and_mean_passed():
    sel = {"a": "code", "b": "chat"}

    def judged(floors: Floors):
        return judge_mean(2.0, {"8": 2.5}, floors)

    m = judged(Floors(chain={"a": 1.5, "b": 2.5}, ddtree={8: {"a": 2.0, "b": 3.0}}).select(sel))
    assert m.mean_floor == 2.0 and m.mean_ddtree_floor == {"8": 2.5} and m.passed is True
    assert mean_passed([], _means(m)) is True
    assert mean_passed([SimpleNamespace(check="vocab", message="m")], _means(m)) is False  # refused
    m = judged(Floors(chain={"a": 1.5, "b": 2.5}).select(sel))  # no DDTree-8 prompt floors: no mean floor
    assert m.mean_floor == 2.0 and m.mean_ddtree_floor == {"8": None}
    assert m.passed is False and mean_passed([], _means(m)) is False
    m = judged(Floors(chain={"a": 1.5, "b": 2.5}, ddtree={8: {"a": 2.0}}).select(sel))  # b lacks DDTree-8
    assert m.mean_ddtree_floor == {"8": None} and m.passed is False
    m = judged(Floors(chain={"a": 1.7, "b": 2.5}, ddtree={8: {"a": 1.0, "b": 1.0}}).select(sel))
    assert m.mean_floor == pytest.approx(2.1) and m.passed is False
    assert mean_passed([], _means(m)) is False
    m = judged(Floors(chain={"a": 1.5}).select({}))  # nothing selected: no mean floor
    assert m.mean_floor is None and m.passed is False
    m = judged(Floors(mean_override=2.0).select(sel))  # --tau-floor: the mean floor, chain and every budget
    assert m.mean_floor == 2.0 and m.mean_ddtree_floor == {"8": 2.0} and m.passed is True
    m = judged(Floors(mean_override=2.1))
    assert m.passed is False and mean_passed([], _means(m)) is False
    m = judged(Floors(prompt_override=1.5).select(sel))  # --tau-floor-prompt: the derived mean
    assert m.mean_floor == 1.5 and m.mean_ddtree_floor == {"8": 1.5} and m.passed is True
    assert mean_passed([], means(NAN, 1.0)) is False and mean_passed([], None) is False  # NaN; no τ measured


def _category(chain: float, ddtree: dict[str, float]) -> SimpleNamespace:
    """A category's row as the τ rules judge it: its summaries' means, its floors and verdict not judged yet."""
    return SimpleNamespace(chain=SimpleNamespace(mean=chain), ddtree={b: SimpleNamespace(mean=v) for b, v in
                                                                     ddtree.items()},
                           floor=None, ddtree_floor={}, passed=None)


def _categories() -> dict:
    return {"code": _category(2.0, {"8": 2.5}),
            "chat": _category(1.5, {}),  # lacks the DDTree-8 summary
            "all": _category(1.8, {"8": 2.4})}


SELECTION = {"p1": "code", "p2": "code", "c1": "chat"}


def test_judge_categories_without_floors_has_no_verdict():
    cats = _categories()
    judge_categories(cats, None, ["8"])
    for r in cats.values():
        assert r.floor is None and r.ddtree_floor == {"8": None} and r.passed is None


def test_judge_categories_with_floors():
    cats = _categories()
    fl = Floors(chain={"p1": 1.5, "p2": 2.5, "c1": 1.0}, ddtree={8: {"p1": 2.0, "p2": 3.0, "c1": 2.6}}).select(
        SELECTION)
    judge_categories(cats, fl, ["8"])
    assert cats["code"].floor == 2.0 and cats["code"].ddtree_floor == {"8": 2.5}  # mean of p1, p2's floors
    assert cats["code"].passed is True  # equal to both floors
    assert cats["chat"].floor == 1.0 and cats["chat"].ddtree_floor == {"8": 2.6}
    assert cats["chat"].passed is False  # no DDTree-8 summary: fails even with a floor
    assert cats["all"].floor == pytest.approx(5 / 3)  # "all": the mean floors over every selected prompt
    assert cats["all"].ddtree_floor["8"] == pytest.approx(7.6 / 3)
    assert cats["all"].passed is False  # DDTree-8 2.4 < 2.533

    cats = _categories()  # a selected prompt of "code" without a floor: "code" and "all" have no floor, and fail
    judge_categories(cats, Floors(chain={"p1": 1.0, "c1": 1.0}, ddtree={8: {"p1": 1.0, "c1": 1.0}}).select(
        SELECTION), ["8"])
    assert cats["code"].floor is None and cats["code"].passed is False
    assert cats["all"].floor is None and cats["all"].passed is False
    assert cats["chat"].floor == 1.0 and cats["chat"].passed is False  # still lacks its DDTree-8 summary

    cats = _categories()  # --tau-floor alone: categories without prompt floors are not gated, the mean is
    judge_categories(cats, Floors(mean_override=1.0).select(SELECTION), ["8"])
    assert cats["code"].floor is None and cats["code"].passed is None
    assert cats["chat"].passed is None
    assert cats["all"].floor == 1.0 and cats["all"].ddtree_floor == {"8": 1.0} and cats["all"].passed is True


def test_a_reason_rounds_its_numbers_as_the_tables_do():
    """A floor averaged over the selected prompts (3.504875) reads as every table prints it (3.505)."""
    assert gate_reasons({}, [Threshold("chain", 1.82612, 3.504875)]) == ["mean chain τ 1.826 < 3.505"]


def test_gate_reasons():
    fl = Floors(chain={"a": 1.5, "b": 1.5, "c": 1.5}, ddtree={8: {"a": 2.0, "c": 2.0}})
    ok = Floors(chain={"a": 1.5}, ddtree={8: {"a": 2.0}})
    prompts = {"a": row(2.0, {"8": 2.5})}
    judge_prompts(prompts, ok)
    assert gate_reasons(typed(prompts), mean_thresholds(2.0, {"8": 2.5}, Floors(mean_override=1.0))) == []
    prompts = {"a": row(2.0, {"8": 2.5}), "b": row(2.0, {"8": 2.5}), "c": row(1.0, {"8": 2.5}),
               "d": row(1.0, {"8": 1.0})}
    judge_prompts(prompts, fl)
    means = [Threshold("chain", 2.0, None), Threshold("DDTree-8", 1.9, 2.0), Threshold("DDTree-4", 3.0, 2.0)]
    assert gate_reasons(typed(prompts), means) == [
        "no floor for 2 prompt(s) (e.g. 'b'; pass --tau-floor-prompt)",  # b lacks DDTree-8, d every floor
        "1 prompt(s) below floor",  # c; b and d are counted as missing, not as below
        "no mean chain floor",
        "mean DDTree-8 τ 1.900 < 2.000",
    ]


def test_gate_reasons_with_tau_floor_alone():
    mean_only = Floors(mean_override=2.0).select({"a": "code", "b": "code"})
    prompts = {"a": row(1.0, {"8": 1.0}), "b": row(3.0, {"8": 3.0})}
    judge_prompts(prompts, mean_only)
    assert [r.passed for r in prompts.values()] == [None, None]  # not gated: neither missing nor below
    assert gate_reasons(typed(prompts), mean_thresholds(2.0, {"8": 2.0}, mean_only)) == []
    assert gate_reasons(typed(prompts), mean_thresholds(1.5, {"8": 2.5}, mean_only)) == ["mean chain τ 1.500 < 2.000"]
    with_file = Floors(chain={"a": 1.5}, ddtree={8: {"a": 1.5}}, mean_override=2.0).select({"a": "code", "b": "code"})
    judge_prompts(prompts, with_file)  # the prompts that have floors are still judged against them
    assert prompts["a"].passed is False and prompts["b"].passed is None
    assert gate_reasons(typed(prompts), mean_thresholds(2.0, {"8": 2.0}, with_file)) == ["1 prompt(s) below floor"]


def test_gate_reasons_ignore_ungated_missing_budget_floors():
    fl = Floors(chain={"a": 1.5}, mean_override=1.0).select({"a": "code"})  # no DDTree-8 floor for "a"
    prompts = {"a": row(2.0, {"8": 2.5})}
    judge_prompts(prompts, fl)
    assert prompts["a"].passed is True  # judged on its chain floor; DDTree-8 is not gated
    means = mean_thresholds(2.0, {"8": 2.5}, fl)
    assert gate_reasons(typed(prompts), means, prompt_floors_required=fl.prompt_floors_required) == []
    prompts["a"].tau = 1.0
    judge_prompts(prompts, fl)
    assert gate_reasons(typed(prompts), means, prompt_floors_required=False) == ["1 prompt(s) below floor"]


def _run(prompts: dict[str, PromptRow] | None = None, *, mean: bool = True) -> RunResult:
    """A run's result of the prompts a (code), b (chat) and c (code, no speculative round), means 2.5 and
    {"8": 3.0} (``mean`` False: no τ means), not judged."""
    if prompts is None:
        prompts = {"a": row(2.0, {"8": 2.5}), "b": row(3.0, {"8": 3.5}, "chat"), "c": row(NAN, {"8": NAN})}
    if not mean:  # eval.json's data of prompts without τ means (a process's result holds the means with them)
        data = {**merge([fragment()]).to_dict(), "prompts": rows_to_dict(prompts)}
        if prompts:  # the categories the merge makes of the prompts
            data["categories"] = rows_to_dict(category_rows(prompts, None))
        return RunResult.from_dict(data)
    return merge([fragment(prompts=rows_to_dict(prompts), mean_tau=2.5, mean_ddtree={"8": 3.0}, mean_floor=None,
                           mean_ddtree_floor={"8": None})])


def test_judge_run_rejudges_after_floors_change():
    run = _run()
    lenient = Floors(prompt_override=1.0)
    data = run.judged(lenient)
    assert [r.passed for r in data.prompts.values()] == [True, True, False]  # NaN fails whatever the floor
    assert data.mean_passed is True and data.tau.mean_floor == 1.0
    assert set(data.categories) == {"code", "chat", "all"}
    assert data.categories["code"].n == 1  # the NaN prompt is left out of the statistics
    assert data.categories["code"].passed is True and data.categories["all"].floor == 1.0
    first = data.to_dict()
    assert all(r.passed is False for r in run.prompts.values())  # the result judged is left as it was

    # floors selected for other prompts: judged() selects the run's own prompts
    strict = Floors(chain={"a": 2.5, "b": 3.0, "c": 2.5}, ddtree={8: {"a": 2.5, "b": 3.5, "c": 1.0}}).select(
        {"zz": "code"})
    data = data.judged(strict)
    assert {p: r.passed for p, r in data.prompts.items()} == {"a": False, "b": True, "c": False}
    assert data.prompts["a"].floor == 2.5 and data.prompts["a"].ddtree_floor == {"8": 2.5}
    assert data.tau.mean_floor == pytest.approx(8 / 3) and data.tau.mean_ddtree_floor["8"] == pytest.approx(7 / 3)
    assert data.mean_passed is False  # chain 2.5 < 2.667
    cats = data.categories
    assert cats["code"].floor == 2.5 and cats["code"].ddtree_floor == {"8": 1.75}  # a and c
    assert cats["code"].passed is False and cats["chat"].passed is True
    assert cats["all"].floor == pytest.approx(8 / 3) and cats["all"].passed is False

    data = data.judged(lenient)  # back to the first floors: the first verdicts again
    assert _same(data.to_dict(), first)


def test_judge_run_keeps_a_refused_drafter_failing():
    """Floors rewritten after a run (``--update-tau-floors``) judge the prompts again, never the refusal: a drafter
    an architecture check refused fails the mean whatever its floors."""
    prompts = {"a": row(2.0, {"8": 2.5}), "b": row(3.0, {"8": 3.5}, "chat")}
    refused = {"path": "ckpt", "fingerprint": "f", "config": {}, "refused": [{"check": "fc_shape", "message": "m"}]}
    run = merge([fragment(prompts=rows_to_dict(prompts), mean_tau=2.5, mean_ddtree={"8": 3.0}, mean_floor=None,
                          mean_ddtree_floor={"8": None}, drafter=refused)])
    assert run.mean_passed is False
    data = run.judged(Floors(prompt_override=1.0))
    assert [r.passed for r in data.prompts.values()] == [True, True] and data.tau.mean_floor == 1.0
    assert data.mean_passed is False


def test_judge_run_with_tau_floor_alone_judges_only_the_mean():
    data = _run().judged(Floors(mean_override=2.0))
    assert [r.passed for r in data.prompts.values()] == [None, None, None]  # NaN prompt too: not gated
    assert all(r.floor is None for r in data.prompts.values())
    assert data.tau.mean_floor == 2.0 and data.tau.mean_ddtree_floor == {"8": 2.0} and data.mean_passed is True
    cats = data.categories
    assert cats["code"].passed is None and cats["chat"].passed is None
    assert cats["all"].floor == 2.0 and cats["all"].passed is True
    data = data.judged(Floors(mean_override=2.6))
    assert data.mean_passed is False and data.categories["all"].passed is False
    reasons = gate_reasons(typed(data.prompts), mean_thresholds(data.tau.mean_tau, data.tau.mean_ddtree,
                                                                Floors(mean_override=2.6)))
    assert reasons == ["mean chain τ 2.500 < 2.600"]


def _same(a: dict, b: dict) -> bool:
    """Equality where NaN equals NaN (rows of prompts without a speculative round)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def test_judge_run_without_a_mean_or_prompts():
    data = _run({"a": row(2.0, {"8": 2.5})}, mean=False).judged(Floors(prompt_override=1.0))
    assert data.mean_passed is None and data.tau is None and data.prompts["a"].passed is True
    assert data.categories["all"].floor == 1.0 and data.categories["all"].passed is True
    empty = _run({}, mean=False).judged(Floors(prompt_override=1.0))
    assert empty.categories is None


def test_category_table_then_judge_matches_judge_run():
    run = _run()
    fl = Floors(chain={"a": 1.5, "b": 4.0, "c": 1.0}, ddtree={8: {"a": 2.0, "b": 3.0, "c": 2.0}}).select(
        {p: r.category for p, r in run.prompts.items()})
    prompts = {p: dataclasses.replace(r) for p, r in run.prompts.items()}
    judge_prompts(prompts, fl)
    cats = rows_from_dict(CategoryRow, category_table(prompts))
    judge_categories(cats, fl, ["8"])
    assert _same(rows_to_dict(cats), rows_to_dict(run.judged(fl).categories))
    assert cats["code"].floor == 1.25 and cats["code"].passed is True and cats["chat"].passed is False


@pytest.mark.parametrize("taus, expected", [
    ([1.0, 1.0, NAN], True),  # a prompt without a speculative round is left out
    ([1.004, 1.0], True),  # prints as 1.00
    ([1.0, 1.006], False),
    ([1.0], False),  # one prompt is not "every prompt"
    ([NAN, NAN], False),
])
def test_no_acceptance(taus, expected):
    from dflash_eval.metrics.verdict import no_acceptance

    assert no_acceptance(taus) is expected


def test_no_acceptance_is_the_first_gate_reason_and_a_diagnosis():
    from dflash_eval.metrics.verdict import NO_ACCEPTANCE, diagnoses

    rows = {p: {"tau": 1.0, "floor": 3.0, "ddtree_floor": {}, "passed": False} for p in ("a", "b")}
    reasons = gate_reasons(typed(rows), [Threshold("chain", 1.0, 3.0)])
    assert reasons[0] == NO_ACCEPTANCE and "2 prompt(s) below floor" in reasons
    assert diagnoses(typed(rows), None, None) == [f"{NO_ACCEPTANCE} (2 prompts)"]
    rows["b"]["tau"] = 1.5
    assert NO_ACCEPTANCE not in gate_reasons(typed(rows), [Threshold("chain", 1.25, 3.0)])
    assert not diagnoses(typed(rows), None, None)


def test_no_acceptance_under_floors_that_accept_it_is_no_diagnosis():
    """``--tau-floor 1`` for a random drafter: τ 1.00 everywhere passes, and is not a failure to explain."""
    from dflash_eval.metrics.verdict import diagnoses, no_acceptance_fails

    rows = {p: {"tau": 1.0, "floor": None, "ddtree_floor": {}, "passed": None} for p in ("a", "b")}
    assert not no_acceptance_fails(typed(rows), means(1.0, 1.0)) and not diagnoses(typed(rows), means(1.0, 1.0), None)
    assert gate_reasons(typed(rows), [Threshold("chain", 1.0, 1.0)], prompt_floors_required=False) == []
    assert no_acceptance_fails(typed(rows), means(1.0, 2.0))


def test_refused_drafter_is_never_a_pass_whichever_fragment_knows_it():
    """Under xdist the first fragment may come from a worker that never needed the drafter."""
    refused = [{"check": "fc_shape", "message": "key 'fc.weight': expected [256, 1024], got [256, 768]"}]
    data = merge([fragment(worker="gw0", drafter={"path": "d", "fingerprint": "f", "config": {}}),
                  fragment(worker="gw1", drafter={"path": "d", "fingerprint": "f", "config": {},
                                                  "refused": refused})]).to_dict()
    assert data["drafter"]["refused"] == refused and data["mean_passed"] is False
    assert "does not fit the target: refused by architecture check fc_shape" in data["diagnoses"][0]


def test_a_kernel_change_is_noticed_once_as_the_cause_of_the_failures():
    """eval.json's ``provenance.kernel_probe.changed`` (the probe's and the witness's evidence) is one notice of the
    part ``kernels``, naming each changed label and kind once, whatever the number of failures it causes."""
    changed = [kernel_change("torch/float32"), kernel_change("torch/bfloat16"),
               kernel_change("torch/float32")]  # two workers said it
    provenance = {"kernel_probe": {"probes": [], "changed": changed}}
    assert [(c.label, c.kinds) for c in result_of(provenance).kernel_changes] == [
        (c["label"], c["kinds"]) for c in changed]  # the part of the provenance the verdict reads, typed
    v = run_verdict(result_of(provenance), failed_tests=13)
    (part,) = [p for p in v.parts if p.name == KERNELS]
    assert part.passed is None and part.reasons == () and len(part.notices) == 1
    assert part.notices[0].startswith("the target's kernels changed since the cache was made: torch/float32 "
                                      "(witness), torch/bfloat16 (witness), named below; nothing they made was used")
    assert v.passed is False and v.reasons == ["13 tests failed"]  # the failures stay the live kernels' own
    none = result_of({"kernel_probe": {"probes": [], "changed": []}})
    assert KERNELS not in {p.name for p in run_verdict(none).parts}
