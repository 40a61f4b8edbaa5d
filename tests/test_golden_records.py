"""What a run needs from the golden folder and lacks (:mod:`dflash_eval.golden.needed`), the commands the messages
name in the form the run was started with (:mod:`dflash_eval.options.invocation`), and the per-command option
applicability (:mod:`dflash_eval.options.commands`). No model, no torch: the session is a stand-in holding settings,
floors and prompts (the same attributes :class:`dflash_eval.session.eval_session.EvalSession` answers with).

Run: ``pytest tests/test_golden_records.py -p no:cacheprovider -n 0``
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_eval.golden.needed import (
    gate_floors_message,
    missing_floors,
    missing_message,
    missing_records,
    snapshot_path,
)
from dflash_eval.metrics.floors import load_floors
from dflash_eval.options.commands import environ_for, refused
from dflash_eval.options.invocation import args_for, record_command, started_as, started_as_command, suite_options
from dflash_eval.options.settings import OPTIONS, EvalSettings

PROMPTS = [SimpleNamespace(id="p-0", category="code"), SimpleNamespace(id="p-1", category="code"),
           SimpleNamespace(id="q-0", category="math")]
SELECTED = ["test_tau.py::test_tau[p-0]", "test_tau.py::test_tau[p-1]", "test_tau.py::test_tau[q-0]",
            "test_tau.py::test_ddtree_tau[p-0-ddtree8]", "test_tau.py::test_mean_tau",
            "test_tau.py::test_category_mean_tau[math]",
            "test_reference_completions.py::test_reference_completion[p-0]",
            "test_reference_completions.py::test_reference_completion[q-0]", "test_checkpoint.py::test_config_loads"]


def session(tmp_path: Path, floors: dict | None = None, *, update: bool = False, **overrides) -> SimpleNamespace:
    path = tmp_path / "golden" / "tau_floors.json"
    if floors is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(floors))
    fl = load_floors(path, mean_override=overrides.get("mean"), prompt_override=overrides.get("prompt"))
    s = SimpleNamespace(floors_file=path, golden_dir=tmp_path / "golden", target_model=tmp_path / "models" / "mine",
                        ddtree_budget=(8,), update_tau_floors=update, snapshot_folder="mine",
                        records_profile=overrides.get("profile", ""))
    return SimpleNamespace(settings=s, floors=fl.select({p.id: p.category for p in PROMPTS}),
                           inputs=SimpleNamespace(prompts=PROMPTS))


def test_a_first_run_lacks_the_floors_file_and_every_snapshot(tmp_path):
    m = missing_records(session(tmp_path), SELECTED, updates_snapshots=False)
    assert m and not m.floors_exists and m.prompts == 3
    assert m.floors == {"DDTree-8": ["p-0", "p-1", "q-0"], "chain": ["p-0", "p-1", "q-0"]}
    assert m.snapshots == ["p-0", "q-0"]
    assert m.snapshot_dir == tmp_path / "golden" / "snapshots" / "mine" / "test_reference_completions"
    msg = missing_message(m, "mine", "dflash-eval record --target-model models/mine --drafter d")
    assert msg.splitlines()[0] == "nothing recorded to gate this run against (target 'mine', 3 prompts):"
    assert f"τ floors: {tmp_path}/golden/tau_floors.json does not exist" in msg
    assert f"no snapshot in {m.snapshot_dir} for 2 of 3 prompts (p-0, q-0)" in msg
    assert "\n  dflash-eval record --target-model models/mine --drafter d\n" in msg and "--tau-floor VALUE" in msg


def test_records_are_kept_per_dtype_and_backend(tmp_path, monkeypatch):
    """float32 / torch keeps the records at the golden folder's top; any other dtype or backend has its own floors
    file and snapshot folder, chosen by the run's resolved settings unless --floors-file is given."""
    fp32 = EvalSettings.from_mapping({}, origins={})
    assert fp32.records_profile == "" and fp32.snapshot_folder == "target"
    assert fp32.floors_file.name == "tau_floors.json"
    bf16 = EvalSettings.from_mapping({"dtype": "bf16"}, origins={"dtype": "cli"})
    assert bf16.records_profile == "bfloat16-torch" and bf16.snapshot_folder == "target.bfloat16-torch"
    assert bf16.floors_file.name == "tau_floors.bfloat16-torch.json"
    assert bf16.floors_file.parent == fp32.floors_file.parent
    given = EvalSettings.from_mapping({"dtype": "bf16", "floors_file": str(tmp_path / "mine.json")})
    assert given.floors_file == tmp_path / "mine.json"  # a floors file the user names is the one read
    m = missing_records(session(tmp_path, profile="bfloat16-fla"), SELECTED, updates_snapshots=False)
    assert "this run's are bfloat16-fla" in missing_message(m, "mine", "dflash-eval record")


def test_only_what_the_selected_tests_need(tmp_path):
    floors = {"chain": {"p-0": 2.0, "p-1": 2.0}, "ddtree": {"8": {"p-0": 2.5}}}
    s = session(tmp_path, floors)
    snap = snapshot_path(s.settings.golden_dir, "mine", "test_reference_completion[p-0]")
    snap.parent.mkdir(parents=True)
    snap.write_text("{}")
    m = missing_records(s, SELECTED[:2] + SELECTED[6:], updates_snapshots=False)  # p-0, p-1 and two completions
    assert not m.floors and m.snapshots == ["q-0"]
    m = missing_records(s, ["test_tau.py::test_category_mean_tau[math]"], updates_snapshots=False)
    assert m.floors == {"DDTree-8": ["q-0"], "chain": ["q-0"]} and m.floors_exists
    msg = missing_message(m, "mine", "CMD")
    assert f"{s.settings.floors_file} has no chain floor for 1 of 3 prompts (q-0)" in msg
    assert not missing_records(s, SELECTED[8:], updates_snapshots=False)  # a test needing neither
    assert not missing_records(s, ["test_tau.py::test_tau[setup-error]"], updates_snapshots=False)


def test_recording_runs_and_explicit_thresholds_need_nothing(tmp_path):
    assert not missing_records(session(tmp_path, update=True), SELECTED, updates_snapshots=True)
    assert not missing_records(session(tmp_path, mean=3.0), SELECTED[:6], updates_snapshots=False)
    assert not missing_records(session(tmp_path, prompt=1.5), SELECTED[:6], updates_snapshots=False)
    assert missing_records(session(tmp_path), SELECTED[:6], updates_snapshots=True)  # floors still missing


def test_gate_needs_every_prompt_and_budget(tmp_path):
    s = session(tmp_path, {"chain": {"p-0": 2.0, "p-1": 2.0, "q-0": 2.0}, "ddtree": {"8": {"p-0": 2.5}}})
    m = missing_floors(s)
    assert m.floors == {"DDTree-8": ["p-1", "q-0"]} and not m.snapshots
    msg = gate_floors_message(m, "dflash-eval record --drafter a")
    assert f"no τ floors to gate against: {s.settings.floors_file} has no DDTree-8 floor for 2 of 3 prompts" in msg
    assert "\n  dflash-eval record --drafter a\n" in msg
    assert "does not exist" in gate_floors_message(missing_floors(session(tmp_path / "none")), "X")
    assert not missing_floors(session(tmp_path / "none", mean=2.0))


def test_commands_in_the_form_the_run_was_started_with():
    args = ["--target-model", "models/my target", "--drafter=ckpt", "--baseline", "old.json", "-n", "2",
            "--snapshot-warn-unused", "--drift-budget-tol", "0.2", "-k", "tau"]
    assert started_as() is None
    plain = record_command(["--pyargs", "dflash_eval.tests_eval", "--target-model=m"],
                           add=["--update-tau-floors", "--snapshot-update"])
    assert shlex.split(plain)[-5:] == ["--pyargs", "dflash_eval.tests_eval", "--target-model=m",
                                       "--update-tau-floors", "--snapshot-update"]
    assert shlex.split(plain)[:-5] in (["pytest"], ["python", "-m", "pytest"])
    with started_as_command("run", args):
        assert started_as() == ("run", args)
        cmd = record_command(["ignored"])
    assert started_as() is None
    assert shlex.split(cmd) == ["dflash-eval", "record", "--target-model", "models/my target", "--drafter=ckpt", "-n",
                                "2", "-k", "tau"]  # --baseline and the drift option are not record's
    assert args_for(args, "gate") == ["--target-model", "models/my target", "--drafter=ckpt", "--baseline",
                                      "old.json", "-n", "2", "--snapshot-warn-unused", "-k", "tau"]
    assert suite_options(args, "gate") == ["--target-model", "models/my target", "--drafter=ckpt", "--baseline",
                                           "old.json"]


def test_options_a_command_does_not_honour_are_refused_and_their_env_not_read():
    assert refused(["--drafter", "a", "--tau-floor=3", "--cache-dir", "c"], "gate") == []
    lines = refused(["--update-tau-floors", "--drift-budget-tol=1", "--golden-dir", "g", "--", "--baseline"], "gate")
    assert lines == ["--update-tau-floors: not an option of `dflash-eval gate` (honoured by `dflash-eval run` / "
                     "pytest)", "--drift-budget-tol: not an option of `dflash-eval gate` (honoured by `dflash-eval "
                     "run` / pytest)", "--golden-dir: not an option of `dflash-eval gate` (honoured by `dflash-eval "
                     "run` / pytest, `dflash-eval record`)"]
    assert refused(["--baseline", "x"], "record", why={"baseline": "record never compares"}) == [
        "--baseline: not an option of `dflash-eval record` (record never compares)"]
    env = {"DFLASH_EVAL_UPDATE_TAU_FLOORS": "1", "DFLASH_EVAL_TAU_FLOOR": "2", "HOME": "/h"}
    assert environ_for(env, "gate") == {"DFLASH_EVAL_TAU_FLOOR": "2", "HOME": "/h"}
    assert environ_for(env, "run") == env


@pytest.mark.parametrize("command", ["gate", "record"])
def test_every_command_refuses_something_and_the_suite_nothing(command):
    assert any(not o.applies_to(command) for o in OPTIONS)
    assert all(o.applies_to("run") for o in OPTIONS)


def test_record_and_gate_refuse_what_they_do_not_honour(capsys):
    from dflash_eval.cli.main import main

    assert main(["record", "--target-model", "m", "--baseline", "old.json", "--update-tau-floors", "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert "--baseline: not an option of `dflash-eval record` (honoured by `dflash-eval run` / pytest, " in err
    assert "--update-tau-floors: not an option of `dflash-eval record` (it always writes the τ floors)" in err
    assert main(["gate", "--drafter", "d", "--update-fingerprints", "--drift-rel-tol=1", "--tau-floor", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dflash-eval gate: bad input: options it does not take:")
    assert "--update-fingerprints: not an option of `dflash-eval gate` (the gate only judges; `dflash-eval record` " \
           "writes floors, snapshots and the fingerprint)" in err
    assert "--drift-rel-tol: not an option of `dflash-eval gate`" in err and "--tau-floor" not in err


def test_record_narrows_the_selection_to_the_recording_tests():
    from dflash_eval.cli.record import RECORDING_KEYWORDS, with_recording_keywords

    assert with_recording_keywords(["--drafter", "d"]) == ["--drafter", "d", "-k", RECORDING_KEYWORDS]
    assert with_recording_keywords(["-k", "mean", "-n", "2"]) == ["-n", "2", "-k", f"(mean) and ({RECORDING_KEYWORDS})"]
    assert with_recording_keywords(["-kfoo"])[-1] == f"(foo) and ({RECORDING_KEYWORDS})"
