"""Unit tests of dflash_eval.floors (floor arithmetic, overrides, malformed files) and the floors file round trip
through dflash_eval.golden.write_floors."""

from __future__ import annotations

import math

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.floors import UPDATE_COMMAND, floor_value, load_floors, make_floors
from dflash_eval.golden import write_floors


def test_floor_value_rounds_down_and_never_below_one():
    assert floor_value(3.4567, 0.25) == 3.206
    assert floor_value(1.1, 0.25) == 1.0
    assert floor_value(math.nan, 0.25) == 1.0


def test_round_trip_and_override(tmp_path):
    doc = make_floors({"a": 3.0, "b": 2.0}, {8: {"a": 4.0, "b": 2.5}}, 2.5, {8: 3.25}, margin=0.25,
                      context={"target": "t"}, previous={"chain": {"old": 5.0}})
    path = tmp_path / "golden" / "tau_floors.json"
    write_floors(path, doc)
    fl = load_floors(path)
    assert fl.for_prompt("a") == 2.75 and fl.for_prompt("b", 8) == 2.25 and fl.for_prompt("old") == 5.0
    assert fl.for_mean() == 2.25 and fl.for_mean(8) == 3.0
    assert fl.for_prompt("missing") is None and fl.for_prompt("a", 4) is None
    assert UPDATE_COMMAND in fl.missing_message("prompt 'missing'")
    over = load_floors(path, override=1.5)
    assert over.for_prompt("missing") == 1.5 and over.for_mean(8) == 1.5


def test_absent_file_is_empty_and_malformed_is_an_error(tmp_path):
    assert load_floors(tmp_path / "none.json").for_prompt("a") is None
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed"):
        load_floors(bad)
    with pytest.raises(ConfigError, match="margin"):
        make_floors({}, {}, 1.0, {}, margin=-1)


def test_category_floors_round_trip_and_previous_kept(tmp_path):
    doc = make_floors({"a": 3.0}, {8: {"a": 4.0}}, 3.0, {8: 4.0}, margin=0.25,
                      category_chain={"code": 3.5}, category_ddtree={8: {"code": 4.0}},
                      previous={"categories": {"chat": 2.0, "code": 9.0}, "categories_ddtree": {"8": {"chat": 2.5}}})
    assert doc["categories"] == {"chat": 2.0, "code": 3.25}
    assert doc["categories_ddtree"] == {"8": {"chat": 2.5, "code": 3.75}}
    path = tmp_path / "f.json"
    write_floors(path, doc)
    fl = load_floors(path)
    assert fl.for_category("code") == 3.25 and fl.for_category("chat", 8) == 2.5
    assert fl.for_category("code", 4) is None and fl.for_category("prose") is None
    assert load_floors(path, override=1.2).for_category("prose", 8) == 1.2
    old = tmp_path / "old.json"  # a floors file without category entries still loads
    old.write_text('{"schema": 1, "chain": {"a": 2.0}, "mean": {"chain": 2.0}}')
    assert load_floors(old).for_category("code") is None
