"""Evaluate the checkpoints a SpecForge-style trainer saves, through a callback that hands τ and the verdict back
to the trainer's own tracker.

SpecForge's DFlash trainer (``scripts/train_dflash.py``) saves a checkpoint every ``--save-interval`` steps as a
folder ``<output-dir>/epoch_<e>_step_<s>`` (``config.json`` + ``model.safetensors``, the layout dflash-eval reads
as ``--drafter``) and logs a dict of numbers per step through its tracker (``tracker.log(logdict, step=step)``).
:class:`DFlashEvalCallback` fits there: ``on_save(save_dir, step)`` evaluates the folder just written with one
:class:`dflash_eval.Evaluator` (the target's completions and features are produced once, by the first call) and
returns the numbers to log: τ with its CI bounds, the floor, and the verdict as 0/1 scalars to alert on
(``dflash_eval.TRACKER_SCALARS`` names them all), prefixed ``dflash_eval/``. ``on_eval(model, step)`` does the
same for the live module without a save; ``on_train_end()`` writes ``history.md`` and ``history.png``.

The trainer below stands in for SpecForge's loop (same folder names, same tracker call) and reuses the recipe of
``train_loop.py`` beside this file; it needs only the installed dflash-eval (plus torch) and a target folder::

    python specforge_callback.py --target-model /models/Qwen3-8B --prompts humaneval:20 --steps 2000 \\
        --save-interval 500 --output-dir runs/exp1

The same evaluation, out of process, from the saved folders: ``dflash-eval gate runs/exp1 --watch --latest ...``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from train_loop import Trainer, add_options, evaluator_settings, setup

from dflash_eval import Evaluator, save_drafter, tracker_scalars


class DFlashEvalCallback:
    """Evaluate each saved checkpoint (or the live module) and return the numbers for the trainer's tracker.

    Args:
        settings: the Evaluator's settings (dflash-eval's option names: target_model, prompts, tau_floor, ...).
        prefix: what the returned names start with, beside the trainer's own ``train/...``.
        trackers: dflash-eval trackers of its own (TensorBoardTracker, WandbTracker), if the trainer's are not
            used.
    """

    def __init__(self, settings: dict[str, Any], *, prefix: str = "dflash_eval/", trackers: Sequence[Any] = ()) -> None:
        self.evaluator = Evaluator(settings, history=True, trackers=list(trackers))
        self.evaluator.check_inputs()  # the target's files and the prompts: before the first training step
        self.prefix = prefix

    def _logdict(self) -> dict[str, float]:
        rec = self.evaluator.records[-1]
        return {self.prefix + k: v for k, v in tracker_scalars(rec).items()}

    def on_save(self, save_dir: str | Path, step: int) -> dict[str, float]:
        """Evaluate the checkpoint folder just saved (read as ``dflash-eval --drafter`` reads it)."""
        self.evaluator.evaluate(Path(save_dir), step=step)
        return self._logdict()

    def on_eval(self, model: Any, step: int) -> dict[str, float]:
        """Evaluate the live drafter module (in training mode, on its device; its mode is restored)."""
        self.evaluator.evaluate(model, step=step)
        return self._logdict()

    def on_train_end(self) -> list[Path]:
        """Close the evaluator: history.md and history.png beside history.jsonl; returns their paths."""
        self.evaluator.close()
        return self.evaluator.trend_files


class JsonlTracker:
    """A stand-in for SpecForge's tracker (``create_tracker``): ``log(logdict, step=...)`` appends a JSON line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, logdict: dict[str, float], step: int) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, **logdict}) + "\n")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Train; save every ``--save-interval`` steps and evaluate the saved folder through the callback; returns the
    lines logged at the saves."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(ap)
    ap.add_argument("--save-interval", type=int, default=50, help="save (and evaluate) every N steps")
    ap.add_argument("--output-dir", default="runs/drafter", help="checkpoints: <output-dir>/epoch_0_step_<N>")
    args = ap.parse_args(argv)
    target, drafter, examples = setup(args)
    trainer = Trainer(target, drafter, examples, lr=args.lr, batch=args.batch, anchors=args.anchors,
                      steps=args.steps, seed=args.seed)
    out_dir = Path(args.output_dir)
    tracker = JsonlTracker(out_dir / "metrics.jsonl")
    callback = DFlashEvalCallback(evaluator_settings(args))
    logged = []
    for step in range(1, args.steps + 1):
        loss = trainer.step()
        logdict = {"train/loss": loss}
        if step % args.save_interval == 0 or step == args.steps:
            save_dir = out_dir / f"epoch_0_step_{step}"
            save_drafter(drafter, save_dir)  # as SpecForge's draft_model.save_pretrained(save_dir)
            logdict.update(callback.on_save(save_dir, step))
            logged.append({"step": step, **logdict})
            rec = callback.evaluator.records[-1]
            print(f"step {step}: loss {loss:.3f}, τ {rec.mean_tau:.3f}, {rec.verdict}", flush=True)
        tracker.log(logdict, step=step)
    print("history: " + ", ".join(str(p) for p in callback.on_train_end()))
    return logged


if __name__ == "__main__":
    main()
