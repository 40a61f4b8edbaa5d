"""Merging the per-process results of a run (the controller's and every xdist worker's) into eval.json's data.

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

import json
import time
from collections import Counter, defaultdict
from typing import Any

from dflash_eval.common.progress import Compilation
from dflash_eval.errors import ResultKeyError
from dflash_eval.metrics.acceptance_rates import TAU_DEFINITIONS, pooled_means
from dflash_eval.metrics.sampled_ci import sampled_summary
from dflash_eval.metrics.stats import conversation_table, turn_table
from dflash_eval.metrics.verdict import diagnoses, mean_passed
from dflash_eval.session.blocks import DrafterBlock, Refusal
from dflash_eval.session.rows import ConversationRow, PromptRow, TurnRow, rows_from_dict, rows_to_dict
from dflash_eval.session.run_result import SCHEMA, TauMeans, category_rows

__all__ = ["SCHEMA", "merge"]

#: The τ means the τ tests write, read together as the result's :class:`TauMeans` with the pooled means.
_MEANS = ("mean_tau", "mean_floor", "mean_ddtree", "mean_ddtree_floor")


def _kernel_probes(fragments: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Every process's ``provenance.kernel_probe`` in one: each (backend, dtype, probe shape) probe once (every
    process probes its own kernels), every kernel change any process noticed, the probe time per worker."""
    found = [(f.get("worker", "?"), (f.get("provenance") or {}).get("kernel_probe")) for f in fragments]
    blocks: list[tuple[str, dict[str, Any]]] = [(w, b) for w, b in found if b]
    if not blocks:
        return None
    probes: dict[tuple[str, str, str], Any] = {}
    changed: dict[tuple[str, str], Any] = {}
    for _, b in blocks:
        for p in b.get("probes", []):
            probes.setdefault((p.get("backend"), p.get("dtype"), json.dumps(p.get("shape"), sort_keys=True)), p)
        for c in b.get("changed", []):
            changed.setdefault((c.get("label"), c.get("was")), c)
    return {"seconds": max(b.get("seconds", 0.0) for _, b in blocks), "probes": list(probes.values()),
            "changed": list(changed.values()), "per_worker": {w: b.get("seconds", 0.0) for w, b in blocks}}


def _drift(fragments: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The drift rows (one per comparison, prompt and layer) and the drift τ rows (per comparison and prompt)."""
    drift: dict[tuple, Any] = {}
    accept: dict[tuple, Any] = {}
    for f in fragments:
        for r in f.get("drift", []):
            drift[(r["comparison"], r["prompt_id"], r["layer"])] = r
        for r in f.get("drift_accept", []):
            accept[(r["comparison"], r["prompt_id"])] = r
    return list(drift.values()), list(accept.values())


def _measurements(fragments: list[dict[str, Any]]) -> dict[str, Any]:
    """The registered measurements' blocks: of the blocks of one name, the first non-empty one."""
    out: dict[str, Any] = {}
    for f in fragments:
        for name, block in (f.get("measurements") or {}).items():
            if block and name not in out:
                out[name] = block
    return out


def _timings(fragments: list[dict[str, Any]], wall_s: float | None) -> dict[str, Any]:
    """The run's wall time, every stage's seconds summed over processes, per worker, the workers' spans, and the GPU
    kernel compilation inside those stages (summed, with where the kernel cache was)."""
    total: dict[str, float] = defaultdict(float)
    for f in fragments:
        for k, v in f.get("timings", {}).items():
            total[k] += v
    out = {"wall_s": None if wall_s is None else round(wall_s, 3),
           "sum": {k: round(v, 3) for k, v in sorted(total.items())},
           "per_worker": {f.get("worker", "?"): f.get("timings", {}) for f in fragments},
           "spans": {f.get("worker", "?"): f.get("spans", []) for f in fragments if f.get("spans")}}
    blocks = [f["compile"] for f in fragments if f.get("compile")]
    if blocks:
        cache = next((b["kernel_cache"] for b in blocks if b.get("kernel_cache")), None)
        out["compile"] = {**Compilation.merged(blocks).to_dict(), "kernel_cache": cache}
    return out


def not_checked(skipped: dict[str, str]) -> list[dict[str, Any]]:
    """What a run did not check: its skipped suite tests grouped by reason (``reason``, ``tests``: how many, ``first``:
    one node id), in the order first met."""
    groups: dict[str, list[str]] = {}
    for nodeid, reason in skipped.items():
        groups.setdefault(reason, []).append(nodeid)
    return [{"reason": reason, "tests": len(ids), "first": ids[0]} for reason, ids in groups.items()]


def merge(fragments: list[dict[str, Any]], *, outcomes: dict[str, str] | None = None,
          skipped: dict[str, str] | None = None, wall_s: float | None = None) -> dict[str, Any]:
    """Merge per-process fragments (identical measurements from several workers are de-duplicated); ``outcomes``
    and ``skipped`` (node id -> skip reason) of the suite's tests go to ``tests`` and ``not_checked``."""
    out: dict[str, Any] = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for key in ("settings", "target", "drafter", "provenance", "context", "fingerprint", "sglang", "baseline",
                "drift_budget", "speedup"):
        for f in fragments:
            if f.get(key):
                out[key] = f[key]
                break
    prompts: dict[str, Any] = {}
    for f in fragments:
        prompts.update(f.get("prompts", {}))
    order = [p for f in fragments for p in f.get("prompts", {})]
    out["prompts"] = {p: prompts[p] for p in dict.fromkeys(order)}
    try:  # the merged rows, read as the result's typed rows: the statistics and the verdict read nothing else
        rows = rows_from_dict(PromptRow, out["prompts"])
    except ResultKeyError as exc:
        raise exc.under("prompts") from None
    for key in _MEANS:
        for f in fragments:
            if key in f:
                out[key] = f[key]
                break
    refusal = next((f["drafter"]["refused"] for f in fragments if (f.get("drafter") or {}).get("refused")), None)
    if refusal:  # the first fragment may come from a process that never needed the drafter
        out["drafter"] = {**out.get("drafter", {}), "refused": refusal}
    means = None
    if "mean_tau" in out:
        # the other τ of the same rounds: pooled over every round (mean_tau and mean_ddtree are macro means)
        pooled, pooled_ddtree = pooled_means(rows)
        means = TauMeans.from_dict({**{k: out[k] for k in _MEANS}, "mean_tau_pooled": pooled,
                                    "mean_ddtree_pooled": pooled_ddtree, "tau_definitions": dict(TAU_DEFINITIONS)})
    if means is not None or refusal:  # the verdict's: a refused drafter never passes
        out["mean_passed"] = mean_passed([Refusal.from_dict(r) for r in refusal or []], means)
    if means is not None:
        out["mean_tau_pooled"], out["mean_ddtree_pooled"] = means.mean_tau_pooled, means.mean_ddtree_pooled
        out["tau_definitions"] = means.tau_definitions
    cats = next((f["categories"] for f in fragments if f.get("categories")), None)
    if cats is None and rows:
        cats = rows_to_dict(category_rows(rows, None))
    if cats is not None:
        out["categories"] = cats
    sampled = sampled_summary(rows)  # --temperature > 0: the mean over prompts of the means over samples
    if sampled is not None:
        out["sampled"] = sampled
    convs = next((f for f in fragments if f.get("conversations")), None)
    if convs is not None:
        out["conversations"], out["turns"] = convs["conversations"], convs.get("turns", {})
    elif any(r.conversation for r in rows.values()):
        out["conversations"] = rows_to_dict(rows_from_dict(ConversationRow, conversation_table(rows)))
        out["turns"] = rows_to_dict(rows_from_dict(TurnRow, turn_table(rows)))
    out["drift"], out["drift_accept"] = _drift(fragments)
    probes = _kernel_probes(fragments)
    if probes is not None:
        out["provenance"] = {**out.get("provenance", {}), "kernel_probe": probes}
    gate = {(r["comparison"], r["layer"]): r for f in fragments for r in f.get("drift_gate", [])}
    if gate or "drift_budget" in out:
        out["drift_gate"] = list(gate.values())
    measurements = _measurements(fragments)
    if measurements:
        out["measurements"] = measurements
    ties = {(d["prompt_id"], d["against"]): d for f in fragments for d in f.get("near_ties") or []}
    if ties:  # every process judges its own tests' prompts: one row per prompt and comparison
        out["near_ties"] = [ties[k] for k in sorted(ties)]
    out["timings"] = _timings(fragments, wall_s)
    out["counts"] = {f.get("worker", "?"): f.get("counts", {}) for f in fragments}
    out["cache"] = {f.get("worker", "?"): f.get("cache", {}) for f in fragments}
    oc = dict(outcomes or {})
    out["tests"] = {"counts": dict(Counter(oc.values())), "outcomes": oc, "skipped": dict(skipped or {})}
    if skipped:
        out["not_checked"] = not_checked(skipped)
    drafter = DrafterBlock.from_dict(out["drafter"]) if out.get("drafter") else None
    named = diagnoses(rows, means, drafter)
    if named:
        out["diagnoses"] = named
    return out
