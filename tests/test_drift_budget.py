"""Unit tests of dflash_eval.metrics.drift_budget and drift_fit: the monotone fit, its crossing and bootstrap CI on
synthetic τ curves (signed harm: a raise of τ is no harm; the lower-bound case; NaN prompts), the three-way gate and
its messages, the perturbations, the batched measurement against the plain draft path; and the budget through a
session (cached once, tolerance applied on read).

Run: ``pytest tests/test_drift_budget.py``
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from dflash_eval.common.dtypes import round_through
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.drift_budget import (
    Direction,
    DriftBudget,
    Perturbation,
    gate_check,
    gate_reason,
    impact,
    measure_ladder,
    parse_ladder,
    perturb_layers,
)
from dflash_eval.metrics.drift_checks import GateCheck
from dflash_eval.metrics.drift_fit import crossing, fit_budget, isotonic
from dflash_eval.metrics.tau import chain_tau, draft_table
from dflash_eval.options.settings import EvalSettings
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.blocks import DriftBudgetBlock
from dflash_eval.session.eval_session import EvalSession

ERRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0]


def drops_of(curve, n: int = 40, spread: float = 0.05, seed: int = 0) -> np.ndarray:
    """Per-prompt drops ``curve(e) + noise`` at :data:`ERRS`, shape [level, prompt] (the noise is one draw per
    prompt and level, zero mean)."""
    rng = np.random.default_rng(seed)
    return np.array([[curve(e) for _ in range(n)] for e in ERRS]) + spread * rng.standard_normal((len(ERRS), n))


def test_isotonic_is_the_monotone_least_squares_fit():
    assert isotonic([1.0, 3.0, 2.0, 4.0]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([3.0, 2.0, 1.0]).tolist() == [2.0, 2.0, 2.0]
    y = np.random.default_rng(1).standard_normal(30).cumsum()
    f = isotonic(y)
    assert np.all(np.diff(f) >= 0) and f.sum() == pytest.approx(y.sum())  # monotone; pooling keeps the sum


def test_crossing_is_log_linear_between_points_and_flags_the_edges():
    x, tol = [0.01, 0.1, 1.0], 0.1
    assert crossing(x, [0.0, 0.05, 0.15], tol) == (pytest.approx(10 ** -0.5), "crossed")  # halfway in log x
    assert crossing(x, [0.0, 0.1, 0.2], tol) == (pytest.approx(0.1), "crossed")  # reaching it counts
    assert crossing(x, [0.2, 0.3, 0.4], tol) == (pytest.approx(0.005), "below_range")  # on the line from (0, 0)
    assert crossing(x, [0.0, 0.01, 0.09], tol) == (1.0, "not_reached")


@pytest.mark.parametrize("knee", [3e-2, 0.2, 0.6])
def test_fit_recovers_a_known_crossing_with_a_ci_around_it(knee):
    # the drop doubles per factor ~3 of error past the knee; 0.1 reached exactly at `knee`
    fit = fit_budget(ERRS, drops_of(lambda e: 0.1 * (e / knee) ** 1.5), 0.1)
    assert fit.status == "crossed" and fit.budget == pytest.approx(knee, rel=0.35)
    assert fit.ci_low <= fit.budget <= fit.ci_high and fit.ci_low < knee * 1.4 and fit.ci_high > knee / 1.4
    assert all(b >= a for a, b in zip(fit.fitted, fit.fitted[1:])) and min(fit.fitted) >= 0  # monotone, >= 0
    again = fit_budget(ERRS, drops_of(lambda e: 0.1 * (e / knee) ** 1.5), 0.1)
    assert (again.ci_low, again.ci_high) == (fit.ci_low, fit.ci_high)  # the bootstrap is seeded


def test_ci_widens_with_fewer_prompts():
    curve = lambda e: 0.1 * (e / 0.3) ** 1.5  # noqa: E731
    many, few = (fit_budget(ERRS, drops_of(curve, n=n, spread=0.2), 0.1) for n in (200, 8))
    assert few.ci_high - few.ci_low > many.ci_high - many.ci_low


def test_a_raise_of_tau_is_no_harm():
    # prompts' τ rises by 0.3 at 0.1 and 0.3 (negative drops): the |Δτ| of the old rule would have counted it
    fit = fit_budget(ERRS, drops_of(lambda e: -0.3 if 0.05 < e < 0.5 else (0.5 if e >= 1 else 0.0)), 0.1)
    assert fit.drops[4] < -0.2 and fit.fitted[4] == 0.0 and fit.fitted[5] == 0.0
    assert fit.status == "crossed" and 0.3 < fit.budget < 1.0


def test_no_crossing_gives_a_lower_bound_with_an_open_ci():
    fit = fit_budget(ERRS, drops_of(lambda e: 0.01 * e, spread=0.01), 0.1)
    assert fit.status == "not_reached" and fit.lower_bound and fit.budget == 3.0
    assert fit.ci_high == math.inf and fit.ci_low <= 3.0


def test_a_crossing_below_the_smallest_level_is_extrapolated_to_no_error():
    fit = fit_budget(ERRS, drops_of(lambda e: 0.5, spread=0.01), 0.1)
    assert fit.below_range and fit.budget == pytest.approx(1e-3 * 0.1 / 0.5, rel=0.1)


def test_nan_prompts_and_zero_error_levels_are_left_out():
    d = drops_of(lambda e: 0.1 * (e / 0.3) ** 1.5, n=20)
    d[:, 3] = np.nan  # a prompt without a round
    with_zero = np.vstack([np.zeros((1, 20)), d])
    fit = fit_budget([0.0, *ERRS], with_zero, 0.1)
    assert fit.n_prompts == 19 and len(fit.errors) == len(ERRS) and 0 not in fit.order
    nothing = fit_budget(ERRS, np.full((len(ERRS), 3), np.nan), 0.1)
    assert nothing.status == "no_prompts" and nothing.lower_bound and nothing.ci_high == math.inf


def budget_of(levels: list[tuple[str, float, list[float]]], base=(4.0, 5.0), tol=0.1, safety=10.0,
              conclusive: bool = False, direction: Direction | None = None, axis_note: str = "") -> DriftBudget:
    ladder = parse_ladder(",".join(s for s, _, _ in levels))
    n = len(base)
    return DriftBudget.build(drafter="f" * 64, base="torch/float32", prompt_ids=[f"p{i}" for i in range(n)],
                             base_tau=list(base), ladder=ladder, taus=[t for _, _, t in levels],
                             injected=[[[e]] * n for _, e, _ in levels], tol=tol, safety=safety, seed=0,
                             spec=",".join(s for s, _, _ in levels), conclusive=conclusive, direction=direction,
                             axis_note=axis_note)


def forty_prompts(conclusive: bool = False) -> DriftBudget:
    """40 prompts at τ 4: no drop up to 0.1, then drops of 0.05 / 0.2 / 1.0 on average (one prompt in four
    carrying them, so the bootstrap has something to resample)."""
    base = [4.0] * 40
    def at(mean: float) -> list[float]:
        return [4.0 - (4 * mean if i % 4 == 0 else 0.0) for i in range(40)]
    return budget_of([("1e-2", 1e-2, at(0.0)), ("1e-1", 0.1, at(0.0)), ("3e-1", 0.3, at(0.05)),
                      ("1", 1.0, at(0.2)), ("3", 3.0, at(1.0))], base=tuple(base), safety=5.0, conclusive=conclusive)


def test_budget_json_and_levels():
    b = forty_prompts()
    lo, hi = b.ci
    assert b.fit.status == "crossed" and 0.3 < lo <= b.budget <= hi < 3.0 and not b.lower_bound
    assert [lv.within(b.tol) for lv in b.levels] == [True, True, True, False, False]
    js = json.loads(json.dumps(DriftBudgetBlock.of(b).to_dict()))
    assert js["budget"] == pytest.approx(b.budget) and js["ci"] == [pytest.approx(lo), pytest.approx(hi)]
    assert js["status"] == "crossed" and js["n_measured"] == 40 and js["gate_limit"] == pytest.approx(b.budget / 5)
    assert js["levels"][3]["mean_drop"] == pytest.approx(0.2) and js["levels"][3]["drop"]["p0"] == pytest.approx(0.8)
    assert js["fit"]["points"][2]["fitted_drop"] == pytest.approx(0.05) and "isotonic" in js["rule"]


def test_the_drift_axis_is_the_budget_and_the_isotropic_one_is_reported_beside_it():
    base = [4.0] * 40

    def at(mean: float) -> list[float]:
        return [4.0 - (4 * mean if i % 4 == 0 else 0.0) for i in range(40)]
    drift = [("x1", 5e-3, at(0.0)), ("x10", 5e-2, at(0.0)), ("x30", 0.15, at(0.05)), ("x100", 0.5, at(0.4)),
             ("x300", 1.5, at(2.0))]
    iso = [("0.1", 0.1, at(0.0)), ("0.5", 0.5, at(0.02)), ("1", 1.0, at(0.4)), ("bf16", 2e-3, at(0.0))]
    direction = Direction("bf16-vs-fp32", "torch/float32", "torch/bfloat16", 5e-3,
                          (("torch-vs-torch-recurrent", 3e-7), ("bf16-vs-fp32", 5e-3)))
    b = budget_of(iso + drift, base=tuple(base), safety=5.0, direction=direction)
    alone = {a: budget_of(lv, base=tuple(base), safety=5.0) for a, lv in (("drift", drift), ("iso", iso))}
    assert b.axis == "drift" and b.fit.errors == alone["drift"].fit.errors and b.budget == alone["drift"].budget
    assert b.secondary is not None and b.secondary.fit.budget == alone["iso"].budget and b.ci == alone["drift"].ci
    assert 0.15 < b.budget < 0.5 < b.secondary.fit.budget < 1.0  # the structured direction hurts at less error
    assert [lv.fitted for lv in b.levels] == [lv.fitted for lv in alone["iso"].levels + alone["drift"].levels]
    text = "along the bf16-vs-fp32 drift of this run (torch/bfloat16 - torch/float32), amplified x1..x300"
    assert b.axis_text == text and text in b.describe() and "isotropic noise and rounding alone" in b.describe()
    js = json.loads(json.dumps(DriftBudgetBlock.of(b).to_dict()))
    assert js["axis"] == "drift" and js["axis_text"] == text and js["direction"]["comparison"] == "bf16-vs-fp32"
    assert js["secondary"]["axis"] == "isotropic" and js["secondary"]["budget"] == pytest.approx(b.secondary.fit.budget)
    assert [lv["axis"] for lv in js["levels"]] == ["isotropic"] * 4 + ["drift"] * 5
    assert [lv["kind"] for lv in js["levels"]][-1] == "drift" and js["levels"][-1]["nominal"] == 300.0
    # the gate judges against the drift axis's CI only
    lo, hi = b.ci
    assert gate_check("c", 1, {"a": 1.01 * hi / 5}, b).outcome == "fail" and hi < b.secondary.fit.ci_low
    # no second feature side: the isotropic axis is the budget, and says so
    fallback = budget_of(iso, base=tuple(base), safety=5.0, axis_note="no drift direction: no comparison")
    assert fallback.axis == "isotropic" and fallback.secondary is None and fallback.direction is None
    assert "isotropic relative noise and dtype rounding (no drift direction: no comparison)" in fallback.describe()


def test_three_way_gate_and_its_messages():
    b = forty_prompts()
    lo, hi = b.ci
    below, inside, above = 0.5 * lo / 5, (lo + hi) / 2 / 5, 2 * hi / 5  # drift (x safety 5)
    outcome = {x: gate_check("bf16-vs-fp32", 1, {"a": x, "b": x / 2}, b).outcome for x in (below, inside, above)}
    assert outcome == {below: "pass", inside: "inconclusive", above: "fail"}
    g = gate_check("bf16-vs-fp32", 1, {"a": inside}, b)
    assert g.in_ci and not g.passed and g.to_dict()["outcome"] == "inconclusive"
    assert GateCheck.from_dict(g.to_dict()) == g  # one class computes the row and reads it back
    why = gate_reason(g, b, "bf16 vs fp32, target layer 1")
    assert why.startswith("drift gate inconclusive") and f"{g.scaled:.2e}" in why and f"{lo:.2e}" in why
    assert "--drift-budget-min-prompts" in why and "--drift-budget-conclusive" in why
    assert gate_reason(gate_check("c", 1, {"a": above}, b), b, "c").startswith("drift over budget")
    decided = forty_prompts(conclusive=True)
    est = decided.budget / 5
    assert gate_check("c", 1, {"a": est * 0.99}, decided).outcome == "pass"
    over = gate_check("c", 1, {"a": est * 1.01}, decided)
    assert over.outcome == "fail" and over.to_dict()["decided_on"] == "estimate"
    assert GateCheck.from_dict(json.loads(dumps_strict(over.to_dict()))).outcome == "fail"  # as eval.json holds it
    assert "decided on the estimate" in gate_reason(over, decided, "c")
    assert impact(below, b).startswith("τ impact: within budget")
    assert impact(above, b).startswith("τ impact: over budget")
    assert impact(inside, b).startswith("τ impact: near the budget")
    assert "as far as this check can tell" in impact(below, b, bound=True)


def test_gate_on_a_lower_bound_never_fails_by_the_ci():
    b = budget_of([("1e-2", 1e-2, [4.0, 5.0]), ("1e-1", 0.1, [4.0, 5.0])], safety=5.0)
    assert b.lower_bound and b.budget == pytest.approx(0.1) and b.ci[1] == math.inf
    assert gate_check("c", 1, {"a": 1e-2}, b).outcome == "pass"  # 5e-2 <= 0.1, below the lower bound
    assert gate_check("c", 1, {"a": 1.0}, b).outcome == "inconclusive"  # beyond what was measured
    forced = budget_of([("1e-2", 1e-2, [4.0, 5.0]), ("1e-1", 0.1, [4.0, 5.0])], safety=5.0, conclusive=True)
    assert gate_check("c", 1, {"a": 1.0}, forced).outcome == "fail"


def test_parse_ladder():
    lad = parse_ladder("1e-3, bf16,0.1,fp8,1e-3")
    assert [p.label for p in lad] == ["noise 0.001", "round bf16", "noise 0.1", "round fp8"]
    for bad in ("", "0", "-1e-3", "fp64", "nan"):
        with pytest.raises(ConfigError, match="--drift-budget-ladder"):
            parse_ladder(bad)


@pytest.mark.parametrize("bad", ["x", "x0", "x-3", "xabc", "xnan", "xinf", "x1e999"])
def test_parse_ladder_drift_levels_and_their_errors(bad):
    lad = parse_ladder("x1,X10, x3e1,0.1,bf16,x10")
    assert [(p.kind, p.size) for p in lad[:3]] == [("drift", 1.0), ("drift", 10.0), ("drift", 30.0)]
    assert [p.label for p in lad] == ["drift x1", "drift x10", "drift x30", "noise 0.1", "round bf16"]
    assert [p.axis for p in lad] == ["drift"] * 3 + ["isotropic"] * 2
    assert not lad[0].seeded and lad[3].seeded and not lad[4].seeded
    with pytest.raises(ConfigError, match=f"--drift-budget-ladder: '{bad}' is not an amplification"):
        parse_ladder(f"x1,{bad},0.1")


def test_drift_level_amplifies_the_other_side_and_ignores_the_seed():
    g = torch.Generator().manual_seed(0)
    f = {1: torch.randn(64, 32, generator=g) * 3, 3: torch.randn(64, 32, generator=g) + 5}
    d = {i: 1e-3 * torch.randn(64, 32, generator=g) * x.pow(2).mean().sqrt() for i, x in f.items()}
    other = {i: f[i] + d[i] for i in f}
    drift = [float(d[i].norm() / f[i].norm()) for i in f]
    for alpha in (1.0, 10.0, 300.0):
        p = parse_ladder(f"x{alpha:g}")[0]
        out, errs = perturb_layers(f, p, seed=0, prompt_id="x", dtype=torch.float32, other=other)
        want = torch.cat([f[i] + alpha * d[i] for i in f], -1)
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-4)  # along the direction, scaled by α
        assert errs == pytest.approx([alpha * e for e in drift], rel=1e-3)  # injected error = α x the drift
        again, _ = perturb_layers(f, p, seed=7, prompt_id="y", dtype=torch.float32, other=other)
        assert torch.equal(out, again)  # neither the seed nor the prompt id enters
    p = parse_ladder("x3")[0]
    with pytest.raises(ValueError, match="prompt 'x': no features of the other side for layers \\[3\\]"):
        perturb_layers(f, p, seed=0, prompt_id="x", dtype=torch.float32, other={1: other[1]})
    with pytest.raises(ValueError, match="not the same tokens"):
        perturb_layers(f, p, seed=0, prompt_id="x", dtype=torch.float32, other={1: other[1][:5], 3: other[3]})
    bf = perturb_layers(f, p, seed=0, prompt_id="x", dtype=torch.bfloat16, other=other)[0]
    assert bf.dtype == torch.bfloat16  # what a bf16 drafter sees


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


def test_drift_levels_through_the_ladder_equal_the_plain_draft_path(tiny_drafter, tiny_head):
    g = torch.Generator().manual_seed(1)
    h, layers = tiny_drafter.config.hidden_size, tiny_drafter.config.target_layer_ids
    prompts = []
    for k, t in enumerate((33, 48)):
        feats = {i: torch.randn(t, h, generator=g) for i in layers}
        other = {i: x + 0.05 * torch.randn(t, h, generator=g) for i, x in feats.items()}
        prompts.append((f"p{k}", feats, torch.randint(2, tiny_head.vocab_size, (t,), generator=g), 8, other))
    ladder = parse_ladder("x1,x30,0.5")
    taus, inj = measure_ladder(tiny_drafter, tiny_head, prompts, ladder, seed=2, memory=1)
    other_seed, inj5 = measure_ladder(tiny_drafter, tiny_head, prompts, ladder, seed=5)
    assert other_seed[:2] == taus[:2] and inj5[:2] == inj[:2]  # the drift levels do not depend on the seed
    assert inj5[2] != inj[2]  # the noise level does
    for p, ts in zip(ladder, taus):
        items = [(perturb_layers(f, p, seed=2, prompt_id=pid, dtype=torch.float32, other=o)[0], toks, pl)
                 for pid, f, toks, pl, o in prompts]
        assert ts == [chain_tau(tb).tau for tb in draft_table(tiny_drafter, tiny_head, items)]
    assert np.mean(inj[1]) == pytest.approx(30 * np.mean(inj[0]), rel=1e-3)
    with pytest.raises(ValueError, match="no features of the other side"):
        measure_ladder(tiny_drafter, tiny_head, [p[:4] for p in prompts], ladder[:1])


def test_an_identity_level_reuses_the_base_tau(tiny_drafter, tiny_head):
    h, layers = tiny_drafter.config.hidden_size, tiny_drafter.config.target_layer_ids
    feats = {i: torch.randn(30, h).to(torch.bfloat16).float() for i in layers}  # already bf16-exact
    toks = torch.randint(2, tiny_head.vocab_size, (30,))
    taus, inj = measure_ladder(tiny_drafter, tiny_head, [("a", feats, toks, 5)], parse_ladder("bf16"),
                               base_tau=[123.0])
    assert taus == [[123.0]] and inj == [[[0.0] * len(layers)]]


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
    looser = dataclasses.replace(settings, drift_budget_tol=5.0, drift_budget_safety=2.0,
                                 drift_budget_conclusive=True)
    b2 = EvalSession(looser, worker=("master", 0, 1)).drift_budget()
    assert _produced(settings, "drift_budget") == 2  # tolerance, safety and the gate's rule are applied on read
    assert [lv.tau for lv in b2.levels] == [lv.tau for lv in b1.levels] and b2.safety == 2.0 and b2.lower_bound
    assert b2.conclusive and not b1.conclusive and b2.fit.status == "not_reached"
    EvalSession(dataclasses.replace(settings, drift_budget_seed=1), worker=("master", 0, 1)).drift_budget()
    assert _produced(settings, "drift_budget") == 3  # the seed is part of the noise level's key, not the rounding's
    fewer = dataclasses.replace(settings, drift_budget_ladder="0.01")
    b3 = EvalSession(fewer, worker=("master", 0, 1)).drift_budget()
    assert _produced(settings, "drift_budget") == 3  # a ladder's levels are reused by another ladder
    assert b3.levels[0].tau == b1.levels[0].tau
    gates = s1.drift_gate("torch-vs-torch-recurrent")
    assert set(gates) == set(s1.evaluation.layer_ids) and all(g.passed for g in gates.values())
    res = s1.result().to_dict()
    assert res["drift_budget"]["budget"] == b1.budget and len(res["drift_gate"]) == len(gates)


def test_drift_levels_through_the_session_follow_the_largest_drift_and_not_the_seed(settings):
    s = dataclasses.replace(settings, drift_budget_ladder="x3,x30,1e-2")
    b = EvalSession(s, worker=("master", 0, 1)).drift_budget()
    assert b.axis == "drift" and b.direction is not None and b.secondary is not None
    assert (b.direction.comparison, b.direction.other) == ("bf16-vs-fp32", "torch/bfloat16")  # the largest drift
    cands = dict(b.direction.candidates)
    assert cands["bf16-vs-fp32"] > 100 * cands["torch-vs-torch-recurrent"] and b.direction.drift > 0
    x3, x30 = b.levels[0], b.levels[1]
    assert x3.injected == pytest.approx(3 * b.direction.drift, rel=0.02)  # α x the measured drift
    assert x30.injected == pytest.approx(10 * x3.injected, rel=1e-3)
    assert "amplified x3..x30" in b.describe() and _produced(s, "drift_budget") == 3
    b1 = EvalSession(dataclasses.replace(s, drift_budget_seed=1), worker=("master", 0, 1)).drift_budget()
    assert _produced(s, "drift_budget") == 4  # only the noise level is measured again under another seed
    assert [lv.tau for lv in b1.levels[:2]] == [lv.tau for lv in b.levels[:2]] and b1.budget == b.budget
    # another other side (a kernel fault on the evaluation side): the drift levels are new, the noise level reused
    f = EvalSession(dataclasses.replace(s, kernel_fault="noise:0.5"), worker=("master", 0, 1)).drift_budget()
    assert f.direction is not None and f.direction.comparison == "torch+noise=0.5-vs-torch"
    assert _produced(s, "drift_budget") == 6 and f.levels[2].tau == b.levels[2].tau
    assert f.levels[0].injected > 10 * x3.injected


def test_without_a_second_side_the_isotropic_axis_is_the_budget(settings):
    s = EvalSession(dataclasses.replace(settings, drift_budget_ladder="x3,1e-2"), worker=("master", 0, 1))
    s.inputs.__dict__["comparisons"] = []  # a run that compares no second feature side
    b = s.drift_budget()
    assert b.axis == "isotropic" and b.direction is None
    assert [lv.perturbation.label for lv in b.levels] == ["noise 0.01"]
    assert b.skipped == ["drift x3: no drift comparison of this run has the reference side torch/float32 on one side"]
    assert "isotropic relative noise and dtype rounding (no drift direction: no drift comparison" in b.describe()
    only = EvalSession(dataclasses.replace(settings, drift_budget_ladder="x3,x10"), worker=("master", 0, 1))
    only.inputs.__dict__["comparisons"] = []
    with pytest.raises(ConfigError, match="only amplified-drift levels.*add isotropic levels"):
        only.drift_budget()


def test_kernel_fault_is_its_own_side_and_comparison(settings):
    s = EvalSession(dataclasses.replace(settings, kernel_fault="noise:0.5"), worker=("master", 0, 1))
    assert s.inputs.eval_side.backend == "torch+noise=0.5" and s.inputs.reference_side.backend == "torch"
    assert [c.name for c in s.inputs.comparisons] == ["torch+noise=0.5-vs-torch"]
    d = s.drift("torch+noise=0.5-vs-torch")
    assert all(st.rel_err > 0.01 for per in d.stats.values() for st in per.values())
    assert s.run_context()["backend"] == "torch+noise=0.5"
    with pytest.raises(Exception, match="unknown kernel fault"):
        dataclasses.replace(settings, kernel_fault="noise:-1").validate()
