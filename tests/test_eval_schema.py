"""Reports that other tools can read: eval.json is strict JSON (no NaN / Infinity: null) and validates against the
published schema ``src/dflash_eval/report/eval.schema.json``; the junit properties of a run; the plot at 10 and 500
prompts keeps its size. (Runs of the real suite validate their eval.json in ``tests/test_user_tests.py`` and
``tests/test_wheel_install.py``.)

Run: ``pytest tests/test_eval_schema.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import math
import struct
from importlib import resources
from pathlib import Path

import pytest
from result_rows import fragment as read_fragment

from dflash_eval import report
from dflash_eval.metrics.verdict import run_verdict
from dflash_eval.pytest_plugin.junit import junit_properties
from dflash_eval.report.plot import worst_rows
from dflash_eval.report.strict_json import dumps_strict, strict
from dflash_eval.session.eval_result import EvalResult
from dflash_eval.session.run_result import RunResult

NAN = float("nan")


def schema() -> dict:
    return json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())


@pytest.fixture
def jsonschema():
    return pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")


@pytest.fixture
def validator(jsonschema):
    jsonschema.Draft202012Validator.check_schema(schema())
    return jsonschema.Draft202012Validator(schema())


def fragment(prompts: dict[str, float], *, passed: dict[str, bool | None] | None = None) -> EvalResult:
    passed = passed or {}
    return read_fragment(**{
        "worker": "master", "settings": {"max_new_tokens": 8}, "target": {"path": "/t", "identity": "i" * 64},
        "drafter": {"path": "/d", "fingerprint": "f" * 64, "config": {"block_size": 8}},
        "prompts": {p: {"category": "code" if i % 3 else "prose", "tau": tau, "rounds": 0 if math.isnan(tau) else 3,
                        "accept_lengths": [] if math.isnan(tau) else [1, 2, 3], "histogram": [1, 1, 1],
                        "position_rates": [0.5, 0.25], "ddtree": {"8": tau + 0.5},
                        "ddtree_accept_lengths": {"8": [2, 2]}, "floor": 1.5,
                        "ddtree_floor": {"8": 2.0}, "prompt_tokens": 5, "completion_tokens": 7,
                        "passed": passed.get(p, None if math.isnan(tau) else tau >= 1.5)}
                    for i, (p, tau) in enumerate(prompts.items())},
        "mean_tau": NAN, "mean_floor": 1.5, "mean_ddtree": {"8": NAN}, "mean_ddtree_floor": {"8": 2.0},
        "drift": [{"comparison": "c1", "prompt_id": "a", "layer": 0, "rel_err": NAN, "cos": 0.9999, "max_abs": 0.1,
                   "rel_tol": 5e-3, "cos_tol": 0.999, "passed": False}],
        "drift_accept": [{"comparison": "c1", "prompt_id": "a", "tau_a": NAN, "tau_b": 2.1, "diff": NAN, "tol": 0.5,
                          "passed": False, "a": "torch/float32", "b": "torch-recurrent/float32"}],
        "timings": {"generation": 1.0}, "cache": {"hits": 1},
    })


def test_eval_json_is_strict_and_valid_with_nan_measurements(tmp_path, validator):
    data = report.merge([fragment({"a": NAN, "b": 2.0, "c": 1.0})], outcomes={"x.py::t": "passed"},
                        wall_s=1.0).to_dict()
    data["verdict"] = run_verdict(RunResult.from_dict(data), failed_tests=1).to_dict()  # as the run's end stores it
    paths = report.write_reports(RunResult.from_dict(data), tmp_path)
    text = paths["json"].read_text()
    assert "NaN" not in text and "Infinity" not in text
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard constant {c} in eval.json"))
    assert doc["prompts"]["a"]["tau"] is None and doc["mean_tau"] is None and doc["drift"][0]["rel_err"] is None
    validator.validate(doc)


def test_schema_rejects_what_it_should(jsonschema, validator):
    merged = report.merge([fragment({"b": 2.0})], wall_s=1.0).to_dict()
    good = json.loads(dumps_strict({**merged, "verdict": run_verdict(RunResult.from_dict(merged)).to_dict()}))
    validator.validate(good)
    for path, value in [(("prompts", "b", "tau"), "2.0"), (("prompts", "b", "passed"), "yes"),
                        (("tests", "outcomes"), {"t": "exploded"}), (("schema",), 2), (("drift",), {}),
                        (("verdict", "label"), "maybe"), (("verdict", "parts"), [{"name": "floors"}])]:
        bad = json.loads(json.dumps(good))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)
    del good["prompts"]
    with pytest.raises(jsonschema.ValidationError, match="'prompts' is a required property"):
        validator.validate(good)


def test_strict_replaces_every_non_finite_number():
    assert strict({"a": [NAN, float("inf"), 1.5], 2: (float("-inf"),), "p": Path("/x")}) == \
        {"a": [None, None, 1.5], "2": [None], "p": "/x"}
    with pytest.raises(ValueError):
        json.dumps({"x": NAN}, allow_nan=False)  # what dumps_strict relies on for anything it missed


def test_junit_properties_give_mean_tau_and_verdict():
    data = report.merge([fragment({"b": 2.0, "c": 1.0})]).to_dict()
    data["mean_tau"], data["mean_passed"] = 1.5, True
    props = junit_properties(RunResult.from_dict(data))
    assert props["dflash_eval.mean_tau"] == 1.5 and props["dflash_eval.mean_floor"] == 1.5
    assert props["dflash_eval.failed_prompts"] == 1 and props["dflash_eval.verdict"] == "FAIL"
    data["prompts"]["c"]["passed"] = True
    data["categories"] = {}
    assert junit_properties(RunResult.from_dict(data))["dflash_eval.verdict"] == "PASS"
    assert junit_properties(report.merge([read_fragment(measurements={"m": {}})])) == {}


def png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


@pytest.mark.parametrize("n", [10, pytest.param(500, marks=pytest.mark.slow)])
def test_plot_size_does_not_grow_with_prompts(n, tmp_path):
    prompts = {f"p{i}": 1.5 + (i * 37 % 50) / 10 for i in range(n)}  # all at or above the floor 1.5 ...
    prompts["p7"] = 1.2  # ... but one
    data = report.merge([fragment(prompts)], wall_s=1.0).to_dict()
    data["mean_tau"] = 3.0
    assert report.write_plot(RunResult.from_dict(data), tmp_path / "eval.png") is not None
    assert png_size(tmp_path / "eval.png") == (1400, 760)
    worst = worst_rows(RunResult.from_dict(data).prompts)
    assert worst[0] == "p7" and len(worst) == min(n, 25)
