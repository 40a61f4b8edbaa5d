"""A test run's verdict, from its eval.json data: the parts (:data:`RUN_PARTS`: the kernels, a refused drafter, a
plugin's rejection, τ against its floors, ``--baseline``, the drift gate, ``--speedup-floor``, the near ties) and
the tests; composed once by :func:`run_verdict` when the run ends, stored in eval.json's ``verdict`` and read back by
:func:`stored_verdict` (the terminal, eval.md, eval.html, the junit properties, pytest's exit status:
:func:`run_fails`).

Named causes (:func:`diagnoses`), each reported once instead of as many ordinary failures as it causes: a drafter
refused by an architecture check (:func:`refused`: never a pass, and a run without a failed test still fails), and
τ of about 1 on every prompt in a run that misses its floors (:func:`no_acceptance_fails`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from dflash_eval.metrics import near_tie
from dflash_eval.metrics.verdict.core import (
    BASELINE,
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
    reasons_part,
)
from dflash_eval.metrics.verdict.rules import FAIL, INCONCLUSIVE, NO_ACCEPTANCE, PASS, no_acceptance
from dflash_eval.metrics.verdict.tau_rules import (
    baseline_failures,
    mean_floors_pass,
    refused,
    speedup_floor_part,
    tau_verdict,
)

__all__ = ["no_acceptance_fails", "diagnoses", "row_outcome", "gate_outcome", "RunPart", "RUN_PARTS",
           "run_verdict", "reports_part", "stored_verdict", "EXIT_PARTS", "run_fails"]


def _rows_accept_nothing(prompts: Mapping[str, Mapping[str, Any]]) -> bool:
    """:func:`no_acceptance` of eval.json's prompt rows (their chain τ and rounds)."""
    rows = list(prompts.values())
    return no_acceptance([r.get("tau") for r in rows], [r.get("rounds") for r in rows])


def no_acceptance_fails(data: dict[str, Any]) -> bool:
    """τ 1.00 on every prompt of eval.json data (or a τ summary's) that fails its floors: the one cause of those
    failures. A run whose floors accept τ 1 (``--tau-floor 1`` for a random drafter) is not diagnosed."""
    prompts = data.get("prompts", {})
    if not _rows_accept_nothing(prompts):
        return False
    return ("mean_tau" in data and not mean_floors_pass(data)) or any(r.get("passed") is False
                                                                      for r in prompts.values())


def _accepted_text(prompts: Mapping[str, Mapping[str, Any]]) -> str:
    """``": N accepted draft tokens in R rounds"`` over the prompts whose τ and rounds are known ("" when none)."""
    known = [(r["tau"], r["rounds"]) for r in prompts.values()
             if isinstance(r.get("rounds"), int) and r.get("tau") is not None and not math.isnan(r["tau"])]
    if not known:
        return ""
    accepted = sum(round((t - 1) * n) for t, n in known)
    return f": {accepted} accepted draft token{'s' if accepted != 1 else ''} in {sum(n for _, n in known)} rounds"


def diagnoses(data: dict[str, Any]) -> list[str]:
    """The named causes of a failing run found in eval.json data, one line each (empty when none)."""
    out = []
    checks = refused(data)
    if checks:
        out.append(f"the drafter {(data.get('drafter') or {}).get('path')} does not fit the target: refused by "
                   f"architecture check{'s' if len(checks) > 1 else ''} "
                   + "; ".join(f"{c['check']}: {c['message']}" for c in checks)
                   + "; every test that needs the drafter was skipped")
    if no_acceptance_fails(data):
        out.append(f"{NO_ACCEPTANCE} ({len(data['prompts'])} prompts{_accepted_text(data['prompts'])})")
    return out



def row_outcome(row: dict[str, Any]) -> str:
    """A drift_gate row's outcome: its ``outcome`` field, else (reports from before it) pass / fail by ``passed``."""
    return row.get("outcome") or ("pass" if row.get("passed") else "fail")


def gate_outcome(data: dict[str, Any]) -> str | None:
    """The drift gate over all its rows: "fail" when one fails, else "inconclusive" when one is, else "pass"
    (None: no drift was gated in this run)."""
    rows = data.get("drift_gate") or []
    if not rows:
        return None
    outcomes = [row_outcome(r) for r in rows]
    return FAIL if FAIL in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else PASS


#: A part of a test run's verdict, from eval.json's data (None: the part does not apply to this run). A new part is
#: one more function in :data:`RUN_PARTS`: every writer shows its reasons and notices.
RunPart = Callable[[dict[str, Any]], Part | None]


def _refusal(data: dict[str, Any]) -> Part | None:
    checks = refused(data)
    return None if not checks else Part(REFUSAL, False, (
        "the drafter was refused by " + ", ".join(c["check"] for c in checks),))


def _plugins(data: dict[str, Any]) -> Part | None:
    rejected = data.get("rejected") or []
    return None if not rejected else Part(PLUGINS, False, tuple(f"rejected by plugin {r['plugin']!r}"
                                                                for r in rejected))


def _baseline(data: dict[str, Any]) -> Part | None:
    b = data.get("baseline")
    if not isinstance(b, dict) or "drop_passed" not in b:
        return None
    rel = b.get("rel_change")
    return reasons_part(BASELINE, baseline_failures(math.nan if rel is None else rel, b.get("drop_tol", math.nan),
                                                     b.get("rise_tol", math.nan), bool(b["drop_passed"]),
                                                     bool(b.get("rise_passed"))))


def _tau(data: dict[str, Any]) -> Part | None:
    tau = tau_verdict(data)
    return None if tau is None else Part(FLOORS, tau, () if tau else ("τ below its floors",))


def _drift_gate(data: dict[str, Any]) -> Part | None:
    gate = gate_outcome(data)
    return None if gate is None else Part(DRIFT_GATE, gate != FAIL, ("drift over budget",) if gate == FAIL else (),
                                          outcome=gate)


def _speedup(data: dict[str, Any]) -> Part | None:
    return speedup_floor_part(data.get("speedup"))


def _kernels(data: dict[str, Any]) -> Part | None:
    changed = ((data.get("provenance") or {}).get("kernel_probe") or {}).get("changed") or []
    if not changed:
        return None
    seen = ", ".join(dict.fromkeys(f"{c.get('label', '?')} ({', '.join(c.get('kinds') or ['?'])})" for c in changed))
    return notice(KERNELS, f"the target's kernels changed since the cache was made: {seen}, named below; nothing "
                           "they made was used as cached (completions, teacher-forced argmax, features, τ, ...): all "
                           "of it was made again with the live kernels, as on an empty cache, and this run's results "
                           "and failures are theirs")


def _near_ties(data: dict[str, Any]) -> Part | None:
    lines = near_tie.near_tie_notices(data.get("near_ties") or [])
    return notice(NEAR_TIES, *lines) if lines else None


#: The parts of a test run's verdict read from its eval.json data, in the order its reasons are given.
RUN_PARTS: list[RunPart] = [_kernels, _refusal, _plugins, _tau, _baseline, _drift_gate, _speedup, _near_ties]


def run_verdict(data: dict[str, Any], *, failed_tests: int = 0, exitstatus: int = 0) -> Verdict:
    """A test run's verdict from its eval.json data: it passes when τ passes its floors (:func:`tau_verdict`) and its
    ``--baseline``, the drift gate has no failing row (:func:`gate_outcome`), the predicted speed-up passes
    ``--speedup-floor``, the
    drafter was not refused (:func:`refused`), no plugin rejected the result (``rejected``:
    ``pytest_dflash_eval_result_ready``) (:data:`RUN_PARTS`), no test failed (``failed_tests``) and pytest's
    ``exitstatus`` is 0; the reasons say why not."""
    parts = [part(data) for part in RUN_PARTS]
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


def stored_verdict(data: dict[str, Any]) -> Verdict:
    """The verdict eval.json ``data`` holds (``verdict``, composed by :func:`run_verdict` when the run ended); data of
    an earlier version, without one, is judged now from the suite tests' outcomes it holds."""
    if isinstance(data.get("verdict"), dict):
        return Verdict.from_dict(data["verdict"])
    counts = (data.get("tests") or {}).get("counts") or {}
    return run_verdict(data, failed_tests=int(counts.get("failed", 0)) + int(counts.get("error", 0)))


#: The parts of a run's verdict that no suite test asserts (a refused drafter's tests are skipped, a plugin rejects
#: the merged result, the reports are written after the tests): they decide pytest's exit status beside its tests.
#: Every other part is a suite test's own assertion (the τ tests, the baseline, the drift gate, the speed-up floor),
#: which a run that does not select that test does not check.
EXIT_PARTS = (REFUSAL, PLUGINS, REPORTS)


def run_fails(data: Mapping[str, Any] | None, *, broken: bool = False) -> bool:
    """Whether the run's verdict fails pytest's exit status beside its tests: a part of :data:`EXIT_PARTS` fails in
    the verdict its eval.json data holds (:func:`stored_verdict`), or no verdict could be composed because the
    result was ``broken`` (a plugin broke the result hook's rules, the reports failed before the verdict)."""
    if not data:
        return broken
    return any(p.passed is False for p in stored_verdict(dict(data)).parts if p.name in EXIT_PARTS)
