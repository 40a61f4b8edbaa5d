"""Per-sample records: each prompt row of eval.json holds the references its τ was measured on (ids, text, each
token's piece, the rounds of the chain and every DDTree budget: ``completions``), and ``reports/samples.jsonl`` has
one line per (prompt, reference), at temperature 0 (one greedy reference) and above (one per sampled reference, with
its stream seed). Token pieces join to the text also where a character spans several tokens, and a warm run reads
them from the cache without a tokenizer.

Run: ``pytest tests/test_samples.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import transformers
from result_rows import fragment, prompt_row

from dflash_eval import report
from dflash_eval.options.settings import EvalSettings
from dflash_eval.references.token_pieces import decode_pieces, pieces_of
from dflash_eval.report.samples import SAMPLES_NAME, sample_records, write_samples
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.eval_result import EvalResult
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.session.rows import ResultKeyError
from dflash_eval.session.run_result import RunResult
from dflash_eval.target.sampling import stream_seed

ROOT = Path(__file__).resolve().parents[1]
TEXTS = {"p0": "def add(a, b):", "p1": "Grüße → 😀 naïve"}


def _session(target: Path, drafter: Path, tmp_path: Path, **over: Any) -> EvalSession:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "category": "c", "text": t}) + "\n" for i, t in TEXTS.items()))
    values = {"target_model": target, "drafter": drafter, "prompts": prompts, "cache_dir": tmp_path / "cache",
              "max_new_tokens": 12, "device": "cpu", "torch_threads": 1, "tau_floor": 1.0, "witness_prompts": 0,
              "floors_file": tmp_path / "tau_floors.json",
              **over}
    return EvalSession(EvalSettings.from_mapping(values), worker=("master", 0, 1))


def _fragment(session: EvalSession) -> dict[str, Any]:
    session.tau_summary()
    return json.loads(dumps_strict(session.result().to_dict()))


def _schema_validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


# ------------------------------------------------------------------------------------------------- token pieces
@pytest.fixture(scope="module")
def bundled_tokenizer() -> Any:
    return transformers.AutoTokenizer.from_pretrained(ROOT / "fixtures" / "target", local_files_only=True)


def test_pieces_join_to_the_text_where_characters_span_tokens(bundled_tokenizer) -> None:
    text = "def f(x):\n    return x  # héllo → 😀 end"
    ids = bundled_tokenizer(text, add_special_tokens=False)["input_ids"]
    alone = [bundled_tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in a for a in alone)  # the case the pieces exist for: a token alone is no character
    decoded, pieces = decode_pieces(bundled_tokenizer, ids + [0] + ids)  # 0: a special token, skipped
    assert decoded == text + text and "".join(pieces) == decoded and len(pieces) == 2 * len(ids) + 1
    assert "\ufffd" not in "".join(pieces) and "😀" in pieces and "é" in pieces
    assert pieces[len(ids)] == "" and pieces[:3] == ["def", " f", "("]


class _StrippingTokenizer:
    """A tokenizer whose decoding strips trailing spaces: a prefix's decoding is no prefix of the whole one."""

    words = ["a ", "b ", "c", " "]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.words[i] for i in ids).rstrip(" ")

    def batch_decode(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(s) for s in seqs]


def test_pieces_are_cut_from_the_text_when_prefixes_do_not_extend() -> None:
    text, pieces = decode_pieces(_StrippingTokenizer(), [0, 3, 1, 2])  # type: ignore[arg-type]
    assert text == "a  b c" and "".join(pieces) == text and len(pieces) == 4


def test_recorded_pieces_are_used_and_missing_ones_decoded(bundled_tokenizer) -> None:
    ids = bundled_tokenizer("x → y", add_special_tokens=False)["input_ids"]
    assert pieces_of(["p"] * len(ids), ids, lambda: pytest.fail("decoded recorded pieces")) == ["p"] * len(ids)
    assert "".join(pieces_of(None, ids, lambda: bundled_tokenizer)) == "x → y"
    assert "".join(pieces_of(["p"], ids, lambda: bundled_tokenizer)) == "x → y"  # pieces of other ids: decoded


# ------------------------------------------------------------------------------------------------- a real run
def test_greedy_rows_and_samples_jsonl(tiny_target_dir, tiny_drafter_dir, tmp_path, monkeypatch) -> None:
    cold = _session(tiny_target_dir, tiny_drafter_dir, tmp_path)
    frag = _fragment(cold)
    refs = cold.completions()
    for pid, row in frag["prompts"].items():
        (c,) = row["completions"]
        rec = refs[pid]
        assert c["sample"] == 0 and c["source"] == "local" and "seed" not in c
        assert c["ids"] == rec.output_ids and c["text"] == rec.text and "".join(c["pieces"]) == c["text"]
        assert len(c["pieces"]) == len(c["ids"]) == row["completion_tokens"]
        assert c["accept_lengths"] == row["accept_lengths"] and 1 + sum(c["accept_lengths"]) == len(c["ids"])
        assert c["tau"] == row["tau"] and c["ddtree"] == row["ddtree"]
        assert c["ddtree_accept_lengths"] == row["ddtree_accept_lengths"]
        assert row["prompt_ids"] == rec.prompt_ids and row["prompt_text"] == TEXTS[pid]
    # the typed result round-trips the rows, and the to_dict of a process is what eval.json merges
    assert json.loads(dumps_strict(EvalResult.from_dict(frag).to_dict()))["prompts"] == frag["prompts"]

    paths = report.write_reports(report.merge([EvalResult.from_dict(frag)], wall_s=1.0), tmp_path / "reports")
    lines = [json.loads(x) for x in paths["samples"].read_text().splitlines()]
    assert [(x["prompt_id"], x["sample"]) for x in lines] == [("p0", 0), ("p1", 0)]
    for x in lines:
        row = frag["prompts"][x["prompt_id"]]
        c = row["completions"][0]
        assert x["completion_ids"] == c["ids"] and x["completion_text"] == c["text"]
        assert x["completion_pieces"] == c["pieces"] and x["accept_lengths"] == c["accept_lengths"]
        assert x["prompt_ids"] == row["prompt_ids"] and x["prompt_text"] == TEXTS[x["prompt_id"]]
        assert x["tau"] == c["tau"] and x["ddtree"] == c["ddtree"] and x["rounds"] == len(c["accept_lengths"])
        assert x["source"] == "local" and x["temperature"] == 0.0 and x["block_size"] == frag["context"]["block_size"]
    _schema_validator().validate(json.loads(paths["json"].read_text()))

    # warm: the pieces come from the cache, no tokenizer is built
    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("a warm run must not build the tokenizer")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    warm = _fragment(_session(tiny_target_dir, tiny_drafter_dir, tmp_path))
    assert {p: r["completions"] for p, r in warm["prompts"].items()} == \
        {p: r["completions"] for p, r in frag["prompts"].items()}


def test_sampled_rows_one_line_per_sample(tiny_target_dir, tiny_drafter_dir, tmp_path) -> None:
    session = _session(tiny_target_dir, tiny_drafter_dir, tmp_path, temperature=0.9, samples_per_prompt=3,
                       sampling_seed=7)
    frag = _fragment(session)
    sampled = session.evaluation.sampled_references.completions()
    for pid, row in frag["prompts"].items():
        comps = row["completions"]
        assert [c["sample"] for c in comps] == [0, 1, 2]
        assert [c["seed"] for c in comps] == [stream_seed(7, pid, k) for k in range(3)]
        assert [c["ids"] for c in comps] == sampled[pid]
        assert all("".join(c["pieces"]) == c["text"] and len(c["pieces"]) == len(c["ids"]) for c in comps)
        assert [c["tau"] for c in comps] == row["sample_tau"]
        assert [a for c in comps for a in c["accept_lengths"]] == row["accept_lengths"]  # the pooled rounds
        assert [c["ddtree"]["8"] for c in comps] == row["ddtree_sample_tau"]["8"]
    run = report.merge([EvalResult.from_dict(frag)], wall_s=1.0)
    recs = list(sample_records(run))
    assert [(r.prompt_id, r.sample) for r in recs] == [(p, k) for p in TEXTS for k in range(3)]
    assert all(r.temperature == 0.9 and r.seed is not None for r in recs)
    _schema_validator().validate(json.loads(dumps_strict(run.to_dict())))


def test_no_references_no_samples_file_and_an_earlier_one_removed(tmp_path) -> None:
    path = tmp_path / SAMPLES_NAME
    path.write_text('{"prompt_id": "from an earlier run"}\n')
    row = prompt_row(category="c", tau=2.0, rounds=1, accept_lengths=[2])
    data = report.merge([fragment(prompts={"a": row}, mean_tau=2.0, mean_floor=None, mean_ddtree={},
                                  mean_ddtree_floor={})], wall_s=1.0).to_dict()
    assert write_samples(RunResult.from_dict(data), path) is None and not path.exists()
    bad = {**data, "prompts": {"a": {**row, "completions": [{"sample": 0}]}}}
    with pytest.raises(ResultKeyError, match=r"missing key 'prompts\.a\.completions\[0\]\.source'"):
        RunResult.from_dict(bad)  # a row that claims references must hold them whole
