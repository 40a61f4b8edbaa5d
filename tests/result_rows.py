"""Whole rows for the hand-made eval.json fragments of the report tests: the reports read a run's data as one typed
result (:class:`~dflash_eval.session.run_result.RunResult`), which refuses a row that lacks a field, so a test that
cares about a few fields of a row gives those and takes the rest from here (empty rounds, no DDTree rounds, no
tokens: what changes no table, plot or verdict of the tests that use them); :func:`fragment` reads a hand-made fragment
as the process's typed result the merge takes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dflash_eval.session.eval_result import EvalResult

#: A prompt row's fields besides those a test gives (eval.json's ``prompts`` rows: PromptRow).
PROMPT_FIELDS: dict[str, Any] = {"category": "c", "tau": float("nan"), "rounds": 0, "accept_lengths": [],
                                 "histogram": [], "position_rates": [], "ddtree": {}, "ddtree_accept_lengths": {},
                                 "floor": None, "ddtree_floor": {}, "prompt_tokens": 0, "completion_tokens": 0,
                                 "passed": None}


def prompt_row(**fields: Any) -> dict[str, Any]:
    """A whole prompt row with ``fields`` (the others from :data:`PROMPT_FIELDS`)."""
    return {**PROMPT_FIELDS, **fields}


def drafter_block(path: str = "/d", fingerprint: str = "f" * 64, **more: Any) -> dict[str, Any]:
    """eval.json's ``drafter``: its path, fingerprint and (empty) config, with ``more`` (``refused``, ``step``)."""
    return {"path": path, "fingerprint": fingerprint, "config": {}, **more}


def fit_block(points: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """eval.json's ``drift_budget.fit`` with its ``points`` (the other fields: a crossed fit on one prompt)."""
    return {"method": "isotonic", "points": points, "status": "crossed", "n_prompts": 1, "ci_level": 0.9,
            "resamples": 0, "crossed_share": 1.0, **fields}


def budget_block(**fields: Any) -> dict[str, Any]:
    """eval.json's ``drift_budget`` with ``fields`` (the others: a budget of 0.1 on no prompt, no level; ``fit``: a
    dict of :func:`fit_block`'s fields, or its points under ``points``)."""
    fit = fields.pop("fit", {})
    out = {"drafter": "d" * 64, "base": "torch/float32", "n_prompts": 0, "prompt_ids": [], "base_mean_tau": 2.0,
           "base_tau": {}, "tol": 0.1, "safety": 5.0, "seed": 0, "ladder": "x1", "budget": 0.1, "ci": [0.08, 0.12],
           "ci_level": 0.9, "status": "crossed", "lower_bound": False, "gate_limit": 0.02, "skipped": [],
           "min_prompts": 0, "n_measured": 0, "selected_prompts": None, "conclusive": False, "rule": "...",
           "levels": [], **fields}
    out["fit"] = fit_block(**{"points": [], **fit})
    return out


def level_row(**fields: Any) -> dict[str, Any]:
    """One level of ``drift_budget.levels`` with ``fields`` (the others: no drop, on no prompt)."""
    return {"kind": "noise", "label": "noise", "nominal": 0.0, "injected_rel_err": 0.0, "mean_tau": 2.0,
            "mean_drop": 0.0, "drop_ci95": [0.0, 0.0], "fitted_drop": 0.0, "mean_abs_dtau": 0.0, "max_abs_dtau": 0.0,
            "within": True, "drop": {}, **fields}


def gate_row(**fields: Any) -> dict[str, Any]:
    """One ``drift_gate`` row with ``fields`` (the others: a drift of 0.004 on layer 0 against a budget of 0.1, its CI
    0.08-0.12, safety 5: a pass)."""
    out = {"comparison": "c1", "layer": 0, "max_rel_err": 0.004, "mean_rel_err": 0.004, "worst_prompt": "p0",
           "budget": 0.1, "budget_ci": [0.08, 0.12], "safety": 5.0, "margin": 25.0, "lower_bound": False,
           "passed": True, "outcome": "pass", "decided_on": "ci", **fields}
    out.setdefault("mean_rel_err", out["max_rel_err"])
    return out


def prediction(**fields: Any) -> dict[str, Any]:
    """One strategy's entry of ``speedup.strategies`` with ``fields`` (the others: the chain at τ 2, speed-up 2)."""
    return {"strategy": "chain", "loop": "server", "tau": 2.0, "tau_ci": [2.0, 2.0], "round_s": 0.01, "parts": {},
            "speedup": 2.0, "speedup_ci": [2.0, 2.0], "tokens_per_s": 200.0, "tokens_per_s_ci": [200.0, 200.0],
            **fields}


def costs_block(**fields: Any) -> dict[str, Any]:
    """eval.json's ``speedup.costs`` with ``fields`` (the others: a CPU, a step of 10 ms, a round of 20 ms's parts,
    no tree, the recompute loop's parts not timed)."""
    return {"device": "cpu", "device_kind": "cpu", "dtype": "float32", "backend": "torch", "threads": 1,
            "context_len": 64, "block_size": 8, "repeats": 3, "warmup": 1, "step": 0.01, "draft": 0.005,
            "build": 0.001, "verify": 0.012, "accept": 0.001, "commit": [0.001, 0.002], "tree_build": {},
            "tree_verify": {}, "tree_accept": {}, "draft_full": None, "snapshot": None, "project": [None, None],
            "forward_2": None, "forward_b": None, "spread": {}, "seconds": 0.5, **fields}


def speedup_block(**fields: Any) -> dict[str, Any]:
    """eval.json's ``speedup`` with ``fields`` (the others: a CPU, plain decoding at 100 tokens/s, no strategy)."""
    return {"device": "cpu", "device_kind": "cpu", "dtype": "float32", "backend": "torch", "threads": 1,
            "context_len": 64, "block_size": 8, "plain_tokens_per_s": 100.0, "costs": costs_block(), "cached": False,
            "strategies": {}, "best": None, "near_best": [], "best_budget": None, "loop": {}, "pooled": {},
            "models": {}, "assumptions": [], "floor": None, "passed": None, **fields}


def kernel_change(label: str, **fields: Any) -> dict[str, Any]:
    """One of eval.json's ``provenance.kernel_probe.changed`` with ``fields`` (the others: the witness's, on the
    torch backend in float32)."""
    return {"label": label, "backend": "torch", "dtype": "float32", "was": "a", "now": "b", "kernels": ["witness"],
            "first": "witness", "kinds": ["witness"], "what": "features", "message": f"{label} changed",
            "witness": {}, **fields}


def judged_run(**fields: Any) -> SimpleNamespace:
    """What a test run's verdict reads of its result (``dflash_eval.metrics.verdict.JudgedRun``) with ``fields``, the
    others as a result without them holds them (no τ, no drafter, no gate, no tests counted, no stored verdict)."""
    base: dict[str, Any] = {"prompts": {}, "tau": None, "mean_passed": None, "categories": None, "drafter": None,
                            "rejected": None, "baseline": None, "drift_gate": None, "speedup": None,
                            "near_ties": None, "kernel_changes": [], "tests": SimpleNamespace(counts={}),
                            "verdict": None}
    return SimpleNamespace(**{**base, **fields})


def means(mean_tau: float, mean_floor: float | None, mean_ddtree: dict | None = None,
          mean_ddtree_floor: dict | None = None) -> SimpleNamespace:
    """The τ means a verdict reads (``dflash_eval.metrics.verdict.JudgedMeans``)."""
    return SimpleNamespace(mean_tau=mean_tau, mean_floor=mean_floor, mean_ddtree=mean_ddtree or {},
                           mean_ddtree_floor=mean_ddtree_floor or {})


def fragment(**fields: Any) -> EvalResult:
    """A process's result of eval.json fragment ``fields``, read as the controller reads a worker's
    (:meth:`~dflash_eval.session.eval_result.EvalResult.from_dict`): worker ``master``, empty settings, timings,
    counts and cache unless ``fields`` give them."""
    return EvalResult.from_dict({"worker": "master", "settings": {}, "timings": {}, "counts": {}, "cache": {},
                                 **fields})
