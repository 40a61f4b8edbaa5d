"""``--baseline``: an earlier run's eval.json read as its typed result
(:meth:`~dflash_eval.session.run_result.RunResult.read`) and handed to the comparison as the
:class:`~dflash_eval.metrics.baseline.Baseline` it reads: each prompt's chain τ (and per-sample τ at temperature > 0),
the τ-relevant settings it was recorded with and the drafter's fingerprint.

A file that is not an eval.json of this schema (not JSON, a key the result does not know inside a fragment, a key a
fragment needs and lacks) is one ConfigError naming ``--baseline``, the file and the key's path. No torch: the
preflight reads it before anything else runs.
"""

from __future__ import annotations

from pathlib import Path

from dflash_eval.errors import ConfigError, EvalError
from dflash_eval.metrics.baseline import Baseline
from dflash_eval.session.run_result import RunResult

__all__ = ["read_baseline", "baseline_problem"]


def read_baseline(path: str | Path) -> Baseline:
    """The baseline of the eval.json at ``path`` (ConfigError naming ``--baseline``, the file and the problem: not
    found, not eval.json's layout, with the key's path, no prompts with τ)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--baseline {path}: not found (an earlier reports/eval.json)")
    try:
        result = RunResult.read(path)
    except EvalError as exc:  # names the file (and the key's path)
        raise ConfigError(f"--baseline {exc}") from None
    if not result.prompts:
        raise ConfigError(f"--baseline {path}: no 'prompts' with τ (is it a reports/eval.json of a τ run?)")
    tau = {str(p): float(r.tau) for p, r in result.prompts.items() if r.tau is not None}
    samples = {str(p): [float(v) for v in r.sample_tau] for p, r in result.prompts.items() if r.sample_tau}
    context = result.context.to_dict() if result.context is not None else {}
    return Baseline(path, tau, context, result.drafter.fingerprint if result.drafter is not None else None, samples)


def baseline_problem(path: Path) -> str | None:
    """What is wrong with the ``--baseline`` file (:func:`read_baseline`'s message), or None: the preflight's check
    (:func:`dflash_eval.options.preflight.preflight`'s ``baseline_check``)."""
    try:
        read_baseline(path)
    except ConfigError as exc:
        return str(exc)
    return None
