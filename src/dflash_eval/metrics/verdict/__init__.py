"""The verdict: τ against its floors and every other gate part, composed into one object. The only place a measured
number is compared with its floor, budget, tolerance or band, and the only place a part is decided or a verdict
composed; the τ tests, the drift checks, the reports, the gate CLI, pytest's exit status and the training history
all ask this package.

- :mod:`.rules`: each comparison of a measured number with its threshold (τ with its floor, the change against a
  baseline with its tolerances, drift with its tolerances and the budget's CI, a near tie's margin with its band).
- :mod:`.core`: :class:`Part`, :class:`Verdict`, :func:`compose`, the part names, the gate's aggregate.
- :mod:`.tau_rules`: a checkpoint's verdict (τ against its floors, ``--baseline``, ``--speedup-floor``; the gate's
  table, gate.json, the training history and its trackers) and the judged fields of the run's typed τ rows.
- :mod:`.run`: a test run's verdict from its typed result (:data:`RUN_PARTS`; :class:`JudgedRun` says what it
  reads, :class:`~dflash_eval.session.run_result.RunResult` is one), stored in eval.json's ``verdict`` and read
  back by :func:`stored_verdict`; the named causes of a failing run (:func:`diagnoses`). The verdict reads typed
  values only, never eval.json's dict: the protocols say what it reads, the session's rows are what it is given.

Every public name is importable from here (``from dflash_eval.metrics.verdict import compose``).
"""

from __future__ import annotations

from dflash_eval.metrics.verdict.core import (
    BASELINE,
    CHECKPOINT,
    DRIFT_GATE,
    EXIT_STATUS,
    FLOORS,
    KERNELS,
    NEAR_TIES,
    PLATEAU,
    PLUGINS,
    REFUSAL,
    REGRESSION,
    REPORTS,
    SPEEDUP_FLOOR,
    TESTS,
    Gated,
    Part,
    Verdict,
    compose,
    gating_pass,
    notice,
    parts_from_dicts,
    reasons_part,
)
from dflash_eval.metrics.verdict.rules import (
    FAIL,
    INCONCLUSIVE,
    NO_ACCEPTANCE,
    NO_ACCEPTANCE_EPS,
    NO_ACCEPTANCE_MAX_EXCESS,
    NO_ACCEPTANCE_TOKENS,
    PASS,
    VACUOUS_FLOOR,
    Threshold,
    against,
    drift_holds,
    drift_outcome,
    drop_holds,
    fit_within,
    gained,
    in_ci,
    is_near_tie,
    no_acceptance,
    overall,
    passes,
    regressed,
    rise_holds,
    sketch_changed,
    stat_moved,
    tau_agrees,
    within_bound,
    within_estimate,
)
from dflash_eval.metrics.verdict.run import (
    EXIT_PARTS,
    RUN_PARTS,
    GateRow,
    JudgedRun,
    KernelChange,
    PluginRejection,
    RunPart,
    TestCounts,
    diagnoses,
    gate_outcome,
    no_acceptance_fails,
    reports_part,
    row_outcome,
    run_fails,
    run_verdict,
    stored_verdict,
)
from dflash_eval.metrics.verdict.tau_rules import (
    BaselineCheck,
    JudgedMeans,
    JudgedPrompt,
    JudgedRow,
    MeanFloors,
    NamedLoop,
    RefusalCheck,
    RefusedDrafter,
    SpeedupCheck,
    baseline_failures,
    baseline_part,
    baseline_reasons,
    category_thresholds,
    checkpoint_verdict,
    floors_part,
    gate_reasons,
    judge_categories,
    judge_mean,
    judge_prompts,
    mean_floors_pass,
    mean_passed,
    mean_thresholds,
    plateau_part,
    prompt_threshold,
    prompt_thresholds,
    record_verdict,
    refused,
    regression_part,
    speedup_floor_part,
    speedup_floor_reason,
    tau_verdict,
    vacuous_floors,
)

__all__ = ["passes", "overall", "Threshold", "prompt_threshold", "prompt_thresholds", "mean_thresholds",
           "category_thresholds", "judge_prompts", "judge_mean", "judge_categories", "MeanFloors", "mean_passed",
           "mean_floors_pass", "gate_reasons", "NO_ACCEPTANCE", "NO_ACCEPTANCE_EPS", "NO_ACCEPTANCE_TOKENS",
           "NO_ACCEPTANCE_MAX_EXCESS", "no_acceptance", "no_acceptance_fails", "refused", "diagnoses",
           "JudgedPrompt", "FLOORS", "BASELINE", "SPEEDUP_FLOOR", "REGRESSION", "PLATEAU", "DRIFT_GATE", "REFUSAL",
           "PLUGINS", "TESTS", "NEAR_TIES", "KERNELS", "EXIT_STATUS", "REPORTS", "CHECKPOINT", "Part", "Verdict",
           "compose", "notice", "reasons_part", "Gated", "gating_pass", "parts_from_dicts", "BaselineCheck",
           "baseline_reasons", "baseline_failures", "drop_holds", "rise_holds", "baseline_part", "VACUOUS_FLOOR",
           "vacuous_floors", "floors_part", "speedup_floor_reason", "speedup_floor_part", "regressed", "gained",
           "regression_part",
           "plateau_part", "checkpoint_verdict", "record_verdict", "tau_verdict", "PASS", "FAIL", "INCONCLUSIVE",
           "drift_outcome", "row_outcome", "gate_outcome", "RunPart", "RUN_PARTS", "run_verdict", "reports_part",
           "stored_verdict", "run_fails", "EXIT_PARTS", "against", "within_estimate", "in_ci", "drift_holds",
           "tau_agrees", "is_near_tie", "fit_within", "stat_moved", "sketch_changed", "within_bound", "JudgedRun",
           "KernelChange", "PluginRejection", "TestCounts", "JudgedMeans", "JudgedRow", "NamedLoop", "RefusalCheck",
           "RefusedDrafter", "SpeedupCheck", "GateRow"]
