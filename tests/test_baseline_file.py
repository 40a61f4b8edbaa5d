"""The earlier results a run reads back go through their typed form at the file boundary: ``--baseline`` (an earlier
eval.json, :func:`dflash_eval.session.baseline_file.read_baseline` through
:meth:`~dflash_eval.session.run_result.RunResult.read`) and the gate's history (``history.jsonl``, what ``gate
--latest`` judges the newest checkpoint against). A planted unknown key and a missing one are each one message naming
the file and the key's path, answered before torch is imported (no run work) and before anything is written.

Run: ``pytest tests/test_baseline_file.py -p no:cacheprovider -n 0``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from result_rows import drafter_block, fragment, prompt_row

from dflash_eval import report
from dflash_eval.errors import ConfigError
from dflash_eval.options.preflight import input_problems
from dflash_eval.options.settings import resolve
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.baseline_file import baseline_problem, read_baseline

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"
# The command runs in this interpreter; the last line says which heavy modules it had imported by then.
PROBE = ("import sys\nfrom dflash_eval.cli.main import main\nrc = main(sys.argv[1:])\n"
         "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\nsys.exit(rc)\n")
CONTEXT = {"target": "i" * 64, "max_new_tokens": 8, "max_blocks": None, "block_size": 8, "chat_template": "auto",
           "thinking": None, "dtype": "float32", "backend": "torch"}


def eval_json() -> dict[str, Any]:
    """A whole eval.json of a τ run, as the writer writes it."""
    run = report.merge([fragment(drafter=drafter_block(), context=CONTEXT,
                                 prompts={"p0": prompt_row(tau=2.0), "p1": prompt_row(tau=3.0)}, mean_tau=2.5,
                                 mean_floor=None, mean_ddtree={}, mean_ddtree_floor={})], outcomes={})
    return run.to_dict()


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(dumps_strict(data) + "\n")
    return path


def planted(kind: str) -> dict[str, Any]:
    data = eval_json()
    if kind == "unknown":
        data["prompts"]["p1"]["bogus"] = 1
    else:
        del data["prompts"]["p1"]["rounds"]
    return data


def test_a_baseline_reads_through_the_typed_result(tmp_path):
    b = read_baseline(write(tmp_path / "eval.json", eval_json()))
    assert b.tau == {"p0": 2.0, "p1": 3.0} and b.samples == {} and b.drafter == "f" * 64
    assert b.context == CONTEXT and b.path == tmp_path / "eval.json"


@pytest.mark.parametrize(("kind", "says"), [("unknown", "unknown key 'prompts.p1.bogus'"),
                                            ("missing", "missing key 'prompts.p1.rounds'")])
def test_a_bad_key_in_a_baseline_names_the_file_and_the_key(tmp_path, kind, says):
    path = write(tmp_path / "old.json", planted(kind))
    with pytest.raises(ConfigError) as err:
        read_baseline(path)
    assert str(err.value).startswith(f"--baseline {path}: {says}"), err.value
    assert baseline_problem(path) == str(err.value)
    s = resolve({"target_model": str(TARGET), "drafter": str(DRAFTER), "baseline": str(path)}.get, environ={},
                invocation_dir=tmp_path, root=tmp_path, check=False)
    assert [p for p in input_problems(s, baseline_check=baseline_problem) if "--baseline" in p] == [str(err.value)]


def test_a_baseline_that_is_not_eval_json_is_named(tmp_path):
    (tmp_path / "old.json").write_text("{")
    with pytest.raises(ConfigError, match=rf"^--baseline {tmp_path}/old.json: cannot read it as eval.json"):
        read_baseline(tmp_path / "old.json")
    with pytest.raises(ConfigError, match=rf"^--baseline {tmp_path}/gone.json: not found"):
        read_baseline(tmp_path / "gone.json")
    write(tmp_path / "empty.json", {**eval_json(), "prompts": {}})
    with pytest.raises(ConfigError, match="no 'prompts' with τ"):
        read_baseline(tmp_path / "empty.json")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}
    return subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("kind", ["unknown", "missing"])
@pytest.mark.parametrize("command", ["run", "gate"])
def test_a_bad_baseline_stops_the_run_before_any_work(tmp_path, command, kind):
    """``dflash-eval run`` (exit 4, pytest's usage error) and ``dflash-eval gate`` (exit 2) name the file and the key
    before torch is imported and before the report folder is made."""
    path = write(tmp_path / "old.json", planted(kind))
    key = "prompts.p1.bogus" if kind == "unknown" else "prompts.p1.rounds"
    extra = ["-p", "no:cacheprovider"] if command == "run" else []
    p = _run([command, *extra, "--target-model", str(TARGET), "--drafter", str(DRAFTER), "--baseline", str(path),
              "--report-dir", str(tmp_path / "reports")], tmp_path)
    assert p.returncode == (4 if command == "run" else 2), p.stdout + p.stderr
    assert f"--baseline {path}: {kind} key '{key}'" in p.stderr, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []", p.stdout
    assert not (tmp_path / "reports").exists()


#: A history record as :meth:`dflash_eval.training_loop.history.CheckpointRecord.to_json` writes it.
RECORD = {"step": 100, "time": "2026-01-01T00:00:00+00:00", "drafter": "ckpt/step_100", "fingerprint": "fp",
          "settings_digest": "d1", "mean_tau": 1.4, "mean_tau_ci95": [1.3, 1.5], "mean_ddtree": {"8": 1.6},
          "mean_ddtree_ci95": {"8": [1.5, 1.7]}, "mean_floor": 1.5,
          "categories": {"all": {"n": 2, "tau": 1.4, "ci95": [1.3, 1.5], "ddtree": {}}},
          "prompts": {"p0": 1.3, "p1": 1.5}, "drift_budget": None, "reference": None, "passed": True, "reasons": [],
          "regression": None, "plateau": None, "mean_tau_pooled": 1.41, "mean_ddtree_pooled": {"8": 1.6},
          "ci_method": "Hall t over prompts", "speedup": None, "parts": None, "verdict": "pass"}


@pytest.mark.parametrize(("kind", "says"), [("unknown", "unknown key 'bogus'"), ("missing", "missing key 'mean_tau'")])
def test_a_bad_key_in_the_history_stops_gate_latest_before_any_work(tmp_path, kind, says):
    """``gate DIR --latest`` judges the newest checkpoint against the history: a line with a key no version wrote,
    or without one every version wrote, is exit 2 naming the file, the line and the key, before torch is imported,
    with the history as it was and no report written."""
    train = tmp_path / "train"
    train.mkdir()
    (train / "step_100").symlink_to(DRAFTER, target_is_directory=True)
    bad = {**RECORD, "bogus": 1} if kind == "unknown" else {k: v for k, v in RECORD.items() if k != "mean_tau"}
    history = tmp_path / "history.jsonl"
    text = json.dumps(RECORD) + "\n" + json.dumps(bad) + "\n"
    history.write_text(text)
    p = _run(["gate", str(train), "--latest", "--target-model", str(TARGET), "--history", str(history),
              "--report-dir", str(tmp_path / "reports")], tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{history}:2: not a history record: {says}" in p.stderr, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []", p.stdout
    assert history.read_text() == text and not (tmp_path / "reports").exists()
