"""Logging each evaluated checkpoint to the trackers researchers already use, through their own libraries.

- :class:`TensorBoardTracker`: event files written by ``torch.utils.tensorboard.SummaryWriter`` (needs the
  ``tensorboard`` package);
- :class:`WandbTracker`: a Weights & Biases run (``wandb``), offline by default (no network, no account: the run
  is kept under ``dir`` and can be synced later with ``wandb sync``).

Both log, keyed by the training step (the record's step; records without one count up from 0): ``tau/mean``,
``tau/ddtree-<N>``, ``tau/category/<name>``, ``tau/position/<k>`` (the per-position acceptance rate of draft slot
k over all prompts), and, when known, ``tau/reference``, ``tau/reference_diff`` and ``drift_budget``. A tracker
whose library is not installed is refused when it is made, with one error naming the package to install.

Each is a plugin implementing the ``pytest_dflash_eval_history_record`` hook (:mod:`dflash_eval.hookspec`): the
:class:`~dflash_eval.training_loop.evaluator.Evaluator` registers the trackers it is given on its hook manager and
calls the hook, never a tracker itself, after each record is appended.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from dflash_eval.errors import ConfigError
from dflash_eval.training_loop.history import CheckpointRecord

if TYPE_CHECKING:  # imports torch: kept out of the trackers' own import
    from dflash_eval.results.eval_result import EvalResult

__all__ = ["scalars", "TensorBoardTracker", "WandbTracker", "require"]


#: The modes of ``wandb.init``: "offline" keeps the run on this machine.
WandbMode = Literal["online", "offline", "disabled", "shared"]


def require(module: str, package: str, what: str) -> None:
    """ConfigError naming ``package`` when ``module`` cannot be imported."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{what} needs the {package!r} package, which is not installed here "
                          f"(pip install {package})")


def scalars(record: CheckpointRecord, result: EvalResult) -> dict[str, float]:
    """The values a tracker logs for one checkpoint (see module docstring); NaNs left out."""
    out = {"tau/mean": record.mean_tau}
    out.update({f"tau/ddtree-{b}": v for b, v in record.mean_ddtree.items()})
    out.update({f"tau/category/{c}": v["tau"] for c, v in record.categories.items() if c != "all"})
    assert result.tau is not None, "a tracker logs an evaluated drafter's result"
    every = result.tau.categories.get("all")
    chain = every.acceptance.get("chain") if every is not None else None
    out.update({f"tau/position/{k}": r for k, r in enumerate(chain.position_rates if chain else [], 1)})
    if record.reference:
        out["tau/reference"], out["tau/reference_diff"] = record.reference["mean_tau"], record.reference["mean_diff"]
    if record.drift_budget is not None:
        out["drift_budget"] = record.drift_budget
    return {k: float(v) for k, v in out.items() if v is not None and not math.isnan(float(v))}


class _Steps:
    """The step a record is logged at: its own, else one past the last logged."""

    def __init__(self) -> None:
        self.last = -1

    def of(self, record: CheckpointRecord) -> int:
        self.last = record.step if record.step is not None else self.last + 1
        return self.last


class TensorBoardTracker:
    """TensorBoard event files in ``log_dir`` (one ``SummaryWriter``)."""

    def __init__(self, log_dir: str | Path) -> None:
        require("tensorboard", "tensorboard", "TensorBoard logging")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self._steps = _Steps()

    @pytest.hookimpl
    def pytest_dflash_eval_history_record(self, record: CheckpointRecord, result: EvalResult) -> None:
        self.log(record, result)

    def log(self, record: CheckpointRecord, result: EvalResult) -> None:
        step = self._steps.of(record)
        for tag, value in scalars(record, result).items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.add_text("verdict", f"{record.verdict}: " + "; ".join(
            [*record.reasons, *(x for x in (record.regression, record.plateau) if x)]), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run in ``dir`` (``mode="offline"``: nothing leaves the machine)."""

    def __init__(self, dir: str | Path, *,  # noqa: A002 - wandb.init's own name for the run's folder
                 project: str = "dflash-eval", name: str | None = None, mode: WandbMode = "offline",
                 config: dict[str, Any] | None = None) -> None:
        require("wandb", "wandb", "Weights & Biases logging")
        import wandb

        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, dir=str(self.dir), mode=mode, config=config or {},
                              reinit="create_new")
        self._steps = _Steps()

    @pytest.hookimpl
    def pytest_dflash_eval_history_record(self, record: CheckpointRecord, result: EvalResult) -> None:
        self.log(record, result)

    def log(self, record: CheckpointRecord, result: EvalResult) -> None:
        self.run.log({**scalars(record, result), "verdict": record.verdict}, step=self._steps.of(record))

    def close(self) -> None:
        self.run.finish()
