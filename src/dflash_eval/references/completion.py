"""One reference completion as the later stages read it: the prompt's ids, the generated ids, the decoded text (and
each token's piece of it: :mod:`dflash_eval.references.token_pieces`) and where it came from (local generation, an
SGLang server with its own accept length, or the cache)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CompletionRecord"]


@dataclass
class CompletionRecord:
    """A reference completion: generated ids only (no prompt), decoded text, where it came from."""

    prompt_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    source: str
    finish_reason: Any = None
    spec_accept_length: float | None = None  # meta_info.spec_accept_length of a speculative SGLang server
    spec_accept_histogram: list[int] | None = None  # its meta_info.spec_accept_histogram (rounds per accepted drafts)
    pieces: list[str] | None = None  # each output id's text, joining to ``text`` (None: an entry written before them)
    sample: int | None = None  # the sampled reference's index at temperature > 0 (None: the greedy reference)
    seed: int | None = None  # its stream seed (:func:`dflash_eval.target.sampling.stream_seed`)

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.output_ids
