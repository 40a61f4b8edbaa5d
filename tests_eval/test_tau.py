"""τ (mean acceptance length) of the drafter per prompt and on average, against floors in golden/tau_floors.json.

Every test here has "tau" in its name, and no other test of the suite does: ``pytest tests_eval -k tau`` runs
exactly these. Rewrite the floors from a measured run minus a margin with::

    pytest tests_eval -k tau --update-tau-floors --tau-margin 0.25
"""

from __future__ import annotations

import pytest

from dflash_eval.pytest_plugin import SetupError, collect, safe_id, setup_error_param
from dflash_eval.verdict import Threshold, category_thresholds, mean_thresholds, prompt_threshold


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
    return (f"measured τ {r.tau:.3f} ({r.method}), floor {floor}, rounds {r.rounds}, "
            f"acceptance histogram {{{hist}}}, accept lengths {r.accept_lengths[:40]}"
            f"{' ...' if r.rounds > 40 else ''}")


def _check(r, t: Threshold, what: str, eval_session, record_property) -> None:
    record_property("tau", round(r.tau, 4))  # shows up in --junitxml as <property>
    record_property("floor", t.floor)
    record_property("rounds", r.rounds)
    if eval_session.settings.update_tau_floors:
        return  # floors are rewritten from this run at the end of the session
    if t.missing:
        pytest.fail(eval_session.inputs.floors.missing_message(what) + f"; {_describe(r, None)}", pytrace=False)
    if r.rounds == 0:
        pytest.fail(f"{what}: no speculative round (completion too short: nothing after the first token)",
                    pytrace=False)
    assert t.passed, f"{what}: τ below floor: {_describe(r, t.floor)}"


def test_tau(prompt_id, tau_results, eval_session, record_property) -> None:
    """Chain τ of this prompt >= its floor."""
    if isinstance(prompt_id, SetupError):
        prompt_id.fail()
    r = tau_results[prompt_id].chain
    t = prompt_threshold(prompt_id, r.tau, eval_session.inputs.floors)
    _check(r, t, f"prompt {prompt_id!r} chain", eval_session, record_property)


def test_ddtree_tau(prompt_id, budget, tau_results, eval_session, record_property) -> None:
    """DDTree-N τ of this prompt >= its floor."""
    for v in (prompt_id, budget):
        if isinstance(v, SetupError):
            v.fail()
    r = tau_results[prompt_id].ddtree[budget]
    t = prompt_threshold(prompt_id, r.tau, eval_session.inputs.floors, budget)
    _check(r, t, f"prompt {prompt_id!r} DDTree-{budget}", eval_session, record_property)


def test_mean_tau(tau_results, eval_session) -> None:
    """Macro-averaged chain τ and DDTree-N τ over all prompts >= the aggregate floors."""
    summary = eval_session.tau_summary()
    if eval_session.settings.update_tau_floors:
        return  # floors are rewritten from this run at the end of the session
    floors = eval_session.inputs.floors
    problems = []
    for t in mean_thresholds(summary.mean_tau, summary.mean_ddtree, floors):
        if t.missing:
            problems.append(floors.missing_message(f"the mean {t.label} τ") + f" (measured {t.value:.3f})")
        elif not t.passed:
            problems.append(f"mean {t.label} τ {t.value:.3f} < floor {t.floor} over {len(tau_results)} prompts")
    assert not problems, "\n".join(problems)


def test_category_mean_tau(category, tau_results, eval_session) -> None:
    """Mean chain τ and DDTree-N τ over this category's prompts >= the category floors (golden "categories")."""
    if isinstance(category, SetupError):
        category.fail()
    row = eval_session.tau_summary().categories[category]
    if eval_session.settings.update_tau_floors:
        return  # floors are rewritten from this run at the end of the session
    floors = eval_session.inputs.floors
    stats = {"chain": row["chain"], **{f"DDTree-{b}": s for b, s in row["ddtree"].items()}}
    problems = []
    for t in category_thresholds(category, row["chain"]["mean"], {b: s["mean"] for b, s in row["ddtree"].items()},
                                 floors):
        s = stats[t.label]
        ci = f"median {s['median']:.3f}, 95% CI [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}], n {s['n']}"
        if t.missing:
            problems.append(floors.missing_message(f"category {category!r} ({t.label})") + f" (measured mean "
                            f"{s['mean']:.3f}, {ci})")
        elif not t.passed:
            problems.append(f"category {category!r} mean {t.label} τ {s['mean']:.3f} < floor {t.floor} ({ci})")
    assert not problems, "\n".join(problems)
