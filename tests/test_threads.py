"""torch's CPU threads are shared among xdist workers on every device: two workers each with one thread per core
would oversubscribe the CPU, on a GPU run too (its drift budget perturbs features on the CPU). The count is set once
per process by the entry point (:func:`dflash_eval.common.threads.set_torch_threads`), never by a stage constructor.

Run: ``pytest tests/test_threads.py -p no:cacheprovider``
"""

from __future__ import annotations

import pytest
import torch

from dflash_eval.common import threads as threads_mod
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_default_threads_are_divided_among_the_workers(monkeypatch, restore_threads) -> None:
    """Whatever the device: the count takes only ``--torch-threads`` and the worker count."""
    monkeypatch.setattr(threads_mod, "_DEFAULT_THREADS", 8)  # as on a machine with 8 physical cores
    for workers, want in [(1, 8), (2, 4), (3, 2), (16, 1)]:
        assert threads_mod.set_torch_threads(None, workers) == want and torch.get_num_threads() == want


def test_an_explicit_thread_count_wins(monkeypatch, restore_threads) -> None:
    monkeypatch.setattr(threads_mod, "_DEFAULT_THREADS", 8)
    assert threads_mod.set_torch_threads(3, 2) == 3 and torch.get_num_threads() == 3


def test_a_session_leaves_the_thread_count_alone_and_reports_it(tiny_target_dir, tiny_drafter_dir, tmp_path,
                                                                  restore_threads) -> None:
    torch.set_num_threads(1)
    s = EvalSettings.from_mapping({"target_model": tiny_target_dir, "drafter": tiny_drafter_dir,
                                   "prompts": "fixtures/prompts.jsonl", "cache_dir": tmp_path, "device": "cpu",
                                   "torch_threads": 2})
    session = EvalSession(s, worker=("master", 0, 1), progress=None)
    assert torch.get_num_threads() == 1 and session.inputs.meter.counts["torch_threads"] == 1
