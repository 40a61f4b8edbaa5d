"""The fifth stage: everything one process measured, as one typed object that turns into eval.json's fields.

:func:`build_result` reads the earlier stages (it never computes: what was not asked for during the run is left
out) and judges τ through :mod:`dflash_eval.metrics.verdict`. Under pytest-xdist each worker sends its
:meth:`EvalResult.to_dict` to the controller as JSON, which reads it back once (:meth:`EvalResult.from_dict`,
strictly: a key a fragment does not know is one :class:`~dflash_eval.errors.ResultKeyError` naming it) and merges
the typed results of every process into the run's (:func:`dflash_eval.session.merge.merge`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_eval.common.progress import Compilation
from dflash_eval.common.workdir import run_location
from dflash_eval.errors import DFlashEvalError, ResultKeyError
from dflash_eval.measurements.drafter_evaluation import DrafterEvaluation, PromptTau
from dflash_eval.measurements.online_greedy import OnlineTau
from dflash_eval.measurements.round_costs import ROUND_COSTS
from dflash_eval.metrics.acceptance_rates import acceptance_block, histogram, pooled_means, position_rates
from dflash_eval.metrics.baseline import BaselineComparison
from dflash_eval.metrics.drift_budget import impact
from dflash_eval.metrics.drift_checks import DriftStat, GateCheck
from dflash_eval.metrics.floors import Floors
from dflash_eval.metrics.near_tie import Divergence
from dflash_eval.metrics.sampled_tau import SampledTau, sample_row
from dflash_eval.metrics.speedup import Speedup, speedup_block
from dflash_eval.metrics.stats import conversation_table, turn_table
from dflash_eval.metrics.tau_result import TauResult, macro_tau
from dflash_eval.metrics.verdict import (
    SpeedupCheck,
    Verdict,
    checkpoint_verdict,
    judge_prompts,
    mean_thresholds,
    speedup_floor_part,
    tau_agrees,
)
from dflash_eval.prompts import Prompt
from dflash_eval.references.greedy import CompletionRecord
from dflash_eval.references.token_pieces import decode_pieces
from dflash_eval.session.blocks import (
    BaselineBlock,
    DrafterBlock,
    DriftAcceptRow,
    DriftBudgetBlock,
    FingerprintBlock,
    Refusal,
)
from dflash_eval.session.rows import (
    CategoryRow,
    ConversationRow,
    PromptRow,
    TurnRow,
    rows_from_dict,
    rows_from_list,
    rows_to_dict,
)
from dflash_eval.session.run_blocks import ContextBlock, ProvenanceBlock, TargetBlock
from dflash_eval.session.run_result import category_rows
from dflash_eval.target.kernel_cache import KernelCacheDir
from dflash_eval.target.provenance import provenance

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["EvalResult", "TauSummary", "JsonBlock", "build_result", "prompt_rows", "tau_summary", "speedup_summary"]


#: The result's blocks whose layout belongs to another part of the suite, carried as eval.json holds them: the
#: settings (:mod:`dflash_eval.options`), the cache's counters, the SGLang server's description and the registered
#: measurements' own blocks.
JsonBlock = dict[str, Any]


@dataclass
class TauSummary:
    """τ of a run: judged per-prompt rows (eval.json's ``prompts``), the macro means and their floors, the
    per-category table, and for multi-turn conversations the per-conversation and per-turn tables."""

    prompts: dict[str, PromptRow]
    mean_tau: float
    mean_ddtree: dict[str, float]
    mean_floor: float | None
    mean_ddtree_floor: dict[str, float | None]
    categories: dict[str, CategoryRow]
    baseline: BaselineComparison | None = None
    conversations: dict[str, ConversationRow] = field(default_factory=dict)
    turns: dict[str, TurnRow] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {"prompts": rows_to_dict(self.prompts), "mean_tau": self.mean_tau, "mean_ddtree": dict(self.mean_ddtree),
               "mean_floor": self.mean_floor, "mean_ddtree_floor": dict(self.mean_ddtree_floor),
               "categories": rows_to_dict(self.categories)}
        if self.conversations:
            out["conversations"], out["turns"] = rows_to_dict(self.conversations), rows_to_dict(self.turns)
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_json()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TauSummary:
        """The τ fields of eval.json data (or of :meth:`to_dict`): the prompts and the means are needed (a missing one
        is a ResultKeyError naming it), the categories, conversations and turns may be left out (empty: the merge
        makes them from the prompts); the baseline comparison is not read back (:attr:`EvalResult.baseline` is)."""
        missing = next((k for k in _TAU_NEEDED if k not in data), None)
        if missing is not None:
            raise ResultKeyError("missing", missing)
        rows: dict[str, Any] = {}
        for key, row in (("prompts", PromptRow), ("categories", CategoryRow), ("conversations", ConversationRow),
                         ("turns", TurnRow)):
            try:
                rows[key] = rows_from_dict(row, data.get(key) or {})
            except ResultKeyError as exc:
                raise exc.under(key) from None
        return cls(rows["prompts"], data["mean_tau"], dict(data["mean_ddtree"]), data["mean_floor"],
                   dict(data["mean_ddtree_floor"]), rows["categories"], None, rows["conversations"], rows["turns"])

    def verdict(self, floors: Floors, *, floors_required: bool = True,
                speedup: SpeedupCheck | None = None) -> Verdict:
        """The checkpoint's verdict: this τ against ``floors`` and the baseline, and the predicted speed-up
        (``speedup``: the result's :class:`~dflash_eval.metrics.speedup.Speedup`) against ``--speedup-floor``
        (:func:`dflash_eval.metrics.verdict.checkpoint_verdict`; ``floors_required`` False: the floors unjudged, not
        failed, when there are none)."""
        means = mean_thresholds(self.mean_tau, self.mean_ddtree, floors)
        return checkpoint_verdict(self.prompts, means, floors, self.baseline, speedup=speedup,
                                  floors_required=floors_required)


#: The τ fields a fragment with τ holds (:meth:`TauSummary.from_dict`), and those it may leave out.
_TAU_NEEDED = ("prompts", "mean_tau", "mean_ddtree", "mean_floor", "mean_ddtree_floor")
_TAU_KEYS = (*_TAU_NEEDED, "categories", "conversations", "turns")
#: A fragment's keys (:meth:`EvalResult.to_dict`) that every process writes.
_FRAGMENT_NEEDED = ("worker", "settings", "timings", "counts", "cache")
#: The compilation block's keys (:meth:`EvalResult.to_dict`: the process's compilation and its kernel cache).
_COMPILE_KEYS = ("seconds", "by_stage", "kernels_compiled", "kernels_loaded", "kernel_cache")


def _list_of(read: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    """A reader of a list of records (:func:`~dflash_eval.session.rows.rows_from_list`: a bad key named under its
    index)."""
    return functools.partial(rows_from_list, read)


def _compile(block: Mapping[str, Any]) -> tuple[Compilation, KernelCacheDir | None]:
    ResultKeyError.check(block, _COMPILE_KEYS)
    cache = block["kernel_cache"]
    return Compilation.from_dict(dict(block)), None if cache is None else KernelCacheDir.from_dict(cache)


#: How each of a fragment's typed keys is read (the others are kept as the fragment holds them).
_READERS: dict[str, Callable[[Any], Any]] = {
    "target": TargetBlock.from_dict, "provenance": ProvenanceBlock.from_dict, "drafter": DrafterBlock.from_dict,
    "context": ContextBlock.from_dict, "baseline": BaselineBlock.from_dict, "drift": _list_of(DriftStat.from_dict),
    "drift_accept": _list_of(DriftAcceptRow.from_dict), "drift_budget": DriftBudgetBlock.from_dict,
    "drift_gate": _list_of(GateCheck.from_dict), "fingerprint": FingerprintBlock.from_dict,
    "speedup": Speedup.from_dict, "near_ties": _list_of(Divergence.from_dict), "compile": _compile,
    "spans": _list_of(tuple), "errors": list, "measurements": dict,
}
#: Every key of a fragment, in the order :meth:`EvalResult.to_dict` writes them.
_FRAGMENT_KEYS = ("worker", "settings", "timings", "counts", "cache", "errors", "spans", "sglang", "target",
                  "provenance", "drafter", "context", *_TAU_KEYS, "baseline", "drift", "drift_accept", "drift_budget",
                  "drift_gate", "fingerprint", "measurements", "speedup", "near_ties", "compile")


@dataclass
class EvalResult:
    """What one process measured (see module docstring); optional parts are None when not computed. The target, the
    provenance (the kernel probe of this process: no ``per_worker``), the τ-relevant context, the ``--baseline``
    comparison (``baseline``: its eval.json block, read back from a fragment too; ``tau.baseline`` is the live
    comparison, in the process that made it) and the predicted speed-up are the typed blocks the run's result holds
    (:mod:`dflash_eval.session.run_result`)."""

    worker: str
    settings: JsonBlock
    timings: dict[str, float]
    counts: dict[str, int]
    cache: JsonBlock
    errors: list[str] = field(default_factory=list)
    sglang: JsonBlock | None = None
    target: TargetBlock | None = None
    provenance: ProvenanceBlock | None = None
    drafter: DrafterBlock | None = None
    context: ContextBlock | None = None
    tau: TauSummary | None = None
    baseline: BaselineBlock | None = None
    drift: list[DriftStat] | None = None
    drift_accept: list[DriftAcceptRow] | None = None
    drift_budget: DriftBudgetBlock | None = None
    drift_gate: list[GateCheck] | None = None
    fingerprint: FingerprintBlock | None = None
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    measurements: dict[str, JsonBlock] = field(default_factory=dict)  # registered measurements' own blocks
    speedup: Speedup | None = None  # the predicted speed-up (dflash_eval.metrics.speedup.speedup_block)
    near_ties: list[Divergence] = field(default_factory=list)  # completions that left a comparison at a near tie
    compile: Compilation | None = None  # GPU kernel compilation in this process, by stage
    kernel_cache: KernelCacheDir | None = None  # where compiled kernels were kept (target.kernel_cache)

    def to_dict(self) -> dict[str, Any]:
        """eval.json's fields for this process (a fragment, before merging across workers)."""
        out: dict[str, Any] = {"worker": self.worker, "settings": self.settings, "timings": self.timings,
                               "counts": self.counts, "cache": self.cache, "errors": list(self.errors),
                               "spans": [list(sp) for sp in self.spans]}
        for key in ("sglang", "target", "provenance", "drafter", "context"):
            value = getattr(self, key)
            if value:
                out[key] = value if key == "sglang" else value.to_dict()
        if self.tau is not None:
            out.update(self.tau.to_dict())
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict()
        if self.drift is not None:
            out["drift"] = [r.to_dict() for r in self.drift]
            out["drift_accept"] = None if self.drift_accept is None else [r.to_dict() for r in self.drift_accept]
        if self.drift_budget is not None:
            out["drift_budget"] = self.drift_budget.to_dict()
            out["drift_gate"] = [r.to_dict() for r in self.drift_gate or []]
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint.to_dict()
        if self.measurements:
            out["measurements"] = self.measurements
        if self.speedup is not None:
            out["speedup"] = self.speedup.to_dict()
        if self.near_ties:
            out["near_ties"] = [d.to_dict() for d in self.near_ties]
        if self.compile is not None:
            out["compile"] = {**self.compile.to_dict(),
                              "kernel_cache": None if self.kernel_cache is None else self.kernel_cache.to_dict()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalResult:
        """A process's result from its :meth:`to_dict` fragment, read strictly: ResultKeyError naming the first key
        the fragment does not know, a key every fragment holds that it lacks (``worker``, ``settings``, ``timings``,
        ``counts``, ``cache``) or the path of a key inside a typed block. Its τ is read whole (the prompts with the
        means: :meth:`TauSummary.from_dict`) or not at all; a key held as null is a part not computed."""
        ResultKeyError.check(data, _FRAGMENT_KEYS, [k for k in _FRAGMENT_KEYS if k not in _FRAGMENT_NEEDED])
        kw: dict[str, Any] = {}
        for key, read in _READERS.items():
            if data.get(key) is not None:
                try:
                    kw[key] = read(data[key])
                except ResultKeyError as exc:
                    raise exc.under(key) from None
        if "compile" in kw:
            kw["compile"], kw["kernel_cache"] = kw["compile"]
        if any(k in data for k in _TAU_KEYS):
            kw["tau"] = TauSummary.from_dict(data)
        return cls(worker=data["worker"], settings=data["settings"], timings=data["timings"], counts=data["counts"],
                   cache=data["cache"], sglang=data.get("sglang"), **kw)


def _no_tokenizer() -> PreTrainedTokenizerBase:
    raise ValueError("a reference without its token pieces, and no tokenizer to decode them")


def _online_row(o: OnlineTau) -> dict[str, Any]:
    row = {**acceptance_block(histogram(o.tau.accept_lengths, o.tau.block_size)),
           "accept_lengths": o.tau.accept_lengths, "tokens": o.tokens, "matches_reference": o.matches_reference,
           "first_divergence": o.first_divergence}
    if isinstance(o.tau, SampledTau):  # at temperature > 0: the mean over the samples, as the offline τ
        row.update(tau=o.tau.tau, samples=len(o.tau.samples), sample_tau=o.tau.sample_taus)
    return row


def completion_rows(r: PromptTau, refs: list[CompletionRecord],
                    tokenizer: Callable[[], PreTrainedTokenizerBase]) -> list[dict[str, Any]]:
    """The ``completions`` of a prompt row: each reference of ``refs`` (the greedy one, or the sampled ones in sample
    order) with the rounds τ was measured on it (:class:`~dflash_eval.session.rows.CompletionRow`); ``tokenizer``
    decodes the pieces of an entry written before they were recorded."""
    def per_sample(t: TauResult) -> list[TauResult]:
        return list(t.samples) if isinstance(t, SampledTau) else [t]

    chains, dd = per_sample(r.chain), {str(b): per_sample(t) for b, t in r.ddtree.items()}
    if len(chains) != len(refs) or any(len(v) != len(refs) for v in dd.values()):
        raise ValueError(f"prompt {r.prompt_id!r}: τ measured on {len(chains)} references, {len(refs)} given")
    out = []
    for k, (rec, chain) in enumerate(zip(refs, chains)):
        text, pieces = rec.text, rec.pieces
        if pieces is None or len(pieces) != len(rec.output_ids):  # an entry written before pieces were recorded
            text, pieces = decode_pieces(tokenizer(), rec.output_ids)
        row: dict[str, Any] = {"sample": k if rec.sample is None else rec.sample, "source": rec.source,
                               "ids": list(rec.output_ids), "text": text, "pieces": list(pieces),
                               "accept_lengths": list(chain.accept_lengths), "tau": chain.tau,
                               "ddtree": {b: v[k].tau for b, v in dd.items()},
                               "ddtree_accept_lengths": {b: list(v[k].accept_lengths) for b, v in dd.items()}}
        if rec.seed is not None:
            row["seed"] = rec.seed
        out.append(row)
    return out


def prompt_rows(results: dict[str, PromptTau], floors: Floors,
                completions: dict[str, CompletionRecord] | None = None,
                baseline: BaselineComparison | None = None, prompts: dict[str, Prompt] | None = None,
                online: dict[str, OnlineTau] | None = None,
                references: dict[str, list[CompletionRecord]] | None = None,
                tokenizer: Callable[[], PreTrainedTokenizerBase] | None = None) -> dict[str, PromptRow]:
    """eval.json's judged ``prompts`` rows, typed; ``completions`` adds an SGLang server's own accept length (and
    histogram), ``baseline`` the baseline's τ of the prompt, ``prompts`` the conversation and turn of a multi-turn
    prompt and its text, ``online`` the online loop's rounds, ``references`` the references τ was measured on (the
    greedy one, or the sampled ones) with their rounds (:func:`completion_rows`; ``tokenizer``: for entries written
    before pieces were recorded)."""
    out = {}
    for pid, r in results.items():
        hist = r.chain.histogram
        out[pid] = {
            "category": r.category, "tau": r.chain.tau, "rounds": r.chain.rounds,
            "accept_lengths": r.chain.accept_lengths, "histogram": hist, "position_rates": position_rates(hist),
            "ddtree": {str(b): t.tau for b, t in r.ddtree.items()},
            "ddtree_accept_lengths": {str(b): t.accept_lengths for b, t in r.ddtree.items()},
            "floor": None, "ddtree_floor": {}, "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens, "passed": False,
        }
        out[pid].update(sample_row(r.chain, r.ddtree))  # a sampled run's samples (nothing at temperature 0)
        rec = (completions or {}).get(pid)
        if rec is not None and rec.spec_accept_length is not None:  # the server ran the drafter itself
            out[pid]["server_accept_length"] = rec.spec_accept_length
        if rec is not None and rec.spec_accept_histogram:
            out[pid]["server_histogram"] = list(rec.spec_accept_histogram)
            out[pid]["server_position_rates"] = position_rates(rec.spec_accept_histogram)
        p = (prompts or {}).get(pid)
        if p is not None and p.conversation is not None:
            out[pid]["conversation"], out[pid]["turn"] = p.conversation, p.turn
        if online is not None and pid in online:
            out[pid]["online"] = _online_row(online[pid])
        if baseline is not None and pid in baseline.deltas:
            out[pid]["baseline_tau"] = baseline.deltas[pid][0]
        refs = (references or {}).get(pid)
        if refs:
            out[pid]["prompt_ids"] = list(refs[0].prompt_ids)
            if p is not None:
                out[pid]["prompt_text"] = p.text
            out[pid]["completions"] = completion_rows(r, refs, tokenizer or _no_tokenizer)
    rows = rows_from_dict(PromptRow, out)
    judge_prompts(rows, floors)
    return rows


def tau_summary(ev: DrafterEvaluation, floors: Floors, baseline: BaselineComparison | None = None,
                online: dict[str, OnlineTau] | None = None) -> TauSummary:
    """Judge ``ev``'s τ against ``floors`` (and note each prompt's baseline τ and, given, its online τ)."""
    res = ev.tau_results
    known = {p: r for p in res if (r := ev.references.known(p)) is not None}
    refs = ev.sampled_references.records() if ev.sampled else {p: [r] for p, r in known.items()}
    rows = prompt_rows(res, floors, known, baseline, ev.inputs.prompt_by_id, online, refs,
                       lambda: ev.inputs.tokenizer)
    budgets = tuple(ev.settings.ddtree_budget)
    mean_tau = macro_tau([r.chain for r in res.values()])
    mean_ddtree = {str(b): macro_tau([r.ddtree[b] for r in res.values()]) for b in budgets}
    means = mean_thresholds(mean_tau, mean_ddtree, floors)
    return TauSummary(rows, mean_tau, mean_ddtree, means[0].floor,
                      {t.label.removeprefix("DDTree-"): t.floor for t in means[1:]}, category_rows(rows, floors),
                      baseline, rows_from_dict(ConversationRow, conversation_table(rows)),
                      rows_from_dict(TurnRow, turn_table(rows)))


def speedup_summary(ev: DrafterEvaluation, tau: TauSummary) -> Speedup:
    """eval.json's ``speedup``: the predicted speed of every strategy from the round costs timed on the run's device
    (the ``round_costs`` measurement, timed now unless cached) and the mean τ with its CI over prompts, judged against
    ``--speedup-floor`` (:func:`dflash_eval.metrics.speedup.speedup_block`, the typed block itself)."""
    costs, cached = ev.measure(ROUND_COSTS)
    every = tau.categories.get("all")
    chain = (tau.mean_tau, every.chain.ci95 if every is not None else None)
    ddtree = {int(b): (v, every.ddtree[b].ci95 if every is not None and b in every.ddtree else None)
              for b, v in tau.mean_ddtree.items()}
    pooled, pooled_dd = pooled_means(tau.prompts)
    speedup = speedup_block(costs, chain, ddtree, floor=ev.settings.speedup_floor, cached=cached,
                            pooled={"chain": pooled, **{f"ddtree-{b}": v for b, v in pooled_dd.items()}})
    part = speedup_floor_part(speedup)  # the floor's verdict, kept beside the prediction
    return dataclasses.replace(speedup, passed=None if part is None else part.passed)


def _drift_rows(ev: DrafterEvaluation) -> tuple[list[DriftStat], list[DriftAcceptRow]]:
    rows: list[DriftStat] = []
    acc: list[DriftAcceptRow] = []
    for name, d in ev.drifts.items():
        c = d.comparison
        for per in d.stats.values():
            rows.extend(per.values())
        for pid, (a, b) in d.accept.items():
            acc.append(DriftAcceptRow(comparison=name, prompt_id=pid, tau_a=a, tau_b=b, diff=abs(a - b),
                                      tol=c.accept_tol, passed=tau_agrees(a, b, c.accept_tol), a=c.a.label,
                                      b=c.b.label))
    return rows, acc


def _with_witness_impact(ev: DrafterEvaluation, kernel_probe: dict[str, Any]) -> dict[str, Any]:
    """``provenance.kernel_probe`` with the τ impact of every witness mismatch (its layer's relative error against
    the drafter's drift budget, measured now if it was not) added to its entry and message."""
    changed = [dict(c) for c in kernel_probe.get("changed", [])]
    for c in changed:
        if isinstance(c.get("witness"), dict) and c["witness"].get("what", "features") == "features":
            try:
                c["tau_impact"] = impact(float(c["witness"]["rel_err"]), ev.drift_budget())
            except DFlashEvalError as exc:
                c["tau_impact"] = f"τ impact: unknown (the drift budget could not be measured: {exc})"
            c["message"] = f"{c['message']}; {c['tau_impact']}"
    return {**kernel_probe, "changed": changed}


def build_result(ev: DrafterEvaluation, *, tau: TauSummary | None = None, sglang: dict[str, Any] | None = None,
                 fingerprint: dict[str, Any] | FingerprintBlock | None = None,
                 context: dict[str, Any] | None = None) -> EvalResult:
    """The result of one process from what its stages computed (``tau``: the judged τ, when computed;
    ``context``: the τ-relevant settings, when known)."""
    inp = ev.inputs
    s = inp.settings
    target = inp.describe_target()
    prov = None
    if target:
        prov = provenance(backend=s.feature_backend, dtype=s.torch_dtype, device=s.torch_device, **run_location())
        if ev.store.probes.results:  # the kernels the features' keys carry
            prov["kernel_probe"] = _with_witness_impact(ev, ev.store.probes.to_json())
        if ev.store.witness.checks:  # the live features compared with the cache
            prov["witness"] = ev.store.witness.to_json()
    result = EvalResult(
        worker=inp.worker_id, settings=s.to_dict(), timings={k: round(v, 4) for k, v in inp.meter.timings.items()},
        counts=dict(inp.meter.counts), spans=list(inp.meter.spans), cache=inp.cache.stats.to_dict(),
        sglang=sglang or None, target=TargetBlock.from_dict(target) if target else None,
        provenance=None if prov is None else ProvenanceBlock.from_dict(prov), tau=tau,
        context=ContextBlock.from_dict(context) if context else None,
        baseline=None if tau is None or tau.baseline is None else BaselineBlock.from_dict(tau.baseline.to_json()),
        fingerprint=FingerprintBlock.from_dict(fingerprint) if isinstance(fingerprint, dict) else fingerprint,
        compile=inp.meter.compilation, kernel_cache=inp.kernel_cache)
    result.near_ties = ev.references.argmax.near_ties()
    if ev.checkpoint_read:
        ck = ev.checkpoint
        result.drafter = DrafterBlock(path=str(ck.source), fingerprint=ck.fingerprint, config=ck.config.to_dict())
        if ev.refusal_known and ev.refusal is not None:  # the architecture checks that refused it
            result.drafter.refused = [Refusal(check=n, message=m) for n, m in ev.refusal.checks]
    if ev.drifts:
        result.drift, result.drift_accept = _drift_rows(ev)
    if tau is not None and ev.runner.computed(ROUND_COSTS):  # the speed-up test (or the Evaluator) timed a round
        result.speedup = speedup_summary(ev, tau)
    if ev.budget_computed:
        result.drift_budget = DriftBudgetBlock.of(ev.drift_budget())
        result.drift_gate = [g for name in ev.drifts for g in ev.drift_gate(name).values()]
    return result
