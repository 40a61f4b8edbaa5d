"""torch's CPU threads are shared among xdist workers on every device: two workers each with one thread per core
would oversubscribe the CPU, on a GPU run too (its drift budget perturbs features on the CPU).

Run: ``pytest tests/test_threads.py -p no:cacheprovider``
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dflash_eval.suite import inputs as inputs_mod
from dflash_eval.suite.progress import Meter


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_default_threads_are_divided_among_the_workers(device: str, monkeypatch, restore_threads) -> None:
    monkeypatch.setattr(inputs_mod, "_DEFAULT_THREADS", 8)  # as on a machine with 8 physical cores
    for workers, want in [(1, 8), (2, 4), (3, 2), (16, 1)]:
        fake = SimpleNamespace(settings=SimpleNamespace(torch_device=torch.device(device), torch_threads=None),
                               worker_count=workers, meter=Meter())
        inputs_mod.Inputs._set_threads(fake)  # type: ignore[arg-type]
        assert torch.get_num_threads() == want and fake.meter.counts["torch_threads"] == want


def test_an_explicit_thread_count_wins(monkeypatch, restore_threads) -> None:
    monkeypatch.setattr(inputs_mod, "_DEFAULT_THREADS", 8)
    fake = SimpleNamespace(settings=SimpleNamespace(torch_device=torch.device("cuda"), torch_threads=3),
                           worker_count=2, meter=Meter())
    inputs_mod.Inputs._set_threads(fake)  # type: ignore[arg-type]
    assert torch.get_num_threads() == 3
