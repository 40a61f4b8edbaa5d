"""The local target's check of an SGLang server's greedy completions, before any of them is cached.

Every completion of a fetch is teacher-forced through the local target: prompt + completion, several per forward
(right-padded batches: a causal model's output at a position depends only on the tokens up to it, so the padding
after a row's last token changes nothing for that row, up to floating-point summation order), and the target's
argmax at every completion position is compared with the server's token there. Each position where they differ is
judged by the near-tie rule (:mod:`dflash_eval.metrics.near_tie`): where the server's token lies within the near-tie
band of the target's best (a bf16 server, other kernels, another batch flip near ties) it is a near tie and does not
count; where it lies outside, the server contradicts a confident target. A completion with confident disagreements at
more than :data:`SERVER_MAX_DISAGREEMENT` of its positions (and at more than one) is wrong:
:func:`check_server_completions` raises one error naming the prompt, the number of confident disagreements and the
first one (server token vs target token, both decoded, and the target's margin there), the near ties beside them, and
the other wrong prompts of the fetch. A server that answers some prompts right and others wrong (a replica behind a
router that serves other weights, a mixed adapter) is caught like one that is wrong throughout.

The argmax of these batches is not cached as the teacher-forced argmax entry (that entry is one unpadded forward,
written bit for bit by the feature extraction): the check costs one batched forward per
:data:`CHECK_LOGITS_BUDGET` logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from dflash_eval.errors import EvalError
from dflash_eval.metrics.near_tie import TOP_K, Divergence, TopTokens, judge
from dflash_eval.target.backends import use_backend
from dflash_eval.target.generation import generation_groups

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dflash_eval.inputs.run_inputs import Inputs

__all__ = ["SERVER_MAX_DISAGREEMENT", "CHECK_LOGITS_BUDGET", "Disagreement", "check_server_completions",
           "teacher_forced_tensors", "top_tokens", "disagreement", "teacher_forced_logits", "teacher_forced_rows"]

#: Largest fraction of a fetched completion's tokens at which the local target's teacher-forced argmax may
#: confidently disagree with the server (near ties aside; at least one token: the server's numerics are not the local
#: target's); above it the server is refused.
SERVER_MAX_DISAGREEMENT = 0.1
#: Most logits (rows x padded length x vocabulary) that one batched forward of the check may produce.
CHECK_LOGITS_BUDGET = 2**28  # 1 GiB of float32 logits


@dataclass(frozen=True)
class Disagreement:
    """Where a server completion and the target's teacher-forced argmax differ, each position judged by the near-tie
    rule (``expected``: the local argmax, ``got``: the server's token)."""

    prompt_id: str
    n_tokens: int
    divergences: list[Divergence]

    @property
    def wrong(self) -> list[Divergence]:
        """The confident disagreements (outside the near-tie band)."""
        return [d for d in self.divergences if not d.near_tie]

    @property
    def near_ties(self) -> list[Divergence]:
        return [d for d in self.divergences if d.near_tie]

    @property
    def refused(self) -> bool:
        return len(self.wrong) > max(1, int(SERVER_MAX_DISAGREEMENT * self.n_tokens))


def disagreement(pid: str, prompt_len: int, ids: list[int], logits: torch.Tensor, dtype: object,
                 decode: Callable[[int], str] | None = None) -> Disagreement:
    """Compare the server's completion ``ids`` with the target's float32 ``logits`` [len(ids), V] predicting them."""
    tensors = teacher_forced_tensors(logits)
    argmax = tensors["top_ids"][:, 0].tolist()
    found = [judge(pid, "server", k, prompt_len + k, want, got, top_tokens(tensors, k), dtype, decode)
             for k, (want, got) in enumerate(zip(argmax, ids)) if want != got]
    return Disagreement(pid, len(ids), found)


def teacher_forced_tensors(logits: torch.Tensor, k: int = TOP_K) -> dict[str, torch.Tensor]:
    """The teacher-forced entry's tensors from [T, V] float32 logits: the ``k`` best token ids (int64 [T, k], best
    first) and their logits (float32 [T, k]) at every position."""
    top = logits.float().topk(min(k, logits.shape[-1]), dim=-1)
    return {"top_ids": top.indices.to(torch.int64).cpu(), "top_logits": top.values.cpu()}


def top_tokens(tensors: dict[str, torch.Tensor], position: int) -> TopTokens:
    """The target's best tokens at ``position`` of a teacher-forced entry (:func:`teacher_forced_tensors`)."""
    return TopTokens(tuple(tensors["top_ids"][position].tolist()), tuple(tensors["top_logits"][position].tolist()))


@torch.no_grad()
def teacher_forced_logits(model: nn.Module, rows: list[tuple[list[int], list[int]]], device: torch.device,
                          pad_id: int = 0) -> list[torch.Tensor]:
    """One right-padded causal forward of ``model`` over every (prompt ids, completion ids) of ``rows``: for each
    row the float32 logits [len(completion), V] at the positions that predict its completion tokens."""
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for n, (p, c) in enumerate(rows):
        ids[n, :len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
    logits = model(input_ids=ids.to(device)).logits
    return [logits[n, len(p) - 1:len(p) - 1 + len(c)].float() for n, (p, c) in enumerate(rows)]


def teacher_forced_rows(inputs: Inputs, items: list[tuple[str, list[int], list[int]]]
                        ) -> Iterator[tuple[str, list[int], torch.Tensor]]:
    """(name, completion ids, float32 logits [len(completion), V] predicting them) of every (name, prompt ids,
    completion ids) of ``items``, teacher-forced through ``inputs.target`` on the evaluation backend in right-padded
    batches of at most :data:`CHECK_LOGITS_BUDGET` logits (the module docstring says why padding is exact)."""
    s = inputs.settings
    target = inputs.target
    width = max(len(p) + len(c) for _, p, c in items)
    rows_per_batch = max(1, CHECK_LOGITS_BUDGET // (width * max(1, inputs.vocab_size)))
    by_name = {name: (p, c) for name, p, c in items}
    for group in generation_groups({name: len(p) + len(c) for name, p, c in items}, rows_per_batch):
        with inputs.meter.timed("target_forward"), use_backend(s.eval_backend, s.torch_device):
            logits = teacher_forced_logits(target.model, [by_name[n] for n in group], target.device)
        inputs.meter.counts["target_forwards"] += 1
        for name, lg in zip(group, logits):
            yield name, by_name[name][1], lg


def _token(tokenizer: PreTrainedTokenizerBase, t: int) -> str:
    try:
        return repr(tokenizer.decode([t]))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode a lone id: the id alone says enough
        return "?"


def check_server_completions(inputs: Inputs, items: list[tuple[str, list[int], list[int]]], url: str) -> None:
    """Teacher-force every (prompt id, prompt ids, server completion ids) of ``items`` through ``inputs.target``;
    raise :class:`EvalError` if any completion is wrong (see module docstring), before anything is cached."""
    if not items:
        return
    s = inputs.settings
    tok = inputs.tokenizer
    lengths = {pid: len(p) for pid, p, _ in items}
    found: dict[str, Disagreement] = {}
    for pid, ids, logits in teacher_forced_rows(inputs, items):
        found[pid] = disagreement(pid, lengths[pid], ids, logits, s.torch_dtype)
    bad = [found[pid] for pid, _, _ in items if found[pid].refused]
    if not bad:
        return
    d = bad[0]
    w = d.wrong[0]
    ties = f" and {len(d.near_ties)} near ties within the {w.dtype} band {w.band:g}, not counted" if d.near_ties else ""
    others = f"; also wrong: prompts {[b.prompt_id for b in bad[1:]]}" if len(bad) > 1 else ""
    raise EvalError(
        f"{url} does not serve the target {s.target_model}: its greedy completion of prompt {d.prompt_id!r} "
        f"disagrees with the local target's teacher-forced argmax at {len(d.wrong)} of {d.n_tokens} tokens (first "
        f"at completion token {w.position}: server {w.got} {_token(tok, w.got)}, local {w.expected} "
        f"{_token(tok, w.expected)}, the local target's margin {w.margin_text}, outside the {w.dtype} near-tie band)"
        f"{ties}{others}; {len(items) - len(bad)} of the {len(items)} completions of this fetch agree. Other weights, "
        "another checkpoint, a replica or adapter behind the URL that serves something else, or a broken server? "
        "No completion cached"
    )
