"""The ``dflash-eval`` command line: ``gate`` over several checkpoints in one process, exit codes, --help.

Run: ``pytest tests/test_cli.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from patch_uses import patch_uses

import dflash_eval.target.loader as target_mod
from dflash_eval.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_TARGET = ROOT / "fixtures" / "target"
FIXTURE_DRAFTER = ROOT / "fixtures" / "drafter"
FLOORS = ROOT / "golden" / "tau_floors.json"  # the bundled floors file (recorded with --max-new-tokens 128)


@pytest.fixture
def common(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "category": "code", "text": t}) + "\n" for i, t in
                               enumerate(["def add(a, b):\n    return", "for i in range(10):\n    print("])))
    return ["--target-model", str(FIXTURE_TARGET), "--prompts", str(prompts), "--max-new-tokens", "12",
            "--cache-dir", str(tmp_path / "cache"), "--device", "cpu", "--torch-threads", "1", "--quiet",
            "--report-dir", str(tmp_path / "reports")]


def test_gate_two_checkpoints_then_failing_floor_then_bad_path(common, tmp_path, capsys, monkeypatch):
    copy = tmp_path / "step_2"
    shutil.copytree(FIXTURE_DRAFTER, copy)
    out_json = tmp_path / "gate.json"
    # --tau-floor is the floor of the MEAN only: the bundled floors file (recorded with 128 new tokens, this run
    # has 12) is ignored with a warning, and prompts without a floor are not gated one by one.
    with pytest.warns(UserWarning, match=r"(?s)floors file .* ignored: .*max_new_tokens .*recorded 128, this run 12"):
        rc = main(["gate", "--drafter", str(FIXTURE_DRAFTER), "--drafter", str(copy), "--tau-floor", "1.0",
                   "--floors-file", str(FLOORS), "--json", str(out_json), *common])
    out = capsys.readouterr().out
    assert rc == 0, out
    for col in ("checkpoint", "mean τ", "DDTree-8 τ", "worst prompt", "verdict"):
        assert col in out
    assert out.count("PASS") == 2 and "2/2 checkpoint(s) passed" in out
    rows = json.loads(out_json.read_text())["checkpoints"]
    assert [r["drafter"] for r in rows] == [str(FIXTURE_DRAFTER), str(copy)]
    assert rows[0]["mean_tau"] == rows[1]["mean_tau"] and rows[0]["worst_prompt"] in ("q0", "q1")
    assert rows[0]["mean_floor"] == 1.0 and rows[0]["reasons"] == []
    assert {pid: r["floor"] for pid, r in rows[0]["prompts"].items()} == {"q0": None, "q1": None}
    assert {pid: r["passed"] for pid, r in rows[0]["prompts"].items()} == {"q0": None, "q1": None}  # not gated
    # --report-dir: the combined report of every checkpoint, strict JSON and markdown.
    report = json.loads((tmp_path / "reports" / "gate.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"gate.json holds {c}: not strict JSON"))
    assert report["passed"] is True
    assert [r["drafter"] for r in report["checkpoints"]] == [str(FIXTURE_DRAFTER), str(copy)]
    assert report["budgets"] == [8] and "drafter" not in report["settings"] and report["checkpoints"][0]["prompts"]
    md = (tmp_path / "reports" / "gate.md").read_text()
    assert "2/2 checkpoint(s) passed" in md and "| drafter |" in md and "| step_2 |" in md
    assert "### Lowest chain τ (2 of 2 prompts, worst first)" in md

    # Warm (same cache), the witness off (it re-extracts a prompt through the live target by design): the target
    # is never built; a floor nobody reaches fails the gate with exit 1.
    patch_uses(monkeypatch, target_mod, "load_target", lambda *a, **k: pytest.fail("warm gate loaded the target"))
    with pytest.warns(UserWarning, match="ignored"):
        rc = main(["gate", "--drafter", str(FIXTURE_DRAFTER), "--drafter", str(copy), "--tau-floor", "100",
                   "--floors-file", str(FLOORS), "--json", str(out_json), "--witness-prompts", "0", *common])
    out = capsys.readouterr().out
    assert rc == 1 and out.count("FAIL") == 2 and "0/2 checkpoint(s) passed" in out
    assert "mean chain τ" in out and "below floor" not in out  # only the mean is gated
    rows = json.loads(out_json.read_text())["checkpoints"]
    for r in rows:
        assert r["passed"] is False and r["mean_floor"] == 100.0
        assert r["reasons"][0] == f"mean chain τ {r['mean_tau']:.3f} < 100.000"  # rounded as the tables round
        assert all(x.startswith("mean ") and x.endswith("< 100.000") for x in r["reasons"])  # chain and DDTree-8
        assert not any("below floor" in x or "no floor" in x for x in r["reasons"])
    assert rc == 1 and out.count("FAIL") == 2 and "mean chain τ" in out and "100.000" in out  # the cell may fold
    assert "0/2 checkpoint(s) passed" in out
    report = json.loads((tmp_path / "reports" / "gate.json").read_text())
    assert report["passed"] is False and all("< 100.000" in r["reasons"][0] for r in report["checkpoints"])
    assert "FAIL: mean chain τ" in (tmp_path / "reports" / "gate.md").read_text()

    # A path that does not exist: exit 2 before evaluating anything, naming the path.
    missing = tmp_path / "nope" / "step_3"
    rc = main(["gate", "--drafter", str(copy), "--drafter", str(missing), *common])
    err = capsys.readouterr().err
    assert rc == 2 and f"--drafter {missing}: not found" in err


def test_bad_option_value_is_exit_2(common, capsys):
    rc = main(["gate", "--drafter", str(FIXTURE_DRAFTER), *common, "--max-new-tokens", "0"])  # last one wins
    assert rc == 2 and "--max-new-tokens must be >= 1" in capsys.readouterr().err


def test_help_and_module_entry_point():
    assert main(["--help"]) == 0
    assert main(["gate", "--help"]) == 0
    p = subprocess.run([sys.executable, "-m", "dflash_eval", "gate", "--help"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0 and "--drafter" in p.stdout and "--tau-floor" in p.stdout
    assert "--tau-floor-prompt" in p.stdout and "--allow-settings-mismatch" in p.stdout and "--baseline" in p.stdout


@pytest.mark.slow
def test_run_passes_pytest_arguments_through_and_outside_a_checkout_needs_a_target(tmp_path):
    """`dflash-eval run`: pytest's help with the dflash-eval group; from a folder that is not a checkout, a missing
    --target-model / --drafter is one usage error (exit 4) before anything is collected."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}
    p = subprocess.run([sys.executable, "-m", "dflash_eval", "run", "--help"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 0 and "dflash-eval" in p.stdout
    assert "--target-model" in p.stdout and "-k EXPRESSION" in p.stdout
    p = subprocess.run([sys.executable, "-m", "dflash_eval", "run", "-p", "no:cacheprovider", "-q"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "--target-model and --drafter required" in p.stderr and "collected" not in p.stdout
    assert not (tmp_path / "reports").exists()


def test_run_joins_suite_option_values():
    """pytest picks its rootdir before plugin options exist: `--target-model DIR` must reach it as one argument."""
    from dflash_eval.cli.main import joined_option_values

    assert joined_option_values(["--target-model", "/m", "-k", "tau", "--cache-only", "--ddtree-budget", "4",
                                 "--prompts=p.jsonl", "tests"]) == [
        "--target-model=/m", "-k", "tau", "--cache-only", "--ddtree-budget=4", "--prompts=p.jsonl", "tests"]


@pytest.mark.parametrize("argv, command, wanted, rc", [
    (["run", "--target-modle", "models/x"], "run", "--target-model", 4),
    (["record", "--drafer", "d"], "record", "--drafter", 4),
    (["gate", "--promtps", "humaneval:4"], "gate", "--prompts", 2),
    (["gate", "--drafter", "d", "--watch-timout", "5"], "gate", "--watch-timeout", 2),  # a gate option of its own
])
def test_a_misspelled_option_gets_the_command_usage_and_a_suggestion(argv, command, wanted, rc, capsys):
    assert main(argv) == rc
    err = capsys.readouterr().err
    assert f"dflash-eval {command}: {argv[1] if command != 'gate' or argv[1] != '--drafter' else argv[3]}: unknown " \
           f"option of `dflash-eval {command}`; did you mean {wanted}?" in err
    assert f"usage: dflash-eval {command} " in err and "usage: dflash-eval [-h]" not in err and "pytest" not in \
        err.split("usage:", 1)[0]


@pytest.mark.parametrize("args, first", [
    (["-n", "2"], "-n"), (["-n2"], "-n"), (["-nauto"], "-n"), (["--numprocesses=2"], "--numprocesses"),
    (["--dist", "load"], "--dist"), (["-k", "tau"], None), (["--", "-n", "2"], None)])
def test_xdist_options_without_xdist_name_the_extra(args, first):
    from dflash_eval.options.commands import xdist_missing

    line = xdist_missing(args, installed=False)
    if first is None:
        assert line is None
    else:
        assert line is not None and line.startswith(f"{first} runs the tests in parallel through pytest-xdist")
        assert "xdist extra" in line and "[xdist]" in line and "\n" not in line
        assert xdist_missing(args, installed=True) is None
    assert tomllib_extras()["xdist"] == ["pytest-xdist>=3.5"]  # the extra the line names exists


def tomllib_extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]


def test_plain_pytest_says_what_an_unknown_argument_needs(pytester, monkeypatch):
    """Under plain pytest too, not only under the dflash-eval commands: a misspelled suite option gets "did you
    mean", and pytest-xdist's -n without pytest-xdist names the extra to install; one usage error (exit 4) before
    anything is collected."""
    from dflash_eval.options import commands

    monkeypatch.setattr(commands, "xdist_installed", lambda: False)  # as where it is not installed
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    args = ["-p", "dflash_eval.pytest_plugin", "-p", "no:cacheprovider", "-p", "no:xdist"]  # xdist's options gone
    res = pytester.runpytest_inprocess(*args, "--num-promtps", "4")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: dflash-eval: --num-promtps: unknown option of the dflash-eval suite; did you "
                              "mean --num-prompts?"])
    res = pytester.runpytest_inprocess(*args, "-n", "2")
    assert res.ret == pytest.ExitCode.USAGE_ERROR and "collected" not in res.stdout.str()
    errors = [line for line in res.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and errors[0].startswith("ERROR: dflash-eval: -n runs the tests in parallel"), errors
    assert pytester.runpytest_inprocess(*args).ret == 0  # nothing unknown: nothing said


def test_run_with_n_without_xdist_names_the_extra(monkeypatch, capsys):
    from dflash_eval.options import commands

    monkeypatch.setattr(commands, "xdist_installed", lambda: False)
    assert main(["run", "-p", "no:xdist", "-p", "no:cacheprovider", "-n", "2"]) == pytest.ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "-n runs the tests in parallel through pytest-xdist" in lines[0], err
    assert "[xdist]" in lines[0] and "unrecognized arguments" not in err


def test_an_unknown_gate_option_answers_with_the_gate_usage(capsys):
    assert main(["gate", "--drafter", "d", "--no-such-thing-at-all"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dflash-eval gate ") and "unrecognized arguments: --no-such-thing-at-all" in err


def test_no_pytest_option_is_taken_for_a_misspelled_suite_option():
    """Options of pytest and its plugins pass through `run` and `record`: none of them may read as a typo of a suite
    option (the suggestions only flag flags close to a suite option that are no option at all)."""
    from dflash_eval.options.commands import misspelled

    out = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], capture_output=True,
                         text=True, timeout=300).stdout
    flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", out)))  # every flag pytest's help shows
    assert "--maxfail" in flags and "--snapshot-update" in flags and "--trace-config" in flags
    for command in ("run", "record"):
        assert misspelled(flags, command) == [], command


def test_library_output_is_left_out_alike_in_run_and_gate(tmp_path):
    """transformers' fallback warnings and weight-loading bar, which pytest's capture keeps out of `dflash-eval run`,
    are left out of `dflash-eval gate` too; a Python warning is one line, not its source line quoted."""
    from dflash_eval.common.third_party import QUIET_ENVIRONMENT, one_line_warnings, quiet_libraries

    env = {"TRANSFORMERS_VERBOSITY": "info"}
    quiet_libraries(env)
    assert env == {**QUIET_ENVIRONMENT, "TRANSFORMERS_VERBOSITY": "info"}  # the user's own setting is kept
    import io
    import warnings

    buf = io.StringIO()
    with one_line_warnings("dflash-eval gate"), warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: buf.write(warnings.formatwarning(m, c, f, n))
        warnings.warn("floors judge nothing", UserWarning, stacklevel=1)
    assert buf.getvalue() == "dflash-eval gate: warning: floors judge nothing (UserWarning)\n"
    with pytest.warns(UserWarning, match="recorded as ever"), one_line_warnings("dflash-eval gate"):
        warnings.warn("recorded as ever", UserWarning, stacklevel=1)
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    clean = {k: v for k, v in os.environ.items() if k not in QUIET_ENVIRONMENT and not k.startswith("DFLASH_EVAL_")}
    p = subprocess.run([sys.executable, "-m", "dflash_eval", "gate", "--drafter", str(fixtures / "drafter"),
                        "--target-model", str(fixtures / "target"), "--prompts", str(fixtures / "prompts.jsonl"),
                        "--num-prompts", "1", "--max-new-tokens", "8", "--tau-floor", "1.0", "--quiet",
                        "--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path / "reports")],
                       capture_output=True, text=True, cwd=tmp_path, env=clean, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[transformers]" not in p.stderr and "causal_conv1d" not in p.stderr and "Loading weights" not in p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("dflash-eval gate: warning: ") or line.startswith("  ") for line in lines), \
        p.stderr  # only the gate's own warnings (a floors file recorded for other settings; floors at 1)
