"""reports/samples.jsonl: one JSON line per (prompt, reference completion) a run measured τ on, the per-sample record
(as lm-evaluation-harness's ``--log_samples``) that joins a prompt's rounds to its text without the cache.

A line holds the prompt (id, category, its token ids as the target saw them, its text, the conversation and turn of
a multi-turn prompt), the reference (``sample``: 0 at temperature 0, the sampled reference's index above it, with
its stream ``seed``; ``source``: ``local`` or ``sglang``; its ids, text and each token's piece of the text), and the
drafter's rounds on it: the chain loop's accept length of every verification round, its τ, and each DDTree budget's
τ and accept lengths, with the block size and temperature that say what the numbers mean. Round ``r`` starts at
completion position ``c_r`` (``c_1 = 0``, the prefill's token; ``c_{r+1} = c_r + a_r``), accepts the drafts of
positions ``c_r + 1 .. c_r + a_r - 1`` and ends with the target's token at ``c_r + a_r``: the first rejected
draft's position unless ``a_r`` is the block size (:class:`dflash_eval.session.rows.CompletionRow`).

The lines come from the run's typed result (:class:`~dflash_eval.session.run_result.RunResult`: each prompt row's
``completions``), in the prompts' order; strict JSON (a τ without rounds is ``null``), written atomically with the
other reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.report.strict_json import dumps_strict
from dflash_eval.session.rows import Row, _opt
from dflash_eval.session.run_result import RunResult

__all__ = ["SAMPLES_NAME", "SampleRecord", "sample_records", "write_samples"]

#: The file's name in the report folder.
SAMPLES_NAME = "samples.jsonl"


@dataclass
class SampleRecord(Row):
    """One line of samples.jsonl (module docstring): the prompt, the reference completion and the drafter's rounds
    on it, with the temperature and block size (None: not recorded) that say what the numbers mean; the conversation
    and turn of a multi-turn prompt only."""

    prompt_id: str
    category: str
    sample: int
    source: str
    seed: int | None
    temperature: float | None
    block_size: int | None
    prompt_ids: list[int] | None
    prompt_text: str | None
    prompt_tokens: int
    completion_ids: list[int]
    completion_text: str
    completion_pieces: list[str]
    completion_tokens: int
    rounds: int
    accept_lengths: list[int]
    tau: float
    ddtree: dict[str, float]
    ddtree_accept_lengths: dict[str, list[int]]
    conversation: str | None = _opt()
    turn: int | None = _opt()


def sample_records(result: RunResult) -> Iterator[SampleRecord]:
    """The lines of samples.jsonl (module docstring) for the run's ``result``: one per reference of every prompt row
    that holds its ``completions``."""
    block = None if result.context is None else result.context.block_size
    temperature = None if result.settings is None else result.settings.get("temperature")
    for pid, row in result.prompts.items():
        for c in row.completions or []:
            yield SampleRecord(
                prompt_id=pid, category=row.category, sample=c.sample, source=c.source, seed=c.seed,
                temperature=temperature, block_size=block, prompt_ids=row.prompt_ids, prompt_text=row.prompt_text,
                prompt_tokens=row.prompt_tokens, completion_ids=c.ids, completion_text=c.text,
                completion_pieces=c.pieces, completion_tokens=len(c.ids), rounds=len(c.accept_lengths),
                accept_lengths=c.accept_lengths, tau=c.tau, ddtree=c.ddtree,
                ddtree_accept_lengths=c.ddtree_accept_lengths,
                conversation=row.conversation, turn=None if row.conversation is None else row.turn)


def write_samples(result: RunResult, path: Path) -> Path | None:
    """samples.jsonl at ``path`` (atomically); None, and a file an earlier run left there removed, when no prompt
    row holds its references (a run that measured no τ, or the result of a version before they were recorded): an
    earlier run's lines would be read as this one's. OSError when it cannot be written (the caller names it)."""
    lines = [dumps_strict(rec.to_dict(), indent=None) + "\n" for rec in sample_records(result)]
    if not lines:
        path.unlink(missing_ok=True)
        return None
    atomic_write_text(path, "".join(lines))
    return path
