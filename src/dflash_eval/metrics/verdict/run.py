"""A test run's verdict, from its result (eval.json's data read as one typed value): the parts (:data:`RUN_PARTS`:
the kernels, a refused drafter, a plugin's rejection, τ against its floors, ``--baseline``, the drift gate,
``--speedup-floor``, the near ties) and the tests; composed once by :func:`run_verdict` when the run ends, stored in
eval.json's ``verdict`` and read back by :func:`stored_verdict` (the terminal, eval.md, eval.html, the junit
properties, pytest's exit status: :func:`run_fails`).

Named causes (:func:`diagnoses`), each reported once instead of as many ordinary failures as it causes: a drafter
refused by an architecture check (:func:`refused`: never a pass, and a run without a failed test still fails), and
τ of about 1 on every prompt in a run that misses its floors (:func:`no_acceptance_fails`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from dflash_eval.metrics import near_tie
from dflash_eval.metrics.verdict.core import (
    DRIFT_GATE,
    EXIT_STATUS,
    FLOORS,
    KERNELS,
    NEAR_TIES,
    PLUGINS,
    REFUSAL,
    REPORTS,
    TESTS,
    Part,
    Verdict,
    compose,
    notice,
)
from dflash_eval.metrics.verdict.rules import FAIL, INCONCLUSIVE, NO_ACCEPTANCE, PASS, no_acceptance
from dflash_eval.metrics.verdict.tau_rules import (
    BaselineCheck,
    JudgedMeans,
    JudgedPrompt,
    JudgedRow,
    RefusedDrafter,
    SpeedupCheck,
    baseline_part,
    mean_floors_pass,
    refused,
    speedup_floor_part,
    tau_verdict,
)

__all__ = ["no_acceptance_fails", "diagnoses", "row_outcome", "gate_outcome", "RunPart", "RUN_PARTS",
           "run_verdict", "reports_part", "stored_verdict", "EXIT_PARTS", "run_fails", "JudgedRun", "KernelChange",
           "PluginRejection", "TestCounts", "GateRow"]


class KernelChange(Protocol):
    """A kernel whose output changed since the cache was made (one of eval.json's
    ``provenance.kernel_probe.changed``): its label and the kinds of kernel that moved."""

    @property
    def label(self) -> str: ...
    @property
    def kinds(self) -> Sequence[str]: ...


class GateRow(Protocol):
    """A drift gate row's outcome (:class:`~dflash_eval.metrics.drift_checks.GateCheck`): pass, fail or
    inconclusive."""

    @property
    def outcome(self) -> str: ...


class PluginRejection(Protocol):
    """A plugin that rejected the result (eval.json's ``rejected``)."""

    @property
    def plugin(self) -> str: ...


class TestCounts(Protocol):
    """The suite's tests: how many of each outcome (eval.json's ``tests.counts``)."""

    @property
    def counts(self) -> Mapping[str, int]: ...


class JudgedRun(Protocol):
    """What a test run's verdict reads of its result (:class:`~dflash_eval.session.run_result.RunResult` is one):
    the judged prompt rows, the τ means and their verdict, the categories, the drafter, the plugins' rejections, the
    ``--baseline`` comparison, the drift gate's rows, the predicted speed-up, the near ties, the kernels that
    changed, the tests and the verdict stored when the run ended (None: none)."""

    @property
    def prompts(self) -> Mapping[str, JudgedPrompt]: ...
    @property
    def tau(self) -> JudgedMeans | None: ...
    @property
    def mean_passed(self) -> bool | None: ...
    @property
    def categories(self) -> Mapping[str, JudgedRow] | None: ...
    @property
    def drafter(self) -> RefusedDrafter | None: ...
    @property
    def rejected(self) -> Sequence[PluginRejection] | None: ...
    @property
    def baseline(self) -> BaselineCheck | None: ...
    @property
    def drift_gate(self) -> Sequence[GateRow] | None: ...
    @property
    def speedup(self) -> SpeedupCheck | None: ...
    @property
    def near_ties(self) -> Sequence[near_tie.Divergence] | None: ...
    @property
    def kernel_changes(self) -> Sequence[KernelChange]: ...
    @property
    def tests(self) -> TestCounts: ...
    @property
    def verdict(self) -> Verdict | None: ...


def no_acceptance_fails(prompts: Mapping[str, JudgedPrompt], means: JudgedMeans | None) -> bool:
    """τ 1.00 on every prompt (the judged rows; ``means``: the mean τ and its floors, None: not measured) that fails
    its floors: the one cause of those failures. A run whose floors accept τ 1 (``--tau-floor 1`` for a random
    drafter) is not diagnosed."""
    rows = list(prompts.values())
    if not no_acceptance([r.tau for r in rows], [r.rounds for r in rows]):
        return False
    return (means is not None and not mean_floors_pass(means)) or any(r.passed is False for r in rows)


def _accepted_text(prompts: Mapping[str, JudgedPrompt]) -> str:
    """``": N accepted draft tokens in R rounds"`` over the prompts whose τ and rounds are known ("" when none)."""
    known = [(r.tau, r.rounds) for r in prompts.values()
             if isinstance(r.rounds, int) and r.tau is not None and not math.isnan(r.tau)]
    if not known:
        return ""
    accepted = sum(round((t - 1) * n) for t, n in known)
    return f": {accepted} accepted draft token{'s' if accepted != 1 else ''} in {sum(n for _, n in known)} rounds"


def diagnoses(prompts: Mapping[str, JudgedPrompt], means: JudgedMeans | None,
              drafter: RefusedDrafter | None) -> list[str]:
    """The named causes of a failing run found in its judged prompt rows, τ means (None: not measured) and drafter
    (None: not read), one line each (empty when none)."""
    out = []
    checks = refused(drafter)
    if drafter is not None and checks:
        out.append(f"the drafter {drafter.path} does not fit the target: refused by "
                   f"architecture check{'s' if len(checks) > 1 else ''} "
                   + "; ".join(f"{c.check}: {c.message}" for c in checks)
                   + "; every test that needs the drafter was skipped")
    if no_acceptance_fails(prompts, means):
        out.append(f"{NO_ACCEPTANCE} ({len(prompts)} prompts{_accepted_text(prompts)})")
    return out


def row_outcome(row: GateRow) -> str:
    """A drift gate row's outcome (:attr:`~dflash_eval.metrics.drift_checks.GateCheck.outcome`)."""
    return row.outcome


def gate_outcome(rows: Sequence[GateRow] | None) -> str | None:
    """The drift gate over all its rows: "fail" when one fails, else "inconclusive" when one is, else "pass"
    (None: no drift was gated in this run)."""
    if not rows:
        return None
    outcomes = [row_outcome(r) for r in rows]
    return FAIL if FAIL in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else PASS


#: A part of a test run's verdict, from its result (None: the part does not apply to this run). A new part is one
#: more function in :data:`RUN_PARTS`: every writer shows its reasons and notices.
RunPart = Callable[[JudgedRun], Part | None]


def _refusal(run: JudgedRun) -> Part | None:
    checks = refused(run.drafter)
    return None if not checks else Part(REFUSAL, False, (
        "the drafter was refused by " + ", ".join(c.check for c in checks),))


def _plugins(run: JudgedRun) -> Part | None:
    rejected = run.rejected or []
    return None if not rejected else Part(PLUGINS, False, tuple(f"rejected by plugin {r.plugin!r}"
                                                                for r in rejected))


def _baseline(run: JudgedRun) -> Part | None:
    return baseline_part(run.baseline)


def _tau(run: JudgedRun) -> Part | None:
    tau = tau_verdict(run.tau is not None, run.mean_passed, run.prompts, run.categories)
    return None if tau is None else Part(FLOORS, tau, () if tau else ("τ below its floors",))


def _drift_gate(run: JudgedRun) -> Part | None:
    gate = gate_outcome(run.drift_gate)
    return None if gate is None else Part(DRIFT_GATE, gate != FAIL, ("drift over budget",) if gate == FAIL else (),
                                          outcome=gate)


def _speedup(run: JudgedRun) -> Part | None:
    return speedup_floor_part(run.speedup)


def _kernels(run: JudgedRun) -> Part | None:
    changed = run.kernel_changes
    if not changed:
        return None
    seen = ", ".join(dict.fromkeys(f"{c.label} ({', '.join(c.kinds or ['?'])})" for c in changed))
    return notice(KERNELS, f"the target's kernels changed since the cache was made: {seen}, named below; nothing "
                           "they made was used as cached (completions, teacher-forced argmax, features, τ, ...): all "
                           "of it was made again with the live kernels, as on an empty cache, and this run's results "
                           "and failures are theirs")


def _near_ties(run: JudgedRun) -> Part | None:
    lines = near_tie.near_tie_notices(run.near_ties or [])
    return notice(NEAR_TIES, *lines) if lines else None


#: The parts of a test run's verdict read from its result, in the order its reasons are given.
RUN_PARTS: list[RunPart] = [_kernels, _refusal, _plugins, _tau, _baseline, _drift_gate, _speedup, _near_ties]


def run_verdict(run: JudgedRun, *, failed_tests: int = 0, exitstatus: int = 0) -> Verdict:
    """A test run's verdict from its result: it passes when τ passes its floors (:func:`tau_verdict`) and its
    ``--baseline``, the drift gate has no failing row (:func:`gate_outcome`), the predicted speed-up passes
    ``--speedup-floor``, the
    drafter was not refused (:func:`refused`), no plugin rejected the result (``rejected``:
    ``pytest_dflash_eval_result_ready``) (:data:`RUN_PARTS`), no test failed (``failed_tests``) and pytest's
    ``exitstatus`` is 0; the reasons say why not."""
    parts = [part(run) for part in RUN_PARTS]
    tests = Part(TESTS, not failed_tests, (f"{failed_tests} test{'s' if failed_tests > 1 else ''} failed",)
                 if failed_tests else ())
    verdict = compose(*parts, tests)
    if exitstatus != 0 and verdict.passed is not False:
        verdict = verdict.with_parts(Part(EXIT_STATUS, False, (f"pytest exit status {exitstatus}",)))
    return verdict


def reports_part() -> Part:
    """The run's reports could not be written (the message naming the file and the cause is printed once, beside
    the verdict): the run fails."""
    return Part(REPORTS, False, ("the reports could not be written (above)",))


def stored_verdict(run: JudgedRun) -> Verdict:
    """The verdict a run's result holds (eval.json's ``verdict``, composed by :func:`run_verdict` when the run
    ended); a result of an earlier version, without one, is judged now from the suite tests' outcomes it holds."""
    if run.verdict is not None:
        return run.verdict
    counts = run.tests.counts
    return run_verdict(run, failed_tests=sum(int(counts[k]) for k in ("failed", "error") if k in counts))


#: The parts of a run's verdict that no suite test asserts (a refused drafter's tests are skipped, a plugin rejects
#: the merged result, the reports are written after the tests): they decide pytest's exit status beside its tests.
#: Every other part is a suite test's own assertion (the τ tests, the baseline, the drift gate, the speed-up floor),
#: which a run that does not select that test does not check.
EXIT_PARTS = (REFUSAL, PLUGINS, REPORTS)


def run_fails(run: JudgedRun | None, *, broken: bool = False) -> bool:
    """Whether the run's verdict fails pytest's exit status beside its tests: a part of :data:`EXIT_PARTS` fails in
    the verdict its result holds (:func:`stored_verdict`), or no verdict could be composed (``run`` None) because
    the result was ``broken`` (a plugin broke the result hook's rules, the reports failed before the verdict)."""
    if run is None:
        return broken
    return any(p.passed is False for p in stored_verdict(run).parts if p.name in EXIT_PARTS)
