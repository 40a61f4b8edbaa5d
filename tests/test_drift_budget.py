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
    DriftBudget,
    Perturbation,
    gate_check,
    gate_reason,
    impact,
    measure_ladder,
    parse_ladder,
    perturb_layers,
)
from dflash_eval.metrics.drift_fit import crossing, fit_budget, isotonic
from dflash_eval.metrics.tau import chain_tau, draft_table
from dflash_eval.options.settings import EvalSettings
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
              conclusive: bool = False) -> DriftBudget:
    ladder = parse_ladder(",".join(s for s, _, _ in levels))
    n = len(base)
    return DriftBudget.build(drafter="f" * 64, base="torch/float32", prompt_ids=[f"p{i}" for i in range(n)],
                             base_tau=list(base), ladder=ladder, taus=[t for _, _, t in levels],
                             injected=[[[e]] * n for _, e, _ in levels], tol=tol, safety=safety, seed=0,
                             spec=",".join(s for s, _, _ in levels), conclusive=conclusive)


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
    js = json.loads(json.dumps(b.to_json()))
    assert js["budget"] == pytest.approx(b.budget) and js["ci"] == [pytest.approx(lo), pytest.approx(hi)]
    assert js["status"] == "crossed" and js["n_measured"] == 40 and js["gate_limit"] == pytest.approx(b.budget / 5)
    assert js["levels"][3]["mean_drop"] == pytest.approx(0.2) and js["levels"][3]["drop"]["p0"] == pytest.approx(0.8)
    assert js["fit"]["points"][2]["fitted_drop"] == pytest.approx(0.05) and "isotonic" in js["rule"]


def test_three_way_gate_and_its_messages():
    b = forty_prompts()
    lo, hi = b.ci
    below, inside, above = 0.5 * lo / 5, (lo + hi) / 2 / 5, 2 * hi / 5  # drift (x safety 5)
    outcome = {x: gate_check("bf16-vs-fp32", 1, {"a": x, "b": x / 2}, b).outcome for x in (below, inside, above)}
    assert outcome == {below: "pass", inside: "inconclusive", above: "fail"}
    g = gate_check("bf16-vs-fp32", 1, {"a": inside}, b)
    assert g.in_ci and not g.passed and g.to_json()["outcome"] == "inconclusive"
    why = gate_reason(g, b, "bf16 vs fp32, target layer 1")
    assert why.startswith("drift gate inconclusive") and f"{g.scaled:.2e}" in why and f"{lo:.2e}" in why
    assert "--drift-budget-min-prompts" in why and "--drift-budget-conclusive" in why
    assert gate_reason(gate_check("c", 1, {"a": above}, b), b, "c").startswith("drift over budget")
    decided = forty_prompts(conclusive=True)
    est = decided.budget / 5
    assert gate_check("c", 1, {"a": est * 0.99}, decided).outcome == "pass"
    over = gate_check("c", 1, {"a": est * 1.01}, decided)
    assert over.outcome == "fail" and over.to_json()["decided_on"] == "estimate"
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
