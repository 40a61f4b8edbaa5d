"""The predicted speed-up (:mod:`dflash_eval.metrics.speedup`) and the round costs it is computed from
(:mod:`dflash_eval.measurements.round_costs`): the formula against a computation by hand, τ's CI carried through it,
the floor's verdict, the timing of a tiny target (the server-style loop's stages: tests/test_server_loop.py
checks the loop itself), and the cached measurement served to a second session of the same device and shapes.

Run: ``pytest tests/test_speedup.py -n 0 -p no:randomly``
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dflash_eval.errors import ResultKeyError
from dflash_eval.measurements.round_costs import ROUND_COSTS
from dflash_eval.metrics.speedup import (
    RoundCosts,
    Speedup,
    best_strategy,
    context_bucket,
    mean_context,
    predict,
    round_parts,
    speedup_block,
    speedup_digest,
)
from dflash_eval.metrics.verdict import (
    SPEEDUP_FLOOR,
    Part,
    checkpoint_verdict,
    compose,
    speedup_floor_part,
    speedup_floor_reason,
)
from dflash_eval.report.strict_json import dumps_strict

ROOT = Path(__file__).resolve().parents[1]


def floor_reason(block: Speedup) -> str | None:
    """The speed-up floor's reason for the typed block."""
    return speedup_floor_reason(block)


def floor_part(block: Speedup) -> Part | None:
    """The speed-up floor's part for the typed block."""
    return speedup_floor_part(block)


@pytest.fixture(autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    """One torch thread, restored after: timings on a shared machine are not at the mercy of idle spinning threads
    (the thread count is in the costs' cache key, like the device)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def costs(**over: object) -> RoundCosts:
    """Costs in ms-sized seconds, chosen so that each part's share is visible in the sums."""
    kw: dict = dict(device="cpu (test)", device_kind="cpu", dtype="float32", backend="torch", threads=1,
                    context_len=192, block_size=8, repeats=7, warmup=1, step=0.010, draft=0.004, build=0.00005,
                    verify=0.015, accept=0.0001, commit=(0.0002, 0.0009), tree_verify={4: 0.012, 8: 0.017},
                    tree_build={4: 0.0003, 8: 0.0005}, tree_accept={4: 0.0001, 8: 0.0002}, draft_full=0.006,
                    snapshot=0.001, project=(0.0001, 0.0003), forward_2=0.013, forward_b=0.015)
    kw.update(over)
    return RoundCosts(**kw)


def test_speedup_is_tau_times_step_over_the_round() -> None:
    c = costs()
    tau = 4.5
    commit = 0.0002 + (0.0009 - 0.0002) * (tau - 1) / 7  # linear between 1 and B = 8 committed tokens
    chain_round = 0.004 + 0.00005 + 0.015 + 0.0001 + commit
    p = predict(c, "chain", tau, (4.0, 5.0))
    assert p.round_s == pytest.approx(chain_round)
    assert p.speedup == pytest.approx(tau * 0.010 / chain_round)
    assert p.tokens_per_s == pytest.approx(tau / chain_round)
    tree_round = 0.004 + 0.0005 + 0.017 + 0.0002 + commit
    assert predict(c, "ddtree-8", tau).speedup == pytest.approx(tau * 0.010 / tree_round)
    assert sum(round_parts(c, 8, tau).values()) == pytest.approx(tree_round)
    # the recompute loop: recomputed context, a cache snapshot, a plain verify and the τ committed tokens run again
    rerun = 0.013 + (0.015 - 0.013) * (tau - 2) / 6  # through 1 (step), 2 (forward_2) and 8 (forward_b) tokens
    loop_round = 0.006 + (0.0001 + 0.0002 * (tau - 1) / 7) + 0.001 + 0.015 + 0.0001 + rerun
    assert predict(c, "chain", tau, loop="loop").round_s == pytest.approx(loop_round)
    with pytest.raises(ValueError, match="chain only"):
        round_parts(c, 8, tau, "loop")
    with pytest.raises(KeyError):
        round_parts(c, 16, tau)  # a budget the costs were not measured for


def test_tau_ci_maps_through_the_formula() -> None:
    c = costs()
    p = predict(c, "chain", 4.5, (4.0, 5.0))
    lo, hi = p.speedup_ci
    assert lo == pytest.approx(predict(c, "chain", 4.0).speedup)
    assert hi == pytest.approx(predict(c, "chain", 5.0).speedup)
    assert lo < p.speedup < hi  # the speed-up increases with τ: the interval keeps its order
    assert p.tokens_per_s_ci == pytest.approx([lo / 0.010, hi / 0.010])
    none = predict(c, "chain", 4.5, (None, math.nan))  # one prompt: no CI
    assert all(math.isnan(x) for x in none.speedup_ci) and none.speedup == pytest.approx(p.speedup)
    assert math.isnan(predict(c, "chain", math.nan).speedup)
    wide = predict(c, "chain", 1.5, (0.2, 9.5))  # a t interval of two prompts reaching past τ's range [1, B]
    assert wide.tau_ci == [1.0, 8.0] and wide.speedup_ci[0] == pytest.approx(predict(c, "chain", 1.0).speedup)


def test_commit_sized_costs_are_clamped_to_one_and_b_tokens() -> None:
    c = costs()
    assert round_parts(c, None, 0.5)["commit"] == pytest.approx(0.0002)
    assert round_parts(c, None, 12.0)["commit"] == pytest.approx(0.0009)
    commit = {t: round_parts(c, None, t, "loop")["commit"] for t in (0.5, 1.0, 1.5, 2.0, 8.0, 12.0)}
    assert commit[0.5] == commit[1.0] == pytest.approx(0.010) and commit[1.5] == pytest.approx(0.0115)
    assert commit[2.0] == pytest.approx(0.013) and commit[8.0] == commit[12.0] == pytest.approx(0.015)
    no_2 = costs(forward_2=math.nan)  # costs without the 2-token forward: linear from 1 to B
    assert round_parts(no_2, None, 4.5, "loop")["commit"] == pytest.approx(0.010 + 0.005 * 3.5 / 7)


def test_mean_context_and_bucket() -> None:
    # positions 10..13 (4 tokens) and 100..101 (2 tokens): token-weighted mean
    assert mean_context([(10, 4), (100, 2)]) == pytest.approx((10 + 11 + 12 + 13 + 100 + 101) / 6)
    assert math.isnan(mean_context([(5, 0)]))
    assert context_bucket(1.0) == 64 and context_bucket(64.0) == 64 and context_bucket(64.5) == 128
    assert context_bucket(math.nan) == 64


def test_block_names_the_best_strategy_and_judges_the_floor() -> None:
    c = costs()
    block = speedup_block(c, (4.5, (4.0, 5.0)), {4: (3.9, (3.5, 4.3)), 8: (5.6, (5.0, 6.2)), 16: (6.0, (5, 7))},
                          floor=1.5, pooled={"chain": 4.0, "ddtree-8": 5.0, "ddtree-16": 5.5})
    assert set(block.pooled) == {"chain", "ddtree-8"}  # the strategies predicted
    assert block.pooled["chain"].speedup == pytest.approx(predict(c, "chain", 4.0).speedup)
    assert list(block.strategies) == ["chain", "ddtree-4", "ddtree-8"]  # 16: no costs measured for it
    speeds = {k: v.speedup for k, v in block.strategies.items()}
    assert block.best == max(speeds, key=lambda k: speeds[k]) == "ddtree-8" and block.best_budget == 8
    assert block.plain_tokens_per_s == pytest.approx(100.0)
    assert block.near_best == []  # DDTree-8 beats the chain and DDTree-4 by more than 5 %
    assert block.costs is c and block.strategies["chain"] == predict(c, "chain", 4.5, (4.0, 5.0))  # no dict between
    tie = speedup_block(costs(tree_verify={4: 0.017, 8: 0.017}, tree_build={4: 0.0005, 8: 0.0005}),
                        (4.5, None), {4: (5.5, None), 8: (5.6, None)})
    assert tie.best == "ddtree-8" and tie.near_best == ["ddtree-4"]  # 5.5 / 5.6: within 5 %
    assert block.passed is None  # the block predicts; the verdict judges its floor
    assert floor_part(block) == compose().with_parts(floor_part(block)).part(SPEEDUP_FLOOR)
    assert floor_part(block).passed is True and floor_reason(block) is None
    high = speedup_block(c, (4.5, (4.0, 5.0)), {}, floor=speeds["chain"] + 0.01)
    assert floor_part(high).passed is False
    reason = floor_reason(high)
    assert reason is not None and "--speedup-floor" in reason and "cpu (test)" in reason and "context 192" in reason
    assert floor_part(high).reasons == (reason,)
    assert floor_part(speedup_block(c, (4.5, (4.0, 5.0)), {})) is None  # no floor: not judged
    nan = speedup_block(c, (math.nan, (None, None)), {}, floor=1.0)  # no τ: a floor fails, like a τ floor
    assert floor_part(nan).passed is False
    assert best_strategy({}) is None


def test_costs_round_trip_through_strict_json() -> None:
    """eval.json's ``speedup.costs`` is the costs' own dict (strict JSON: a part not timed written as null), read back
    as the same costs (NaN, int budgets, pairs as tuples) and written again key for key; a key the costs do not know
    or lack is one error naming it."""
    c = costs(spread={"step": math.nan, "verify": 0.1}, draft_full=math.nan, project=(math.nan, math.nan))
    held = json.loads(dumps_strict(c.to_dict()))
    assert held["draft_full"] is None and held["project"] == [None, None] and held["tree_verify"]["8"] == 0.017
    back = RoundCosts.from_dict(held)
    assert back.tree_verify == c.tree_verify and back.commit == c.commit and back.step == c.step
    assert math.isnan(back.spread["step"]) and back.budgets == (4, 8) and math.isnan(back.draft_full)
    assert isinstance(back.project, tuple) and math.isnan(back.project[1])
    assert json.loads(dumps_strict(back.to_dict())) == held and list(back.to_dict()) == list(held)
    with pytest.raises(ResultKeyError, match="unknown key 'colour'"):
        RoundCosts.from_dict({**held, "colour": 1})
    with pytest.raises(ResultKeyError, match="missing key 'forward_2'"):
        RoundCosts.from_dict({k: v for k, v in held.items() if k != "forward_2"})


def test_block_round_trips_and_digests_typed() -> None:
    """The typed block is eval.json's ``speedup`` (key for key through strict JSON, read back strictly); the digest
    the history, the trackers and the gate keep reads it typed."""
    c = costs(draft_full=math.nan)
    block = speedup_block(c, (4.5, (4.0, 5.0)), {8: (5.6, (5.0, 6.2))}, floor=1.5, pooled={"chain": 4.25})
    held = json.loads(dumps_strict(block.to_dict()))
    assert list(held) == [f for f in Speedup.__dataclass_fields__] and held["costs"]["draft_full"] is None
    back = Speedup.from_dict(held)
    assert json.loads(dumps_strict(back.to_dict())) == held
    with pytest.raises(ResultKeyError, match=r"unknown key 'pooled\.chain\.colour'"):
        Speedup.from_dict({**held, "pooled": {"chain": {**held["pooled"]["chain"], "colour": 1}}})
    with pytest.raises(ResultKeyError, match=r"missing key 'models\.server\.checked'"):
        Speedup.from_dict({**held, "models": {"server": {"name": "n", "module": "m", "what": "w"}}})
    chain = block.strategies["chain"]
    assert speedup_digest(block) == {
        "device": "cpu (test)", "dtype": "float32", "context_len": 192, "chain": chain.speedup,
        "chain_ci95": chain.speedup_ci, "tokens_per_s": chain.tokens_per_s, "plain_tokens_per_s": 100.0,
        "ddtree": {"8": block.strategies["ddtree-8"].speedup}, "best": block.best, "best_budget": 8, "floor": 1.5,
        "passed": None}
    assert speedup_digest(back) == speedup_digest(block) and speedup_digest(None) is None


# ------------------------------------------------------------------------------------------------ on a model
def test_round_costs_on_a_tiny_target(tiny_target, tiny_head, tiny_drafter_config) -> None:  # type: ignore[no-untyped-def]
    from dflash_eval.measurements.round_costs import measure_round_costs

    seen: list[int] = []
    c = measure_round_costs(tiny_target, tiny_drafter_config, tiny_head, context_len=64, budgets=(2, 5),
                            backend="torch", tokens=list(range(3, 70)), repeats=3, warmup=1, report=seen.append)
    assert seen == [1, 2, 3, 4]  # one warm-up round, then three timed rounds of every part
    assert c.budgets == (2, 5) and c.context_len == 64 and c.block_size == tiny_drafter_config.block_size
    for name in ("step", "draft", "build", "verify", "accept", "forward_2", "forward_b", "draft_full", "snapshot"):
        assert 0 < getattr(c, name) < 10, name
    assert all(0 < x < 10 for x in (*c.commit, *c.project, *c.tree_verify.values(), *c.tree_build.values(),
                                    *c.tree_accept.values()))
    assert c.repeats == 3 and c.seconds > 0 and set(c.spread) >= {"step", "verify", "commit_1", "tree_verify_5"}
    assert c.device_kind == "cpu" and c.dtype == "float32"
    p = predict(c, "chain", 3.0, (2.5, 3.5))
    assert p.speedup > 0 and p.speedup_ci[0] < p.speedup < p.speedup_ci[1]


def test_round_costs_are_cached_per_device_and_shapes(tmp_path: Path, tiny_target_dir: Path,
                                                     tiny_drafter_dir: Path) -> None:
    """The first session times the round (and its result reports it); a second one of the same target, drafter
    shape, device and dtype reads the costs back; a floor above the prediction is a failing verdict."""
    from dflash_eval import EvalSession, EvalSettings
    from dflash_eval.session.eval_result import speedup_summary

    base = {"target_model": str(tiny_target_dir), "drafter": str(tiny_drafter_dir),
            "prompts": str(ROOT / "fixtures" / "prompts.jsonl"), "num_prompts": 2, "max_new_tokens": 12,
            "cache_dir": str(tmp_path / "cache"), "witness_prompts": 0, "tau_floor": 1.0}
    first = EvalSession(EvalSettings.from_mapping(base), progress=None)
    c1, cached1 = first.evaluation.measure(ROUND_COSTS)
    assert cached1 is False and c1.context_len == context_bucket(mean_context(
        [(len(r.prompt_ids), len(r.output_ids)) for r in first.completions().values()]))
    first.tau_summary()  # result() reports what was computed: τ, then the speed-up from it
    block = first.result().to_dict()["speedup"]
    assert set(block["strategies"]) == {"chain", "ddtree-8"} and block["passed"] is None
    second = EvalSession(EvalSettings.from_mapping({**base, "speedup_floor": 1000.0}), progress=None)
    c2, cached2 = second.evaluation.measure(ROUND_COSTS)
    assert cached2 is True and c2 == c1
    judged = speedup_summary(second.evaluation, second.tau_summary())
    assert judged.passed is False and "--speedup-floor 1000" in (speedup_floor_reason(judged) or "")
    other = EvalSession(EvalSettings.from_mapping({**base, "ddtree_budget": "4"}), progress=None)
    assert other.evaluation.measure(ROUND_COSTS)[1] is False  # other budgets: timed anew
    from dflash_eval.errors import CacheError

    torch.set_num_threads(2)  # a warm --cache-only run with another thread count (a cold -n 2 run, then -n 0)
    warm = EvalSession(EvalSettings.from_mapping({**base, "cache_only": True}), progress=None)
    assert warm.evaluation.measure(ROUND_COSTS) == (c1, True)  # the 1-thread costs serve, nothing is timed
    normal = EvalSession(EvalSettings.from_mapping(base), progress=None)
    c3, cached3 = normal.evaluation.measure(ROUND_COSTS)
    assert cached3 is False and c3.threads == 2  # outside --cache-only this thread count is timed for itself
    miss = EvalSession(EvalSettings.from_mapping({**base, "cache_only": True, "ddtree_budget": "16"}), progress=None)
    with pytest.raises(CacheError, match="round"):
        miss.evaluation.measure(ROUND_COSTS)


# ------------------------------------------------------------------------------------------------ reports
def test_reports_show_the_prediction(tmp_path: Path) -> None:
    from result_rows import fragment

    from dflash_eval.metrics.verdict import stored_verdict
    from dflash_eval.report import merge
    from dflash_eval.report.render import render_markdown, render_terminal
    from dflash_eval.report.speedup_report import (
        SPEEDUP_PLOT,
        speedup_rows,
        verdict_line,
        write_speedup_plot,
    )
    from dflash_eval.session.run_result import RunResult

    block = speedup_block(costs(), (4.5, (4.0, 5.0)), {4: (3.9, (3.5, 4.3)), 8: (5.6, (5.0, 6.2))}, floor=9.0,
                          pooled={"chain": 4.25})
    data = json.loads(dumps_strict(merge([fragment(speedup=block.to_dict())]).to_dict()))  # as eval.json holds it
    result = RunResult.from_dict(data)
    header, rows = speedup_rows(result.speedup)
    assert [r[:2] for r in rows] == [["chain", "server-style loop"], ["DDTree-4", "server-style loop"],
                                     ["DDTree-8 (best)", "server-style loop"], ["chain", "recompute loop"]]
    chain = block.strategies["chain"]
    assert rows[0][4] == f"{chain.speedup:.2f}x [{chain.speedup_ci[0]:.2f}x, {chain.speedup_ci[1]:.2f}x]"
    line = verdict_line(result.speedup, stored_verdict(result))
    assert line is not None and "cpu (test)" in line and "floor 9 FAIL" in line and "best DDTree-8" in line
    md = render_markdown(result)
    assert "### Predicted speed-up" in md and "--speedup-floor 9 (the server-style loop's chain): FAIL" in md
    assert "speedup.png" in md and "the recompute loop" in md
    assert f"chain {block.pooled['chain'].speedup:.2f}x (τ 4.250" in md  # the pooled τ's speed-up
    text = render_terminal(result)
    assert "DDTree-8 (best)" in text and "recompute loop" in text
    assert write_speedup_plot(result, tmp_path / SPEEDUP_PLOT) == tmp_path / SPEEDUP_PLOT
    assert (tmp_path / SPEEDUP_PLOT).read_bytes()[:4] == b"\x89PNG"
    nothing = merge([fragment()])
    assert write_speedup_plot(nothing, tmp_path / "none.png") is None and speedup_rows(None)[1] == []
    assert verdict_line(None, compose()) is None
    assert "Predicted speed-up" not in render_markdown(nothing)


def test_block_validates_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    from importlib import resources

    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    v = jsonschema.Draft202012Validator({"$defs": schema["$defs"], **schema["properties"]["speedup"]})
    block = speedup_block(costs(), (4.5, (None, None)), {8: (5.6, (5.0, 6.2))}, floor=1.2).to_dict()
    assert not list(v.iter_errors(json.loads(dumps_strict(block))))
    bad = json.loads(dumps_strict({**block, "strategies": {"tree8": block["strategies"]["chain"]}}))
    assert list(v.iter_errors(bad))  # a strategy's name is chain or ddtree-N


# ------------------------------------------------------------------------------------------------ training loop
def test_floor_joins_a_checkpoint_verdict() -> None:
    from dflash_eval.metrics.floors import Floors
    from dflash_eval.metrics.verdict import Threshold

    def verdict(block: Speedup | None, *, mean_floor: float | None = None, tau: float = 2.0):
        floors = Floors(mean_override=mean_floor)
        return checkpoint_verdict({}, [Threshold("chain", tau, mean_floor)], floors, None, speedup=block,
                                  floors_required=False)

    block = speedup_block(costs(), (4.5, (4.0, 5.0)), {}, floor=1.5)
    assert verdict(None).passed is None and verdict(block).passed is True  # unjudged by τ: judged by the speed-up
    below = verdict(block, mean_floor=3.0)
    assert (below.passed, below.reasons) == (False, ["mean chain τ 2.000 < 3.000"])
    high = speedup_block(costs(), (4.5, (4.0, 5.0)), {}, floor=99.0)
    failed = verdict(high, mean_floor=1.0)
    assert failed.passed is False and "--speedup-floor 99" in failed.reasons[0] and "judge nothing" in failed.notices[0]
    no_floor = speedup_block(costs(), (4.5, (4.0, 5.0)), {})
    assert verdict(no_floor).parts == verdict(None).parts


def test_evaluator_records_and_tracks_the_prediction(tmp_path: Path, tiny_target_dir: Path,
                                                     tiny_drafter_dir: Path) -> None:
    """Each checkpoint's record holds the prediction (the costs timed once: the second checkpoint reads them), the
    trackers log it, and --speedup-floor fails a checkpoint whose τ passes."""
    from dflash_eval import Evaluator, tracker_scalars

    opts = {"target_model": str(tiny_target_dir), "prompts": str(ROOT / "fixtures" / "prompts.jsonl"),
            "num_prompts": 2, "max_new_tokens": 12, "cache_dir": str(tmp_path / "cache"), "witness_prompts": 0,
            "tau_floor": 1.0, "speedup_floor": 50.0, "report_dir": str(tmp_path / "reports")}
    with Evaluator(opts, history=True) as ev:
        first = ev.evaluate(tiny_drafter_dir, step=1)
        second = ev.evaluate(tiny_drafter_dir, step=2)
    assert first.speedup is not None and first.speedup.cached is False
    assert second.speedup is not None and second.speedup.cached is True
    rec = ev.records[-1]
    assert rec.speedup is not None and rec.speedup["chain"] == second.speedup.strategies["chain"].speedup
    assert rec.verdict == "fail" and any("--speedup-floor 50" in r for r in rec.reasons)
    got = tracker_scalars(rec)
    assert got["speedup/chain"] == rec.speedup["chain"] and "speedup/ddtree-8" in got
    assert got["speedup/plain_tokens_per_s"] == pytest.approx(second.speedup.plain_tokens_per_s)
    line = json.loads((tmp_path / "reports" / "history.jsonl").read_text().splitlines()[-1])
    assert line["speedup"]["floor"] == 50.0 and line["speedup"]["passed"] is False
    with Evaluator({**opts, "speedup_floor": None}, speedup=False) as off:
        assert off.evaluate(tiny_drafter_dir, step=3).speedup is None and off.records[-1].speedup is None


def test_gate_shows_and_judges_the_prediction(tmp_path: Path, tiny_target_dir: Path, tiny_drafter_dir: Path) -> None:
    import shutil

    from dflash_eval.cli.main import main

    run, reports = tmp_path / "run", tmp_path / "reports"
    shutil.copytree(tiny_drafter_dir, run / "step_100")

    def gate(*extra: str) -> int:
        return main(["gate", str(run), "--target-model", str(tiny_target_dir), "--prompts",
                     str(ROOT / "fixtures" / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "12",
                     "--tau-floor", "1.0", "--witness-prompts", "0", "--cache-dir", str(tmp_path / "cache"),
                     "--report-dir", str(reports), "--quiet", *extra])

    assert gate("--speedup-floor", "50") == 1  # τ passes its floor; the predicted speed-up does not
    row = json.loads((reports / "gate.json").read_text())["checkpoints"][0]
    assert row["passed"] is False and any("--speedup-floor 50" in r for r in row["reasons"])
    assert row["speedup"]["chain"] > 0 and row["speedup"]["floor"] == 50.0
    md = (reports / "gate.md").read_text()
    assert "predicted speed-up, server-style loop (chain [95 % CI]; best)" in md
    assert f"{row['speedup']['chain']:.2f}x" in md
    from dflash_eval.cli.gate_run import record_row
    from dflash_eval.training_loop.history import History

    again = record_row(History(reports / "history.jsonl").read()[0])  # a row judged from its history record
    assert again.speedup == row["speedup"] and again.passed is False


# ------------------------------------------------------------------------------------------------ the suite
def test_suite_gates_on_the_floor(pytester: pytest.Pytester, suite_checkout, tmp_path: Path,  # type: ignore[no-untyped-def]
                                  tiny_target_dir: Path, tiny_drafter_dir: Path) -> None:
    """test_predicted_speedup: skipped without a floor (the prediction reported all the same), failed below one
    with the reason naming the floor and the device, passed above one; the verdict block has the line."""
    suite_checkout()

    def run(*extra: str, name: str) -> tuple[pytest.RunResult, dict]:
        res = pytester.runpytest_inprocess(
            "tests_eval", "-q", "-k", "predicted_speedup", "--target-model", str(tiny_target_dir), "--drafter",
            str(tiny_drafter_dir), "--prompts", str(ROOT / "fixtures" / "prompts.jsonl"), "--num-prompts", "2",
            "--max-new-tokens", "12", "--tau-floor", "1.0", "--witness-prompts", "0", "--torch-threads", "1",
            "--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path / name), *extra)
        return res, json.loads((tmp_path / name / "eval.json").read_text())

    res, data = run(name="none")
    res.assert_outcomes(skipped=1)
    assert data["speedup"]["floor"] is None and data["speedup"]["strategies"]["chain"]["speedup"] > 0
    assert "predicted speed-up (server-style loop) on cpu" in res.stdout.str()
    assert (tmp_path / "none" / "speedup.png").is_file()
    chain = data["speedup"]["strategies"]["chain"]["speedup"]
    high = float(f"{chain * 10:.3f}")
    res, data = run("--speedup-floor", str(high), name="high")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert "predicted chain speed-up" in out and f"< --speedup-floor {high:g} on cpu" in out
    assert data["speedup"]["passed"] is False and data["speedup"]["cached"] is True  # timed once, by the first run
    res, data = run("--speedup-floor", f"{chain / 10:.4f}", name="low")
    res.assert_outcomes(passed=1)
    assert data["speedup"]["passed"] is True
