"""Multi-turn conversations around the reference completions: the token ids of a later turn, and the order turns are
produced in.

Turn k of a conversation (:func:`dflash_eval.prompts.expand_turns`) is evaluated with everything before it in
context, as the reference DFlash benchmark does for MT-Bench: its prompt is the conversation's first k user turns with
the target's reference reply to each of the first k-1 (:mod:`dflash_eval.prompts.formatting`), so its ids exist only
once turn k-1's completion does. :class:`~dflash_eval.references.greedy.References` therefore produces completions
turn by turn (:func:`turn_groups`: every first turn and single-turn prompt, then every second turn, ...), each group
batched as before (local jobs over xdist workers, one SGLang batch). The ids are cached like first-turn ids
(``prompt_ids`` entries keyed by the tokenizer, the formatting and the messages, or the previous sequence's digest in
raw mode), so a warm run needs no tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.errors import EvalError
from dflash_eval.prompts import RAW_TURN_SEPARATOR, Prompt, conversation_messages, encode_messages

if TYPE_CHECKING:
    from dflash_eval.inputs.run_inputs import Inputs

__all__ = ["HistoryMissing", "turn_groups", "turn_prompt_ids"]


class HistoryMissing(EvalError):
    """A later turn's ids were asked for before the earlier turn's completion exists."""


def turn_groups(prompts: Sequence[Prompt]) -> list[list[str]]:
    """Prompt ids grouped by turn, in the order they can be produced (single-turn prompts with the first turns)."""
    groups: dict[int, list[str]] = {}
    for p in prompts:
        groups.setdefault(max(1, p.turn), []).append(p.id)
    return [groups[k] for k in sorted(groups)]


def turn_prompt_ids(inputs: Inputs, p: Prompt, replies: Sequence[str], previous: Sequence[int]) -> list[int]:
    """Token ids of later turn ``p`` given the reference ``replies`` to its earlier turns (decoded texts, in order)
    and ``previous``, the token ids of the turn before it (prompt + completion; used in raw-text mode)."""
    fmt = inputs.prompt_format
    digest = inputs.target_dir.tokenizer_digest()
    if fmt["chat_template"] == "on":
        msgs = conversation_messages(p.turns, list(replies))
        fields = {"tokenizer": digest, "messages": msgs, "add_special_tokens": False, **fmt}

        def encode() -> list[int]:
            return encode_messages(inputs.tokenizer, msgs, thinking=bool(fmt["enable_thinking"]))
    else:
        text = RAW_TURN_SEPARATOR + p.text
        fields = {"tokenizer": digest, "prefix": ids_digest(list(previous)), "n_prefix": len(previous), "text": text,
                  "add_special_tokens": False, **fmt}

        def encode() -> list[int]:
            return list(previous) + list(inputs.tokenizer(text, add_special_tokens=False)["input_ids"])

    req = Request("prompt_ids", fields, what=f"the token ids of prompt {p.id!r}", derived=True)
    e = inputs.cache.ensure([Batch([req], lambda todo: [Produced(
        {"ids": torch.tensor(encode(), dtype=torch.long)}, {"prompt_id": p.id, "turn": p.turn})])])[req.key]
    return e.tensors["ids"].tolist()
