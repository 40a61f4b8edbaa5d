"""The measurement registry: a measurement added from a test module, with nothing else edited, runs through the
one runner (cache entry written once, read back warm), reaches the in-process result and eval.json, and becomes a
test of the suite that fails with the measurement's own check."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.errors import ConfigError
from dflash_eval.measurements import builtin
from dflash_eval.measurements.registry import (
    Measurement,
    MeasurementReport,
    Plan,
    Subject,
    register,
    registered_here,
    unregister,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"


class MeanCompletionLength(Measurement[None, float]):
    """A toy measurement: the mean length of the reference completions over the run's prompts, cached as one
    entry keyed by the completions' contents."""

    name: ClassVar[str] = "toy_completion_length"
    kind: ClassVar[str] = "toy_completion_length"
    produced: ClassVar[int] = 0
    minimum: float = 0.0

    def applies(self, settings: Any) -> bool:
        return True

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[None]:
        comps = subject.completions()
        ids = [p.id for p in subject.inputs.prompts]
        req = Request(self.kind, {"completions": [ids_digest(comps[p].output_ids) for p in ids]},
                      what="the toy measurement", derived=True)

        def produce(todo: list[Request]) -> list[Produced]:
            type(self).produced += 1
            return [Produced({"lengths": torch.tensor([len(comps[p].output_ids) for p in ids])}, {"ids": ids})]

        return Plan([Batch([req], produce)], {"lengths": req})

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[None],
               params: Mapping[str, Any]) -> float:
        return float(entries["lengths"].tensors["lengths"].float().mean())

    def report(self, value: float) -> MeasurementReport:
        return MeasurementReport({"mean_completion_tokens": value}, [("mean completion tokens", f"{value:.1f}")])

    def check(self, value: float) -> str | None:
        return None if value >= self.minimum else f"mean completion length {value:.1f} < {self.minimum}"


@pytest.fixture
def toy() -> Iterator[MeanCompletionLength]:
    m = register(MeanCompletionLength())
    MeanCompletionLength.produced = 0
    yield m
    unregister(m.name)


def _settings(tmp_path: Path) -> dict[str, Any]:
    return {"target_model": FIXTURES / "target", "drafter": FIXTURES / "drafter",
            "prompts": FIXTURES / "prompts.jsonl", "num_prompts": 2, "max_new_tokens": 16,
            "cache_dir": tmp_path / "cache", "report_dir": tmp_path / "reports", "tau_floor": 1.0}


def test_a_registered_measurement_reaches_the_result_once_produced(toy: MeanCompletionLength, tmp_path: Path) -> None:
    from dflash_eval import Evaluator

    first = Evaluator(_settings(tmp_path)).evaluate()
    block = first.measurements[toy.name]
    assert block["rows"] == [["mean completion tokens", f"{block['summary']['mean_completion_tokens']:.1f}"]]
    assert 1 <= block["summary"]["mean_completion_tokens"] <= 16
    assert first.to_dict()["measurements"] == {toy.name: block}
    assert MeanCompletionLength.produced == 1
    again = Evaluator(_settings(tmp_path)).evaluate()  # a new process's view: the entry is read, not produced
    assert again.measurements == first.measurements and MeanCompletionLength.produced == 1


def test_builtin_measurements_are_specs_of_the_registry() -> None:
    names = set(builtin.registered())
    assert {"tau", "tau_sampled", "drift_budget", "online", "online_sampled"} <= names
    for name, ref in (("tau", builtin.TAU), ("tau_sampled", builtin.TAU_SAMPLED), ("drift_budget",
                      builtin.DRIFT_BUDGET), ("online", builtin.ONLINE), ("online_sampled", builtin.ONLINE_SAMPLED),
                      ("round_costs", builtin.ROUND_COSTS)):
        m = builtin.spec(name)
        assert m is ref  # the name finds the instance the suite asks for by reference
        assert isinstance(m, Measurement) and m.kind and not m.applies(None)  # type: ignore[arg-type]  # built-ins never auto-run


def test_names_are_unique(toy: MeanCompletionLength) -> None:
    with pytest.raises(ConfigError, match="registered already"):
        register(MeanCompletionLength())  # another instance under the same name
    with pytest.raises(ConfigError, match="no measurement named 'nope'"):
        builtin.spec("nope")

    class Clash(MeanCompletionLength):
        name: ClassVar[str] = "tau"

    register(Clash())
    try:
        with pytest.raises(ConfigError, match="built-in"):
            builtin.registered()
    finally:
        unregister("tau")
    assert "tau" in builtin.registered() and "tau" not in registered_here()


CONFTEST = '''
pytest_plugins = ["dflash_eval.pytest_plugin"]
import sys
sys.path.insert(0, {here!r})
from test_measurement_registry import MeanCompletionLength
from dflash_eval.measurements.registry import register
m = MeanCompletionLength()
m.minimum = {minimum}
register(m, replace=True)
'''


@pytest.mark.parametrize("minimum", [1.0, 1000.0])
def test_a_registered_measurement_is_a_test_of_the_suite(minimum: float, bundled_suite: Callable[..., Any],
                                                         pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makeconftest(CONFTEST.format(here=str(Path(__file__).parent), minimum=minimum))
    try:
        res = bundled_suite("-k", "registered_measurement", "--max-new-tokens", "16", "--tau-floor", "1.0",
                            report="r", cache=tmp_path / "cache")
    finally:
        unregister(MeanCompletionLength.name)
    if minimum <= 1.0:
        res.assert_outcomes(passed=1)
        data = json.loads((tmp_path / "r" / "eval.json").read_text())
        assert data["measurements"][MeanCompletionLength.name]["summary"]["mean_completion_tokens"] >= 1
    else:
        res.assert_outcomes(failed=1)
        res.stdout.fnmatch_lines(["*measurement 'toy_completion_length': mean completion length * < 1000.0*"])
