"""docs/examples/train_with_eval.py, a short version: a random drafter trained with the project's recipe on the
bundled target, evaluated through the Evaluator at steps 0, 10 and 20; τ starts at 1 (a random drafter accepts
nothing beyond the bonus token), every evaluation lands in the history, the trend table and plot are written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dflash_eval.training_loop.history import History

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_short_training_run_evaluated_every_10_steps(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("train_with_eval", ROOT / "docs" / "examples" / "train_with_eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    reports = tmp_path / "reports"
    out = mod.main(["--steps", "20", "--every", "10", "--windows", "16", "--new-tokens", "32", "--num-prompts", "3",
                    "--max-new-tokens", "24", "--report-dir", str(reports), "--cache-dir", str(tmp_path / "cache")])
    assert [s for s, _, _ in out] == [0, 10, 20]
    assert out[0][1] == pytest.approx(1.0, abs=0.05)  # the random drafter
    assert all(t >= 1.0 for _, t, _ in out)
    records = History(reports / "history.jsonl").read()
    assert [r.step for r in records] == [0, 10, 20] and [r.mean_tau for r in records] == [t for _, t, _ in out]
    assert (reports / "history.md").is_file() and (reports / "history.png").is_file()
    assert "| step | drafter | mean τ" in capsys.readouterr().out
