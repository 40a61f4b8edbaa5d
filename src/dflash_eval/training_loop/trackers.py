"""Logging each evaluated checkpoint to the trackers researchers already use, through their own libraries.

- :class:`TensorBoardTracker`: event files written by ``torch.utils.tensorboard.SummaryWriter`` (needs the
  ``tensorboard`` package);
- :class:`WandbTracker`: a Weights & Biases run (``wandb``), offline by default (no network, no account: the run
  is kept under ``dir`` and can be synced later with ``wandb sync``).

Both log, keyed by the training step (the record's step; records without one count up from the last step logged),
the scalars of :func:`tracker_scalars` (their names: :data:`TRACKER_SCALARS`, one line each): τ with its 95 % CI
bounds, the floor, the verdict as numbers to alert on (``verdict/pass``, ``verdict/floor_missed``,
``verdict/regression``, ``verdict/plateau``: 1 or 0), the reference drafter's τ and the paired difference with its
CI, the drift budget, the predicted speed-up on the evaluation's device; TensorBoard also the verdict's text. A
tracker whose library is not installed is refused when it is made, with one error naming the package to install.

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

from dflash_eval.common.number_text import ci_text, ends, fmt
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.verdict import CHECKPOINT, FLOORS, PLATEAU, REGRESSION
from dflash_eval.training_loop.history import CheckpointRecord

if TYPE_CHECKING:  # imports torch: kept out of the trackers' own import
    from dflash_eval.session.eval_result import EvalResult

__all__ = ["TRACKER_SCALARS", "tracker_scalars", "verdict_text", "TensorBoardTracker", "WandbTracker", "require"]


#: The modes of ``wandb.init``: "offline" keeps the run on this machine.
WandbMode = Literal["online", "offline", "disabled", "shared"]

#: Every scalar a tracker logs (``<N>``: a DDTree budget, ``<name>``: a category, ``<k>``: a draft slot), and what it
#: is. A scalar whose value is not known for a checkpoint (no floor, no reference drafter, unjudged) is left out of
#: that step, never logged as 0 or NaN.
TRACKER_SCALARS: dict[str, str] = {
    "tau/mean": "macro mean chain τ over the prompts",
    "tau/mean_ci95_low": "lower bound of its 95 % CI (the record's ci_method: t over prompts)",
    "tau/mean_ci95_high": "upper bound of that CI",
    "tau/pooled": "pooled chain τ: accepted tokens / verification rounds over every round",
    "tau/ddtree-<N>": "macro mean DDTree-N τ",
    "tau/ddtree-<N>_ci95_low": "lower bound of its 95 % CI",
    "tau/ddtree-<N>_ci95_high": "upper bound of its 95 % CI",
    "tau/category/<name>": "a category's mean chain τ",
    "tau/position/<k>": "acceptance rate of draft slot k over all prompts",
    "tau/floor": "the floor of the mean chain τ (--tau-floor, or the mean of the selected prompts' floors)",
    "tau/reference": "the reference drafter's mean chain τ (--reference-drafter)",
    "tau/reference_diff": "paired mean difference τ(checkpoint) - τ(reference) over the prompts",
    "tau/reference_diff_ci95_low": "lower bound of its 95 % CI (paired t over prompts)",
    "tau/reference_diff_ci95_high": "upper bound of that CI",
    "drift_budget": "the drift budget, when measured",
    "speedup/chain": "predicted chain speed-up of the server-style loop over plain decoding on the evaluation's device "
                     "(docs/speedup.md)",
    "speedup/chain_ci95_low": "lower bound of its 95 % CI (τ's CI through the formula)",
    "speedup/chain_ci95_high": "upper bound of that CI",
    "speedup/ddtree-<N>": "predicted DDTree-N speed-up",
    "speedup/best_budget": "the DDTree budget with the highest predicted speed-up",
    "speedup/tokens_per_s": "predicted chain tokens per second (plain decoding: speedup/plain_tokens_per_s)",
    "speedup/plain_tokens_per_s": "plain greedy decoding's tokens per second, timed on the same device",
    "verdict/pass": "1 the checkpoint passes, 0 it fails (a floor missed or a regression); left out when unjudged",
    "verdict/floor_missed": "1 a floor was missed, 0 every floor met; left out without floors",
    "verdict/regression": "1 below the run's recent level beyond the noise between checkpoints, else 0",
    "verdict/plateau": "1 no gain beyond noise over the last K checkpoints (a notice), else 0",
}


def require(module: str, package: str, what: str) -> None:
    """ConfigError naming ``package`` when ``module`` cannot be imported."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{what} needs the {package!r} package, which is not installed here "
                          f"(pip install {package})")


def _bounds(name: str, ci: Any) -> dict[str, Any]:
    """``<name>_ci95_low`` / ``_high`` of a [low, high] pair (nothing when it is not one)."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return {}
    return {f"{name}_ci95_low": ci[0], f"{name}_ci95_high": ci[1]}


def _number(v: Any) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def tracker_scalars(record: CheckpointRecord, result: EvalResult | None = None) -> dict[str, float]:
    """The values a tracker logs for one checkpoint (names: :data:`TRACKER_SCALARS`); values not known left out.
    ``result`` adds the per-position acceptance rates (``tau/position/<k>``)."""
    out: dict[str, Any] = {"tau/mean": record.mean_tau, **_bounds("tau/mean", record.mean_tau_ci95),
                           "tau/pooled": record.mean_tau_pooled}
    for b, v in record.mean_ddtree.items():
        out[f"tau/ddtree-{b}"] = v
        out.update(_bounds(f"tau/ddtree-{b}", record.mean_ddtree_ci95.get(b)))
    out.update({f"tau/category/{c}": v["tau"] for c, v in record.categories.items() if c != "all"})
    every = result.tau.categories.get("all") if result is not None and result.tau is not None else None
    chain = every.acceptance.get("chain") if every is not None else None
    out.update({f"tau/position/{k}": r for k, r in enumerate(chain.position_rates if chain else [], 1)})
    out["tau/floor"] = record.mean_floor
    if record.reference:
        ref = record.reference
        out.update({"tau/reference": ref.get("mean_tau"), "tau/reference_diff": ref.get("mean_diff"),
                    **_bounds("tau/reference_diff", ref.get("ci95"))})
    out["drift_budget"] = record.drift_budget
    sp = record.speedup or {}
    if sp:  # the predicted speed-up (left out when not measured)
        out.update({"speedup/chain": sp.get("chain"), **_bounds("speedup/chain", sp.get("chain_ci95")),
                    "speedup/best_budget": sp.get("best_budget"), "speedup/tokens_per_s": sp.get("tokens_per_s"),
                    "speedup/plain_tokens_per_s": sp.get("plain_tokens_per_s")})
        out.update({f"speedup/ddtree-{b}": v for b, v in (sp.get("ddtree") or {}).items()})
    verdict = record.judgement  # the checkpoint's whole verdict, as its record holds it
    if verdict.passed is not None:
        out["verdict/pass"] = 1.0 if verdict.passed else 0.0
    floors = verdict.part(FLOORS) or verdict.part(CHECKPOINT)  # CHECKPOINT: a record from before parts were kept
    if floors is not None and floors.passed is not None:
        out["verdict/floor_missed"] = 0.0 if floors.passed else 1.0
    out["verdict/regression"] = 1.0 if verdict.part(REGRESSION) else 0.0
    out["verdict/plateau"] = 1.0 if verdict.part(PLATEAU) else 0.0
    return {k: x for k, v in out.items() if (x := _number(v)) is not None}


def verdict_text(record: CheckpointRecord) -> str:
    """The verdict as a line of text: the label, mean τ with its CI against the floor, then the verdict's reasons and
    notices."""
    verdict = record.judgement
    head = (f"{verdict.label.upper()}: mean chain τ {fmt(record.mean_tau)} (95 % CI "
            f"{ci_text(*ends(record.mean_tau_ci95), brackets=True)}), "
            f"floor {fmt(record.mean_floor)}")
    notes = [*verdict.reasons, *verdict.notices]
    return head + ("; " + "; ".join(notes) if notes else "")


class _Steps:
    """The step a record is logged at: its own, else one past the last logged (a tracker's axis holds integers)."""

    def __init__(self) -> None:
        self.last = -1

    def of(self, record: CheckpointRecord) -> int:
        self.last = record.step if record.step is not None else self.last + 1
        return self.last


class TensorBoardTracker:
    """TensorBoard event files in ``log_dir`` (one ``SummaryWriter``): the scalars of :data:`TRACKER_SCALARS` and the
    verdict's text (tag ``verdict``)."""

    def __init__(self, log_dir: str | Path) -> None:
        require("tensorboard", "tensorboard", "TensorBoard logging")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self._steps = _Steps()

    @pytest.hookimpl
    def pytest_dflash_eval_history_record(self, record: CheckpointRecord, result: EvalResult) -> None:
        self.log(record, result)

    def log(self, record: CheckpointRecord, result: EvalResult | None = None) -> None:
        step = self._steps.of(record)
        for tag, value in tracker_scalars(record, result).items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.add_text("verdict", verdict_text(record), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run in ``dir`` (``mode="offline"``: nothing leaves the machine): the scalars of
    :data:`TRACKER_SCALARS` and the verdict's label (``verdict``: pass / fail / unjudged)."""

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

    def log(self, record: CheckpointRecord, result: EvalResult | None = None) -> None:
        self.run.log({**tracker_scalars(record, result), "verdict": record.verdict}, step=self._steps.of(record))

    def close(self) -> None:
        self.run.finish()
