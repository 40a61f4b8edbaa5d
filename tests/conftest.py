"""Shared fixtures of the library's unit tests: a tiny random Qwen3.5 target and a matching random drafter.

Run: ``pytest tests`` (all unit tests) or ``pytest tests -m 'not slow'``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_eval.drafter import DFlashDrafter, DrafterConfig, save_drafter
from dflash_eval.head import TargetHead
from dflash_eval.target import Target, load_target
from dflash_eval.tiny import build_random_target, random_drafter_config

pytest_plugins = ["pytester"]  # tests/test_options.py runs the eval-suite plugin in a pytest of its own


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
    from dflash_eval.backends import fla_available

    cuda = torch.cuda.is_available()
    for item in items:
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason=f"not checked: {item.name} needs a CUDA device (none here)"))
        elif item.get_closest_marker("fla") and not (cuda and fla_available()):
            item.add_marker(pytest.mark.skip(
                reason=f"not checked: {item.name} needs fla's CUDA kernels (CUDA {cuda}, fla importable "
                       f"{fla_available()})"))
