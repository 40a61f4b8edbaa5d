"""``dflash-eval record``: measure a target / drafter / prompt selection once and write what later runs gate against.

A first run on a new model has nothing to gate against; this is the one step that records it::

    dflash-eval record --target-model models/mytarget --drafter ckpt/released --prompts humaneval:40
    dflash-eval run    --target-model models/mytarget --drafter ckpt/released --prompts humaneval:40   # gates

It runs the suite's recording tests in this process (τ of every prompt, chain and DDTree; the reference
completions, with the target's own teacher-forced check; the feature fingerprint) with ``--update-tau-floors
--update-fingerprints --snapshot-update`` (and syrupy's ``--snapshot-no-cleanup`` where it has it: snapshots of
prompts not selected stay), then prints what it wrote and the exact commands that gate against it. The τ floors
are the measured τ minus ``--tau-margin`` (default 0.25), in ``--floors-file`` (default ``golden/tau_floors.json``);
the snapshots go to ``<--golden-dir>/snapshots/<target folder name>/``, the fingerprint to
``<--golden-dir>/fingerprints/<device kind>-<backend>-<dtype>.json``.

Options: the suite options ``record`` honours (``dflash-eval record --help``; the option table of
``docs/reference.md`` says which command honours which), and pytest's own (``-n 2``, ``-x``, ``--junitxml``),
which pass through. An option ``record`` does not honour (thresholds, ``--baseline``, the drift tolerances,
``--update-tau-floors`` / ``--update-fingerprints``, which it always does) is refused before anything runs.

Exit status: 0 recorded; 1 a recording test failed or nothing could be recorded (the cause is printed); 2 an option
``record`` does not honour; 4 bad input (a path that does not exist, an invalid value: the suite's usage error).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.cli.suite_run import run_suite
from dflash_eval.golden.needed import FLOOR_TESTS, SNAPSHOT_MODULE, SNAPSHOT_TEST
from dflash_eval.metrics.floors import load_floors
from dflash_eval.options.commands import add_command_options, refused
from dflash_eval.options.invocation import RECORD_FLAGS, args_for, shell_join, suite_options
from dflash_eval.pytest_plugin.state import RESULT, get_settings, settings_from_config

__all__ = ["record_command", "build_record_parser", "with_recording_keywords", "RecordPlugin", "RECORDING_TESTS",
           "RECORDING_KEYWORDS", "EXIT_REFUSED"]

EXIT_REFUSED = 2
#: The suite's tests a recording run keeps: {test module: test functions}.
RECORDING_TESTS = {
    "test_tau.py": FLOOR_TESTS,
    f"{SNAPSHOT_MODULE}.py": (SNAPSHOT_TEST, "test_teacher_forced_agreement"),
    "test_hidden_state_drift.py": ("test_fingerprint_regression",),
}
#: The same selection as a -k expression (pytest-xdist workers collect without this process's plugin objects): the
#: suite's test ids never contain "tau" but in the τ tests, and the completion module holds only recording tests.
RECORDING_KEYWORDS = "tau or test_reference_completions or test_fingerprint_regression"
_ALWAYS = {"update_tau_floors": "it always writes the τ floors", "update_fingerprints": "it always writes the "
           "feature fingerprint"}


def build_record_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dflash-eval record", allow_abbrev=False,
        description="Measure τ, the reference completions and the feature fingerprint of one target / drafter / "
                    "prompt selection and write them as the golden records later runs gate against (τ floors = "
                    "measured τ - --tau-margin), then print what was written and the command that gates against it.",
        epilog="pytest's own options (-n 2, -x, --junitxml FILE, -q) pass through. Exit 0: recorded; 1: a recording "
               "test failed or nothing could be recorded; 2: an option record does not honour; 4: bad input.")
    add_command_options(ap, "record")
    return ap


class RecordPlugin:
    """Keeps the recording tests of the suite (deselects the rest) and remembers what the run wrote."""

    def __init__(self) -> None:
        self.config: pytest.Config | None = None
        self.snapshots: list[str] = []
        self.started = time.time()
        self.floors_before: dict[str, Any] = {}  # the floors file as it was (to say what the recording replaced)

    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config
        if hasattr(config.option, "no_cleanup"):  # syrupy's --snapshot-no-cleanup: keep other prompts' snapshots
            config.option.no_cleanup = True

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:

        try:  # the floors file's path needs no validation (which imports torch, ahead of the xdist workers' start)
            self.floors_before = load_floors(settings_from_config(session.config, check=False).floors_file).raw
        except Exception:  # noqa: BLE001 - bad options or a malformed file: the run's usage error says so
            self.floors_before = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep: list[pytest.Item] = []
        drop: list[pytest.Item] = []
        for it in items:
            module = Path(str(getattr(it, "path", ""))).name
            (keep if getattr(it, "originalname", it.name) in RECORDING_TESTS.get(module, ()) else drop).append(it)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed and f"::{SNAPSHOT_TEST}[" in report.nodeid:
            self.snapshots.append(report.nodeid)


def _written(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since - 1
    except OSError:
        return False


def _shown(p: Path) -> str:
    """``p`` relative to the current folder when it is inside it, else absolute."""
    try:
        return str(Path(p).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def summary(plugin: RecordPlugin, argv: list[str]) -> tuple[list[str], bool]:
    """The lines that say what was recorded and how to gate against it; and whether the floors were written."""

    config = plugin.config
    if config is None:
        return [], False
    try:
        s = get_settings(config)
    except Exception:  # noqa: BLE001 - the run's usage error was printed by pytest
        return [], False
    result = config.stash.get(RESULT, None)
    lines: list[str] = []
    floors_written = _written(Path(s.floors_file), plugin.started) and result is not None and bool(result.prompts)
    if floors_written:
        doc = json.loads(Path(s.floors_file).read_text(encoding="utf-8"))
        budgets = ", ".join(f"DDTree-{b}" for b in doc.get("ddtree", {}))
        assert result is not None  # floors_written
        mean = result.tau.mean_tau if result.tau is not None else None
        lines.append(f"  τ floors     {_shown(s.floors_file)}: {len(result.prompts)} prompts, chain"
                     f"{' and ' + budgets if budgets else ''}, measured τ - {doc.get('margin')}"
                     f" (mean τ {float('nan') if mean is None else mean:.3f})")
        before = plugin.floors_before
        if before.get("context") and before.get("context") != doc.get("context"):
            lines.append("               (replaced the floors recorded there with other τ-relevant settings)")
        if doc.get("chain") and all(v <= 1.0 for v in doc["chain"].values()):
            lines.append("  WARNING: every chain floor is 1.0 (τ - margin <= 1): they accept a drafter that proposes "
                         "nothing; check the drafter before gating on them")
    if plugin.snapshots:
        folder = Path(s.golden_dir) / "snapshots" / s.snapshot_folder / "test_reference_completions"
        lines.append(f"  snapshots    {_shown(folder)}/: {len(plugin.snapshots)} reference completions")
    fp = result.fingerprint if result is not None else None
    if fp is not None:
        from dflash_eval.golden.writer import fingerprint_path  # imports torch: kept out of --help

        path = fingerprint_path(s.golden_dir, fp.device_kind, fp.backend, fp.dtype)
        if _written(path, plugin.started):
            lines.append(f"  fingerprint  {_shown(path)}")
    if not lines:
        return [], False
    gate_args = args_for(argv, "run", drop=("--snapshot-update", "--snapshot-no-cleanup"))
    out = ["dflash-eval record: wrote", *lines, "gate against them (the same options) with:",
           "  " + shell_join(["dflash-eval", "run", *gate_args])]
    gate_options = suite_options(argv, "gate")  # the gate's own --drafter among them, when given here
    if any(a.split("=", 1)[0] == "--drafter" for a in gate_options):
        out += ["or compare checkpoints against the floors with:",
                "  " + shell_join(["dflash-eval", "gate", *gate_options, "--drafter", "CKPT2"])]
    return out, floors_written


def with_recording_keywords(argv: list[str]) -> list[str]:
    """``argv`` with its ``-k`` expression (if any) narrowed to the recording tests (:data:`RECORDING_KEYWORDS`)."""
    out, user = [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-k" and i + 1 < len(argv):
            user, i = argv[i + 1], i + 2
            continue
        if a.startswith("-k") and len(a) > 2:
            user, i = a[2:].removeprefix("="), i + 1
            continue
        out.append(a)
        i += 1
    return [*out, "-k", RECORDING_KEYWORDS if user is None else f"({user}) and ({RECORDING_KEYWORDS})"]


def record_command(argv: list[str]) -> int:
    """``dflash-eval record ARGS``: see the module docstring; returns the exit status."""
    if any(a in ("-h", "--help") for a in argv[:argv.index("--") if "--" in argv else len(argv)]):
        build_record_parser().print_help()
        return 0
    problems = refused(argv, "record", why=_ALWAYS)
    if problems:
        print("dflash-eval record: " + "\n  ".join(["options it does not take:", *problems]) +
              "\n(record writes floors, snapshots and the fingerprint; gate with `dflash-eval run` or `dflash-eval "
              "gate`, which take the thresholds, --baseline and the drift options)", file=sys.stderr)
        return EXIT_REFUSED
    plugin = RecordPlugin()
    rc = run_suite([*with_recording_keywords(argv), *RECORD_FLAGS], command="record", plugins=[plugin])
    if rc == int(pytest.ExitCode.USAGE_ERROR):
        return rc
    lines, floors_written = summary(plugin, argv)
    for line in lines:
        print(line)
    if rc == 0 and not floors_written:
        print("dflash-eval record: no τ floors were written (no prompt was measured: see the skipped tests above)",
              file=sys.stderr)
        return 1
    return rc

