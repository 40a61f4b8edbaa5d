"""Where reference completions come from when they are not cached: the local target's greedy generation, or an
SGLang server's greedy ``/generate`` answers checked against the local target.

Both are producers of :class:`~dflash_eval.cache.requests.Batch` es of ``completion`` requests (the references
stage states the requests, the cache serves them): each gets the batch's missing requests and returns one entry
per request. Nothing is cached unless every answer of a batch is valid: an empty completion or a token id outside
the target's vocabulary is an error naming the prompt, never an entry, and every completion of an SGLang fetch must
be reproduced by the local target's teacher-forced argmax (:mod:`dflash_eval.references.server_check`). A completion's
text is always the local tokenizer's decoding of its ids, kept with each token's piece of it (``pieces``:
:mod:`dflash_eval.references.token_pieces`); the server's own text is kept as ``server_text``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dflash_eval.cache.requests import Produced, Request
from dflash_eval.errors import EvalError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.references.server_check import check_server_completions
from dflash_eval.references.server_link import ServerLink
from dflash_eval.references.token_pieces import decode_pieces
from dflash_eval.target.generation import greedy_generate_batch

__all__ = ["CompletionSources", "out_of_vocab"]


def out_of_vocab(ids: list[int], vocab_size: int) -> tuple[int, int] | None:
    """(position, id) of the first id outside ``0 .. vocab_size - 1``, or None."""
    for k, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            return k, t
    return None


class CompletionSources:
    """The producers of completion entries (see module docstring); ``prompt_ids``: a prompt's token ids (a later
    conversation turn's hold the earlier turns)."""

    def __init__(self, inputs: Inputs, server: ServerLink, prompt_ids: Callable[[str], list[int]]) -> None:
        self.inputs, self.server, self.prompt_ids = inputs, server, prompt_ids

    def check_ids(self, pid: str, source: str, ids: list[int]) -> None:
        """Refuse (before anything is cached) an empty completion or one with an id outside the vocabulary."""
        if not ids:
            raise EvalError(f"empty completion for prompt {pid!r} from {source}: nothing to evaluate "
                            "(the target emitted EOS at once?); no cache entry written")
        vocab = self.inputs.vocab_size
        bad = out_of_vocab(ids, vocab)
        if bad is not None:
            raise EvalError(f"completion of prompt {pid!r} from {source}: token id {bad[1]} at completion position "
                            f"{bad[0]} is outside the target vocabulary (0..{vocab - 1}, config.json vocab_size of "
                            f"{self.inputs.settings.target_model}); the source does not serve this target's "
                            "tokenizer? No cache entry written")

    def _entry(self, pid: str, source: str, ids: list[int], finish: Any,
               extra_meta: dict[str, Any] | None = None) -> Produced:
        text, pieces = decode_pieces(self.inputs.tokenizer, ids)
        return Produced({"output_ids": torch.tensor(ids)}, {"text": text, "pieces": pieces, "source": source,
                                                            "finish_reason": finish, "prompt_id": pid,
                                                            **(extra_meta or {})}, tokens=len(ids))

    def generate_local(self, todo: list[Request]) -> list[Produced]:
        """Greedy-generate, in one left-padded batch, the completions of ``todo`` (requests of one batch)."""

        inp = self.inputs
        pids = [r.item for r in todo]
        with inp.meter.timed("generation"):
            outs = greedy_generate_batch(inp.target, [self.prompt_ids(p) for p in pids], inp.settings.max_new_tokens,
                                         backend=inp.settings.eval_backend)
        for pid, ids in zip(pids, outs):  # every answer of the batch checked before any is cached
            self.check_ids(pid, "local", ids)
        inp.meter.counts["generated_tokens"] += sum(len(ids) for ids in outs)
        return [self._entry(pid, "local", ids, None) for pid, ids in zip(pids, outs)]

    def fetch_sglang(self, todo: list[Request]) -> list[Produced]:
        """Fetch greedy completions of ``todo`` from the ready server; refused unless every answer is valid and
        agrees with the local target (:func:`~dflash_eval.references.server_check.check_server_completions`)."""
        inp = self.inputs
        pids = [r.item for r in todo]
        client = self.server.client()
        with inp.meter.timed("sglang"):
            comps = client.generate_greedy([self.prompt_ids(p) for p in pids],
                                           max_new_tokens=inp.settings.max_new_tokens)
        for pid, c in zip(pids, comps):
            self.check_ids(pid, "sglang", list(c.output_ids))
        check_server_completions(inp, [(p, self.prompt_ids(p), list(c.output_ids)) for p, c in zip(pids, comps)],
                                 getattr(client, "url", "the SGLang server"))
        out = []
        for pid, c in zip(pids, comps):
            extra: dict[str, Any] = {"server_text": c.text}
            if c.spec_accept_length is not None:
                extra.update(spec_accept_length=c.spec_accept_length, spec_verify_ct=c.spec_verify_ct)
            hist = getattr(c, "spec_accept_histogram", None)  # a plugin's client may answer without it
            if hist is not None:
                extra["spec_accept_histogram"] = list(hist)
            out.append(self._entry(pid, "sglang", list(c.output_ids), c.finish_reason, extra))  # text: as local ones
        return out
