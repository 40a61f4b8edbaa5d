"""Multi-turn conversations through the session (each turn's prompt holds the earlier turns and the target's
reference replies; local generation and an SGLang client alike), ``--thinking``, and ``--online-tau``; on the tiny
random target and drafter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from patch_uses import patch_uses

import dflash_eval.metrics.online_loop as online_mod
import dflash_eval.target.generation as generation_mod
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.tau_context import mismatches
from dflash_eval.options.settings import EvalSettings
from dflash_eval.prompts import RAW_TURN_SEPARATOR, encode_messages
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.sglang.generate import Completion
from dflash_eval.target.generation import greedy_generate

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>"
            "{% if enable_thinking is defined and not enable_thinking %}NOTHINK{% endif %}{% endif %}")
TURNS = ["def add(a, b):", "Now write subtract(a, b)."]


def session(target: Path, drafter: Path, tmp_path: Path, **kw: Any) -> EvalSession:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "c", "category": "chat", "turns": TURNS}) + "\n"
                       + json.dumps({"id": "s", "text": "The quick brown fox"}) + "\n")
    values = {"target_model": target, "drafter": drafter, "prompts": prompts, "cache_dir": tmp_path / "cache",
              "max_new_tokens": 8, "device": "cpu", "floors_file": tmp_path / "no_floors.json"} | kw
    return EvalSession(EvalSettings.from_mapping(values), worker=("master", 0, 1))


@pytest.fixture
def templated(tiny_target_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "instruct"
    shutil.copytree(tiny_target_dir, target)
    (target / "chat_template.jinja").write_text(TEMPLATE)
    return target


def test_raw_text_turn_continues_the_previous_sequence(tiny_target_dir, tiny_drafter_dir, tmp_path) -> None:
    s = session(tiny_target_dir, tiny_drafter_dir, tmp_path)
    assert [p.id for p in s.inputs.prompts] == ["c-t1", "c-t2", "s"]
    assert set(s.inputs.prompt_ids) == {"c-t1", "s"}  # a later turn's ids need the reply first
    assert not s.references.cached()
    comps = s.completions()
    t1, t2 = comps["c-t1"], comps["c-t2"]
    sep = s.inputs.tokenizer(RAW_TURN_SEPARATOR + TURNS[1], add_special_tokens=False)["input_ids"]
    assert t2.prompt_ids == t1.sequence + list(sep)
    # the turn-2 completion is the target's greedy continuation of that context
    assert t2.output_ids == greedy_generate(s.inputs.target, t2.prompt_ids, 8, backend="torch")
    summary = s.tau_summary()
    conv = summary.conversations["c"]
    assert conv.turns == ["c-t1", "c-t2"] and conv.category == "chat"
    rows = summary.prompts
    assert conv.rounds == rows["c-t1"].rounds + rows["c-t2"].rounds
    assert conv.turn_tau == [rows["c-t1"].tau, rows["c-t2"].tau]
    assert rows["c-t2"].conversation == "c" and rows["c-t2"].turn == 2 and rows["s"].conversation is None
    assert "conversation" not in rows["s"].to_dict()
    assert set(summary.turns) == {"1", "2"} and summary.turns["2"].chain.n == 1
    # a second session finds every turn cached (its ids included) and generates nothing
    again = session(tiny_target_dir, tiny_drafter_dir, tmp_path)
    assert again.references.cached()
    with pytest.MonkeyPatch.context() as mp:
        patch_uses(mp, generation_mod, "greedy_generate_batch",
                   lambda *a, **k: pytest.fail("generated on a warm cache"))
        assert {p: r.sequence for p, r in again.completions().items()} == {p: r.sequence for p, r in comps.items()}


def test_chat_template_turn_holds_the_reply(templated, tiny_drafter_dir, tmp_path) -> None:
    s = session(templated, tiny_drafter_dir, tmp_path)
    assert s.inputs.prompt_format["enable_thinking"] is False
    comps = s.completions()
    reply = comps["c-t1"].text
    tok = s.inputs.tokenizer
    msgs = [{"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": reply},
            {"role": "user", "content": TURNS[1]}]
    assert comps["c-t2"].prompt_ids == encode_messages(tok, msgs, thinking=False)
    text = tok.decode(comps["c-t2"].prompt_ids)
    assert text.startswith("<|user|>") and text.endswith("<|assistant|>NOTHINK") and text.count("<|user|>") == 2


def test_sglang_completions_are_fetched_turn_by_turn(tiny_target_dir, tiny_drafter_dir, tmp_path) -> None:
    s = session(tiny_target_dir, tiny_drafter_dir, tmp_path, completions="sglang",
                sglang_url="http://127.0.0.1:9")
    target = s.inputs.target

    class Client:  # answers like a speculative SGLang server would (greedy ids, its accept length and histogram)
        def __init__(self) -> None:
            self.batches: list[list[list[int]]] = []

        def generate_greedy(self, batch: list[list[int]], *, max_new_tokens: int) -> list[Completion]:
            self.batches.append([list(b) for b in batch])
            out = []
            for ids in batch:
                gen = greedy_generate(target, ids, max_new_tokens, backend="torch")
                out.append(Completion(gen, target.tokenizer.decode(gen, skip_special_tokens=True),
                                      {"type": "length"}, len(gen) / 3, 3, [1, 1, 1]))
            return out

    client = Client()
    s.references.server.attach(client)
    comps = s.completions()
    assert [len(b) for b in client.batches] == [2, 1]  # turn 1 with the single-turn prompt, then turn 2
    assert client.batches[1][0] == comps["c-t2"].prompt_ids
    assert comps["c-t2"].prompt_ids[:len(comps["c-t1"].sequence)] == comps["c-t1"].sequence
    rows = s.tau_summary().prompts
    assert rows["c-t2"].server_histogram == [1, 1, 1]
    assert rows["c-t2"].server_position_rates == pytest.approx([2 / 3, 1 / 3])
    assert set(s.tau_summary().categories["all"].acceptance) == {"chain", "server"}


def test_thinking_switch(templated, tiny_target_dir, tiny_drafter_dir, tmp_path) -> None:
    off = session(templated, tiny_drafter_dir, tmp_path)
    on = session(templated, tiny_drafter_dir, tmp_path, thinking="on")
    assert on.inputs.prompt_format["enable_thinking"] is True
    assert on.inputs.prompt_format["template_sha256"] == off.inputs.prompt_format["template_sha256"]
    ids_off, ids_on = off.inputs.prompt_ids["s"], on.inputs.prompt_ids["s"]
    assert ids_off != ids_on and off.inputs.tokenizer.decode(ids_off).endswith("NOTHINK")
    assert not on.inputs.tokenizer.decode(ids_on).endswith("NOTHINK")
    assert on.run_context()["thinking"] is True and off.run_context()["thinking"] is False
    assert any("--thinking" in m for m in mismatches(off.run_context(), on.run_context()))
    # the bundled-style target without a template: raw text, thinking not applicable, today's prompt format
    raw = session(tiny_target_dir, tiny_drafter_dir, tmp_path)
    assert raw.inputs.prompt_format == {"chat_template": "off", "template_sha256": None, "enable_thinking": None}
    with pytest.raises(ConfigError, match="--thinking on needs the target's chat template"):
        session(tiny_target_dir, tiny_drafter_dir, tmp_path, thinking="on").inputs.prompt_format  # noqa: B018
    (templated / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ConfigError, match="no enable_thinking switch"):
        session(templated, tiny_drafter_dir, tmp_path, thinking="on").inputs.prompt_format  # noqa: B018


def test_online_tau_beside_offline(tiny_target_dir, tiny_drafter_dir, tmp_path) -> None:
    s = session(tiny_target_dir, tiny_drafter_dir, tmp_path, online_tau=True)
    rows = s.tau_summary().prompts
    for pid, r in rows.items():
        # on the tiny fp32 models the real loop reproduces the reference and the offline rounds exactly
        assert r.online.matches_reference and r.online.first_divergence is None, pid
        assert r.online.accept_lengths == r.accept_lengths, pid
        assert r.online.position_rates == r.position_rates, pid
    acc = s.tau_summary().categories["all"].acceptance
    assert acc["online"].histogram == acc["chain"].histogram
    # cached: a second session does not run the loop again
    again = session(tiny_target_dir, tiny_drafter_dir, tmp_path, online_tau=True)
    with pytest.MonkeyPatch.context() as mp:
        patch_uses(mp, online_mod, "online_generate", lambda *a, **k: pytest.fail("online loop re-run on a warm cache"))
        assert again.tau_summary().prompts["s"].online.accept_lengths == rows["s"].accept_lengths
    assert session(tiny_target_dir, tiny_drafter_dir, tmp_path).tau_summary().prompts["s"].online is None
