"""The run's result as one typed value (:mod:`dflash_eval.session.run_result`): a real run's eval.json read back as a
:class:`RunResult` and written again is the same data, key for key, and valid against the published schema; a key
the result does not know inside a fragment, or one a fragment needs and lacks, is one error naming the file and the
key; a plugin's top-level key is kept as it is. The rows it is made of refuse unknown and missing keys themselves.

Run: ``pytest tests/test_run_result.py -p no:cacheprovider``
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from result_rows import costs_block, kernel_change, prediction, speedup_block

from dflash_eval.errors import EvalError
from dflash_eval.metrics.drift_checks import Direction, DriftStat, GateCheck
from dflash_eval.metrics.near_tie import Divergence
from dflash_eval.metrics.speedup import MODELS, LoopModel, PooledSpeed, Prediction, RoundCosts, Speedup
from dflash_eval.metrics.verdict import Part, Verdict
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.rows import ABSENT, CategoryRow, PromptRow, ResultKeyError, Stat
from dflash_eval.session.run_blocks import ContextBlock, KernelProbeBlock, TargetBlock
from dflash_eval.session.run_result import TOP_LEVEL_KEYS, RunResult

# (what is changed, the change, the error's words)
MUTATIONS = [
    ("the costs held as null", lambda d: d["speedup"].__setitem__("costs", None),
     "key 'speedup.costs' holds null, where an object is expected"),
    ("the target held as a number", lambda d: d.__setitem__("target", 5),
     "key 'target' holds a number, where an object is expected"),
    ("a drift row held as a string", lambda d: d["drift"].__setitem__(0, "row"),
     "key 'drift[0]' holds a string, where an object is expected"),
    ("a prompt held as a list", lambda d: d["prompts"].__setitem__(next(iter(d["prompts"])), []),
     "key 'prompts.{p}' holds a list, where an object is expected"),
    ("a prompt's unknown key", lambda d: _first(d["prompts"]).__setitem__("colour", 1),
     "unknown key 'prompts.{p}.colour'"),
    ("a prompt's missing key", lambda d: _first(d["prompts"]).pop("rounds"), "missing key 'prompts.{p}.rounds'"),
    ("a completion's unknown key", lambda d: _first(d["prompts"])["completions"][0].__setitem__("colour", 1),
     "unknown key 'prompts.{p}.completions[0].colour'"),
    ("a drift row's missing key", lambda d: d["drift"][0].pop("cos"), "missing key 'drift[0].cos'"),
    ("a drift row's unknown key", lambda d: d["drift"][0].__setitem__("colour", 1), "unknown key 'drift[0].colour'"),
    ("a drift gate row's missing key", lambda d: d["drift_gate"][0].pop("mean_rel_err"),
     "missing key 'drift_gate[0].mean_rel_err'"),
    ("a drift gate row's unknown key", lambda d: d["drift_gate"][0].__setitem__("colour", 1),
     "unknown key 'drift_gate[0].colour'"),
    ("the drift direction's unknown key", lambda d: d["drift_budget"]["direction"].__setitem__("colour", 1),
     "unknown key 'drift_budget.direction.colour'"),
    ("a budget level's unknown key", lambda d: d["drift_budget"]["levels"][0].__setitem__("colour", 1),
     "unknown key 'drift_budget.levels[0].colour'"),
    ("a category's unknown key", lambda d: d["categories"]["all"]["chain"].__setitem__("colour", 1),
     "unknown key 'categories.all.chain.colour'"),
    ("a speed-up prediction's missing key", lambda d: d["speedup"]["strategies"]["chain"].pop("round_s"),
     "missing key 'speedup.strategies.chain.round_s'"),
    ("a speed-up prediction's unknown key", lambda d: d["speedup"]["strategies"]["chain"].__setitem__("colour", 1),
     "unknown key 'speedup.strategies.chain.colour'"),
    ("the recompute loop's unknown key", lambda d: d["speedup"]["loop"]["chain"].__setitem__("colour", 1),
     "unknown key 'speedup.loop.chain.colour'"),
    ("a verdict part's unknown key", lambda d: d["verdict"]["parts"][0].__setitem__("colour", 1),
     "unknown key 'verdict.parts[0].colour'"),
    ("a verdict part's missing key", lambda d: d["verdict"]["parts"][0].pop("notices"),
     "missing key 'verdict.parts[0].notices'"),
    ("the verdict's unknown key", lambda d: d["verdict"].__setitem__("colour", 1), "unknown key 'verdict.colour'"),
    ("a near tie's unknown key", lambda d: d.__setitem__("near_ties", [{**TIE, "colour": 1}]),
     "unknown key 'near_ties[0].colour'"),
    ("a near tie's missing key",
     lambda d: d.__setitem__("near_ties", [{k: v for k, v in TIE.items() if k != "got_text"}]),
     "missing key 'near_ties[0].got_text'"),
    ("a block held as null", lambda d: d.__setitem__("settings", None), "unknown key 'settings'"),
    ("the timings' unknown key", lambda d: d["timings"].__setitem__("colour", 1), "unknown key 'timings.colour'"),
    ("a missing top-level key", lambda d: d.pop("tests"), "missing key 'tests'"),
    ("a missing τ mean", lambda d: d.pop("mean_floor"), "missing key 'mean_floor'"),
    ("the round costs' unknown key", lambda d: d["speedup"]["costs"].__setitem__("colour", 1),
     "unknown key 'speedup.costs.colour'"),
    ("the round costs' missing key", lambda d: d["speedup"]["costs"].pop("forward_b"),
     "missing key 'speedup.costs.forward_b'"),
    ("the speed-up's unknown key", lambda d: d["speedup"].__setitem__("colour", 1), "unknown key 'speedup.colour'"),
    ("a pooled speed's unknown key", lambda d: d["speedup"]["pooled"]["chain"].__setitem__("colour", 1),
     "unknown key 'speedup.pooled.chain.colour'"),
    ("a loop model's missing key", lambda d: d["speedup"]["models"]["server"].pop("checked"),
     "missing key 'speedup.models.server.checked'"),
    ("the target's unknown key", lambda d: d["target"].__setitem__("colour", 1), "unknown key 'target.colour'"),
    ("the target's missing identity", lambda d: d["target"].pop("identity"), "missing key 'target.identity'"),
    ("the target's loaded held as null", lambda d: d["target"].__setitem__("loaded", None),
     "unknown key 'target.loaded'"),
    ("the context's unknown key", lambda d: d["context"].__setitem__("colour", 1), "unknown key 'context.colour'"),
    ("the provenance's unknown key", lambda d: d["provenance"].__setitem__("colour", 1),
     "unknown key 'provenance.colour'"),
    ("the git state's missing key", lambda d: d["provenance"].__setitem__("git", {"commit": "0" * 40}),
     "missing key 'provenance.git.dirty'"),
    ("the kernel probe's unknown key", lambda d: d["provenance"]["kernel_probe"].__setitem__("colour", 1),
     "unknown key 'provenance.kernel_probe.colour'"),
    ("a kernel change's unknown key",
     lambda d: d["provenance"]["kernel_probe"].__setitem__("changed", [{**kernel_change("t"), "colour": 1}]),
     "unknown key 'provenance.kernel_probe.changed[0].colour'"),
    ("a kernel change's missing key",
     lambda d: d["provenance"]["kernel_probe"].__setitem__("changed", [_without(kernel_change("t"), "message")]),
     "missing key 'provenance.kernel_probe.changed[0].message'"),
]


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


#: A near tie as eval.json holds it (the bundled run has none: planted).
TIE = Divergence("p", "golden", 3, 9, 11, 12, 0.01, 0.01, 0.0625, "bfloat16", "a", "b").to_dict()


def _first(rows: dict) -> dict:
    return next(iter(rows.values()))


def schema() -> dict:
    return json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())


@pytest.mark.slow
def test_a_real_runs_result_round_trips_and_refuses_what_it_does_not_know(bundled_suite, tmp_path):
    skip = "not reference_completions and not fingerprint"  # no golden records in the checkout: not those
    res = bundled_suite("--tau-floor", "1.0", "--speedup-floor", "0.5", "-k", skip, report="reports",
                        cache=tmp_path / "cache")
    assert res.ret == 0, res.stdout.str()
    path = tmp_path / "reports" / "eval.json"
    data = json.loads(path.read_text())
    result = RunResult.read(path)
    assert result.prompts and result.tau is not None and result.drift_budget is not None
    assert result.verdict is not None and result.verdict.label == data["verdict"]["label"]
    again = json.loads(dumps_strict(result.to_dict()))
    assert again == data and list(again) == list(data)  # key for key, in the file's order
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    jsonschema.Draft202012Validator(schema()).validate(again)

    with_plugin = {**data, "owner": {"team": "drafting"}}  # a plugin's key (pytest_dflash_eval_result_ready)
    typed = RunResult.from_dict(with_plugin, source=path)
    assert typed.plugin_fields == {"owner": {"team": "drafting"}}
    assert list(typed.to_dict())[-2:] == ["owner", "verdict"]

    pid = next(iter(data["prompts"]))
    for what, change, words in MUTATIONS:
        bad = copy.deepcopy(data)
        change(bad)
        with pytest.raises(ResultKeyError) as err:
            RunResult.from_dict(bad, source=path)
        assert str(err.value).startswith(f"{path}: {words.format(p=pid)}"), (what, str(err.value))
        assert isinstance(err.value, EvalError)
    wrong = copy.deepcopy(data)  # a number where the layout holds a list or a mapping, deeper in a block
    _first(wrong["prompts"])["histogram"] = 5
    with pytest.raises(EvalError, match=f"^{re.escape(str(path))}: key 'prompts' holds a value of another type"):
        RunResult.from_dict(wrong, source=path)


def test_top_level_keys_are_the_schemas():
    assert set(TOP_LEVEL_KEYS) == set(schema()["properties"])


def test_a_row_refuses_unknown_and_missing_keys():
    stat = {"n": 2, "mean": 2.0, "median": 2.0, "ci95": [1.0, 3.0]}
    assert Stat.from_dict(stat).to_dict() == stat  # an optional member may be absent
    with pytest.raises(ResultKeyError, match="unknown key 'colour'"):
        Stat.from_dict({**stat, "colour": 1})
    with pytest.raises(ResultKeyError, match="missing key 'median'"):
        Stat.from_dict({k: v for k, v in stat.items() if k != "median"})
    row = {"n": 2, "chain": stat, "ddtree": {"8": {**stat, "colour": 1}}, "acceptance": {}, "floor": None,
           "ddtree_floor": {}, "passed": None}
    with pytest.raises(ResultKeyError, match=r"unknown key 'ddtree\.8\.colour'"):
        CategoryRow.from_dict(row)
    err = ResultKeyError("missing", "tau").under("p1").under("prompts").in_file(Path("reports/eval.json"))
    assert str(err) == "reports/eval.json: missing key 'prompts.p1.tau' (it is required)"
    with pytest.raises(ResultKeyError, match="missing key 'category'"):
        PromptRow.from_dict({})


#: eval.json's ``speedup.costs`` with every part timed (a part not timed, null, is read back as NaN: test_speedup.py).
COSTS = costs_block(draft_full=0.006, snapshot=0.001, project=[0.0001, 0.0003], forward_2=0.013, forward_b=0.015,
                    tree_build={"8": 0.0005}, tree_verify={"8": 0.017}, tree_accept={"8": 0.0002},
                    spread={"step": 0.02})

#: One record of each kind that reads itself (not a Row): what eval.json holds of it.
RECORDS = [
    (DriftStat, DriftStat("bf16-vs-fp32", "p", 3, 1e-3, 0.999, 0.5, 1e-2, 0.99).to_dict()),
    (GateCheck, GateCheck("bf16-vs-fp32", 3, 1e-3, 5e-4, "p", 0.2, 5.0, 0.18, 0.23).to_dict()),
    (Prediction, prediction()),
    (Divergence, TIE),
    (Part, Part("floors", False, ("τ below its floors",)).to_dict()),
    (Verdict, Verdict((Part("floors", True),)).to_dict()),
    (Direction, Direction("bf16-vs-fp32", "torch/float32", "torch/bfloat16", 6e-3, {"bf16-vs-fp32": 6e-3}).to_dict()),
    (RoundCosts, COSTS),
    (LoopModel, dict(MODELS["server"])),
    (PooledSpeed, {"tau": 2.0, "speedup": 2.0, "tokens_per_s": 200.0}),
    (Speedup, speedup_block(costs=COSTS, strategies={"chain": prediction()}, best="chain", loop={"chain": prediction()},
                            pooled={"chain": {"tau": 2.0, "speedup": 2.0, "tokens_per_s": 200.0}},
                            models={k: dict(v) for k, v in MODELS.items()}, floor=1.0, passed=True)),
]


@pytest.mark.parametrize(("cls", "d"), RECORDS, ids=[c.__name__ for c, _ in RECORDS])
def test_a_record_that_reads_itself_refuses_unknown_and_missing_keys(cls, d):
    """The records of the metrics that eval.json holds read their own keys as strictly as a row: the result checks
    no key itself."""
    assert cls.from_dict(d).to_dict() == d
    with pytest.raises(ResultKeyError, match="unknown key 'colour'"):
        cls.from_dict({**d, "colour": 1})
    last = list(d)[-1]
    with pytest.raises(ResultKeyError, match=f"missing key '{last}'"):
        cls.from_dict({k: v for k, v in d.items() if k != last})
    with pytest.raises(ResultKeyError, match="null where an object is expected"):
        cls.from_dict(None)


def test_a_block_tells_a_missing_key_from_a_null_one():
    """A field that may be absent or null (the target's shape, the context's ``max_blocks``) is ABSENT where the key
    is missing and None where it is null, and is written back as it was read; an optional member held as null is a
    key the block does not write."""
    unloaded = {"path": "/t", "identity": None, "num_layers": None, "dtype": "float32"}
    target = TargetBlock.from_dict(unloaded)
    assert target.identity is None and target.num_layers is None and target.hidden_size is ABSENT
    assert target.to_dict() == unloaded and list(target.to_dict()) == list(unloaded)
    with pytest.raises(ResultKeyError, match="missing key 'identity'"):
        TargetBlock.from_dict({"path": "/t"})
    ctx = ContextBlock.from_dict({"target": "i", "max_blocks": None, "block_size": 8})
    assert ctx.max_blocks is None and ctx.thinking is ABSENT and ctx.block_size == 8 and ctx.temperature is None
    assert ctx.to_dict() == {"target": "i", "max_blocks": None, "block_size": 8}
    with pytest.raises(ResultKeyError, match="unknown key 'block_size'"):
        ContextBlock.from_dict({"block_size": None})
    change = kernel_change("torch/float32", shape={"tokens": 8}, first="k", kinds=["norm"])
    probe = KernelProbeBlock.from_dict({"seconds": 0.5, "probes": [], "changed": [change], "per_worker": {"gw0": 0.5}})
    assert [(c.label, c.kinds, c.by_witness) for c in probe.changed] == [("torch/float32", ["norm"], False)]
    assert probe.to_dict()["changed"] == [change]


def test_what_is_not_eval_json_is_one_error(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text("{not json")
    with pytest.raises(EvalError, match="cannot read it as eval.json"):
        RunResult.read(path)
    path.write_text(json.dumps({"schema": 2}))
    with pytest.raises(EvalError, match="schema 2"):
        RunResult.read(path)


def test_the_result_imports_nothing_heavy():
    """The reports, the gate and the CLI read the result: importing it loads neither torch nor numpy."""
    code = ("import sys; import dflash_eval.session.run_result; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
