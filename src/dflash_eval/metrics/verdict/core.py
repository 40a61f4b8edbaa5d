"""The core of a verdict: a :class:`Verdict` is a list of :class:`Part` (a name, pass / fail / not judged, the
reasons of a failure, the notices that do not fail, an outcome in a word where pass or fail does not say it all), and
:func:`compose` makes one of them; :func:`gating_pass` is the one aggregate over several checkpoints' verdicts (the
gate's). The parts themselves are decided by the rules (:mod:`.rules`) in :mod:`.tau_rules` (a checkpoint's) and
:mod:`.run` (a test run's). Every writer shows a verdict's reasons and notices whole, so a new part reaches every
report without touching a writer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dflash_eval.errors import ResultKeyError

__all__ = ["FLOORS", "BASELINE", "SPEEDUP_FLOOR", "REGRESSION", "PLATEAU", "DRIFT_GATE", "REFUSAL", "PLUGINS", "TESTS",
           "NEAR_TIES", "KERNELS", "EXIT_STATUS", "REPORTS", "CHECKPOINT", "Part", "Verdict", "compose", "notice",
           "reasons_part", "Gated", "gating_pass", "parts_from_dicts"]

#: The parts a verdict is composed of, by name (another part is one more name: :class:`Part` takes any).
FLOORS, BASELINE, SPEEDUP_FLOOR, REGRESSION, PLATEAU = "floors", "baseline", "speedup_floor", "regression", "plateau"
DRIFT_GATE, REFUSAL, PLUGINS, TESTS, EXIT_STATUS, REPORTS = ("drift_gate", "refusal", "plugins", "tests", "exit_status",
                                                             "reports")
#: The run's completions that left their golden record or their teacher-forced argmax at a near tie of the target
#: (:mod:`dflash_eval.metrics.near_tie`): a part that only notices.
NEAR_TIES = "near_ties"
#: The target's kernels give other output than the cache's entries were made with (eval.json's
#: ``provenance.kernel_probe.changed``: the kernel probe's or the witness's evidence): a part that only notices, the one
#: cause of whatever the live kernels fail.
KERNELS = "kernels"
#: The one part of a history record written before records kept their verdict's parts: its own verdict (the floors,
#: the baseline and the speed-up floor together).
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Part:
    """One part of a verdict: what was judged (``name``: :data:`FLOORS`, :data:`DRIFT_GATE`, ... or any other),
    whether it passed (None: not judged, or a part that only notices), why it fails (``reasons``), what it says
    without failing (``notices``), and, where pass or fail does not say it all, its ``outcome`` in a word (the drift
    gate's ``inconclusive``)."""

    name: str
    passed: bool | None
    reasons: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    outcome: str | None = None

    @property
    def label(self) -> str:
        """The outcome's word: ``outcome`` when given, else ``pass``, ``fail`` or ``unjudged``."""
        return self.outcome or _label(self.passed)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "outcome": self.label, "reasons": list(self.reasons),
                "notices": list(self.notices)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Part:
        """A part of :meth:`to_dict`; ResultKeyError naming a key it does not know or lacks."""
        ResultKeyError.check(d, _PART_KEYS)
        passed, outcome = d["passed"], d["outcome"]
        return cls(str(d["name"]), passed, tuple(d["reasons"]), tuple(d["notices"]),
                   None if outcome == _label(passed) else outcome)


_PART_KEYS = ("name", "passed", "outcome", "reasons", "notices")


def _label(passed: bool | None) -> str:
    return "unjudged" if passed is None else "pass" if passed else "fail"


@dataclass(frozen=True)
class Verdict:
    """A verdict: its parts, in the order they were judged. It fails when a part fails, passes when a part was
    judged and none fails, and is unjudged (``passed`` None) when no part was judged. Its reasons and notices are its
    parts', in order: a writer shows them whole, whatever the parts are."""

    parts: tuple[Part, ...] = ()

    @property
    def passed(self) -> bool | None:
        judged = [p.passed for p in self.parts if p.passed is not None]
        return None if not judged else all(judged)

    @property
    def reasons(self) -> list[str]:
        """Why it fails: every failing part's reasons."""
        return [r for p in self.parts if p.passed is False for r in p.reasons]

    @property
    def notices(self) -> list[str]:
        """What it says without failing: every part's notices."""
        return [n for p in self.parts for n in p.notices]

    @property
    def label(self) -> str:
        """``pass``, ``fail`` or ``unjudged``."""
        return _label(self.passed)

    def part(self, name: str) -> Part | None:
        """The part called ``name`` (None: not part of this verdict)."""
        return next((p for p in self.parts if p.name == name), None)

    def outcome(self, name: str) -> str | None:
        """The label of the part called ``name`` (None: not part of this verdict)."""
        part = self.part(name)
        return None if part is None else part.label

    def with_parts(self, *parts: Part | None) -> Verdict:
        """This verdict with more parts (:func:`compose`)."""
        return compose(*self.parts, *parts)

    def to_dict(self) -> dict[str, Any]:
        """As eval.json and the history hold it: the outcome, its reasons and notices, and the parts."""
        return {"passed": self.passed, "label": self.label, "reasons": self.reasons, "notices": self.notices,
                "parts": [p.to_dict() for p in self.parts]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """A verdict of :meth:`to_dict` (its outcome, reasons and notices follow from its parts); ResultKeyError
        naming a key it, or one of its parts, does not know or lacks (``parts[0].name``)."""
        ResultKeyError.check(d, ("passed", "label", "reasons", "notices", "parts"))
        return cls(parts_from_dicts(d["parts"]))


def compose(*parts: Part | None) -> Verdict:
    """The one verdict of its parts (None: a part that does not apply, left out), in their order."""
    return Verdict(tuple(p for p in parts if p is not None))


def notice(name: str, *notices: str) -> Part:
    """A part that only says something: it neither fails nor passes a verdict."""
    return Part(name, None, notices=tuple(notices))


def reasons_part(name: str, reasons: list[str] | None, notices: tuple[str, ...] = ()) -> Part:
    """A part judged by its reasons (None: not judged): it fails when there is one."""
    return Part(name, None if reasons is None else not reasons, tuple(reasons or ()), notices)


class Gated(Protocol):
    """What the gate's aggregate reads of one checkpoint's row: its verdict's pass and whether it gates (an earlier
    checkpoint of ``gate --latest`` is reported only)."""

    @property
    def passed(self) -> bool: ...
    @property
    def gating(self) -> bool: ...


def gating_pass(rows: Iterable[Gated]) -> bool:
    """The gate's verdict over its checkpoints: every gating row passed (gate.json's ``passed``, the exit status)."""
    return all(r.passed for r in rows if r.gating)


def parts_from_dicts(items: Iterable[Mapping[str, Any]]) -> tuple[Part, ...]:
    """A verdict's ``parts`` as :meth:`Part.to_dict` wrote them (an eval.json's verdict, a history record's);
    ResultKeyError naming the part and the key it does not know or lacks (``parts[0].name``)."""
    parts = []
    for i, p in enumerate(items):
        try:
            parts.append(Part.from_dict(p))
        except ResultKeyError as exc:
            raise exc.under(i).under("parts") from None
    return tuple(parts)
