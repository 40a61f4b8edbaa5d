"""Unit tests of dflash_eval.metrics.floors (floor arithmetic, per-prompt floors, aggregate floors derived from the
selected prompts, explicit thresholds, schema-1 files, malformed files) and the floors file round trip through
dflash_eval.golden.writer.write_floors."""

from __future__ import annotations

import json
import math

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.golden.writer import write_floors
from dflash_eval.metrics.floors import (
    SCHEMA,
    UPDATE_COMMAND,
    Floors,
    floor_value,
    load_floors,
    make_floors,
)

CTX = {"target": "t" * 64, "max_new_tokens": 128, "max_blocks": None, "block_size": 8, "chat_template": "off",
       "dtype": "float32", "backend": "torch"}


def _write(tmp_path, doc, name="tau_floors.json"):
    path = tmp_path / "golden" / name
    write_floors(path, doc)
    return path


def test_floor_value_rounds_down_and_never_below_one():
    assert floor_value(3.4567, 0.25) == 3.206
    assert floor_value(1.1, 0.25) == 1.0
    assert floor_value(math.nan, 0.25) == 1.0


def test_round_trip_per_prompt_floors_and_previous_kept(tmp_path):
    doc = make_floors({"a": 3.0, "b": 2.0}, {8: {"a": 4.0, "b": 2.5}}, margin=0.25, context=CTX, drafter="f" * 64,
                      previous={"context": CTX, "chain": {"old": 5.0}, "ddtree": {"8": {"old": 6.0}}})
    assert doc["schema"] == SCHEMA == 2 and doc["margin"] == 0.25 and doc["drafter"] == "f" * 64
    assert doc["context"] == CTX and UPDATE_COMMAND in doc["note"]
    assert doc["chain"] == {"a": 2.75, "b": 1.75, "old": 5.0}
    assert doc["ddtree"] == {"8": {"a": 3.75, "b": 2.25, "old": 6.0}}
    assert not {"mean", "categories", "categories_ddtree"} & set(doc)  # no recorded aggregates in schema 2
    path = _write(tmp_path, doc)
    fl = load_floors(path)
    assert fl.path == path and fl.margin == 0.25 and fl.context == CTX and fl.raw == json.loads(path.read_text())
    assert fl.for_prompt("a") == 2.75 and fl.for_prompt("b", 8) == 2.25 and fl.for_prompt("old") == 5.0
    assert fl.for_prompt("missing") is None and fl.for_prompt("a", 4) is None
    assert fl.mean_override is None and fl.prompt_override is None and not fl.explicit
    assert fl.prompt_floors_required
    msg = fl.missing_message("prompt 'missing'", ["missing"])
    assert UPDATE_COMMAND in msg and str(path) in msg and "'missing'" in msg
    assert "--tau-floor VALUE" in msg and "--tau-floor-prompt VALUE" in msg


def test_absent_file_is_empty_and_malformed_is_an_error(tmp_path):
    fl = load_floors(tmp_path / "none.json")
    assert fl.for_prompt("a") is None and fl.chain == {} and fl.raw == {} and fl.context == {}
    assert fl.select({"a": "code"}).for_mean() is None and fl.select({"a": "code"}).missing() == ["a"]
    over = load_floors(tmp_path / "none.json", mean_override=2.0, prompt_override=1.5)
    assert over.mean_override == 2.0 and over.prompt_override == 1.5 and over.explicit
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed"):
        load_floors(bad)
    bad.write_text('{"chain": {"a": "x"}}')
    with pytest.raises(ConfigError, match=r"malformed.*regenerate"):
        load_floors(bad)
    with pytest.raises(ConfigError, match="margin"):
        make_floors({}, {}, margin=-1, context=CTX)


def _recorded(tmp_path) -> Floors:
    doc = make_floors({"a": 3.25, "b": 2.25, "c": 4.25}, {8: {"a": 4.25, "b": 3.25, "c": 5.25}}, margin=0.25,
                      context=CTX)
    return load_floors(_write(tmp_path, doc))


def test_aggregate_floors_follow_the_selection(tmp_path):
    fl = _recorded(tmp_path)  # per-prompt floors: chain a 3.0, b 2.0, c 4.0; DDTree-8 a 4.0, b 3.0, c 5.0
    assert fl.for_mean() is None and fl.for_category("code") is None  # nothing selected: no aggregate floor
    full = fl.select({"a": "code", "b": "chat", "c": "code"})
    assert full.selection == {"a": "code", "b": "chat", "c": "code"} and fl.selection == {}  # select copies
    assert full.for_mean() == pytest.approx(3.0) and full.for_mean(8) == pytest.approx(4.0)
    assert full.for_category("code") == pytest.approx(3.5) and full.for_category("code", 8) == pytest.approx(4.5)
    assert full.for_category("chat") == pytest.approx(2.0) and full.for_category("chat", 8) == pytest.approx(3.0)
    assert full.for_category("prose") is None  # no selected prompt of that category
    assert full.missing() == [] and full.missing(budget=8) == []
    sub = fl.select({"b": "chat", "c": "code"})  # a subset: its own mean floor, not the full set's
    assert sub.for_mean() == pytest.approx(3.0) and sub.for_mean(8) == pytest.approx(4.0)
    sub = fl.select({"a": "code", "c": "code"})
    assert sub.for_mean() == pytest.approx(3.5) != full.for_mean()
    assert sub.for_mean(8) == pytest.approx(4.5) != full.for_mean(8)
    assert sub.for_category("code") == pytest.approx(3.5) and sub.for_category("chat") is None
    assert fl.select({"b": "chat"}).for_mean() == pytest.approx(2.0)


def test_a_selected_prompt_without_a_floor_leaves_the_aggregates_without_one(tmp_path):
    fl = _recorded(tmp_path).select({"a": "code", "b": "chat", "new": "code"})
    assert fl.for_mean() is None and fl.for_mean(8) is None  # no aggregate floor invented around "new"
    assert fl.for_category("code") is None and fl.for_category("code", 8) is None
    assert fl.for_category("chat") == pytest.approx(2.0)  # a category without the floorless prompt keeps its floor
    assert fl.missing() == ["new"] and fl.missing(budget=8) == ["new"] and fl.missing(budget=4) == ["a", "b", "new"]
    assert fl.missing(["a", "b"]) == [] and fl.missing(["new", "zz"]) == ["new", "zz"]
    assert fl.prompt_floors_required
    assert "'new'" in fl.missing_message("the mean", fl.missing())


def test_tau_floor_alone_is_the_mean_floor_only(tmp_path):
    path = _write(tmp_path, make_floors({"a": 3.25}, {8: {"a": 4.25}}, margin=0.25, context=CTX))
    fl = load_floors(path, mean_override=1.5).select({"a": "code", "new": "code"})
    assert fl.explicit and not fl.prompt_floors_required  # prompts without a floor are not gated one by one
    assert fl.for_mean() == 1.5 and fl.for_mean(8) == 1.5 and fl.for_mean(4) == 1.5
    assert fl.for_prompt("a") == 3.0 and fl.for_prompt("new") is None  # per-prompt floors stay the file's
    assert fl.for_category("code") is None  # mean_override does not apply to categories
    assert fl.select({"a": "code"}).for_category("code") == 3.0
    assert fl.missing() == ["new"]
    bare = fl.without_file()
    assert bare.chain == {} and bare.ddtree == {} and bare.mean_override == 1.5 and bare.selection == fl.selection
    assert bare.for_prompt("a") is None and bare.for_mean() == 1.5 and bare.for_category("code") is None


def test_tau_floor_prompt_applies_to_every_prompt_and_the_derived_mean(tmp_path):
    path = _write(tmp_path, make_floors({"a": 3.25}, {8: {"a": 4.25}}, margin=0.25, context=CTX))
    fl = load_floors(path, prompt_override=1.25).select({"a": "code", "new": "chat"})
    assert fl.explicit and fl.prompt_floors_required
    assert fl.for_prompt("a") == 1.25 and fl.for_prompt("new") == 1.25 and fl.for_prompt("new", 4) == 1.25
    assert fl.for_mean() == 1.25 and fl.for_mean(8) == 1.25  # derived from the per-prompt floors
    assert fl.for_category("code") == 1.25 and fl.for_category("chat", 8) == 1.25
    assert fl.missing() == [] and fl.missing(budget=4) == []
    both = load_floors(path, mean_override=2.0, prompt_override=1.25).select({"a": "code"})
    assert both.for_mean() == 2.0 and both.for_prompt("a") == 1.25 and both.for_category("code") == 1.25
    assert not both.prompt_floors_required


def test_schema_1_files_load_without_their_recorded_aggregates(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({
        "schema": 1, "margin": 0.25, "target": "t" * 64,
        "settings": {"max_new_tokens": 64, "max_blocks": None, "num_prompts": 4},
        "chain": {"a": 2.0, "b": 4.0}, "ddtree": {"8": {"a": 3.0, "b": 5.0}},
        "mean": {"chain": 9.0, "ddtree": {"8": 9.0}},
        "categories": {"code": 9.0}, "categories_ddtree": {"8": {"code": 9.0}},
    }))
    fl = load_floors(old)
    assert fl.context == {"target": "t" * 64, "max_new_tokens": 64, "max_blocks": None}  # from target/settings
    assert fl.margin == 0.25 and fl.for_prompt("a") == 2.0 and fl.for_prompt("b", 8) == 5.0
    fl = fl.select({"a": "code", "b": "code"})
    assert fl.for_mean() == 3.0 and fl.for_mean(8) == 4.0  # derived; the recorded 9.0 is ignored
    assert fl.for_category("code") == 3.0 and fl.for_category("code", 8) == 4.0
    bare = tmp_path / "bare.json"  # schema 1 without target or settings: no context
    bare.write_text('{"schema": 1, "chain": {"a": 2.0}, "mean": {"chain": 2.0}}')
    fl = load_floors(bare)
    assert fl.context == {} and fl.select({"b": "code"}).for_mean() is None and fl.for_category("code") is None


def test_make_floors_drops_previous_floors_of_another_context():
    prev = make_floors({"old": 5.25, "a": 9.25}, {8: {"old": 6.25}}, margin=0.25, context=CTX)
    same = make_floors({"a": 3.25}, {8: {"a": 4.25}}, margin=0.25, context=CTX, previous=prev)
    assert same["chain"] == {"a": 3.0, "old": 5.0} and same["ddtree"] == {"8": {"a": 4.0, "old": 6.0}}  # a replaced
    other = dict(CTX, max_new_tokens=512)
    dropped = make_floors({"a": 3.25}, {8: {"a": 4.25}}, margin=0.25, context=other, previous=prev)
    assert dropped["chain"] == {"a": 3.0} and dropped["ddtree"] == {"8": {"a": 4.0}} and dropped["context"] == other
    for field, value in [("target", "u" * 64), ("block_size", 16), ("dtype", "bfloat16"), ("backend", "fla"),
                         ("chat_template", "on"), ("max_blocks", 4)]:
        doc = make_floors({"a": 3.25}, {}, margin=0.25, context=dict(CTX, **{field: value}), previous=prev)
        assert doc["chain"] == {"a": 3.0}, field
    schema1 = {"schema": 1, "target": "t" * 64, "settings": {"max_new_tokens": 64}, "chain": {"old": 5.0}}
    assert make_floors({"a": 3.25}, {}, margin=0.25, context=CTX, previous=schema1)["chain"] == {"a": 3.0}
    schema1["settings"]["max_new_tokens"] = 128  # same context (fields it lacks are not compared): kept
    assert make_floors({"a": 3.25}, {}, margin=0.25, context=CTX, previous=schema1)["chain"] == {"a": 3.0, "old": 5.0}
    no_ctx = {"chain": {"old": 5.0}}  # nothing recorded to compare: kept
    assert make_floors({"a": 3.25}, {}, margin=0.25, context=CTX, previous=no_ctx)["chain"] == {"a": 3.0, "old": 5.0}
