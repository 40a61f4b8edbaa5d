"""What a run records about where it ran and on what: option paths normalised (``..`` resolved as the operating
system would, the last names kept), the host name, and the git commit and dirty flag of the working directory when
it is in a repository (none outside one, none without git); eval.json's schema accepts them.

Run: ``pytest tests/test_paths_and_provenance.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from importlib import resources
from pathlib import Path

import pytest
from result_rows import fragment

from dflash_eval import report
from dflash_eval.common.paths import normal_path
from dflash_eval.common.workdir import git_state, run_location
from dflash_eval.options.settings import resolve, resolve_prompt_spec
from dflash_eval.report.strict_json import dumps_strict

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_normal_path_resolves_dotdot_and_keeps_the_names_after_it(tmp_path):
    (tmp_path / "firstgate").mkdir()
    (tmp_path / "myrepo" / "models").mkdir(parents=True)
    (tmp_path / "elsewhere" / "real-model").mkdir(parents=True)
    (tmp_path / "myrepo" / "models" / "x").symlink_to(tmp_path / "elsewhere" / "real-model")
    assert normal_path(tmp_path / "firstgate" / ".." / "myrepo" / "models" / "x") == tmp_path / "myrepo/models/x"
    assert normal_path(f"{tmp_path}/myrepo/./models/x") == tmp_path / "myrepo/models/x"  # the link keeps its name
    # '..' after a symbolic link leaves the link's target, as open() does: not a lexical cut
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere" / "real-model")
    assert normal_path(tmp_path / "link" / ".." / "real-model") == tmp_path / "elsewhere" / "real-model"
    assert normal_path("../rel/x") == Path("../rel/x")  # relative: nothing to resolve it against
    assert normal_path(tmp_path / "missing" / ".." / "gone.pt") == tmp_path / "gone.pt"


def test_option_paths_and_prompt_files_are_normalised(tmp_path):
    root, cwd = tmp_path / "firstgate", tmp_path / "firstgate"
    root.mkdir()
    cli = {"target_model": "../myrepo/models/x", "drafter": "../myrepo/ckpt/step_a.pt",
           "prompts": "humaneval:2,../myrepo/p.jsonl,gsm8k=../myrepo/data/g:question:5",
           "report_dir": "../myrepo/./reports"}
    s = resolve(lambda name: cli.get(name), environ={}, invocation_dir=cwd, root=root, check=False)
    assert s.target_model == tmp_path / "myrepo" / "models" / "x"
    assert s.drafter == tmp_path / "myrepo" / "ckpt" / "step_a.pt" and s.report_dir == tmp_path / "myrepo/reports"
    assert s.prompts == f"humaneval:2,{tmp_path / 'myrepo/p.jsonl'},gsm8k={tmp_path / 'myrepo/data/g'}:question:5"
    assert ".." not in json.dumps(s.to_dict(), default=str)
    assert resolve_prompt_spec(f"{tmp_path}/a/../b.jsonl", None) == str(tmp_path / "b.jsonl")


def _git(folder: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True, env=env,
                          timeout=60).stdout.strip()


@needs_git
def test_git_commit_and_dirty_flag_of_the_working_directory(tmp_path):
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    _git(repo, "init", "-q")
    assert git_state(repo) is None  # a repository without a commit: nothing to name
    (repo / "a.txt").write_text("1\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")
    assert git_state(repo / "sub") == {"commit": head, "dirty": False, "root": str(repo.resolve())}
    (repo / "untracked.txt").write_text("x\n")  # reports/ and caches are untracked: not dirty
    assert git_state(repo)["dirty"] is False
    (repo / "a.txt").write_text("2\n")
    assert git_state(repo) == {"commit": head, "dirty": True, "root": str(repo.resolve())}
    loc = run_location(repo)
    assert loc["host"] == socket.gethostname() and loc["git"]["commit"] == head


def test_no_git_block_outside_a_repository_or_without_git(tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above tmp_path counts
    assert git_state(plain) is None and run_location(plain) == {"host": socket.gethostname()}
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # git not installed
    assert git_state(Path(__file__).parent) is None and "git" not in run_location(Path(__file__).parent)


@needs_git
def test_eval_json_schema_accepts_host_and_git_and_rejects_a_bad_commit(tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    schema = json.loads(resources.files("dflash_eval.report").joinpath("eval.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "empty")
    frag = fragment(target={"path": "/t", "identity": "i"},
                    provenance={"backend": "torch", "dtype": "float32", "device": "cpu", "versions": {"torch": "2"},
                                **run_location(tmp_path)})
    data = json.loads(dumps_strict(report.merge([frag]).to_dict()))
    assert data["provenance"]["host"] and len(data["provenance"]["git"]["commit"]) == 40
    validator.validate(data)
    data["provenance"]["git"]["commit"] = "not-a-sha"
    with pytest.raises(jsonschema.ValidationError, match="not-a-sha"):
        validator.validate(data)
