"""The in-process API (dflash_eval.Evaluator) on the bundled target and drafter: a live module in training mode gives
the τ of the same weights saved and evaluated from disk by another evaluator on a cold cache, to the last digit;
the calls after the first run no target forward (counted on the target model itself); a state dict with its
config is the same drafter; the module's mode is restored whatever the evaluation raised; bad input is one error
naming what to pass."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import dflash_eval
from dflash_eval.drafter import DFlashDrafter, build_drafter, read_checkpoint, save_drafter
from dflash_eval.errors import CheckpointError, ConfigError, DrafterRefused

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"target_model": str(ROOT / "fixtures" / "target"), "prompts": str(ROOT / "fixtures" / "prompts.jsonl"),
            "num_prompts": 3, "max_new_tokens": 24, "tau_floor": 1.0}

pytestmark = pytest.mark.slow  # cold caches: the target generates and extracts features


@contextmanager
def target_forwards() -> Iterator[list[int]]:
    """Count forwards of every transformers model (the target) while the block runs."""
    from transformers import PreTrainedModel

    count = [0]

    def hook(module: torch.nn.Module, _args: object) -> None:
        if isinstance(module, PreTrainedModel):
            count[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


def trained_module() -> torch.nn.Module:
    """The bundled drafter in fp32, its weights changed a little (a checkpoint no cache has seen), in train mode."""
    m = build_drafter(read_checkpoint(ROOT / "fixtures" / "drafter"), dtype="fp32")
    with torch.no_grad():
        m.fc.weight.mul_(1.01)
    return m.train()


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, int]:
    """An Evaluator after its first call (on a cold cache) and the target forwards that call ran."""
    tmp = tmp_path_factory.mktemp("evaluator")
    ev = dflash_eval.Evaluator({**SETTINGS, "cache_dir": str(tmp / "cache"), "report_dir": str(tmp / "reports")},
                               history=True)
    ev.check_inputs()
    with target_forwards() as n:
        ev.evaluate(ROOT / "fixtures" / "drafter", step=0)
    return ev, n[0]


def test_later_calls_run_no_target_forward(warm):
    ev, first = warm
    assert first > 0  # the counter sees the target's work: completions and features of the cold cache
    before = dict(ev.inputs.meter.counts)
    with target_forwards() as n:
        r1 = ev.evaluate(trained_module(), step=1)
        sd = trained_module().state_dict()
        r2 = ev.evaluate(sd, config=read_checkpoint(ROOT / "fixtures" / "drafter").config.to_dict(), step=2)
    assert n[0] == 0
    assert ev.inputs.meter.counts["target_forwards"] == before.get("target_forwards", 0)
    assert r1.tau.mean_tau == r2.tau.mean_tau and r1.drafter.fingerprint == r2.drafter.fingerprint
    assert [r.step for r in ev.history.read()] == [0, 1, 2]
    assert r1.drafter.step == 1 and r1.drafter.path == "in-memory DFlashDrafter"


def test_live_module_equals_its_saved_checkpoint_to_the_last_digit(warm, tmp_path):
    ev, _ = warm
    m = trained_module()
    grads = [p.requires_grad for p in m.parameters()]
    live = ev.evaluate(m, step=10)
    assert m.training and all(x.training for x in m.modules())  # its mode restored
    assert [p.requires_grad for p in m.parameters()] == grads and all(p.grad is None for p in m.parameters())
    save_drafter(m, tmp_path / "step_10")  # fp32, as trained
    cold = dflash_eval.Evaluator({**SETTINGS, "cache_dir": str(tmp_path / "cache"),
                                  "report_dir": str(tmp_path / "reports")})
    saved = cold.evaluate(tmp_path / "step_10", step=10)
    assert live.drafter.fingerprint == saved.drafter.fingerprint
    assert live.tau.mean_tau == saved.tau.mean_tau and live.tau.mean_ddtree == saved.tau.mean_ddtree
    for pid, row in live.tau.prompts.items():
        assert row.accept_lengths == saved.tau.prompts[pid].accept_lengths
        assert row.ddtree_accept_lengths == saved.tau.prompts[pid].ddtree_accept_lengths
    assert cold.records[-1].prompts == ev.records[-1].prompts


def test_the_mode_is_restored_when_the_evaluation_raises(warm):
    ev, _ = warm
    cfg = read_checkpoint(ROOT / "fixtures" / "drafter").config
    bad = DFlashDrafter(dataclasses.replace(cfg, target_layer_ids=(1, 3, 99))).train()
    with pytest.raises(DrafterRefused, match="target_layer_ids"):
        ev.evaluate(bad)
    assert bad.training


def test_bad_input_is_one_error_naming_what_to_pass(warm, tmp_path):
    ev, _ = warm
    with pytest.raises(ConfigError, match="needs its config"):
        ev.evaluate(trained_module().state_dict())
    with pytest.raises(CheckpointError, match="not found"):
        ev.evaluate(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="cannot evaluate a int"):
        ev.evaluate(3)
    with pytest.raises(CheckpointError, match="not tensors"):
        ev.evaluate({"fc.weight": [1.0]}, config=read_checkpoint(ROOT / "fixtures" / "drafter").config)


def test_close_writes_the_trend_files_and_a_vacuous_floor_is_said(warm, tmp_path):
    """The Evaluator writes history.md and history.png beside its history at close() (once; the trackers closed
    first), and warns that a floor of 1.0 (SETTINGS' --tau-floor) passes any drafter."""
    ev, _ = warm
    report = tmp_path / "reports"
    closed = []

    class Tracker:
        def log(self, record: object, result: object) -> None: ...

        def close(self) -> None:
            closed.append(not (report / "history.md").exists())  # the trackers first, then the files

    other = dflash_eval.Evaluator({**SETTINGS, "cache_dir": str(ev.settings.cache_dir), "report_dir": str(report)},
                                  history=True, trackers=[Tracker()])
    with pytest.warns(UserWarning, match=r"every τ floor judged here is <= 1 .* judge nothing"):
        other.evaluate(ROOT / "fixtures" / "drafter", step=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        other.evaluate(ROOT / "fixtures" / "drafter", step=2)
    assert not [w for w in seen if "judge nothing" in str(w.message)]  # said once per evaluator
    assert not (report / "history.md").exists()
    other.close()
    assert closed == [True] and other.trend_files == [report / "history.md", report / "history.png"]
    assert "| 2 | `drafter` |" in (report / "history.md").read_text()
    assert (report / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    other.close()
    assert closed == [True]  # once
    memory = dflash_eval.Evaluator({**SETTINGS, "cache_dir": str(ev.settings.cache_dir),
                                    "report_dir": str(tmp_path / "mem")})
    memory.close()
    assert memory.trend_files == [] and not (tmp_path / "mem").exists()  # no history file: nothing written
