"""The golden reference completions judged by the target, not by bits.

A run's greedy completion of a prompt is compared with its golden record (the syrupy JSON snapshot under
``<golden>/snapshots/<target>/test_reference_completions/``) token by token. Where they part, the parting is judged
by the target itself (:mod:`dflash_eval.metrics.near_tie`): its best tokens at the first differing position,
teacher-forced on the shared (golden) prefix in the run's settings, are read from the run's teacher-forced entry
(:class:`~dflash_eval.references.teacher_forced.TeacherForced`: the target is causal, so its logits there are those of
the golden prefix alone). Within the dtype's near-tie band the parting is a named near tie: not a failure, the tokens
after it not compared, the golden record kept as it is (a re-recording run does not rewrite it either, so goldens do
not flip between runs on a near tie). Outside the band it is a failure naming the position, both tokens and the
margin; a re-recording run replaces the record.

A later turn of a conversation whose prompt holds an earlier turn's reply follows that reply: when the earlier turn
left its golden one at a near tie, the later turn's prompt differs from its golden one for that reason alone and is
not compared either (:attr:`GoldenComparison.kind` ``after_near_tie``).

The comparison is the same wherever golden completions are compared: the suite's ``test_reference_completion`` (under
``pytest tests_eval``, ``dflash-eval run`` and ``dflash-eval record``), on completions from local generation and from
an SGLang server alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.errors import ConfigError
from dflash_eval.golden.needed import SNAPSHOT_TEST, snapshot_path
from dflash_eval.golden.node_ids import safe_id
from dflash_eval.metrics.near_tie import Divergence, first_divergence

if TYPE_CHECKING:
    from dflash_eval.session.eval_session import EvalSession

__all__ = ["GoldenComparison", "GoldenCompletions", "completion_record", "read_golden"]

#: The fields of a golden completion record (the snapshot's JSON object).
FIELDS = ("prompt_id", "prompt_ids", "output_ids", "text")


def completion_record(prompt_id: str, prompt_ids: list[int], output_ids: list[int], text: str) -> dict[str, Any]:
    """A golden completion record, as the snapshot holds it."""
    return {"prompt_id": prompt_id, "prompt_ids": list(prompt_ids), "output_ids": list(output_ids), "text": text}


def read_golden(path: Path) -> dict[str, Any] | None:
    """The golden completion record at ``path`` (None: no such file); ConfigError naming the file when it is not a
    record (unreadable, not JSON, fields missing or of the wrong type)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: the golden completion cannot be read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: the golden completion is not valid JSON (line {exc.lineno}: {exc.msg}); "
                          "restore it from version control or record it again (--snapshot-update)") from None
    ok = isinstance(data, dict) and all(k in data for k in FIELDS) and all(
        isinstance(data[k], list) and all(isinstance(t, int) for t in data[k]) for k in ("prompt_ids", "output_ids"))
    if not ok:
        raise ConfigError(f"{path}: not a golden completion record (an object with {', '.join(FIELDS)}; token ids "
                          "as lists of integers); restore it from version control or record it again "
                          "(--snapshot-update)")
    return data


@dataclass(frozen=True)
class GoldenComparison:
    """A run's completion of one prompt against its golden record.

    ``kind``: ``same`` (every token equal), ``near_tie`` (parted at a near tie of the target: :attr:`divergence`),
    ``after_near_tie`` (a later conversation turn whose prompt follows an earlier turn's near tie: ``follows`` names
    it), ``changed`` (parted where the target is confident, or the prompt or length differs: a failure), ``new``
    (no golden record)."""

    prompt_id: str
    kind: str
    golden: dict[str, Any] | None
    run: dict[str, Any]
    divergence: Divergence | None = None
    reason: str = ""
    follows: str | None = None

    @property
    def passed(self) -> bool:
        return self.kind in ("same", "near_tie", "after_near_tie")

    @property
    def pinned(self) -> dict[str, Any]:
        """What the golden record must hold after this run: the golden one where the run left it at a near tie (the
        tokens after it are not compared, and a re-recording keeps it), else the run's."""
        if self.kind in ("near_tie", "after_near_tie") and self.golden is not None:
            return self.golden
        return self.run

    @property
    def message(self) -> str:
        """Why the comparison failed, or what the near tie is (empty when the completions are equal)."""
        if self.divergence is not None:
            return self.divergence.describe()
        return self.reason


class GoldenCompletions:
    """The golden comparisons of one session's completions (module docstring), each made once; the near ties go to the
    session's teacher-forced judgements, which the run's report names."""

    def __init__(self, session: EvalSession) -> None:
        self.session = session
        self._done: dict[str, GoldenComparison] = {}

    def path(self, pid: str) -> Path:
        s = self.session.settings
        return snapshot_path(s.golden_dir, s.snapshot_folder, f"{SNAPSHOT_TEST}[{safe_id(pid)}]")

    def compare(self, pid: str) -> GoldenComparison:
        """The run's completion of ``pid`` against its golden record."""
        if pid not in self._done:
            self._done[pid] = self._compare(pid)
        return self._done[pid]

    def _compare(self, pid: str) -> GoldenComparison:
        refs = self.session.references
        rec = refs.completions()[pid]
        run = completion_record(pid, rec.prompt_ids, rec.output_ids, rec.text)
        golden = read_golden(self.path(pid))
        if golden is None:
            return GoldenComparison(pid, "new", None, run, reason=f"prompt {pid!r}: no golden completion at "
                                                                  f"{self.path(pid)}")
        if golden["prompt_ids"] != run["prompt_ids"]:
            earlier = self._earlier_near_tie(pid)
            if earlier is not None:
                return GoldenComparison(pid, "after_near_tie", golden, run, follows=earlier,
                                        reason=f"prompt {pid!r}: its prompt holds the reply of {earlier!r}, which "
                                               "left its golden one at a near tie: not compared")
            k = first_divergence(golden["prompt_ids"], run["prompt_ids"])
            return GoldenComparison(pid, "changed", golden, run, reason=(
                f"prompt {pid!r}: the prompt's token ids differ from the golden record's at prompt token {k} "
                f"({len(run['prompt_ids'])} tokens, golden {len(golden['prompt_ids'])}): the prompt text, its chat "
                "template or the tokenizer changed since the golden completions were recorded; record them again "
                "(dflash-eval record, or --snapshot-update)"))
        k = first_divergence(golden["output_ids"], run["output_ids"])
        if k is None:
            return GoldenComparison(pid, "same", golden, run)
        if k >= min(len(golden["output_ids"]), len(run["output_ids"])):
            return GoldenComparison(pid, "changed", golden, run, reason=(
                f"prompt {pid!r}: the completion has {len(run['output_ids'])} tokens where the golden one has "
                f"{len(golden['output_ids'])}, equal up to the shorter: --max-new-tokens or the end-of-sequence "
                "token differ from the recording"))
        d = refs.argmax.judge(pid, "golden", k, golden["output_ids"][k])
        return GoldenComparison(pid, "near_tie" if d.near_tie else "changed", golden, run, divergence=d)

    def _earlier_near_tie(self, pid: str) -> str | None:
        """The earlier turn of ``pid``'s conversation that left its golden completion at a near tie (or follows one),
        if any."""
        prompt = self.session.inputs.prompt_by_id[pid]
        prev = prompt.previous_id
        while prev is not None:
            if self.compare(prev).kind in ("near_tie", "after_near_tie"):
                return prev
            prev = self.session.inputs.prompt_by_id[prev].previous_id
        return None
