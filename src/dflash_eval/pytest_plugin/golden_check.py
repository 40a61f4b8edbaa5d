"""Golden records a run needs and does not have are one usage error (exit 4), not a failure per test.

Once collection has settled which tests run, the tests that need a golden record are matched against what exists
(:func:`dflash_eval.golden.needed.missing_records`: the floors file after its recorded settings were checked
against the run, one snapshot file per prompt). When anything is missing the run stops with one message naming the
missing files and the command that records them, in the form the run was started with
(:func:`dflash_eval.options.invocation.record_command`): ``dflash-eval record ...`` under ``dflash-eval run``, the same
pytest command with the recording options under plain pytest (a checkout's ``pytest tests_eval``, an installed
``pytest --pyargs dflash_eval.tests_eval``). Under pytest-xdist the controller checks the node ids the first worker
collected (``pytest_xdist_node_collection_finished``), before any test is scheduled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from dflash_eval.golden.needed import Missing, missing_message, missing_records
from dflash_eval.options.invocation import record_command
from dflash_eval.pytest_plugin.state import SESSION, is_controller

if TYPE_CHECKING:  # imports torch: kept out of the plugin's own import
    from dflash_eval.session.eval_session import EvalSession

__all__ = ["GoldenCheck"]


def _record_flags(config: pytest.Config, missing: Missing) -> list[str]:
    """The options that make this pytest command record what is missing (and the fingerprint)."""
    flags = ["--update-tau-floors"] if missing.floors else []
    if missing.snapshots:
        flags.append("--snapshot-update")
        if hasattr(config.option, "no_cleanup"):  # this syrupy can keep the snapshots of prompts not selected
            flags.append("--snapshot-no-cleanup")
    return flags + ["--update-fingerprints"]


class GoldenCheck:
    """The plugin's check of the golden records a run needs (see the module docstring), once per run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.checked = False

    def _check(self, nodeids: list[str]) -> None:
        config = self.config
        session: EvalSession | None = config.stash.get(SESSION, None)
        if self.checked or session is None or config.option.collectonly:
            return  # no suite in this run (its input check made the session), or nothing runs
        self.checked = True
        updates = bool(getattr(config.option, "update_snapshots", False) or
                       getattr(config.option, "update_new_snapshots_only", False))
        missing = missing_records(session, nodeids, updates_snapshots=updates)
        if missing:
            command = record_command(config.invocation_params.args, add=_record_flags(config, missing))
            raise pytest.UsageError("dflash-eval: " + missing_message(missing, session.settings.target_model.name,
                                                                      command))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if is_controller(self.config):
            self._check([it.nodeid for it in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        self._check(list(ids))
