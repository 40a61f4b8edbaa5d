"""The suite's test ids as the golden records name them: a prompt id made safe for ``-k tau`` selection (the τ
tests are the only ones whose ids contain "tau"); the snapshot names and the parametrized tests share it."""

from __future__ import annotations

__all__ = ["safe_id"]


def safe_id(text: str) -> str:
    """A test-id part that never contains 'tau' (so ``-k tau`` selects only the τ tests)."""
    low = text.lower()
    out, i = [], 0
    while i < len(text):
        if low.startswith("tau", i):
            out.append(text[i:i + 2] + "_" + text[i + 2])
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
