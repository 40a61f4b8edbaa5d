"""Unit tests of prompt formatting in the session's inputs stage: --chat-template auto/on/off, the prompt_ids cache
key, --prompts specs (built-in sets + JSONL files) and their errors."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession

TEMPLATE = ("{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def make(target, tmp_path, **kw) -> Inputs:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "text": "def add(a, b):"}) + "\n")
    values = {"target_model": target, "drafter": target, "prompts": prompts, "cache_dir": tmp_path / "cache",
              "device": "cpu"} | kw
    return EvalSession(EvalSettings.from_mapping(values), worker=("master", 0, 1)).inputs


def test_raw_text_without_a_template_and_on_is_an_error(tiny_target_dir, tmp_path):
    s = make(tiny_target_dir, tmp_path)
    assert s.prompt_format["chat_template"] == "off" and s.prompt_format["template_sha256"] is None
    assert s.prompt_ids["a"] == list(s.tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"])
    with pytest.raises(ConfigError, match="--chat-template on"):
        make(tiny_target_dir, tmp_path, chat_template="on").prompt_format  # noqa: B018
    with pytest.raises(ConfigError, match="--chat-template"):
        EvalSettings.from_mapping({"chat_template": "maybe"})


def test_template_applied_on_auto_and_keyed(tiny_target_dir, tmp_path):
    target = tmp_path / "instruct"
    shutil.copytree(tiny_target_dir, target)
    (target / "chat_template.jinja").write_text(TEMPLATE)
    auto = make(target, tmp_path)
    off = make(target, tmp_path, chat_template="off")
    assert auto.prompt_format["chat_template"] == "on" and len(auto.prompt_format["template_sha256"]) == 64
    raw = off.prompt_ids["a"]
    templ = auto.prompt_ids["a"]
    assert templ != raw and len(templ) > len(raw)
    assert auto.tokenizer.decode(templ).startswith("<|user|>")
    # two distinct prompt_ids cache entries, and a second session reads the templated ids back
    assert len(list((tmp_path / "cache").rglob("prompt_ids/*/*/manifest.json"))) == 2
    assert make(target, tmp_path).prompt_ids["a"] == templ


def test_prompt_spec_and_preflight_errors(tiny_target_dir, tmp_path):
    s = make(tiny_target_dir, tmp_path, prompts=f"humaneval:2,{tmp_path / 'p.jsonl'}")
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "category": "chat", "text": "hi"}) + "\n")
    assert [p.id for p in s.prompts] == ["humaneval-0", "humaneval-1", "a"]
    assert [p.category for p in s.prompts] == ["code", "code", "chat"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2"):
        make(tiny_target_dir, tmp_path, prompts=str(bad)).preflight()
    with pytest.raises(ConfigError, match="unknown prompt set 'nope'"):
        make(tiny_target_dir, tmp_path, prompts="humaneval:1,nope").preflight()
