"""One reference completion as the later stages read it: the prompt's ids, the generated ids, the decoded text and
where it came from (local generation, an SGLang server with its own accept length, or the cache)."""

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

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.output_ids
