"""The history of a training run's evaluations: one JSON line per evaluated checkpoint (``history.jsonl`` in the
report folder by default).

A record holds the step, the time, the drafter (label and weight fingerprint), mean chain τ and each DDTree
budget's mean τ (macro means over prompts) with their 95 % CIs (``ci_method``: Hall t over prompts), the pooled τ
(accepted tokens / verification rounds over every round: ``mean_tau_pooled``, ``mean_ddtree_pooled``), the same
per category, every prompt's chain τ (what the verdicts
across steps pair, :mod:`dflash_eval.training_loop.trend`), the drift budget when measured, the reference drafter's
τ and the paired difference against it, the predicted speed-up on the evaluation's device (``speedup``: the chain's
with its CI, tokens/s, each DDTree budget's, the best budget; :func:`dflash_eval.metrics.speedup.speedup_digest`),
the checkpoint's verdict against its floors, ``--baseline`` and ``--speedup-floor`` with its reasons, the trend
verdicts (``regression``: a failure; ``plateau``: a notice), the whole verdict's parts (``parts``: what the trend
table, the trackers and the gate read; :mod:`dflash_eval.metrics.verdict`) and the settings digest (records of one
digest are comparable).

Appending is atomic and safe under concurrent writers: under a file lock (``history.jsonl.lock``, filelock) the
file is read, the new record judged against the earlier ones and the whole file written to a temporary file that
is renamed over it (:mod:`dflash_eval.common.atomic`). A writer killed at any point leaves the history as it was
before its append or with the append complete, never a torn line; the OS releases its lock.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.errors import ConfigError, EvalError, ResultKeyError
from dflash_eval.metrics.acceptance_rates import pooled_means
from dflash_eval.metrics.speedup import speedup_digest
from dflash_eval.metrics.verdict import (
    PLATEAU,
    REGRESSION,
    Part,
    Verdict,
    compose,
    parts_from_dicts,
    plateau_part,
    record_verdict,
    regression_part,
)
from dflash_eval.training_loop import trend

if TYPE_CHECKING:  # both import torch: kept out of the history's own import
    from dflash_eval.session.eval_result import EvalResult
    from dflash_eval.session.rows import CategoryRow, Stat

__all__ = ["CheckpointRecord", "History"]


def _stat(s: Stat) -> dict[str, Any]:
    """A category's τ summary as a record holds it: τ and its 95 % CI."""
    ci = s.ci95 or [math.nan, math.nan]
    return {"tau": s.mean, "ci95": [float(ci[0]), float(ci[1])]}


def _categories(cats: dict[str, CategoryRow]) -> dict[str, dict[str, Any]]:
    return {c: {"n": v.n, **_stat(v.chain), "ddtree": {b: _stat(d) for b, d in v.ddtree.items()}}
            for c, v in cats.items()}


def _reference(block: dict[str, Any] | None) -> dict[str, Any] | None:
    if not block:
        return None
    paired = block["paired"]
    return {"path": block["path"], "fingerprint": block["fingerprint"], "mean_tau": block["mean_tau"],
            "mean_ddtree": block["mean_ddtree"], "mean_diff": paired["mean_diff"], "ci95": paired["ci95"],
            "ci_method": paired.get("ci_method"), "n": paired["n"]}


@dataclass
class CheckpointRecord:
    """One evaluated checkpoint (see module docstring); ``passed`` and ``reasons``: the checkpoint's own verdict
    (its floors, ``--baseline``, ``--speedup-floor``; None: nothing judged); :attr:`judgement`: the whole verdict,
    the verdicts across steps included."""

    step: int | None
    time: str
    drafter: str
    fingerprint: str
    settings_digest: str
    mean_tau: float
    mean_tau_ci95: list[float]
    mean_ddtree: dict[str, float]
    mean_ddtree_ci95: dict[str, list[float]]
    mean_floor: float | None
    categories: dict[str, dict[str, Any]]
    prompts: dict[str, float]
    drift_budget: float | None = None
    reference: dict[str, Any] | None = None
    passed: bool | None = None
    reasons: list[str] = field(default_factory=list)
    regression: str | None = None
    plateau: str | None = None
    mean_tau_pooled: float | None = None  # None: a record written before the pooled τ was recorded
    mean_ddtree_pooled: dict[str, float] = field(default_factory=dict)
    ci_method: str | None = None  # of mean_tau_ci95 and the categories' CIs; None: percentile bootstrap (older)
    speedup: dict[str, Any] | None = None  # the predicted speed-up (metrics.speedup.speedup_digest); None: not measured
    parts: tuple[Part, ...] | None = None  # the whole verdict's parts; None: a record written before they were kept

    @property
    def judgement(self) -> Verdict:
        """The checkpoint's whole verdict: its parts (a record written before they were kept: its own verdict and the
        verdicts across steps, :func:`~dflash_eval.metrics.verdict.record_verdict`)."""
        if self.parts is not None:
            return compose(*self.parts)
        return record_verdict(self.passed, self.reasons, self.regression, self.plateau)

    @property
    def verdict(self) -> str:
        """``fail`` (a part failed: a floor, the baseline, the speed-up floor, a regression across steps), ``pass`` or
        ``unjudged`` (no floors, no regression): the label of :attr:`judgement`."""
        return self.judgement.label

    @classmethod
    def of(cls, result: EvalResult, *, step: int | None, digest: str, verdict: Verdict) -> CheckpointRecord:
        """The record of an :class:`~dflash_eval.session.eval_result.EvalResult` (its τ computed) with the
        checkpoint's ``verdict`` (:meth:`~dflash_eval.session.eval_result.TauSummary.verdict`), not judged across
        steps yet."""
        tau, drafter = result.tau, result.drafter
        assert tau is not None and drafter is not None, "a record is made of an evaluated drafter's result"
        cats = _categories(tau.categories)
        budget = result.drift_budget.budget if result.drift_budget is not None else None
        pooled, pooled_dd = pooled_means(tau.prompts)
        all_row = tau.categories.get("all")
        return cls(step=step, time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   drafter=str(drafter.path), fingerprint=drafter.fingerprint, settings_digest=digest,
                   mean_tau=tau.mean_tau, mean_tau_ci95=cats.get("all", {}).get("ci95", [math.nan, math.nan]),
                   mean_ddtree=dict(tau.mean_ddtree),
                   mean_ddtree_ci95={b: d["ci95"] for b, d in cats.get("all", {}).get("ddtree", {}).items()},
                   mean_floor=tau.mean_floor, categories=cats, prompts={p: r.tau for p, r in tau.prompts.items()},
                   drift_budget=budget, reference=_reference(drafter.reference),
                   passed=verdict.passed, reasons=verdict.reasons, parts=verdict.parts,
                   mean_tau_pooled=pooled, mean_ddtree_pooled=pooled_dd,
                   ci_method=all_row.chain.ci_method if all_row is not None else None,
                   speedup=speedup_digest(result.speedup))

    def judged(self, records: list[CheckpointRecord], window: int) -> CheckpointRecord:
        """This record with its trend verdicts against ``records`` (earlier records of the same settings digest)."""
        earlier = trend.earlier_than(self, records)
        judged = replace(self, regression=trend.regression(self, earlier))
        judged = replace(judged, plateau=trend.plateau(judged, earlier, window))  # a regression is no gain
        own = [p for p in self.judgement.parts if p.name not in (REGRESSION, PLATEAU)]
        verdict = compose(*own, regression_part(judged.regression), plateau_part(judged.plateau))
        return replace(judged, parts=verdict.parts)

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "verdict": self.verdict}
        out["parts"] = None if self.parts is None else [p.to_dict() for p in self.parts]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointRecord:
        """The record of a history line, of this version or an earlier one: a field a record of an earlier version
        lacks takes its default (no ``parts``: a record written before they were kept, judged from ``passed``,
        ``reasons`` and the trend verdicts), the key every version wrote for readers and none reads back
        (``verdict``) is dropped. Strictly otherwise: a key no version wrote (``unknown``), a field every version
        wrote that the line lacks (``missing``) and a verdict part's key (``parts[0].notices``) are one
        ResultKeyError naming the key."""
        if not isinstance(data, dict):
            raise TypeError(f"not a JSON object: {type(data).__name__}")
        ResultKeyError.check(data, [*_FIELDS, *_FOR_READERS], optional=[*_DEFAULTED, *_FOR_READERS])
        kw = {k: v for k, v in data.items() if k in _FIELDS}
        if kw.get("parts") is not None:
            kw["parts"] = parts_from_dicts(kw["parts"])
        return cls(**kw)


#: A record's fields (:class:`CheckpointRecord`), those an earlier version may lack (they have a default), and the
#: keys written for readers only (:meth:`CheckpointRecord.to_json`).
_FIELDS = tuple(f.name for f in fields(CheckpointRecord))
_DEFAULTED = tuple(f.name for f in fields(CheckpointRecord) if f.default is not MISSING
                   or f.default_factory is not MISSING)
_FOR_READERS = ("verdict",)


class History:
    """The JSONL history file (see module docstring)."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 120.0) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def _lock(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.lock_path), timeout=self.lock_timeout_s)

    def read(self) -> list[CheckpointRecord]:
        """Every record, in the order written ([] when the file does not exist); ConfigError naming the file and
        line of a line that is not a record."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(CheckpointRecord.from_json(json.loads(line)))
            except ResultKeyError as exc:  # a key no version of the history wrote, or lacks
                raise ConfigError(f"{self.path}:{n}: not a history record: {exc}; a file edited by hand, or written "
                                  "by a newer version? Move it away to start a new history") from None
            except (json.JSONDecodeError, TypeError, AttributeError) as exc:
                raise ConfigError(f"{self.path}:{n}: not a history record ({type(exc).__name__}: {exc}); a file "
                                  "edited by hand? Move it away to start a new history") from exc
        return out

    def append(self, record: CheckpointRecord, *, window: int = 4) -> CheckpointRecord:
        """Judge ``record`` against the earlier records of its settings digest and append it, atomically under
        the lock (EvalError naming the lock file when another writer holds it for ``lock_timeout_s``)."""
        try:
            with self._lock():
                records = self.read()
                judged = record.judged([r for r in records if r.settings_digest == record.settings_digest], window)
                old = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
                line = json.dumps(judged.to_json(), sort_keys=True, allow_nan=True)
                atomic_write_text(self.path, old + ("" if not old or old.endswith("\n") else "\n") + line + "\n")
        except Timeout as exc:
            raise EvalError(f"{self.lock_path}: another writer held the history's lock for {self.lock_timeout_s:g} s"
                            " (a stuck process? the lock is released when it exits)") from exc
        return judged

    def has(self, drafter: str, step: int | None, digest: str) -> bool:
        """Whether a checkpoint (its label/path and step) was recorded under ``digest``."""
        return any(r.drafter == drafter and r.step == step and r.settings_digest == digest for r in self.read())
