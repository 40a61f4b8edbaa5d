"""Shared fixtures of the library's unit tests: a tiny random Qwen3.5 target and a matching random drafter.

Run: ``pytest tests`` (all unit tests) or ``pytest tests -m 'not slow'``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from dflash_eval.drafter import DFlashDrafter, DrafterConfig, save_drafter
from dflash_eval.measurements.registry import register, registered_here, unregister
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.run_result import RunResult
from dflash_eval.target.head import TargetHead
from dflash_eval.target.loader import Target, load_target
from dflash_eval.testing.tiny import build_random_target, random_drafter_config

pytest_plugins = ["pytester"]  # tests/test_options.py runs the eval-suite plugin in a pytest of its own

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def measurement_registry_restored() -> Iterator[None]:
    """The measurement registry as it was before each test: a measurement a test (or the conftest of an in-process
    suite run) registered does not reach the runs of later tests in the same process."""
    before = registered_here()
    yield
    for name in set(registered_here()) - set(before):
        unregister(name)
    for m in before.values():
        register(m, replace=True)


@pytest.fixture
def suite_checkout(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                   target_modules_imported: None) -> Callable[..., Path]:
    """``suite_checkout(addopts="")``: the pytester directory made a checkout of the suite (a copy of tests_eval/, a
    conftest loading the plugin, an ini with ``addopts`` after the common ones), with no ``DFLASH_EVAL_*`` or
    ``PYTEST_XDIST_*`` variable of the calling environment; returns the directory. The target's modules are imported
    first (``target_modules_imported``): an in-process run that imported them itself would have them removed again
    by pytester's ``sys.modules`` snapshot, and the next in-process run could not load the target."""

    def make(addopts: str = "") -> Path:
        shutil.copytree(ROOT / "tests_eval", pytester.path / "tests_eval")
        pytester.makeconftest('pytest_plugins = ["dflash_eval.pytest_plugin"]')
        pytester.makeini(f"[pytest]\naddopts = -p no:cacheprovider --import-mode=importlib {addopts}".rstrip() + "\n")
        for k in [k for k in os.environ if k.startswith(("DFLASH_EVAL_", "PYTEST_XDIST_"))]:
            monkeypatch.delenv(k)  # the run is a session of its own, not a worker of this one's xdist
        return pytester.path

    return make


@pytest.fixture
def bundled_suite(pytester: pytest.Pytester, suite_checkout: Callable[..., Path],
                  tmp_path: Path) -> Callable[..., pytest.RunResult]:
    """``bundled_suite(*args, report=NAME, cache=DIR)``: the suite, in-process in a fresh checkout, on the first 2
    bundled prompts with the bundled target and drafter, the cache in ``DIR`` and the reports in ``tmp_path / NAME``,
    with ``args`` after those; pytester's RunResult. The drift budget is measured on those 2 prompts
    (``--drift-budget-min-prompts 2``; a test passes its own after to measure it on more): extending it to the default
    32 would make every such run a full cold run of the bundled set (tests/test_drift_budget_prompts.py checks the
    extension). Each run's eval.json is checked to read back as a :class:`~dflash_eval.session.run_result.RunResult`
    that writes the same data."""
    suite_checkout()
    fixtures = ROOT / "fixtures"

    def go(*args: str, report: str, cache: Path) -> pytest.RunResult:
        res = pytester.runpytest_inprocess(
            "tests_eval", "-q", "--target-model", str(fixtures / "target"), "--drafter", str(fixtures / "drafter"),
            "--prompts", str(fixtures / "prompts.jsonl"), "--num-prompts", "2", "--cache-dir", str(cache),
            "--drift-budget-min-prompts", "2", "--report-dir", str(tmp_path / report), *args)
        written = tmp_path / report / "eval.json"
        if written.is_file():  # whatever the run's options, its eval.json reads back as one typed result, key for key
            data = json.loads(written.read_text())
            assert json.loads(dumps_strict(RunResult.read(written).to_dict())) == data
        return res

    return go


@pytest.fixture(scope="session")
def target_modules_imported() -> None:
    """Import what loading the bundled target imports (transformers' modeling module, torch's operator libraries)
    before in-process pytester runs of the suite: pytester drops the modules a run imported, and torch refuses to
    register its operator libraries twice when a later run imports them again."""
    load_target(ROOT / "fixtures" / "target", device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_target(tmp_path_factory.mktemp("tiny_target"), seed=0)


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir: Path) -> Target:
    return load_target(tiny_target_dir, device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def tiny_head(tiny_target: Target) -> TargetHead:
    return TargetHead.from_model(tiny_target.model)


@pytest.fixture(scope="session")
def tiny_drafter_config(tiny_target_dir: Path) -> DrafterConfig:
    return random_drafter_config(tiny_target_dir)


@pytest.fixture(scope="session")
def tiny_drafter(tiny_drafter_config: DrafterConfig) -> DFlashDrafter:
    torch.manual_seed(1)
    return DFlashDrafter(tiny_drafter_config).eval()


@pytest.fixture(scope="session")
def tiny_drafter_dir(tiny_drafter: DFlashDrafter, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny_drafter")
    save_drafter(tiny_drafter, out)
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` / ``fla`` tests where they cannot run, with a reason naming what was not checked."""
    from dflash_eval.target.backends import fla_available

    cuda = torch.cuda.is_available()
    for item in items:
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason=f"not checked: {item.name} needs a CUDA device (none here)"))
        elif item.get_closest_marker("fla") and not (cuda and fla_available()):
            item.add_marker(pytest.mark.skip(
                reason=f"not checked: {item.name} needs fla's CUDA kernels (CUDA {cuda}, fla importable "
                       f"{fla_available()})"))
