"""The settings that change τ, recorded with floors files and reports, and checked before they are compared.

τ floors or a baseline recorded with 128 new tokens say nothing about a 512-token run; nor do ones from another
target, block size, chat-template or thinking mode, HumanEval prompt wrapper, dtype or backend. Each floors file and each eval.json carries this
context; :func:`mismatches` lists every field where a recorded context differs from the current run (fields the
recording does not have are not checked, so older files stay usable).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TAU_FIELDS", "mismatches", "describe"]

# field -> how a user changes it (named in the mismatch message)
TAU_FIELDS: dict[str, str] = {
    "target": "--target-model",
    "max_new_tokens": "--max-new-tokens",
    "max_blocks": "--max-blocks",
    "block_size": "the drafter's block_size",
    "chat_template": "--chat-template",
    "thinking": "--thinking",
    "humaneval_wrapper": "--humaneval-wrapper",
    "dtype": "--dtype",
    "backend": "--hidden-state-backend",
}


def _show(field: str, value: Any) -> str:
    return f"{value[:12]}..." if field == "target" and isinstance(value, str) and len(value) > 16 else repr(value)


def mismatches(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per τ-relevant field whose recorded value differs from the current run's."""
    out = []
    for f, how in TAU_FIELDS.items():
        if f in recorded and f in current and recorded[f] != current[f]:
            out.append(f"{f} ({how}): recorded {_show(f, recorded[f])}, this run {_show(f, current[f])}")
    return out


def describe(context: dict[str, Any]) -> str:
    return ", ".join(f"{f}={_show(f, context[f])}" for f in TAU_FIELDS if f in context)
