"""A whole run's result as one typed value: eval.json's data (:func:`dflash_eval.session.merge.merge`, with the
verdict the run's end adds) read as its fragments, and written back.

:class:`RunResult` holds each of eval.json's top-level keys as a field, typed where the suite owns the layout: the
judged prompts (:class:`~dflash_eval.session.rows.PromptRow`), the categories, conversations and turns, the drift rows
(:class:`~dflash_eval.metrics.drift_checks.DriftStat`, :class:`~dflash_eval.session.blocks.DriftAcceptRow`), the drift
budget and the drift gate (:class:`~dflash_eval.session.blocks.DriftBudgetBlock`,
:class:`~dflash_eval.metrics.drift_checks.GateCheck`), the τ means (:class:`TauMeans`), the predicted speed-up
(:class:`~dflash_eval.metrics.speedup.Speedup`: made from the predictions and read back by the metrics, re-exported
here with :class:`~dflash_eval.metrics.speedup.PooledSpeed`), the timings (:class:`Timings`), the tests
(:class:`Tests`), the near ties, the ``--baseline`` comparison (:class:`~dflash_eval.session.blocks.BaselineBlock`),
the mean over samples (:class:`~dflash_eval.session.blocks.SampledBlock`), the verdict
(:class:`~dflash_eval.metrics.verdict.Verdict`), the target, the τ-relevant settings and the provenance with its
kernel changes (:class:`~dflash_eval.session.run_blocks.TargetBlock`,
:class:`~dflash_eval.session.run_blocks.ContextBlock`, :class:`~dflash_eval.session.run_blocks.ProvenanceBlock`).
The blocks whose layout belongs to another part of the suite (the settings, the cache's counters, the SGLang server,
the registered measurements) are kept as eval.json holds them.

Dicts only at the file boundary: :meth:`RunResult.to_dict` is eval.json's data (:meth:`RunResult.from_dict` of it
gives it back, key for key), :meth:`RunResult.from_dict` and :meth:`RunResult.read` read it, strictly: a key the
result does not know inside a fragment, or a key a fragment needs that the data lacks, is one
:class:`~dflash_eval.session.rows.ResultKeyError` naming the file and the key's path. Plugins may add top-level keys
(``pytest_dflash_eval_result_ready``): a top-level key that is not one of the schema's is a plugin's, kept as it is in
:attr:`RunResult.plugin_fields` and written back after the suite's own keys; a fragment's own keys are never a
plugin's.

No torch: the reports, the gate and the history read it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.errors import EvalError, ResultKeyError
from dflash_eval.metrics.drift_checks import DriftStat, GateCheck
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.near_tie import Divergence
from dflash_eval.metrics.speedup import PooledSpeed, Speedup  # re-exported: their home before they were typed
from dflash_eval.metrics.stats import category_table, ddtree_budgets
from dflash_eval.metrics.verdict import (
    Verdict,
    judge_categories,
    judge_mean,
    judge_prompts,
    mean_passed,
    stored_verdict,
)
from dflash_eval.session.blocks import (
    BaselineBlock,
    DrafterBlock,
    DriftAcceptRow,
    DriftBudgetBlock,
    FingerprintBlock,
    SampledBlock,
)
from dflash_eval.session.rows import (
    CategoryRow,
    ConversationRow,
    PromptRow,
    Row,
    TurnRow,
    _opt,
    plain,
    rows_from_dict,
    rows_from_list,
)
from dflash_eval.session.run_blocks import ContextBlock, KernelChange, ProvenanceBlock, TargetBlock

__all__ = ["RunResult", "category_rows", "TauMeans", "Speedup", "PooledSpeed", "Timings", "Compile", "KernelCache",
           "Tests", "NotChecked", "Rejection", "TOP_LEVEL_KEYS", "SCHEMA"]

#: eval.json's schema version (docs/reference.md; :mod:`dflash_eval.session.merge` writes it).
SCHEMA = 1

#: eval.json's top-level keys, in the order the merge writes them (``rejected`` and ``verdict``, which the run's end
#: adds, last; a plugin's keys go before them).
TOP_LEVEL_KEYS = ("schema", "created", "settings", "target", "drafter", "provenance", "context", "fingerprint",
                  "sglang", "baseline", "drift_budget", "speedup", "prompts", "mean_tau", "mean_floor", "mean_ddtree",
                  "mean_ddtree_floor", "mean_passed", "mean_tau_pooled", "mean_ddtree_pooled", "tau_definitions",
                  "categories", "sampled", "conversations", "turns", "drift", "drift_accept", "drift_gate",
                  "measurements", "near_ties", "timings", "counts", "cache", "tests", "not_checked", "diagnoses",
                  "rejected", "verdict")

#: The τ means, present together (a run that measured τ): :class:`TauMeans`.
_TAU_KEYS = ("mean_tau", "mean_floor", "mean_ddtree", "mean_ddtree_floor", "mean_tau_pooled", "mean_ddtree_pooled",
             "tau_definitions")

JsonBlock = dict[str, Any]


@dataclass(frozen=True)
class TauMeans(Row):
    """The run's mean τ: macro (the mean over prompts, chain and per DDTree budget) with its floors, pooled (over every
    round), and what each kind of τ is."""

    mean_tau: float | None
    mean_floor: float | None
    mean_ddtree: dict[str, float | None]
    mean_ddtree_floor: dict[str, float | None]
    mean_tau_pooled: float | None
    mean_ddtree_pooled: dict[str, float | None]
    tau_definitions: dict[str, str]


@dataclass(frozen=True)
class KernelCache(Row):
    """Where Triton kept the run's compiled kernels and why there
    (:class:`dflash_eval.target.kernel_cache.KernelCacheDir`): ``path`` (None: Triton's default), ``source``
    (``--cache-dir``, ``TRITON_CACHE_DIR``, ``triton default``) and, for the default, ``why``."""

    path: str | None
    source: str
    why: str | None = _opt()


@dataclass(frozen=True)
class Compile(Row):
    """The GPU kernel compilation inside the run's stages (:class:`dflash_eval.common.progress.Compilation`, summed
    over the processes): its seconds, per stage, the kernels compiled and loaded, and the kernel cache (None: not
    known)."""

    seconds: float
    by_stage: dict[str, float]
    kernels_compiled: int
    kernels_loaded: int
    kernel_cache: KernelCache | None


@dataclass(frozen=True)
class Timings(Row):
    """The run's wall time, each stage's seconds summed over processes and per worker, the workers' spans and the GPU
    kernel compilation inside the stages."""

    wall_s: float | None
    sum: dict[str, float]
    per_worker: dict[str, dict[str, float]]
    spans: dict[str, list[list[Any]]] = field(default_factory=dict)
    compile: Compile | None = _opt()


@dataclass(frozen=True)
class Tests(Row):
    """The suite's tests: how many of each outcome, each test's outcome, the skipped ones with their reason."""

    counts: dict[str, int]
    outcomes: dict[str, str]
    skipped: dict[str, str] | None = _opt()


@dataclass(frozen=True)
class NotChecked(Row):
    """Skipped suite tests of one reason: how many, and the first one's node id."""

    reason: str
    tests: int
    first: str


@dataclass(frozen=True)
class Rejection(Row):
    """A plugin that rejected the result, and why."""

    plugin: str
    reason: str


@dataclass(frozen=True)
class RunResult:
    """A run's result (module docstring); a field is None where eval.json has no such key."""

    schema: int
    created: str
    prompts: dict[str, PromptRow]
    drift: list[DriftStat]
    drift_accept: list[DriftAcceptRow]
    timings: Timings
    tests: Tests
    settings: JsonBlock | None = None
    target: TargetBlock | None = None
    drafter: DrafterBlock | None = None
    provenance: ProvenanceBlock | None = None
    context: ContextBlock | None = None
    fingerprint: FingerprintBlock | None = None
    sglang: JsonBlock | None = None
    baseline: BaselineBlock | None = None
    drift_budget: DriftBudgetBlock | None = None
    speedup: Speedup | None = None
    tau: TauMeans | None = None
    mean_passed: bool | None = None
    categories: dict[str, CategoryRow] | None = None
    sampled: SampledBlock | None = None
    conversations: dict[str, ConversationRow] | None = None
    turns: dict[str, TurnRow] | None = None
    drift_gate: list[GateCheck] | None = None
    measurements: dict[str, JsonBlock] | None = None
    near_ties: list[Divergence] | None = None
    counts: dict[str, JsonBlock] | None = None
    cache: dict[str, JsonBlock] | None = None
    not_checked: list[NotChecked] | None = None
    diagnoses: list[str] | None = None
    rejected: list[Rejection] | None = None
    verdict: Verdict | None = None
    plugin_fields: dict[str, Any] = field(default_factory=dict)  # top-level keys plugins added, as they are

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: object = None) -> RunResult:
        """The result of eval.json's data; ``source``: the file it was read from, which an error names.
        ResultKeyError naming the file and the first key a fragment does not know or needs and lacks (module
        docstring); EvalError when ``data`` is not eval.json's data of this schema."""
        try:
            return _from_dict(data)
        except ResultKeyError as exc:
            raise exc.in_file(source) if source is not None else exc from None
        except EvalError as exc:
            raise EvalError(f"{source}: {exc}") if source is not None else exc from None

    @classmethod
    def read(cls, path: str | Path) -> RunResult:
        """An eval.json file's result (:meth:`from_dict`; EvalError naming the file when it is not JSON)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EvalError(f"{path}: cannot read it as eval.json ({exc})") from None
        return cls.from_dict(data, source=path)

    def final_verdict(self) -> Verdict:
        """The run's verdict as the result holds it (composed once, when the run ended); a result of an earlier
        version without one is judged now from its tests' outcomes
        (:func:`dflash_eval.metrics.verdict.stored_verdict`)."""
        return stored_verdict(self)

    @property
    def kernel_changes(self) -> list[KernelChange]:
        """The kernels the provenance's kernel probe (or the witness) found changed since the cache was made (empty:
        none, or no provenance)."""
        return [] if self.provenance is None else self.provenance.kernel_changes

    def judged(self, floors: Floors) -> RunResult:
        """This result judged again against ``floors`` (selected here: the run's prompts), as after
        ``--update-tau-floors`` rewrote them: every prompt, the mean (its floors and ``mean_passed``) and every
        category (its table made again from the prompts)."""
        floors = floors.select({p: r.category for p, r in self.prompts.items()})
        prompts = {p: dataclasses.replace(r) for p, r in self.prompts.items()}
        judge_prompts(prompts, floors)
        kw: dict[str, Any] = {"prompts": prompts}
        if self.tau is not None:
            mean = judge_mean(self.tau.mean_tau, self.tau.mean_ddtree, floors)
            kw["tau"] = tau = dataclasses.replace(self.tau, mean_floor=mean.mean_floor,
                                                  mean_ddtree_floor=mean.mean_ddtree_floor)
            refusals = [] if self.drafter is None else self.drafter.refused or []
            kw["mean_passed"] = mean_passed(refusals, tau)  # a refused drafter never passes, whatever its floors
        if prompts:
            kw["categories"] = category_rows(prompts, floors)
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        """eval.json's data: each key the result holds, in the merge's order, a plugin's keys before ``rejected`` and
        ``verdict``."""
        means = {} if self.tau is None else self.tau.to_dict()
        out: dict[str, Any] = {}
        for key in TOP_LEVEL_KEYS:
            if key == "rejected":
                out.update(self.plugin_fields)
            value = means.get(key) if key in _TAU_KEYS else plain(getattr(self, key))
            if value is not None or key in means:
                out[key] = value
        return out


def category_rows(prompts: Mapping[str, PromptRow], floors: Floors | None) -> dict[str, CategoryRow]:
    """The per-category rows of the run's prompt rows (:func:`dflash_eval.metrics.stats.category_table`), judged
    against ``floors`` (None: not judged, every floor and verdict None)."""
    cats = rows_from_dict(CategoryRow, category_table(prompts))
    judge_categories(cats, floors, ddtree_budgets(prompts))
    return cats


def _under(read: Callable[[Any], Any], key: str) -> Callable[[Any], Any]:
    """``read`` of a top-level key's value, a key a record inside it does not know or lacks named under ``key``."""
    def read_under(value: Any) -> Any:
        try:
            return read(value)
        except ResultKeyError as exc:
            raise exc.under(key) from None
    return read_under


def _rows(read: Callable[[Any], Any], key: str) -> Callable[[Any], Any]:
    """A reader of a list of records under ``key`` (:func:`~dflash_eval.session.rows.rows_from_list`)."""
    return _under(functools.partial(rows_from_list, read), key)


def _mapping(cls: type[Row], key: str) -> Callable[[Any], Any]:
    """A reader of a mapping of ``cls`` rows under ``key`` (:func:`~dflash_eval.session.rows.rows_from_dict`)."""
    return _under(functools.partial(rows_from_dict, cls), key)


def _one(cls: type[Row] | type[Verdict] | type[Speedup], key: str) -> Callable[[Any], Any]:
    return _under(cls.from_dict, key)


#: How each typed top-level key is read (the others are kept as eval.json holds them).
_READERS: dict[str, Callable[[Any], Any]] = {
    "prompts": _mapping(PromptRow, "prompts"), "categories": _mapping(CategoryRow, "categories"),
    "conversations": _mapping(ConversationRow, "conversations"), "turns": _mapping(TurnRow, "turns"),
    "drift": _rows(DriftStat.from_dict, "drift"), "drift_accept": _rows(DriftAcceptRow.from_dict, "drift_accept"),
    "drift_gate": _rows(GateCheck.from_dict, "drift_gate"), "near_ties": _rows(Divergence.from_dict, "near_ties"),
    "not_checked": _rows(NotChecked.from_dict, "not_checked"), "rejected": _rows(Rejection.from_dict, "rejected"),
    "drafter": _one(DrafterBlock, "drafter"), "fingerprint": _one(FingerprintBlock, "fingerprint"),
    "drift_budget": _one(DriftBudgetBlock, "drift_budget"), "speedup": _one(Speedup, "speedup"),
    "timings": _one(Timings, "timings"), "tests": _one(Tests, "tests"), "verdict": _one(Verdict, "verdict"),
    "baseline": _one(BaselineBlock, "baseline"), "sampled": _one(SampledBlock, "sampled"),
    "target": _one(TargetBlock, "target"), "context": _one(ContextBlock, "context"),
    "provenance": _one(ProvenanceBlock, "provenance"),
}


def _from_dict(data: Mapping[str, Any]) -> RunResult:
    if not isinstance(data, Mapping):
        raise EvalError(f"not eval.json's data (a JSON object): {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise EvalError(f"eval.json schema {data.get('schema')!r}, this version reads schema {SCHEMA}")
    names = {f.name for f in dataclasses.fields(RunResult)} - {"tau", "plugin_fields"}
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key in _TAU_KEYS:
            continue
        if key not in names:
            continue  # a plugin's (module docstring)
        if value is None:  # a key :meth:`RunResult.to_dict` leaves out while None: not eval.json's layout
            raise ResultKeyError("unknown", key)
        reader = _READERS.get(key)
        try:
            kw[key] = value if reader is None else reader(value)
        except (TypeError, AttributeError, ValueError) as exc:  # a list or a number where the layout holds another
            raise EvalError(f"key {key!r} holds a value of another type than eval.json's layout "
                            f"({type(exc).__name__}: {exc})") from None
    if "mean_tau" in data:
        kw["tau"] = TauMeans.from_dict({k: data[k] for k in _TAU_KEYS if k in data})
    else:
        stray = next((k for k in _TAU_KEYS if k in data), None)
        if stray is not None:
            raise ResultKeyError("missing", "mean_tau")
    for key in ("schema", "created", "prompts", "drift", "drift_accept", "timings", "tests"):
        if key not in data:
            raise ResultKeyError("missing", key)
    plugin = {k: v for k, v in data.items() if k not in names and k not in _TAU_KEYS}
    return RunResult(plugin_fields=plugin, **kw)

