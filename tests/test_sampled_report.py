"""eval.json of a run at temperature > 0: the ``sampled`` block (mean over prompts of the per-prompt means over
samples with its nested CI over prompts and samples, for the chain, each DDTree budget and the online loop) is
merged from the prompt rows, validates against the published schema, and is absent from a greedy run."""

from __future__ import annotations

import json
import statistics
from importlib import resources

import pytest

from dflash_eval import report
from dflash_eval.metrics.sampled_ci import nested_ci
from dflash_eval.report.strict_json import dumps_strict

TAUS = {"a": [1.2, 1.6, 1.4, 1.8], "b": [2.0, 2.4, 2.2, 2.6], "c": [1.0, 1.1, 1.0, 1.3]}


def _row(pid: str, taus: list[float], *, sampled: bool) -> dict:
    row = {"category": "code", "tau": statistics.fmean(taus), "rounds": 4, "accept_lengths": [1, 2, 1, 2],
           "histogram": [2, 2], "ddtree": {"8": statistics.fmean(taus) + 0.2}, "ddtree_accept_lengths": {"8": [2]},
           "floor": 1.0, "ddtree_floor": {"8": 1.0}, "prompt_tokens": 5, "completion_tokens": 7, "passed": True}
    if sampled:
        row.update(samples=len(taus), sample_tau=taus, sample_ci95=[min(taus), max(taus)],
                   ddtree_sample_tau={"8": [t + 0.2 for t in taus]},
                   online={"tau": statistics.fmean(taus), "rounds": 4, "accept_lengths": [1, 2], "histogram": [1, 1],
                           "position_rates": [0.5], "tokens": 12, "matches_reference": True,
                           "first_divergence": None, "samples": len(taus), "sample_tau": taus})
    return row


def _merged(sampled: bool) -> dict:
    frag = {"worker": "master", "settings": {"temperature": 0.6 if sampled else 0.0},
            "prompts": {p: _row(p, t, sampled=sampled) for p, t in TAUS.items()}, "mean_tau": 1.5}
    return json.loads(dumps_strict(report.merge([frag], wall_s=1.0)))


def test_sampled_block_is_the_nested_ci_of_the_rows_and_validates() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    doc = _merged(True)
    s = doc["sampled"]
    assert s["prompts"] == 3 and s["samples"] == 12
    want = nested_ci(TAUS)
    assert s["chain"]["mean"] == pytest.approx(statistics.fmean(statistics.fmean(v) for v in TAUS.values()))
    assert s["chain"]["ci95"] == pytest.approx([want.ci_low, want.ci_high])
    assert s["chain"]["ci95"][0] < s["chain"]["mean"] < s["chain"]["ci95"][1]
    assert s["ddtree"]["8"]["mean"] == pytest.approx(s["chain"]["mean"] + 0.2)
    assert s["online"]["mean"] == pytest.approx(s["chain"]["mean"])
    v = jsonschema.Draft202012Validator(schema)
    v.validate(doc)
    for bad in ({"sampled": {"prompts": 3}}, {"prompts": {**doc["prompts"], "a": {**doc["prompts"]["a"],
                                                                                   "sample_tau": "1.2"}}}):
        with pytest.raises(jsonschema.ValidationError):
            v.validate({**doc, **bad})
    assert "sampled" not in _merged(False)


def test_nested_ci_widens_with_the_spread_within_prompts() -> None:
    """Prompts of one true mean: with no spread over samples the CI is a point; with spread it is not."""
    narrow = nested_ci({f"p{i}": [1.5] * 4 for i in range(5)})
    wide = nested_ci({f"p{i}": [1.0, 2.0, 1.25, 1.75] for i in range(5)})
    assert narrow.mean == pytest.approx(wide.mean) == pytest.approx(1.5)
    assert narrow.ci_high - narrow.ci_low == pytest.approx(0.0)
    assert wide.ci_low < 1.5 < wide.ci_high


def test_eval_md_and_terminal_show_the_nested_ci_of_a_sampled_run() -> None:
    doc = _merged(True)
    s = doc["sampled"]["chain"]
    want = f"chain {s['mean']:.3f} ({s['ci95'][0]:.3f}..{s['ci95'][1]:.3f})"
    md = report.render_markdown(doc)
    assert "sampled at T=0.6: 3 prompts x 4 samples" in md and want in md and "online " in md
    assert want in report.render_terminal(doc, width=400)
    assert "sampled at" not in report.render_markdown(_merged(False))
