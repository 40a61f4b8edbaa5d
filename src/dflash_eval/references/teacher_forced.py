"""The teacher-forced argmax entries of the references stage: the target's best tokens and their logits
(:data:`~dflash_eval.metrics.near_tie.TOP_K` of them) at every position of prompt + reference completion, one causal
forward per sequence, and the near-tie judgement of a completion against them.

The references stage owns the ``argmax`` cache kind: its key fields (:func:`argmax_fields`), what an entry holds
(:func:`argmax_request`) and how one is made from the target's logits (:func:`argmax_produced`) live here alone. The
feature stage, whose forward over the same sequence on the evaluation backend and dtype runs to the logits anyway,
asks for these requests and hands its logits to :func:`argmax_produced`, so the argmax costs no forward of its own.

Since the target is causal, its logits at position ``i`` of prompt + completion are those of a forward over the first
``i + 1`` tokens alone: where two completions share a prefix, the entry of one holds the target's answer on the
other's prefix too. :meth:`TeacherForced.divergence` judges a completion against its own argmax,
:meth:`TeacherForced.judge` any other token sequence that shares its prefix up to a position (the golden completion:
:mod:`dflash_eval.golden.completions`); both by the near-tie rule of :mod:`dflash_eval.metrics.near_tie`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.metrics.near_tie import TOP_K, Divergence, first_divergence, judge
from dflash_eval.references.completion import CompletionRecord
from dflash_eval.references.server_check import teacher_forced_tensors, top_tokens
from dflash_eval.target.backends import use_backend
from dflash_eval.target.hidden_states import LayerCapture
from dflash_eval.target.kernel_probe import ProbeShape

__all__ = ["TeacherForced", "argmax_fields", "argmax_produced", "argmax_request", "teacher_forced_forward",
           "DECODE_STEPS", "decode_request", "decode_forward", "decode_produced"]

#: single-token steps a decode entry holds at each of its starts (:func:`decode_request`)
DECODE_STEPS = 2


def argmax_fields(inp: Inputs, seq: list[int]) -> dict[str, Any]:
    """Key fields of the teacher-forced argmax entry of ``seq``: the target's full causal forward on the evaluation
    backend (no kernel fault) and dtype, with the kernel probe's digest at the extraction shape of ``seq``'s length
    (:mod:`dflash_eval.target.kernel_probe`)."""
    s = inp.settings
    probe = inp.kernel_probe(s.eval_backend, s.torch_dtype, ProbeShape.for_sequence(len(seq)))
    return {"target": inp.target_identity, "tokens": ids_digest(seq), "n_tokens": len(seq),
            "backend": s.eval_backend, **inp.platform_fields(s.torch_dtype), "kernels": probe.digest, "top": TOP_K}


def argmax_request(inp: Inputs, pid: str, seq: list[int]) -> Request:
    """The argmax entry of prompt ``pid``'s sequence ``seq``: the target's :data:`TOP_K` best token ids (int64) and
    their logits (float32) at every position."""
    n = len(seq)
    k = min(TOP_K, inp.vocab_size)
    return Request("argmax", argmax_fields(inp, seq), what=f"teacher-forced argmax of {pid!r}", item=pid,
                   expect=Expected(tensors={"top_ids": (torch.int64, (n, k)), "top_logits": (torch.float32, (n, k))}))


def decode_request(inp: Inputs, pid: str, seq: list[int], starts: tuple[int, ...]) -> Request:
    """The decode entry of prompt ``pid``'s sequence ``seq`` (prompt + completion): the target's :data:`TOP_K` best
    token ids and logits of every single-token step :func:`decode_forward` runs from ``starts``, on the evaluation
    backend and dtype. The witness makes these steps again: the kernels' decode path (the recurrent rule, the
    convolution's update, attention over a KV cache) in every layer of the real target, which no teacher-forced
    forward runs."""
    k = min(TOP_K, inp.vocab_size)
    n = sum(min(DECODE_STEPS, len(seq) - s) for s in starts)
    return Request("decode", {**argmax_fields(inp, seq), "decode_starts": list(starts), "decode_steps": DECODE_STEPS},
                   what=f"decode steps of {pid!r}", item=pid,
                   expect=Expected(tensors={"top_ids": (torch.int64, (n, k)), "top_logits": (torch.float32, (n, k))}))


def decode_forward(model: torch.nn.Module, seq: list[int], starts: tuple[int, ...] | list[int],
                   device: torch.device | str) -> torch.Tensor:
    """The target's float32 logits [S, V] of each single-token step of ``seq`` from each of ``starts``: a prefill of
    the tokens before the start with the model's cache, then up to :data:`DECODE_STEPS` of the following tokens fed
    one at a time, as greedy generation decodes (batch 1, unpadded)."""
    rows = []
    with torch.no_grad():
        for start in starts:
            out = model(input_ids=torch.tensor([seq[:start]], device=device), use_cache=True)
            for tok in seq[start:start + DECODE_STEPS]:
                # the model's cache under the name its transformers release returns it by (``cache`` from 5.24 on)
                name = "cache" if "cache" in out else "past_key_values"
                out = model(input_ids=torch.tensor([[tok]], device=device), use_cache=True, **{name: out[name]})
                rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


def decode_produced(pid: str, logits: torch.Tensor) -> Produced:
    """The decode entry of prompt ``pid`` from :func:`decode_forward`'s logits (with the torch thread count)."""
    return Produced(teacher_forced_tensors(logits), {"prompt_id": pid, "torch_threads": torch.get_num_threads(),
                                                     "what": "decode steps"})


def argmax_produced(pid: str, logits: torch.Tensor) -> Produced:
    """The argmax entry of prompt ``pid`` from the target's [T, V] float32 logits over its sequence (with the torch
    thread count it was computed with: a CPU's reductions may split by it, and the witness redoes the forward)."""
    return Produced(teacher_forced_tensors(logits), {"prompt_id": pid, "torch_threads": torch.get_num_threads()})


def teacher_forced_forward(model: torch.nn.Module, seq: list[int], device: torch.device | str,
                           layers: tuple[int, ...] = ()) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """The one forward every argmax entry is made by (and the witness makes again): the target's causal forward over
    ``seq`` to its [T, V] float32 logits, with ``layers``' features ``{i: [T, H]}`` captured on the way (the same
    features as a forward stopped after the deepest of them, bit for bit)."""
    ids = torch.tensor([seq], device=device)
    with torch.no_grad():
        if not layers:
            return {}, model(input_ids=ids).logits[0].float()
        with LayerCapture(model, layers) as cap:
            logits = model(input_ids=ids).logits[0].float()
            return {i: t[0] for i, t in cap.per_layer().items()}, logits


class TeacherForced:
    """The target's best tokens per position of each prompt's prompt + completion, from the cache, else one causal
    target forward per prompt; ``completions``: the references stage's completions (the sequences). Every judgement of
    a completion made here is kept in :attr:`judged` (``(prompt, against)`` -> the divergence, None where there is
    none): the run's report names its near ties."""

    def __init__(self, inputs: Inputs, completions: Callable[[], dict[str, CompletionRecord]]) -> None:
        self.inputs = inputs
        self.completions = completions
        self._top: dict[str, dict[str, torch.Tensor]] = {}
        self.judged: dict[tuple[str, str], Divergence | None] = {}

    def get(self, pid: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(argmax, top1 - top2 logit margin) of the target at every position of ``pid``'s prompt + completion."""
        top = self.top(pid)
        ids, logits = top["top_ids"], top["top_logits"]
        margin = logits[:, 0] - logits[:, 1] if logits.shape[1] > 1 else torch.full_like(logits[:, 0], torch.inf)
        return ids[:, 0], margin

    def top(self, pid: str) -> dict[str, torch.Tensor]:
        """The entry of ``pid``: ``top_ids`` [T, K] (best first) and ``top_logits`` [T, K] at every position of its
        prompt + completion.

        Under xdist the first call produces every selected prompt's (each worker starts at its own offset and takes
        what no other worker holds), instead of one prompt per test: the tests of different prompts land on
        different workers in no fixed order, and one lock per prompt would have the workers take turns on them."""
        if pid not in self._top:
            inp = self.inputs
            comps = self.completions()
            pids = [p.id for p in inp.prompts] if inp.worker_count > 1 and not self._top else [pid]
            reqs = {p: argmax_request(inp, p, comps[p].sequence) for p in pids}
            batches = [Batch([reqs[p]], self._produce(p, comps[p].sequence)) for p in pids]
            entries = inp.cache.ensure(batches, worker_index=inp.worker_index, worker_count=inp.worker_count)
            for p in pids:
                self._top[p] = dict(entries[reqs[p].key].tensors)
        return self._top[pid]

    def judge(self, pid: str, against: str, position: int, expected: int) -> Divergence:
        """``expected`` against ``pid``'s completion token at completion ``position``, where the two sequences share
        every earlier token: judged by the target's best tokens there (module docstring), and kept in
        :attr:`judged`."""
        rec = self.completions()[pid]
        at = len(rec.prompt_ids) + position - 1
        tok = self.inputs.tokenizer
        d = judge(pid, against, position, at + 1, expected, rec.output_ids[position], top_tokens(self.top(pid), at),
                  self.inputs.settings.torch_dtype, lambda t: str(tok.decode([t])))
        self.judged[(pid, against)] = d
        return d

    def divergence(self, pid: str) -> Divergence | None:
        """The first position where ``pid``'s completion leaves the target's own teacher-forced argmax over it,
        judged (None: the argmax reproduces the whole completion); kept in :attr:`judged`."""
        rec = self.completions()[pid]
        p = len(rec.prompt_ids)
        argmax = self.top(pid)["top_ids"][p - 1:p - 1 + len(rec.output_ids), 0].tolist()
        k = first_divergence(argmax, rec.output_ids)  # same length: None or a differing token
        if k is None:
            self.judged[(pid, "teacher-forced")] = None
            return None
        return self.judge(pid, "teacher-forced", k, argmax[k])

    def near_ties(self) -> list[Divergence]:
        """The near ties judged in this process, by prompt."""
        return sorted((d for d in self.judged.values() if d is not None and d.near_tie),
                      key=lambda d: (d.prompt_id, d.against))

    def _produce(self, pid: str, seq: list[int]) -> Callable[[list[Request]], list[Produced]]:
        """One causal target forward over ``seq`` on the evaluation backend and dtype."""
        inp, s = self.inputs, self.inputs.settings

        def produce(todo: list[Request]) -> list[Produced]:
            with inp.meter.timed("target_forward"), use_backend(s.eval_backend, s.torch_device):
                _, logits = teacher_forced_forward(inp.target.model, seq, inp.target.device)
            inp.meter.counts["target_forwards"] += 1
            return [argmax_produced(pid, logits)]
        return produce
