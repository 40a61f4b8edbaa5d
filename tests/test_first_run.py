"""The first run on a new model, as a user makes it from a repository of their own (a temporary folder that is not
a checkout of this project; the bundled target and drafter copied in as ``models/mytarget`` and
``ckpt/released``):

1. ``dflash-eval run`` with nothing recorded: one usage error (exit 4) before any test, naming the floors file, the
   snapshot folder and the exact ``dflash-eval record`` command (the same under ``-n 2``);
2. ``dflash-eval gate`` with no floors: exit 2 naming the floors file it looked for and the record command;
3. the record command as printed: exit 0, floors, snapshots and fingerprint written, and the gate commands printed;
4. the printed ``dflash-eval run`` command: green, no PytestWarning; ``dflash-eval gate``: exit 0;
5. plain ``pytest --pyargs dflash_eval.tests_eval`` names the pytest command with the recording options instead;
   that command, run as printed, records;
6. a rootdir moved by ``--target-model ../elsewhere`` (a separate value) is a warning saying where reports and the
   cache go; ``--target-model=...`` is not.

Run: ``pytest tests/test_first_run.py -p no:cacheprovider -n 0`` (2-4 minutes on a loaded 2-core CPU).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
PROMPTS = [("code-0", "code", "def fibonacci(n):\n    "), ("text-0", "prose", "The quick brown fox jumps over")]
SUITE = ["--target-model", "models/mytarget", "--drafter", "ckpt/released", "--prompts", "prompts.jsonl",
         "--max-new-tokens", "24", "-p", "no:cacheprovider"]


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``dflash-eval ...`` / ``pytest ...`` as printed, in this interpreter, from ``cwd``."""
    if argv[0] == "dflash-eval":
        argv = [sys.executable, "-m", "dflash_eval", *argv[1:]]
    elif argv[0] == "pytest":
        argv = [sys.executable, "-m", "pytest", *argv[1:]]
    elif argv[:3] == ["python", "-m", "pytest"]:
        argv = [sys.executable, *argv[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_") and k != "PYTHONPATH"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def printed_command(text: str, after: str) -> list[str]:
    """The command on the line after the line ending with ``after`` (indented by two spaces)."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.rstrip().endswith(after))
    assert lines[i + 1].startswith("  "), text
    return shlex.split(lines[i + 1].strip())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    work = tmp_path / "myrepo"
    shutil.copytree(ROOT / "fixtures" / "target", work / "models" / "mytarget")
    shutil.copytree(ROOT / "fixtures" / "drafter", work / "ckpt" / "released")
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": i, "category": c, "text": t}) + "\n"
                                                for i, c, t in PROMPTS))
    (work / "pyproject.toml").write_text('[project]\nname = "mymodel"\n')  # a project of its own, not dflash-eval
    return work


def test_first_run_record_then_gate(repo):
    p = run(["dflash-eval", "run", *SUITE], repo)
    out = p.stdout + p.stderr
    assert p.returncode == 4, out
    assert p.stderr.count("ERROR:") == 1 and "FAILED" not in out and "passed" not in p.stdout, out
    assert f"τ floors: {repo}/golden/tau_floors.json does not exist" in p.stderr
    assert f"no snapshot in {repo}/golden/snapshots/mytarget/test_reference_completions for 2 of 2 prompts" in p.stderr
    record = printed_command(p.stderr, "with:")
    assert record == ["dflash-eval", "record", *SUITE], record
    assert not (repo / "reports" / "eval.json").exists()

    p = run(["dflash-eval", "run", *SUITE, "-n", "2"], repo)  # under xdist: the same one message
    assert p.returncode == 4 and p.stderr.count("ERROR:") == 1, p.stdout + p.stderr
    assert printed_command(p.stderr, "with:") == [*record, "-n", "2"] and "FAILED" not in p.stdout

    gate = ["dflash-eval", "gate", "--drafter", "ckpt/released", *SUITE[:2], *SUITE[4:8], "--quiet"]
    p = run(gate, repo)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"no τ floors to gate against: {repo}/golden/tau_floors.json does not exist" in p.stderr
    assert printed_command(p.stderr, "sets the bar:") == ["dflash-eval", "record", "--drafter", "ckpt/released",
                                                          *SUITE[:2], *SUITE[4:8]]

    p = run(record, repo)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "dflash-eval record: wrote" in p.stdout
    floors = json.loads((repo / "golden" / "tau_floors.json").read_text())
    assert sorted(floors["chain"]) == ["code-0", "text-0"] and sorted(floors["ddtree"]["8"]) == ["code-0", "text-0"]
    assert "dflash-eval record" in floors["note"] and "tests_eval" not in floors["note"]
    snap_dir = repo / "golden" / "snapshots" / "mytarget" / "test_reference_completions"
    snaps = sorted(p.name for p in snap_dir.iterdir())
    assert snaps == ["test_reference_completion[code-0].json", "test_reference_completion[text-0].json"]
    assert list((repo / "golden" / "fingerprints").glob("*.json"))
    assert "  τ floors     golden/tau_floors.json: 2 prompts, chain and DDTree-8, measured τ - 0.25" in p.stdout
    assert "  snapshots    golden/snapshots/mytarget/test_reference_completions/: 2 reference completions" in p.stdout
    gate_run = printed_command(p.stdout, "gate against them (the same options) with:")
    assert gate_run == ["dflash-eval", "run", *SUITE]

    p = run(gate_run, repo)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-8000:]
    assert " failed" not in p.stdout.splitlines()[-1] and "PytestWarning" not in out
    assert "PytestConfigWarning" not in out
    assert json.loads((repo / "reports" / "eval.json").read_text())["mean_passed"] is True
    p = run(gate, repo)
    assert p.returncode == 0 and "1/1 checkpoint(s) passed" in p.stdout, p.stdout + p.stderr


def test_plain_pytest_names_its_own_recording_command(repo):
    args = ["--pyargs", "dflash_eval.tests_eval", "-k", "tau", "--target-model=models/mytarget",
            "--drafter=ckpt/released", "--prompts=prompts.jsonl", "--max-new-tokens=24", "-p", "no:cacheprovider"]
    p = run(["pytest", *args], repo)
    assert p.returncode == 4 and p.stderr.count("ERROR:") == 1, p.stdout + p.stderr
    assert "reference completions" not in p.stderr  # -k tau selects no completion test: no snapshot is needed
    command = printed_command(p.stderr, "with:")
    assert command[-len(args) - 2:] == [*args, "--update-tau-floors", "--update-fingerprints"], command
    p = run(command, repo)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert sorted(json.loads((repo / "golden" / "tau_floors.json").read_text())["chain"]) == ["code-0", "text-0"]
    p = run(["pytest", *args], repo)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]


def test_a_rootdir_moved_by_an_option_value_is_a_warning(repo, tmp_path):
    work, models = tmp_path / "work", tmp_path / "models"
    work.mkdir()
    shutil.copytree(repo / "models" / "mytarget", models / "mytarget")
    common = ["--pyargs", "dflash_eval.tests_eval", "--collect-only", "-p", "no:cacheprovider",
              f"--drafter={repo / 'ckpt' / 'released'}", f"--prompts={repo / 'prompts.jsonl'}"]
    p = run(["pytest", *common, "--target-model", "../models/mytarget"], work)
    assert p.returncode == 0, p.stdout + p.stderr
    text = " ".join(p.stdout.split())
    assert f"rootdir: {tmp_path}\n" in p.stdout  # pytest's own choice: the common ancestor of work/ and the model
    assert (f"PytestConfigWarning: dflash-eval: pytest chose {tmp_path} as its rootdir, not {work}: it took the "
            "value of --target-model (../models/mytarget) for a test path") in text, p.stdout
    assert f"reports go to {tmp_path}/reports, the cache to {tmp_path}/.dflash_cache" in text
    assert "--target-model=../models/mytarget" in text and f"--rootdir={work}" in text
    p = run(["pytest", *common, "--target-model=../models/mytarget"], work)
    assert p.returncode == 0 and f"rootdir: {work}\n" in p.stdout and "dflash-eval: pytest chose" not in p.stdout
    p = run(["pytest", *common, "--target-model", "../models/mytarget", f"--rootdir={work}"], work)
    assert p.returncode == 0 and "dflash-eval: pytest chose" not in p.stdout
