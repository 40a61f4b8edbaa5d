"""τ (mean acceptance length) of the drafter per prompt and on average, against floors in golden/tau_floors.json.

Every test here has "tau" in its name, and no other test of the suite does: ``pytest tests_eval -k tau`` runs
exactly these. Rewrite the floors from a measured run minus a margin with::

    pytest tests_eval -k tau --update-tau-floors --tau-margin 0.25
"""

from __future__ import annotations

import math

import pytest

from dflash_eval.pytest_plugin import SetupError, collect, safe_id, setup_error_param


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if "prompt_id" in metafunc.fixturenames:
        ids, err = collect(config, lambda s: [p.id for p in s.prompts])
        metafunc.parametrize("prompt_id", [setup_error_param(err)] if err else [pytest.param(i, id=i) for i in ids])
    if "category" in metafunc.fixturenames:
        cats, err = collect(config, lambda s: sorted({p.category for p in s.prompts}))
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


def _check(r, floor, what: str, eval_session, record_property) -> None:
    if isinstance(floor, SetupError):
        floor.fail()
    record_property("tau", round(r.tau, 4))  # shows up in --junitxml as <property>
    record_property("floor", floor)
    record_property("rounds", r.rounds)
    if eval_session.settings.update_tau_floors:
        return  # floors are rewritten from this run at the end of the session
    if floor is None:
        pytest.fail(eval_session.floors.missing_message(what) + f"; {_describe(r, None)}", pytrace=False)
    if r.rounds == 0:
        pytest.fail(f"{what}: no speculative round (completion too short: nothing after the first token)",
                    pytrace=False)
    assert r.tau >= floor, f"{what}: τ below floor: {_describe(r, floor)}"


def test_tau(prompt_id, tau_results, eval_session, record_property) -> None:
    """Chain τ of this prompt >= its floor."""
    if isinstance(prompt_id, SetupError):
        prompt_id.fail()
    r = tau_results[prompt_id].chain
    _check(r, eval_session.floors.for_prompt(prompt_id), f"prompt {prompt_id!r} chain", eval_session,
           record_property)


def test_ddtree_tau(prompt_id, budget, tau_results, eval_session, record_property) -> None:
    """DDTree-N τ of this prompt >= its floor."""
    for v in (prompt_id, budget):
        if isinstance(v, SetupError):
            v.fail()
    r = tau_results[prompt_id].ddtree[budget]
    _check(r, eval_session.floors.for_prompt(prompt_id, budget), f"prompt {prompt_id!r} DDTree-{budget}",
           eval_session, record_property)


def test_mean_tau(tau_results, eval_session) -> None:
    """Macro-averaged chain τ and DDTree-N τ over all prompts >= the aggregate floors."""
    m = eval_session.mean_tau
    if eval_session.settings.update_tau_floors:
        return  # floors are rewritten from this run at the end of the session
    problems = []
    for label, value, floor in [("chain", m["chain"], eval_session.floors.for_mean())] + [
            (f"DDTree-{b}", v, eval_session.floors.for_mean(b)) for b, v in m["ddtree"].items()]:
        if floor is None:
            problems.append(eval_session.floors.missing_message(f"the mean {label} τ") + f" (measured {value:.3f})")
        elif math.isnan(value) or value < floor:
            problems.append(f"mean {label} τ {value:.3f} < floor {floor} over {len(tau_results)} prompts")
    assert not problems, "\n".join(problems)


def test_category_mean_tau(category, tau_results, eval_session) -> None:
    """Mean chain τ and DDTree-N τ over this category's prompts >= the category floors (golden "categories")."""
    if isinstance(category, SetupError):
        category.fail()
    row = eval_session.category_tau[category]
    if eval_session.settings.update_tau_floors:
        return  # floors are rewritten from this run at the end of the session
    fl = eval_session.floors
    problems = []
    checks = [("chain", row["chain"], fl.for_category(category))] + [
        (f"DDTree-{b}", s, fl.for_category(category, int(b))) for b, s in row["ddtree"].items()]
    for label, s, floor in checks:
        ci = f"median {s['median']:.3f}, 95% CI [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}], n {s['n']}"
        if floor is None:
            problems.append(fl.missing_message(f"category {category!r} ({label})") + f" (measured mean "
                            f"{s['mean']:.3f}, {ci})")
        elif math.isnan(s["mean"]) or s["mean"] < floor:
            problems.append(f"category {category!r} mean {label} τ {s['mean']:.3f} < floor {floor} ({ci})")
    assert not problems, "\n".join(problems)
