"""Unit tests of dflash_eval.prompts: JSONL loading with line-numbered errors."""

from __future__ import annotations

import json

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.prompts import load_prompts


def write(tmp_path, lines):
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


def test_loads_ids_categories_and_defaults(tmp_path):
    p = write(tmp_path, [json.dumps({"id": "x-1", "category": "code", "text": "def f():"}), "",
                         "// a comment", json.dumps({"category": "math", "prompt": "1+1="}),
                         json.dumps({"category": "math", "text": "2+2="}), json.dumps({"text": "hi"})])
    ps = load_prompts(p)
    assert [x.id for x in ps] == ["x-1", "math-0", "math-1", "prompt-0"]
    assert ps[1].text == "1+1=" and ps[1].line == 4 and ps[0].category == "code"
    assert [x.id for x in load_prompts(p, limit=2)] == ["x-1", "math-0"]


@pytest.mark.parametrize("bad, needle", [
    ('{"id": "a", text: 1}', ":2: not valid JSON (Expecting property name enclosed in double quotes at column 13)"),
    ('{"id": "c", "text": "open', ":2: not valid JSON (Unterminated string starting at column 21)"),
    ('[1, 2]', ":2: expected a JSON object"),
    ('{"id": "b"}', ":2: missing string field 'text'"),
    ('{"id": "b", "text": "   "}', ":2: empty prompt text"),
    ('{"id": "a", "text": "dup"}', ":2: duplicate prompt id 'a' (first on line 1)"),
    ('{"id": "a b", "text": "x"}', ":2: prompt id 'a b' may only contain"),
])
def test_bad_line_reports_line_number(tmp_path, bad, needle):
    p = write(tmp_path, ['{"id": "a", "text": "ok"}', bad])
    with pytest.raises(ConfigError) as exc:
        load_prompts(p)
    assert needle in str(exc.value) and str(p) in str(exc.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ConfigError, match="prompts file not found"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="no prompts"):
        load_prompts(write(tmp_path, ["", "  "]))
    with pytest.raises(ConfigError, match="--num-prompts must be >= 1"):
        load_prompts(write(tmp_path, ['{"text": "x"}']), limit=0)
