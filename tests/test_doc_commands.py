"""The installed examples of README.md and docs/manual.md run as written: every ``dflash-eval ...`` line of their code
blocks, and the installed commands of the README's table (``dflash-eval run ...``, ``pytest --pyargs ...``), is run
here, in a folder of its own outside the checkout (which then plays the part of the user's repository, as an
installed package sees it), or is named with the reason it cannot run here (:data:`NOT_HERE`).

Only the documents' placeholders are replaced (:data:`PLACES`: ``/models/Qwen3-8B`` and ``models/mytarget`` are
the bundled target, ``ckpt/step_5000`` and ``ckpt_a`` the bundled drafter, ...); every option is the one written.
The environment makes the runs short (``DFLASH_EVAL_MAX_NEW_TOKENS``, ``DFLASH_EVAL_NUM_PROMPTS`` and
``DFLASH_EVAL_DRIFT_BUDGET_MIN_PROMPTS``: options' environment variables, which a command line's own options
override). The README's first run (record, then run, then gate) runs in its order, and
the other commands after it, in the same folder: the golden records it wrote are theirs.

Run: ``pytest tests/test_doc_commands.py -p no:cacheprovider``
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
DOCS = (ROOT / "README.md", ROOT / "docs" / "manual.md")

pytestmark = pytest.mark.slow  # runs the installed commands on the bundled target (a few minutes on 2 cores)

#: The documents' placeholders and what stands in for them here (paths relative to the folder the commands run in).
PLACES = {
    "/models/Qwen3.6-27B": "models/mytarget", "/models/Qwen3-8B": "models/mytarget", "DIR": "models/mytarget",
    "ckpt/released": "ckpt/released", "ckpt/step_4000": "ckpt/step_4000", "ckpt/step_5000": "ckpt/step_5000",
    "ckpt/step_6000": "ckpt/step_6000", "ckpt_a": "ckpt/ckpt_a", "ckpt_b": "ckpt/ckpt_b", "ckpt_c": "ckpt/ckpt_c",
    "CKPT": "ckpt/released", "SPEC": "humaneval:40", "/data/sets": "data/sets",
}

#: The commands that cannot run here, and why (each one is in a document: a test below checks that too).
NOT_HERE = {
    'dflash-eval run -k "tau or checkpoint" --target-model /models/Qwen3.6-27B --drafter runs/dflash/step_20000.pt '
    "--drafter-config runs/dflash/config.json --prompts humaneval:40,my_prompts.jsonl --max-new-tokens 512 "
    "--tau-floor 3.0 --baseline runs/last_good/eval.json --hidden-state-backend fla --reference-backend fla":
        "fla's kernels need a CUDA device",
}

#: Commands in the order they run, and the exit status each must end with: the README's first run first (a model
#: of one's own needs its golden records before anything gates against them).
ORDER = ("dflash-eval record", "dflash-eval run", "pytest", "dflash-eval gate", "dflash-eval sets")


def _commands(path: Path) -> list[str]:
    """The installed commands of ``path``: the ``dflash-eval`` lines of its code blocks (continuation lines joined,
    comments dropped) and, in the README, the installed column of its table of ways to run the suite."""
    text = path.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("dflash-eval "):
                out.append(shlex.join(shlex.split(line, comments=True)).replace("'", '"'))
    if path.name == "README.md":  # the table's installed column: its complete commands (none with "...")
        for row in re.findall(r"^\|[^|\n]*\|([^|\n]*)\|", text, re.M):
            out += [c for c in re.findall(r"`((?:dflash-eval|pytest --pyargs) [^`]+)`", row) if "..." not in c]
    return out


def _place(word: str) -> str:
    """``word`` with a placeholder replaced (``--target-model=/models/Qwen3-8B`` too)."""
    flag, eq, value = word.partition("=")
    return f"{flag}={PLACES.get(value, value)}" if eq and flag.startswith("--") else PLACES.get(word, word)


def _argv(cmd: str) -> list[str]:
    words = [_place(w) for w in shlex.split(cmd)]
    if words[0] == "dflash-eval":
        return [sys.executable, "-m", "dflash_eval", *words[1:]]
    assert words[0] == "pytest", cmd
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *words[1:]]


def _rank(cmd: str) -> int:
    return next(i for i, head in enumerate(ORDER) if cmd.startswith(head))


def test_every_command_is_run_or_said_to_be_not_runnable_here():
    commands = [c for doc in DOCS for c in _commands(doc)]
    assert len(commands) >= 8, commands
    assert all(c in commands for c in NOT_HERE), "a command named in NOT_HERE is in no document any more"
    for c in commands:
        assert _rank(c) >= 0


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the checkout holding the placeholders' stand-ins: the bundled target, drafters."""
    repo = tmp_path_factory.mktemp("user-repo")
    shutil.copytree(FIXTURES / "target", repo / "models" / "mytarget")
    for name in ("released", "step_4000", "step_5000", "step_6000", "ckpt_a", "ckpt_b", "ckpt_c"):
        shutil.copytree(FIXTURES / "drafter", repo / "ckpt" / name)
    (repo / "data" / "sets").mkdir(parents=True)
    return repo


def test_the_documents_installed_commands_run_as_written(repository: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}
    # short runs: 16 new tokens on the first 4 prompts of what a command selects, the drift budget on those 4
    env.update(DFLASH_EVAL_MAX_NEW_TOKENS="16", DFLASH_EVAL_NUM_PROMPTS="4", DFLASH_EVAL_DRIFT_BUDGET_MIN_PROMPTS="4",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    commands = sorted((c for doc in DOCS for c in _commands(doc) if c not in NOT_HERE), key=_rank)
    runs: dict[tuple[str, ...], str] = {}  # a command written twice, or under two placeholders for it, runs once
    for cmd in commands:
        runs.setdefault(tuple(_argv(cmd)), cmd)
    failed = []
    for argv, cmd in runs.items():
        p = subprocess.run(argv, cwd=repository, env=env, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            failed.append(f"{cmd}\n  -> exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
    assert not failed, "documented commands that do not run as written:\n" + "\n".join(failed)
    assert (repository / "golden" / "tau_floors.json").is_file()  # the first run recorded what the others gate on
