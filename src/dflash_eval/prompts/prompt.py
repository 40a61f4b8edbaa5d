"""One evaluation prompt, and how a multi-turn conversation becomes one prompt per turn.

A loader returns a conversation as one :class:`Prompt` whose ``turns`` holds every user turn (two or more);
:func:`expand_turns` turns it into one prompt per turn, ids ``<conversation>-t1``, ``<conversation>-t2``, ...
Turn k's text is the k-th user message; its token ids are built later, from the earlier turns AND the target's
reference replies to them (:mod:`dflash_eval.references.conversations`), so every turn is evaluated with the whole
conversation so far in context, as the reference DFlash benchmark does for MT-Bench.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["Prompt", "ID_RE", "check_id", "expand_turns", "make_prompt"]

ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: a stable id (used in test ids), a category and the (user) text.

    ``turns``: a loaded conversation's user turns (two or more; ``text`` is the first), or, after
    :func:`expand_turns`, the user turns up to and including this one. ``conversation`` / ``turn`` (1-based) are set
    on the per-turn prompts only; a single-turn prompt has ``turns == ()``, ``conversation is None``, ``turn == 0``.
    """

    id: str
    category: str
    text: str
    line: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    turns: tuple[str, ...] = ()
    conversation: str | None = None
    turn: int = 0

    @property
    def is_conversation(self) -> bool:
        """A loaded multi-turn conversation not yet split into turns."""
        return len(self.turns) >= 2 and self.conversation is None

    @property
    def follows(self) -> bool:
        """A later turn of a conversation: its context includes earlier turns and replies."""
        return self.turn > 1

    @property
    def previous_id(self) -> str | None:
        """The id of the turn before this one (None for a first turn or a single-turn prompt)."""
        return f"{self.conversation}-t{self.turn - 1}" if self.follows else None


def check_id(pid: str, where: str) -> str:
    if not ID_RE.match(pid):
        raise ConfigError(f"{where}: prompt id {pid!r} may only contain letters, digits, '_', '.', '-'")
    return pid


def make_prompt(pid: str, category: str, value: Any, *, where: str, line: int = 0,
                extra: dict[str, Any] | None = None, wrapper: str | None = None) -> Prompt:
    """A prompt from a field value: a string, or a list of strings (the user turns of a conversation).

    ``wrapper`` (with a ``{text}`` placeholder) is applied to every turn.
    """
    if isinstance(value, str):
        turns: Sequence[Any] = [value]
    elif isinstance(value, (list, tuple)) and value:
        turns = value
    else:
        raise ConfigError(f"{where}: the prompt must be a string or a non-empty list of strings (user turns), got "
                          f"{type(value).__name__}")
    out = []
    for k, t in enumerate(turns):
        if not isinstance(t, str):
            raise ConfigError(f"{where}: turn {k + 1} is {type(t).__name__}, expected a string")
        if not t.strip():
            raise ConfigError(f"{where}: empty prompt text" + (f" (turn {k + 1})" if len(turns) > 1 else ""))
        out.append(wrapper.replace("{text}", t) if wrapper else t)
    check_id(pid, where)
    return Prompt(id=pid, category=category, text=out[0], line=line, extra=dict(extra or {}),
                  turns=tuple(out) if len(out) > 1 else ())


def expand_turns(prompts: Sequence[Prompt]) -> list[Prompt]:
    """Every conversation replaced by one prompt per turn (``<id>-t<k>``, in turn order); others unchanged."""
    out: list[Prompt] = []
    for p in prompts:
        if not p.is_conversation:
            out.append(p)
            continue
        for k in range(1, len(p.turns) + 1):
            out.append(replace(p, id=f"{p.id}-t{k}", text=p.turns[k - 1], turns=p.turns[:k], conversation=p.id,
                               turn=k, extra=dict(p.extra)))
    return out
