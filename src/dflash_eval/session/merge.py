"""Merging the per-process results of a run (the controller's and every xdist worker's, each an
:class:`~dflash_eval.session.eval_result.EvalResult`) into the run's typed result
(:class:`~dflash_eval.session.run_result.RunResult`), whose :meth:`~dflash_eval.session.run_result.RunResult.to_dict`
is eval.json's data: :func:`merge` reads typed values only (a worker's JSON fragment is read once, on the controller,
by :meth:`EvalResult.from_dict <dflash_eval.session.eval_result.EvalResult.from_dict>`).

How the processes' values combine: of the blocks every process may hold (settings, target, drafter, provenance,
context, fingerprint, SGLang server, baseline, drift budget, speed-up, τ means, categories, conversations), the first
process's that has one; the prompts of every process, each once, in the order first met; the drift rows, the drift τ
rows, the drift gate's rows and the near ties de-duplicated (each process judges its own tests' prompts); each
kernel probe once, every kernel change any process noticed
(:meth:`~dflash_eval.session.run_blocks.KernelProbeBlock.merged`); each registered measurement's first non-empty
block; the stages' seconds summed, per worker and the workers' spans, with the GPU kernel compilation summed; the
counters per worker. What only the whole run knows is computed here: the pooled τ, the categories and the
conversations where no process made them, the mean over samples, the verdict of the mean, the named causes of a
failing run.

eval.json (schema 1; documented in docs/reference.md)::

    {"schema": 1, "created": ISO time, "settings": {...},
     "target": {"path", "identity", "num_layers", "hidden_size", "vocab_size", "layer_types", "dtype", "device"},
     "drafter": {"path", "fingerprint", "config"}, "provenance": {"backend", "dtype", "device", "versions",
                                                                 "kernel_probe": {"seconds", "probes", "changed",
                                                                                  "per_worker"}, ...},
     "context": {"target", "max_new_tokens", "max_blocks", "block_size", "chat_template", "thinking", "dtype",
                 "backend", "humaneval_wrapper" (only with HumanEval prompts)},
     "prompts": {id: {"category", "tau", "rounds", "accept_lengths", "histogram" (rounds per length 1..B),
                      "position_rates" (slot k accepted / rounds, k = 1..B-1), "ddtree": {budget: tau},
                      "ddtree_accept_lengths", "floor", "ddtree_floor": {budget: floor}, "prompt_tokens",
                      "completion_tokens", "passed" (true / false / null: not gated), "baseline_tau",
                      "conversation", "turn" (multi-turn prompts), "server_accept_length", "server_histogram",
                      "server_position_rates" (SGLang speculative server), "online": {"tau", "rounds",
                      "accept_lengths", "histogram", "position_rates", "tokens", "matches_reference",
                      "first_divergence"} (--online-tau)}},
     "mean_tau" (macro), "mean_floor", "mean_passed", "mean_ddtree": {budget: tau} (macro),
     "mean_ddtree_floor": {budget: floor}, "mean_tau_pooled", "mean_ddtree_pooled": {budget: tau} (pooled),
     "tau_definitions": {"macro", "pooled"} (what each τ is, and who else reports it),
     "sampled": {"prompts", "samples", "chain": {"n", "mean", "median", "ci95": [lo, hi], "ci_method",
                                                "sd_between", "sd_within"}, "ddtree": {budget: {...}},
                 "online": {...}} (--temperature > 0: Hall t CI over the prompt means; prompt rows add "samples",
                "sample_tau", "sample_ci95", "sample_ci_method", "ddtree_sample_tau"),
     "categories": {category | "all": {"n", "chain": {"n", "mean", "median", "ci95": [lo, hi], "ci_method"},
                    "ddtree": {budget: {...same...}}, "floor", "ddtree_floor": {budget: floor}, "passed",
                    "acceptance": {"chain" | "online" | "server": {"rounds", "tau", "histogram",
                                                                   "position_rates"}}}},
     "conversations": {conversation: {"category", "turns": [id], "turn_tau", "rounds", "tau", "histogram",
                                      "position_rates"}} (multi-turn prompts only),
     "turns": {k: {"chain": {"n", "mean", "median", "ci95", "ci_method"}, "acceptance": {"rounds", "tau", "histogram",
                                                                            "position_rates"}}},
     "baseline": {"path", "n", "missing", "mean_baseline", "mean_run", "mean_diff", "ci95", "ci_method", "rel_change",
                  "drop_tol", "rise_tol", "drop_passed", "rise_passed", "prompts": {id: {"baseline", "run", "delta"}}},
     "drift": [{"comparison", "prompt_id", "layer", "rel_err", "cos", "max_abs", "rel_tol", "cos_tol", "passed"}],
     "drift_accept": [{"comparison", "prompt_id", "tau_a", "tau_b", "diff", "tol", "passed", "a", "b"}],
     "drift_budget": {"drafter", "base", "n_prompts", "prompt_ids", "base_mean_tau", "base_tau": {id: tau}, "tol",
                      "safety", "seed", "ladder", "budget", "ci": [lo, hi], "ci_level", "status", "lower_bound",
                      "gate_limit", "skipped", "min_prompts", "n_measured", "selected_prompts", "conclusive", "rule",
                      "fit": {"method", "points": [{"injected_rel_err", "mean_drop", "fitted_drop"}], "status",
                              "n_prompts", "ci_level", "resamples", "crossed_share"},
                      "levels": [{"kind", "label", "nominal", "injected_rel_err", "mean_tau", "mean_drop",
                                  "drop_ci95": [lo, hi], "fitted_drop", "mean_abs_dtau", "max_abs_dtau", "within",
                                  "drop": {id: τ drop}}]}
                     (when the budget was measured or read: the drift tests),
     "drift_gate": [{"comparison", "layer", "max_rel_err", "mean_rel_err", "worst_prompt", "budget",
                     "budget_ci": [lo, hi], "safety", "margin", "lower_bound", "passed", "outcome", "decided_on"}],
     "fingerprint": {...} (when computed), "timings": {"wall_s", "sum": {stage: s}, "per_worker": {w: {...}},
     "spans": {w: [[stage, start, end]]}, "compile": {"seconds", "by_stage": {stage: s}, "kernels_compiled",
     "kernels_loaded", "kernel_cache": {"path", "source", "why"}} (GPU kernel compilation, part of the stages'
     seconds; dflash_eval.target.kernel_cache)},
     "cache": {worker: {"hits", "misses", "produced", "corrupted", ...}},
     "tests": {"counts": {outcome: n}, "outcomes": {nodeid: outcome}},
     "diagnoses": [line] (named causes of a failing run, dflash_eval.metrics.verdict.diagnoses; absent when none),
     "measurements": {name: {"summary": {...}, "rows": [[label, value], ...]}} (blocks of measurements registered
                     by plugins; of the workers' blocks of one name the first non-empty one; absent when none),
     "speedup": {"device", "device_kind", "dtype", "backend", "threads", "context_len", "block_size",
                 "plain_tokens_per_s", "costs": {part: s, ...}, "cached", "strategies": {"chain" | "ddtree-N":
                 {"strategy", "loop", "tau", "tau_ci", "round_s", "parts", "speedup", "speedup_ci", "tokens_per_s",
                 "tokens_per_s_ci"}}, "best", "best_budget", "loop": {"chain": {...}}, "assumptions", "floor",
                 "passed"} (the predicted speed-up, test_predicted_speedup, which docs/speedup.md describes),
     "near_ties": [{"prompt_id", "against" ("golden" | "teacher-forced"), "position", "absolute", "expected", "got",
                    "expected_text", "got_text", "margin", "margin_bound", "band", "dtype", "near_tie"}] (completions
                   that left their golden record or their teacher-forced argmax at a near tie of the target: not
                   failures, the tokens after them not compared; dflash_eval.metrics.near_tie; absent when none)}

A drafter refused by architecture checks adds ``"refused": [{"check", "message"}]`` to "drafter" and
``"mean_passed": false``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dflash_eval.common.progress import Compilation
from dflash_eval.metrics.acceptance_rates import TAU_DEFINITIONS, pooled_means
from dflash_eval.metrics.drift_checks import DriftStat, GateCheck
from dflash_eval.metrics.near_tie import Divergence
from dflash_eval.metrics.sampled_ci import sampled_summary
from dflash_eval.metrics.stats import conversation_table, turn_table
from dflash_eval.metrics.verdict import diagnoses, mean_passed
from dflash_eval.session.blocks import DriftAcceptRow, SampledBlock
from dflash_eval.session.rows import ConversationRow, PromptRow, TurnRow, rows_from_dict
from dflash_eval.session.run_blocks import KernelProbeBlock, ProvenanceBlock
from dflash_eval.session.run_result import (
    SCHEMA,
    Compile,
    NotChecked,
    RunResult,
    TauMeans,
    Tests,
    Timings,
    category_rows,
)

if TYPE_CHECKING:  # the process's result imports torch (its builders); the merge reads its fields only
    from dflash_eval.session.eval_result import EvalResult

__all__ = ["SCHEMA", "merge"]

T = TypeVar("T")


def _first(fragments: list[EvalResult], part: Callable[[EvalResult], T | None]) -> T | None:
    """The first process's non-empty ``part`` (None: no process has one)."""
    return next((v for f in fragments if (v := part(f))), None)


def _provenance(fragments: list[EvalResult]) -> ProvenanceBlock | None:
    """The first process's provenance with the kernel probe of every process in one
    (:meth:`~dflash_eval.session.run_blocks.KernelProbeBlock.merged`)."""
    prov = _first(fragments, lambda f: f.provenance)
    blocks = [(f.worker, f.provenance.kernel_probe) for f in fragments
              if f.provenance is not None and f.provenance.kernel_probe is not None]
    if not blocks:
        return prov
    return dataclasses.replace(prov or ProvenanceBlock(), kernel_probe=KernelProbeBlock.merged(blocks))


def _drift(fragments: list[EvalResult]) -> tuple[list[DriftStat], list[DriftAcceptRow]]:
    """The drift rows (one per comparison, prompt and layer) and the drift τ rows (per comparison and prompt)."""
    drift: dict[tuple[str, str, int], DriftStat] = {}
    accept: dict[tuple[str, str], DriftAcceptRow] = {}
    for f in fragments:
        for r in f.drift or []:
            drift[(r.comparison, r.prompt_id, r.layer)] = r
        for a in f.drift_accept or []:
            accept[(a.comparison, a.prompt_id)] = a
    return list(drift.values()), list(accept.values())


def _measurements(fragments: list[EvalResult]) -> dict[str, Any]:
    """The registered measurements' blocks: of the blocks of one name, the first non-empty one."""
    out: dict[str, Any] = {}
    for f in fragments:
        for name, block in f.measurements.items():
            if block and name not in out:
                out[name] = block
    return out


def _compile(fragments: list[EvalResult]) -> Compile | None:
    """The GPU kernel compilation of every process, summed (of their blocks as each process writes it), with the
    first process's kernel cache (None: no process compiled under a watch)."""
    done = [f for f in fragments if f.compile is not None]
    if not done:
        return None
    total = Compilation.merged([f.compile.to_dict() for f in done if f.compile is not None])
    where = next((f.kernel_cache for f in done if f.kernel_cache is not None), None)
    return Compile.from_dict({**total.to_dict(), "kernel_cache": None if where is None else where.to_dict()})


def _timings(fragments: list[EvalResult], wall_s: float | None) -> Timings:
    """The run's wall time, every stage's seconds summed over processes, per worker, the workers' spans, and the GPU
    kernel compilation inside those stages (summed, with where the kernel cache was)."""
    total: dict[str, float] = defaultdict(float)
    for f in fragments:
        for k, v in f.timings.items():
            total[k] += v
    return Timings(wall_s=None if wall_s is None else round(wall_s, 3),
                   sum={k: round(v, 3) for k, v in sorted(total.items())},
                   per_worker={f.worker: dict(f.timings) for f in fragments},
                   spans={f.worker: [list(sp) for sp in f.spans] for f in fragments if f.spans},
                   compile=_compile(fragments))


def not_checked(skipped: dict[str, str]) -> list[NotChecked]:
    """What a run did not check: its skipped suite tests grouped by reason (``reason``, ``tests``: how many, ``first``:
    one node id), in the order first met."""
    groups: dict[str, list[str]] = {}
    for nodeid, reason in skipped.items():
        groups.setdefault(reason, []).append(nodeid)
    return [NotChecked(reason=reason, tests=len(ids), first=ids[0]) for reason, ids in groups.items()]


def merge(fragments: list[EvalResult], *, outcomes: dict[str, str] | None = None,
          skipped: dict[str, str] | None = None, wall_s: float | None = None) -> RunResult:
    """The run's result of the processes' results (module docstring: identical measurements from several processes
    are de-duplicated); ``outcomes`` and ``skipped`` (node id -> skip reason) of the suite's tests go to ``tests``
    and ``not_checked``. Its ``to_dict()`` is eval.json's data (the run's end adds ``rejected`` and ``verdict``)."""
    taus = [f.tau for f in fragments if f.tau is not None]
    prompts: dict[str, PromptRow] = {}
    for t in taus:
        prompts.update(t.prompts)
    order = [p for t in taus for p in t.prompts]
    rows = {p: dataclasses.replace(prompts[p]) for p in dict.fromkeys(order)}  # the run's own rows: judged again
    drafter = _first(fragments, lambda f: f.drafter)
    refusal = _first(fragments, lambda f: None if f.drafter is None else f.drafter.refused)
    if refusal and drafter is not None:  # the first fragment may come from a process that never needed the drafter
        drafter = dataclasses.replace(drafter, refused=refusal)
    means = None
    if taus:
        first = taus[0]
        # the other τ of the same rounds: pooled over every round (mean_tau and mean_ddtree are macro means)
        pooled, pooled_dd = pooled_means(rows)
        pooled_ddtree: dict[str, float | None] = dict(pooled_dd)
        means = TauMeans(mean_tau=first.mean_tau, mean_floor=first.mean_floor, mean_ddtree=dict(first.mean_ddtree),
                         mean_ddtree_floor=dict(first.mean_ddtree_floor), mean_tau_pooled=pooled,
                         mean_ddtree_pooled=pooled_ddtree, tau_definitions=dict(TAU_DEFINITIONS))
    passed = None
    if means is not None or refusal:  # the verdict's: a refused drafter never passes
        passed = mean_passed(refusal or [], means)
    cats = _first(fragments, lambda f: None if f.tau is None else f.tau.categories)
    if cats is None and rows:
        cats = category_rows(rows, None)
    sampled = sampled_summary(rows)  # --temperature > 0: the mean over prompts of the means over samples
    convs = next((t for t in taus if t.conversations), None)
    conversations, turns = (convs.conversations, convs.turns) if convs is not None else (None, None)
    if convs is None and any(r.conversation for r in rows.values()):
        conversations = rows_from_dict(ConversationRow, conversation_table(rows))
        turns = rows_from_dict(TurnRow, turn_table(rows))
    drift, drift_accept = _drift(fragments)
    budget = _first(fragments, lambda f: f.drift_budget)
    gate: dict[tuple[str, int], GateCheck] = {(r.comparison, r.layer): r for f in fragments for r in f.drift_gate or []}
    ties: dict[tuple[str, str], Divergence] = {(d.prompt_id, d.against): d for f in fragments for d in f.near_ties}
    oc = dict(outcomes or {})
    return RunResult(
        schema=SCHEMA, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), prompts=rows, drift=drift,
        drift_accept=drift_accept, timings=_timings(fragments, wall_s),
        tests=Tests(counts=dict(Counter(oc.values())), outcomes=oc, skipped=dict(skipped or {})),
        settings=_first(fragments, lambda f: f.settings), target=_first(fragments, lambda f: f.target),
        drafter=drafter, provenance=_provenance(fragments), context=_first(fragments, lambda f: f.context),
        fingerprint=_first(fragments, lambda f: f.fingerprint), sglang=_first(fragments, lambda f: f.sglang),
        baseline=_first(fragments, lambda f: f.baseline), drift_budget=budget,
        speedup=_first(fragments, lambda f: f.speedup), tau=means, mean_passed=passed, categories=cats,
        sampled=None if sampled is None else SampledBlock.from_dict(sampled), conversations=conversations,
        turns=turns, drift_gate=list(gate.values()) if gate or budget is not None else None,
        measurements=_measurements(fragments) or None,
        near_ties=[ties[k] for k in sorted(ties)] or None,  # every process judges its own tests' prompts
        counts={f.worker: f.counts for f in fragments}, cache={f.worker: f.cache for f in fragments},
        not_checked=not_checked(skipped) if skipped else None,
        diagnoses=diagnoses(rows, means, drafter) or None)
