"""eval.json of a run at temperature > 0: the ``sampled`` block (mean over prompts of the per-prompt means over
samples with its t CI over the prompt means and the spread between and within prompts, for the chain, each DDTree
budget and the online loop) is merged from the prompt rows, validates against the published schema, is the same
interval as the per-category table's ``all`` row, and is absent from a greedy run."""

from __future__ import annotations

import json
import math
import statistics
from importlib import resources

import pytest
from result_rows import fragment

from dflash_eval import report
from dflash_eval.metrics.sampled_ci import sampled_mean, spread
from dflash_eval.metrics.stats import sampled_hall_t_interval
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.run_result import RunResult

# prompt means 1.5, 2.3, 0.7: symmetric, so the interval over them is Student's t (no skewness to correct)
TAUS = {"a": [1.2, 1.6, 1.4, 1.8], "b": [2.0, 2.4, 2.2, 2.6], "c": [0.6, 0.7, 0.6, 0.9]}


def _row(pid: str, taus: list[float], *, sampled: bool) -> dict:
    row = {"category": "code", "tau": statistics.fmean(taus), "rounds": 4, "accept_lengths": [1, 2, 1, 2],
           "histogram": [2, 2], "position_rates": [0.5], "ddtree": {"8": statistics.fmean(taus) + 0.2},
           "ddtree_accept_lengths": {"8": [2]},
           "floor": 1.0, "ddtree_floor": {"8": 1.0}, "prompt_tokens": 5, "completion_tokens": 7, "passed": True}
    if sampled:
        row.update(samples=len(taus), sample_tau=taus, sample_ci95=[min(taus), max(taus)],
                   ddtree_sample_tau={"8": [t + 0.2 for t in taus]},
                   online={"tau": statistics.fmean(taus), "rounds": 4, "accept_lengths": [1, 2], "histogram": [1, 1],
                           "position_rates": [0.5], "tokens": 12, "matches_reference": True,
                           "first_divergence": None, "samples": len(taus), "sample_tau": taus})
    return row


def _merged(sampled: bool) -> dict:
    frag = fragment(settings={"temperature": 0.6 if sampled else 0.0},
                    prompts={p: _row(p, t, sampled=sampled) for p, t in TAUS.items()}, mean_tau=1.5,
                    mean_floor=None, mean_ddtree={}, mean_ddtree_floor={})
    return json.loads(dumps_strict(report.merge([frag], wall_s=1.0).to_dict()))


def test_sampled_block_is_the_t_ci_over_prompt_means_and_validates() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    doc = _merged(True)
    s = doc["sampled"]
    assert s["prompts"] == 3 and s["samples"] == 12
    means = [statistics.fmean(v) for v in TAUS.values()]
    grand = statistics.fmean(means)
    assert s["chain"]["mean"] == pytest.approx(grand)
    # at T > 0 the interval over the prompt means takes its skewness and kurtosis from the samples too
    assert s["chain"]["ci95"] == pytest.approx(list(sampled_hall_t_interval(list(TAUS.values()))), rel=1e-12)
    assert s["chain"]["ci_method"] == "Hall t over prompts and samples"
    # one interval for one number: the category table's "all" row of the same run holds the same one
    assert s["chain"]["ci95"] == pytest.approx(doc["categories"]["all"]["chain"]["ci95"])
    assert s["chain"]["sd_within"] == pytest.approx(math.sqrt(statistics.fmean(statistics.variance(v)
                                                                               for v in TAUS.values())))
    assert s["ddtree"]["8"]["mean"] == pytest.approx(s["chain"]["mean"] + 0.2)
    assert s["online"]["mean"] == pytest.approx(s["chain"]["mean"])
    v = jsonschema.Draft202012Validator(schema)
    v.validate(doc)
    for bad in ({"sampled": {"prompts": 3}}, {"prompts": {**doc["prompts"], "a": {**doc["prompts"]["a"],
                                                                                   "sample_tau": "1.2"}}}):
        with pytest.raises(jsonschema.ValidationError):
            v.validate({**doc, **bad})
    assert "sampled" not in _merged(False)


def test_spread_splits_the_variance_between_and_within_prompts() -> None:
    """Prompts of one true mean whose samples spread: the spread is all within (between 0); prompts that differ
    with no spread over samples: all between. The CI over prompt means widens with either."""
    within = {f"p{i}": [1.0, 2.0, 1.25, 1.75][i % 4:] + [1.0, 2.0, 1.25, 1.75][:i % 4] for i in range(5)}
    assert spread(within)["sd_between"] == pytest.approx(0.0)
    assert spread(within)["sd_within"] == pytest.approx(statistics.stdev([1.0, 2.0, 1.25, 1.75]))
    between = {f"p{i}": [1.0 + 0.25 * i] * 4 for i in range(5)}
    assert spread(between)["sd_within"] == 0.0
    assert spread(between)["sd_between"] == pytest.approx(statistics.stdev([1.0 + 0.25 * i for i in range(5)]))
    flat = sampled_mean({f"p{i}": [1.5] * 4 for i in range(5)})
    wide = sampled_mean(between)
    assert flat.ci_high - flat.ci_low == pytest.approx(0.0) and wide.ci_low < wide.mean < wide.ci_high
    assert math.isnan(sampled_mean({"p": [1.0, 2.0]}).ci_low)  # one prompt: no interval over prompts


def test_eval_md_and_terminal_show_the_ci_of_a_sampled_run_with_its_method() -> None:
    doc = _merged(True)
    s = doc["sampled"]["chain"]
    want = f"chain {s['mean']:.3f} ({s['ci95'][0]:.3f}..{s['ci95'][1]:.3f})"
    md = report.render_markdown(RunResult.from_dict(doc))
    assert "sampled at T=0.6: 3 prompts x 4 samples" in md and want in md and "online " in md
    assert "95 % CI (Hall t over prompts and samples): chain" in md and "nested" not in md
    assert want in report.render_terminal(RunResult.from_dict(doc), width=400)
    assert "sampled at" not in report.render_markdown(RunResult.from_dict(_merged(False)))
