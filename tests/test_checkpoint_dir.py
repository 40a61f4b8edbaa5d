"""The checkpoints of a training output folder (dflash_eval.training_loop.checkpoint_dir) and the watch for new ones
(training_loop.watch): steps from names and metadata, step order, a half-written checkpoint is never handed on,
the watch stops at its total timeout and on Ctrl-C."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_eval.errors import ConfigError
from dflash_eval.training_loop.checkpoint_dir import find_checkpoints, is_complete, step_from_name, step_of
from dflash_eval.training_loop.watch import WatchLimits, watch

WAIT_S = 60


def make_dir(path: Path, n: int = 64) -> Path:
    path.mkdir(parents=True)
    save_file({"fc.weight": torch.arange(n, dtype=torch.float32).reshape(8, -1)}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"]}))
    return path


@pytest.mark.parametrize(("name", "step"), [("step_20000", 20000), ("checkpoint-20000", 20000),
                                            ("global_step20000", 20000), ("epoch_2_step_300.pt", 300),
                                            ("step-5.safetensors", 5), ("iter_0000100", 100), ("final", None)])
def test_step_from_name(name, step):
    assert step_from_name(name) == step


def test_steps_from_metadata_and_step_order(tmp_path):
    make_dir(tmp_path / "checkpoint-300")
    make_dir(tmp_path / "global_step100")
    meta = make_dir(tmp_path / "latest")
    (meta / "trainer_state.json").write_text(json.dumps({"global_step": 200}))
    make_dir(tmp_path / "unnamed")
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "step_50.pt")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    found = find_checkpoints(tmp_path)
    assert [(f.path.name, f.step) for f in found] == [("step_50.pt", 50), ("global_step100", 100), ("latest", 200),
                                                      ("checkpoint-300", 300), ("unnamed", None)]
    assert step_of(meta) == 200
    globbed = find_checkpoints(None, patterns=[str(tmp_path / "*step*")])
    assert [f.step for f in globbed] == [50, 100]


def test_half_written_checkpoints_are_not_complete(tmp_path):
    d = make_dir(tmp_path / "step_1")
    assert is_complete(d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-10])
    assert not is_complete(d)
    d2 = make_dir(tmp_path / "step_2")
    (d2 / "config.json").unlink()
    assert not is_complete(d2)  # the config comes with the weights
    pt = tmp_path / "step_3.pt"
    torch.save({"w": torch.zeros(1000)}, pt)
    assert is_complete(pt)
    pt.write_bytes(pt.read_bytes()[:-100])
    assert not is_complete(pt)


def test_watch_never_reads_a_checkpoint_being_written(tmp_path):
    """A writer thread writes step_1 whole, then step_2 in two halves with a pause between (while the watch polls);
    every checkpoint the watch hands on must load, and the second must hold the complete tensor."""
    handled: list[tuple[str, int]] = []
    half_written, resume, done = threading.Event(), threading.Event(), threading.Event()

    run = tmp_path / "run"
    run.mkdir()

    def writer() -> None:
        make_dir(run / "step_1")
        d = run / "step_2"
        d.mkdir()
        full = tmp_path / "full.safetensors"
        save_file({"fc.weight": torch.ones(4096)}, str(full))
        data = full.read_bytes()
        with open(d / "model.safetensors", "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            half_written.set()
            resume.wait(WAIT_S)
            fh.write(data[len(data) // 2:])
        (d / "config.json").write_text("{}")

    def handle(found) -> None:
        t = load_file(str(found.path / "model.safetensors"))["fc.weight"]
        handled.append((found.path.name, int(t.numel())))
        if found.path.name == "step_1":
            assert half_written.wait(WAIT_S)
            resume.set()  # step_2 is finished only after step_1 was handled
        else:
            done.set()

    def sleep(s: float) -> None:
        done.wait(min(s, 0.05))
        if done.is_set():
            raise KeyboardInterrupt  # the test's Ctrl-C once both are handled

    th = threading.Thread(target=writer)
    th.start()
    why = watch(run, handle, limits=WatchLimits(poll_s=0.05, settle_s=0.2, timeout_s=WAIT_S), sleep=sleep)
    th.join(WAIT_S)
    assert why == "interrupted"
    assert handled == [("step_1", 64), ("step_2", 4096)]


def test_watch_stops_at_its_total_timeout_and_skips_seen(tmp_path):
    d = make_dir(tmp_path / "step_7")
    now = [0.0]
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    handled = []
    why = watch(tmp_path, handled.append, seen={d.absolute()}, limits=WatchLimits(poll_s=3, settle_s=0, timeout_s=10),
                clock=lambda: now[0], sleep=sleep)
    assert why == "timeout" and handled == []
    assert waits == [3, 3, 3, 1]  # each wait bounded by the poll and by what is left
    with pytest.raises(ConfigError, match="timeout_s must be > 0"):
        watch(tmp_path, handled.append, limits=WatchLimits(timeout_s=0))
