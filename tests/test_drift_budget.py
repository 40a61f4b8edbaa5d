"""Unit tests of dflash_eval.metrics.drift_budget: the budget rule on synthetic τ curves, the perturbations, the batched
measurement against the plain draft path, the gate and the τ-impact messages; and the budget through a session
(cached once, tolerance applied on read).

Run: ``pytest tests/test_drift_budget.py``
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from dflash_eval.common.dtypes import round_through
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.drift_budget import (
    DriftBudget,
    Perturbation,
    find_budget,
    find_harm,
    gate_check,
    impact,
    measure_ladder,
    parse_ladder,
    perturb_layers,
)
from dflash_eval.metrics.tau import chain_tau, draft_table
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession


def curve(threshold: float, tol: float = 0.1) -> list[tuple[float, float]]:
    """A synthetic mean |Δτ| curve: flat and small below ``threshold``, steep above it."""
    errs = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0]
    return [(e, 0.2 * tol * e / threshold if e <= threshold else tol * (1 + e / threshold)) for e in errs]


@pytest.mark.parametrize("threshold", [1e-3, 3e-2, 1e-1])
def test_budget_finder_returns_the_known_threshold(threshold):
    pts = curve(threshold)
    budget, lower, first = find_budget(pts[::-1], 0.1)  # order of the points does not matter
    assert budget == threshold and lower is False
    assert pts[::-1][first][0] == min(e for e, _ in pts if e > threshold)


def test_budget_rule_edges():
    # every level within: the largest one, flagged a lower bound
    assert find_budget([(1e-3, 0.0), (1e-1, 0.05)], 0.1) == (1e-1, True, None)
    # the smallest level over: no budget
    assert find_budget([(1e-3, 0.2), (1e-1, 0.0)], 0.1)[:2] == (0.0, False)
    # a level over the tolerance ends the search, even if a larger one falls back within it
    assert find_budget([(1e-3, 0.0), (1e-2, 0.5), (1e-1, 0.0)], 0.1)[:2] == (1e-3, False)
    # NaN (no prompt with a round) counts as over
    assert find_budget([(1e-3, 0.0), (1e-2, math.nan)], 0.1)[:2] == (1e-3, False)
    # equal to the tolerance is within
    assert find_budget([(1e-3, 0.1)], 0.1)[0] == 1e-3


def test_parse_ladder():
    lad = parse_ladder("1e-3, bf16,0.1,fp8,1e-3")
    assert [p.label for p in lad] == ["noise 0.001", "round bf16", "noise 0.1", "round fp8"]
    for bad in ("", "0", "-1e-3", "fp64", "nan"):
        with pytest.raises(ConfigError, match="--drift-budget-ladder"):
            parse_ladder(bad)


def test_noise_has_the_requested_relative_size_and_is_seeded():
    f = {1: torch.randn(64, 32) * 3, 3: torch.randn(64, 32) + 5}
    p = Perturbation("noise", size=0.05)
    a, errs = perturb_layers(f, p, seed=0, prompt_id="x", dtype=torch.float32)
    assert a.shape == (64, 64) and all(abs(e - 0.05) < 0.01 for e in errs)
    b, _ = perturb_layers(f, p, seed=0, prompt_id="x", dtype=torch.float32)
    c, _ = perturb_layers(f, p, seed=0, prompt_id="y", dtype=torch.float32)
    d, _ = perturb_layers(f, p, seed=1, prompt_id="x", dtype=torch.float32)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)


def test_rounding_levels_and_fp8_scale():
    x = torch.randn(128, 64)
    x[0, 0] = 5000.0  # an outlier far beyond fp8-e4m3's 448
    y = round_through(x, "fp8")
    assert torch.isfinite(y).all() and abs(float(y[0, 0]) - 5000.0) / 5000.0 < 0.07
    x = torch.randn(128, 64)
    errs = {name: float((round_through(x, name) - x).norm() / x.norm()) for name in ("fp16", "bf16", "fp8")}
    assert 0 < errs["fp16"] < errs["bf16"] < errs["fp8"] < 0.1
    with pytest.raises(ConfigError, match="cannot round"):
        round_through(x, "int4")


def test_measured_ladder_equals_the_plain_draft_path(tiny_drafter, tiny_head):
    g = torch.Generator().manual_seed(0)
    h = tiny_drafter.config.hidden_size
    layers = tiny_drafter.config.target_layer_ids
    prompts = []
    for k, t in enumerate((40, 57)):
        feats = {i: torch.randn(t, h, generator=g) for i in layers}
        prompts.append((f"p{k}", feats, torch.randint(2, tiny_head.vocab_size, (t,), generator=g), 10))
    ladder = parse_ladder("1e-2,0.5,bf16")
    base = [chain_tau(tb) for tb in draft_table(tiny_drafter, tiny_head, [
        (torch.cat([f[i] for i in layers], -1), toks, pl) for _, f, toks, pl in prompts])]
    taus, inj = measure_ladder(tiny_drafter, tiny_head, prompts, ladder, base_tau=[r.tau for r in base], seed=3,
                               memory=1)
    batched, inj2 = measure_ladder(tiny_drafter, tiny_head, prompts, ladder, seed=3)
    assert taus == batched and inj == inj2 and len(taus) == 3 and len(inj[0][0]) == len(layers)
    for p, ts in zip(ladder, taus):  # each level against a plain draft pass of the same perturbed features
        items = [(perturb_layers(f, p, seed=3, prompt_id=pid, dtype=torch.float32)[0], toks, pl)
                 for pid, f, toks, pl in prompts]
        assert ts == [chain_tau(tb).tau for tb in draft_table(tiny_drafter, tiny_head, items)]


def test_an_identity_level_reuses_the_base_tau(tiny_drafter, tiny_head):
    h, layers = tiny_drafter.config.hidden_size, tiny_drafter.config.target_layer_ids
    feats = {i: torch.randn(30, h).to(torch.bfloat16).float() for i in layers}  # already bf16-exact
    toks = torch.randint(2, tiny_head.vocab_size, (30,))
    taus, inj = measure_ladder(tiny_drafter, tiny_head, [("a", feats, toks, 5)], parse_ladder("bf16"),
                               base_tau=[123.0])
    assert taus == [[123.0]] and inj == [[[0.0] * len(layers)]]


def budget_of(levels: list[tuple[str, float, list[float]]], base=(4.0, 5.0), tol=0.1, safety=10.0) -> DriftBudget:
    ladder = parse_ladder(",".join(s for s, _, _ in levels))
    return DriftBudget.build(drafter="f" * 64, base="torch/float32", prompt_ids=["a", "b"], base_tau=list(base),
                             ladder=ladder, taus=[t for _, _, t in levels], injected=[[[e], [e]] for _, e, _ in levels],
                             tol=tol, safety=safety, seed=0, spec=",".join(s for s, _, _ in levels))


def test_the_rule_judges_the_upper_end_of_the_ci_of_the_mean():
    # level 1e-1: mean |Δτ| 0.075 <= 0.1, but one prompt in four moved by 0.3: the CI's upper end is 0.3
    b = DriftBudget.build(drafter="f" * 64, base="torch/float32", prompt_ids=list("abcd"), base_tau=[4.0] * 4,
                          ladder=parse_ladder("1e-2,1e-1"), taus=[[4.0] * 4, [4.3, 4.0, 4.0, 4.0]],
                          injected=[[[1e-2]] * 4, [[1e-1]] * 4], tol=0.1, safety=5.0, seed=0, spec="1e-2,1e-1")
    assert b.levels[1].mean_abs_dtau == pytest.approx(0.075) and b.levels[1].summary.ci_high > 0.1
    assert b.budget == 1e-2 and b.limiting == "noise 0.1" and [lv.within for lv in b.levels] == [True, False]
    assert b.gate_limit == pytest.approx(2e-3)


def test_budget_json_gate_and_impact():
    b = budget_of([("1e-3", 1e-3, [4.0, 5.0]), ("1e-2", 1e-2, [4.1, 5.0]), ("1e-1", 0.1, [4.5, 4.5])])
    assert b.budget == 1e-2 and not b.lower_bound and b.limiting == "noise 0.1"
    assert [lv.within for lv in b.levels] == [True, True, False]
    js = json.loads(json.dumps(b.to_json()))
    assert js["budget"] == 1e-2 and js["gate_limit"] == pytest.approx(1e-3) and js["n_prompts"] == 2
    assert js["levels"][1]["mean_abs_dtau"] == pytest.approx(0.05) and js["levels"][1]["abs_dtau"]["a"] == \
        pytest.approx(0.1)
    ok = gate_check("fla-vs-torch", 5, {"a": 5e-4, "b": 9e-4}, b)
    bad = gate_check("fla-vs-torch", 5, {"a": 5e-4, "b": 2e-3}, b)
    assert ok.passed and ok.worst_prompt == "b" and ok.margin == pytest.approx(1e-2 / 9e-4)
    assert not bad.passed and bad.to_json()["passed"] is False
    assert impact(9e-4, b).startswith("τ impact: within budget")
    assert impact(2e-3, b).startswith("τ impact: over budget")
    assert "as far as this check can tell" in impact(1e-4, b, bound=True)
    assert impact(1.0, b, bound=True).startswith("τ impact: over budget (at least")


def test_harm_is_the_smallest_level_whose_mean_exceeds_the_tolerance():
    assert find_harm([(1.0, 0.5), (3e-1, 0.2), (1e-1, 0.1)], 0.1) == 1  # 0.1 is not over 0.1
    assert find_harm([(1e-2, 0.0), (1e-1, 0.05)], 0.1) is None
    assert find_harm([(1e-2, math.nan)], 0.1) is None  # no prompt with a round: no evidence of harm


def few_prompts_budget(min_prompts: int) -> DriftBudget:
    """Two prompts: 1e-2 leaves τ as it is; 1e-1 moves one prompt by 0.11 (mean 0.055, within, but the CI reaches
    0.11: over by the CI rule); 1 moves both by 1.0 (mean 1.0: measurably harmful)."""
    return DriftBudget.build(drafter="f" * 64, base="torch/float32", prompt_ids=["a", "b"], base_tau=[4.0, 5.0],
                             ladder=parse_ladder("1e-2,1e-1,1"), taus=[[4.0, 5.0], [4.11, 5.0], [3.0, 4.0]],
                             injected=[[[1e-2], [1e-2]], [[1e-1], [1e-1]], [[1.0], [1.0]]], tol=0.1, safety=5.0,
                             seed=0, spec="1e-2,1e-1,1", min_prompts=min_prompts, selected=2)


def test_gate_over_a_budget_of_too_few_prompts_is_inconclusive_until_the_drift_reaches_harm():
    few = few_prompts_budget(min_prompts=32)
    assert few.budget == 1e-2 and few.limiting == "noise 0.1" and not few.conclusive and few.n_measured == 2
    assert few.harm == 1.0 and few.harm_label == "noise 1"
    outcome = {err: gate_check("bf16-vs-fp32", 1, {"a": err, "b": err / 2}, few).outcome
               for err in (1e-3, 5e-3, 0.1, 0.2, 0.5)}
    # x safety 5: 5e-3 within 1e-2; 2.5e-2 .. 0.5 over the budget but short of harm (1.0); 1.0 and 2.5 reach it
    assert outcome == {1e-3: "pass", 5e-3: "inconclusive", 0.1: "inconclusive", 0.2: "fail", 0.5: "fail"}
    enough = few_prompts_budget(min_prompts=2)
    assert enough.conclusive and gate_check("bf16-vs-fp32", 1, {"a": 5e-3}, enough).outcome == "fail"
    js = json.loads(json.dumps(few.to_json()))
    assert js["conclusive"] is False and js["min_prompts"] == 32 and js["harm_level"] == "noise 1"
    row = gate_check("bf16-vs-fp32", 1, {"a": 5e-3}, few).to_json()
    assert row["outcome"] == "inconclusive" and row["passed"] is False


@pytest.fixture
def settings(tiny_target_dir, tiny_drafter_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "text": "def add(a, b):"}) + "\n" +
                       json.dumps({"id": "b", "text": "The quick brown fox"}) + "\n")
    return EvalSettings.from_mapping({"target_model": tiny_target_dir, "drafter": tiny_drafter_dir,
                                      "prompts": prompts, "cache_dir": tmp_path / "cache", "max_new_tokens": 12,
                                      "device": "cpu", "drift_budget_ladder": "1e-2,bf16",
                                      "floors_file": tmp_path / "no_floors.json"})


def _produced(s: EvalSettings, kind: str) -> int:
    return sum(1 for x in EvalSession(s, worker=("master", 0, 1)).inputs.cache.productions() if x["kind"] == kind)


def test_budget_through_the_session_is_cached_and_judged_on_read(settings):
    s1 = EvalSession(settings, worker=("master", 0, 1))
    b1 = s1.drift_budget()
    assert b1.base == "torch/float32" and [lv.perturbation.label for lv in b1.levels] == ["noise 0.01", "round bf16"]
    assert _produced(settings, "drift_budget") == 2  # one entry per level
    looser = dataclasses.replace(settings, drift_budget_tol=5.0, drift_budget_safety=2.0)
    b2 = EvalSession(looser, worker=("master", 0, 1)).drift_budget()
    assert _produced(settings, "drift_budget") == 2  # tolerance and safety are applied on read
    assert [lv.tau for lv in b2.levels] == [lv.tau for lv in b1.levels] and b2.safety == 2.0 and b2.lower_bound
    EvalSession(dataclasses.replace(settings, drift_budget_seed=1), worker=("master", 0, 1)).drift_budget()
    assert _produced(settings, "drift_budget") == 4  # the seed is part of the key
    fewer = dataclasses.replace(settings, drift_budget_ladder="0.01")
    b3 = EvalSession(fewer, worker=("master", 0, 1)).drift_budget()
    assert _produced(settings, "drift_budget") == 4  # a ladder's levels are reused by another ladder
    assert b3.levels[0].tau == b1.levels[0].tau
    gates = s1.drift_gate("torch-vs-torch-recurrent")
    assert set(gates) == set(s1.evaluation.layer_ids) and all(g.passed for g in gates.values())
    res = s1.result().to_dict()
    assert res["drift_budget"]["budget"] == b1.budget and len(res["drift_gate"]) == len(gates)


def test_kernel_fault_is_its_own_side_and_comparison(settings):
    s = EvalSession(dataclasses.replace(settings, kernel_fault="noise:0.5"), worker=("master", 0, 1))
    assert s.inputs.eval_side.backend == "torch+noise=0.5" and s.inputs.reference_side.backend == "torch"
    assert [c.name for c in s.inputs.comparisons] == ["torch+noise=0.5-vs-torch"]
    d = s.drift("torch+noise=0.5-vs-torch")
    assert all(st.rel_err > 0.01 for per in d.stats.values() for st in per.values())
    assert s.run_context()["backend"] == "torch+noise=0.5"
    with pytest.raises(Exception, match="unknown kernel fault"):
        dataclasses.replace(settings, kernel_fault="noise:-1").validate()
