"""τ (mean acceptance length) of the drafter per prompt, per category and on average, against floors in
golden/tau_floors.json (aggregate floors follow the selected prompts), and against a ``--baseline`` eval.json.

Every test here has "tau" in its name, and no other test of the suite does: ``pytest tests_eval -k tau`` runs
exactly these. Rewrite the floors from a measured run minus a margin with (the τ tests then skip as "recorded")::

    pytest tests_eval -k tau --update-tau-floors --tau-margin 0.25

One cause, one failure: τ of 1.00 on every prompt (the drafter proposes nothing the target accepts) fails
``test_mean_tau`` with that diagnosis, and the other τ tests skip pointing at it; a failure names the architecture
checks that warned about a cause of lost τ (e.g. a mask token that is not the target's).
"""

from __future__ import annotations

import pytest

from dflash_eval.common.number_text import fmt
from dflash_eval.metrics.verdict import (
    NO_ACCEPTANCE,
    Threshold,
    category_thresholds,
    mean_thresholds,
    prompt_threshold,
)
from dflash_eval.pytest_plugin import SetupError, collect, safe_id, setup_error_param

#: Architecture checks whose warning names a cause of lost τ (quoted in τ failures).
TAU_WARNINGS = ("target_layer_ids_range", "target_layer_ids_last_layer", "mask_token_match")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if "prompt_id" in metafunc.fixturenames:
        ids, err = collect(config, lambda s: [p.id for p in s.inputs.prompts])
        metafunc.parametrize("prompt_id", [setup_error_param(err)] if err else [pytest.param(i, id=i) for i in ids])
    if "category" in metafunc.fixturenames:
        cats, err = collect(config, lambda s: sorted({p.category for p in s.inputs.prompts}))
        metafunc.parametrize("category", [setup_error_param(err)] if err else
                             [pytest.param(c, id=safe_id(c)) for c in cats])
    if "budget" in metafunc.fixturenames:
        budgets, err = collect(config, lambda s: list(s.settings.ddtree_budget))
        metafunc.parametrize("budget", [setup_error_param(err)] if err else
                             [pytest.param(b, id=f"ddtree{b}") for b in budgets])


def _describe(r, floor) -> str:
    hist = ", ".join(f"{i + 1}:{c}" for i, c in enumerate(r.histogram) if c)
    return (f"measured τ {fmt(r.tau)} ({r.method}), floor {fmt(floor)}, rounds {r.rounds}, "
            f"acceptance histogram {{{hist}}}, accept lengths {r.accept_lengths[:40]}"
            f"{' ...' if r.rounds > 40 else ''}")


def _skip_when_recording(eval_session) -> None:
    if eval_session.settings.update_tau_floors:
        pytest.skip(f"recorded: --update-tau-floors writes {eval_session.settings.floors_file} from this run's τ at "
                    "the end of the session; nothing was checked")


def _warned(eval_session) -> str:
    """The architecture warnings that may explain a τ failure, as a suffix of its message ("" when none)."""
    warned = [c for c in eval_session.evaluation.checks if c.status == "warn" and c.name in TAU_WARNINGS]
    return "".join(f"\n  architecture check {c.name} warned (test_architecture_check[{c.name}]): {c.message}"
                   for c in warned)


def _no_acceptance(eval_session) -> bool:
    """τ 1.00 on every prompt, and the floors fail because of it (floors that accept τ 1 are not diagnosed)."""
    return eval_session.accepts_nothing()


def _skip_when_no_acceptance(eval_session, request) -> None:
    """τ 1.00 on every prompt is one cause: test_mean_tau reports it (when it runs here; otherwise every τ test
    does)."""
    if _no_acceptance(eval_session) and any(
            getattr(it, "originalname", "") == "test_mean_tau" for it in request.session.items):
        pytest.skip(f"{NO_ACCEPTANCE.split(':')[0]}: reported once, by test_mean_tau")


def _check(r, t: Threshold, what: str, eval_session, testcase_property) -> None:
    testcase_property("tau", round(r.tau, 4))  # --junitxml: a <testcase> property under xunit1 (every family:
    # the suite properties dflash_eval.prompt.<id>.*, pytest_plugin/junit.py)
    testcase_property("floor", t.floor)
    testcase_property("rounds", r.rounds)
    _skip_when_recording(eval_session)
    if _no_acceptance(eval_session):
        pytest.fail(f"{what}: {NO_ACCEPTANCE}; {_describe(r, t.floor)}", pytrace=False)
    if not t.gated:  # one reason for every prompt, which pytest's -ra folds into one line (each τ in eval.md)
        pytest.skip(f"{what.rsplit(' ', 1)[-1]}: no per-prompt floor; only the mean is gated (--tau-floor); each "
                    "prompt's τ in eval.md")
    if t.missing:
        pytest.fail(eval_session.floors.missing_message(what) + f"; {_describe(r, None)}", pytrace=False)
    if r.rounds == 0:
        pytest.fail(f"{what}: no speculative round (completion too short: nothing after the first token)",
                    pytrace=False)
    assert t.passed, f"{what}: τ below floor: {_describe(r, t.floor)}{_warned(eval_session)}"


def test_tau(prompt_id, tau_results, eval_session, testcase_property, request) -> None:
    """Chain τ of this prompt >= its floor."""
    if isinstance(prompt_id, SetupError):
        prompt_id.fail()
    _skip_when_no_acceptance(eval_session, request)
    r = tau_results[prompt_id].chain
    t = prompt_threshold(prompt_id, r.tau, eval_session.floors)
    _check(r, t, f"prompt {prompt_id!r} chain", eval_session, testcase_property)


def test_ddtree_tau(prompt_id, budget, tau_results, eval_session, testcase_property, request) -> None:
    """DDTree-N τ of this prompt >= its floor."""
    for v in (prompt_id, budget):
        if isinstance(v, SetupError):
            v.fail()
    _skip_when_no_acceptance(eval_session, request)
    r = tau_results[prompt_id].ddtree[budget]
    t = prompt_threshold(prompt_id, r.tau, eval_session.floors, budget)
    _check(r, t, f"prompt {prompt_id!r} DDTree-{budget}", eval_session, testcase_property)


def test_mean_tau(tau_results, eval_session, testcase_property) -> None:
    """Macro-averaged chain τ and DDTree-N τ over all prompts >= the aggregate floors."""
    summary = eval_session.tau_summary()
    _skip_when_recording(eval_session)
    if _no_acceptance(eval_session):
        testcase_property("verdict", "FAIL")
        pytest.fail(f"{NO_ACCEPTANCE}: mean chain τ {summary.mean_tau:.3f} over {len(tau_results)} prompts"
                    f"{_warned(eval_session)}", pytrace=False)
    floors = eval_session.floors
    problems = []
    thresholds = mean_thresholds(summary.mean_tau, summary.mean_ddtree, floors)
    for t in thresholds:
        testcase_property(f"mean_tau_{t.label}", round(t.value, 4))  # --junitxml <property>, like the floors
        testcase_property(f"mean_floor_{t.label}", t.floor)
        if t.missing:
            problems.append(floors.missing_message(f"the mean {t.label} τ", floors.missing()) +
                            f" (measured {t.value:.3f})")
        elif not t.passed:
            problems.append(f"mean {t.label} τ {fmt(t.value)} < floor {fmt(t.floor)} over {len(tau_results)} prompts")
    testcase_property("verdict", "FAIL" if problems else "PASS")
    assert not problems, "\n".join(problems) + _warned(eval_session)


def test_category_mean_tau(category, tau_results, eval_session, request) -> None:
    """Mean chain τ and DDTree-N τ over this category's prompts >= the category floors (golden "categories")."""
    if isinstance(category, SetupError):
        category.fail()
    _skip_when_no_acceptance(eval_session, request)
    row = eval_session.tau_summary().categories[category]
    _skip_when_recording(eval_session)
    floors = eval_session.floors
    stats = {"chain": row.chain, **{f"DDTree-{b}": s for b, s in row.ddtree.items()}}
    ts = category_thresholds(category, row.chain.mean, {b: s.mean for b, s in row.ddtree.items()}, floors)
    if not any(t.gated for t in ts):
        pytest.skip(f"category {category!r}: no per-prompt floors to derive its floor from; only the mean is gated "
                    "(--tau-floor)")
    ids = [p for p, c in floors.selection.items() if c == category]
    problems = []
    for t in ts:
        s = stats[t.label]
        ci = f"median {s.median:.3f}, 95% CI [{s.ci95[0]:.3f}, {s.ci95[1]:.3f}], n {s.n}"
        if t.missing:
            problems.append(floors.missing_message(f"category {category!r} ({t.label})", floors.missing(ids)) +
                            f" (measured mean {s.mean:.3f}, {ci})")
        elif not t.passed:
            problems.append(f"category {category!r} mean {t.label} τ {s.mean:.3f} < floor {t.floor} ({ci})")
    assert not problems, "\n".join(problems) + _warned(eval_session)


def _baseline(eval_session):
    if eval_session.settings.baseline is None:
        pytest.skip("no --baseline given (an earlier reports/eval.json to compare τ with)")
    cmp = eval_session.tau_summary().baseline
    if cmp.n == 0:
        pytest.fail(f"--baseline {cmp.path} has none of this run's prompts: nothing to compare", pytrace=False)
    return cmp


def test_baseline_tau_drop(tau_results, eval_session, request) -> None:
    """Paired mean chain τ against --baseline fell by no more than --baseline-drop-tol (relative)."""
    cmp = _baseline(eval_session)
    _skip_when_no_acceptance(eval_session, request)
    worst = sorted(cmp.deltas.items(), key=lambda kv: kv[1][1] - kv[1][0])[:3]
    assert cmp.drop_passed, (f"τ dropped against the baseline: {cmp.describe()}; largest drops: " +
                             ", ".join(f"{p} {b:.3f}->{a:.3f}" for p, (b, a) in worst))


def test_baseline_tau_ceiling(tau_results, eval_session) -> None:
    """Paired mean chain τ against --baseline rose by no more than --baseline-rise-tol (relative)."""
    cmp = _baseline(eval_session)
    assert cmp.rise_passed, (f"τ rose by {100 * cmp.rel_change:.1f} % against the baseline, more than "
                             f"--baseline-rise-tol {100 * cmp.rise_tol:g} %: check the drafter for a future-token "
                             f"leak (a drafter that sees the tokens it predicts scores near the block size); "
                             f"{cmp.describe()}")
