"""Each completion token's text: the pieces of a completion's decoded text, one per token id, whose concatenation is
the text itself (``tokenizer.decode(ids, skip_special_tokens=True)``).

The reports mark a verification round's accepted tokens and the first rejected one in the completion text
(``reports/eval.html``, ``reports/samples.jsonl``); that needs the text each token contributes. Decoding one id alone
is not it: a byte-level BPE splits a multi-byte character over several tokens (each alone decodes to U+FFFD), and a
SentencePiece tokenizer drops a token's leading space when it is decoded alone. So a token's piece is what decoding
it adds to the tokens before it (a few of them as context), and the tokens of an incomplete character (the decoding
ends in U+FFFD) wait for the token that completes it: they get ``""`` and that token the whole character. When the
pieces do not join to the text (a tokenizer whose decoding of a prefix is not a prefix of the whole decoding), they
are taken from the text itself: token ``i``'s piece is the text between where the decodings of the first ``i`` and
``i + 1`` tokens stop agreeing with it.

Pieces are decoded once, when a completion is produced, and cached in its entry's meta beside its text, so a warm
run needs no tokenizer for them (:func:`pieces_of` decodes those of an entry written before they were recorded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["decode_pieces", "pieces_of", "REPLACEMENT"]

#: What a decoder writes for bytes that are no complete UTF-8 character.
REPLACEMENT = "\ufffd"
#: Tokens before a token decoded with it as context (enough for a SentencePiece space or a merged byte sequence).
CONTEXT = 6
#: The most tokens one character may span (UTF-8 characters are at most 4 bytes).
MAX_SPAN = 4


def decode_pieces(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> tuple[str, list[str]]:
    """``(text, pieces)`` of ``ids``: the decoded text (special tokens skipped) and one piece per id, joining to it
    (module docstring)."""
    ids = [int(i) for i in ids]
    text = cast(str, tokenizer.decode(ids, skip_special_tokens=True))
    if not ids:
        return text, []

    def dec(seqs: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(seqs, skip_special_tokens=True)

    n = len(ids)
    heads = dec([ids[max(0, i - CONTEXT):i] for i in range(n)])  # the common case, every token decoded at once
    fulls = dec([ids[max(0, i - CONTEXT):i + 1] for i in range(n)])
    pieces: list[str] = []
    start = 0  # the first token whose text is not given out yet
    for i in range(n):
        if start == i:
            head, full = heads[i], fulls[i]
        else:  # tokens of an incomplete character wait: decode them with this one
            ctx = max(0, start - CONTEXT)
            head, full = dec([ids[ctx:start], ids[ctx:i + 1]])
        if full.endswith(REPLACEMENT) and i + 1 < n and i + 1 - start < MAX_SPAN:
            pieces.append("")
            continue
        pieces.append(full[len(head):] if full.startswith(head) else dec([ids[start:i + 1]])[0])
        start = i + 1
    if "".join(pieces) != text:
        pieces = _aligned(text, dec([ids[:i + 1] for i in range(n)]))
    return text, pieces


def _aligned(text: str, prefixes: list[str]) -> list[str]:
    """Pieces cut from ``text`` where the decodings of the growing prefixes of the ids stop agreeing with it."""
    cuts, done = [], 0
    for k, p in enumerate(prefixes):
        agree = 0
        for a, b in zip(p, text):
            if a != b:
                break
            agree += 1
        done = len(text) if k == len(prefixes) - 1 else max(done, agree)
        cuts.append(done)
    return [text[a:b] for a, b in zip([0, *cuts[:-1]], cuts)]


def pieces_of(pieces: list[str] | None, ids: Sequence[int],
              tokenizer: Callable[[], PreTrainedTokenizerBase]) -> list[str]:
    """The recorded ``pieces`` of a completion when they fit its ``ids``; else decoded now (an entry written before
    pieces were recorded) with ``tokenizer()``."""
    if pieces is not None and len(pieces) == len(ids):
        return list(pieces)
    return decode_pieces(tokenizer(), ids)[1]
