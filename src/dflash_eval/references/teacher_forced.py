"""The teacher-forced argmax entries of the references stage: the target's argmax and top-2 margin at every position
of prompt + reference completion, one causal forward per sequence.

The references stage owns the ``argmax`` cache kind: its key fields (:func:`argmax_fields`), what an entry holds
(:func:`argmax_request`) and how one is made from the target's logits (:func:`argmax_produced`) live here alone. The
feature stage, whose forward over the same sequence on the evaluation backend and dtype runs to the logits anyway,
asks for these requests and hands its logits to :func:`argmax_produced`, so the argmax costs no forward of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.keys import ids_digest
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.references.completion import CompletionRecord
from dflash_eval.serving.server_check import teacher_forced_tensors
from dflash_eval.target.backends import use_backend
from dflash_eval.target.kernel_probe import ProbeShape
from dflash_eval.target.provenance import device_kind, library_versions

__all__ = ["TeacherForced", "argmax_fields", "argmax_produced", "argmax_request"]


def argmax_fields(inp: Inputs, seq: list[int]) -> dict[str, Any]:
    """Key fields of the teacher-forced argmax entry of ``seq``: the target's full causal forward on the evaluation
    backend (no kernel fault) and dtype, with the kernel probe's digest at the extraction shape of ``seq``'s length
    (:mod:`dflash_eval.target.kernel_probe`)."""
    s = inp.settings
    probe = inp.kernel_probe(s.eval_backend, s.torch_dtype, ProbeShape.for_sequence(len(seq)))
    return {"target": inp.target_identity, "tokens": ids_digest(seq), "n_tokens": len(seq),
            "backend": s.eval_backend, "dtype": str(s.torch_dtype), "device_kind": device_kind(s.torch_device),
            "versions": library_versions(), "kernels": probe.digest}


def argmax_request(inp: Inputs, pid: str, seq: list[int]) -> Request:
    """The argmax entry of prompt ``pid``'s sequence ``seq``: an int64 argmax and a float32 margin per position."""
    n = len(seq)
    return Request("argmax", argmax_fields(inp, seq), what=f"teacher-forced argmax of {pid!r}", item=pid,
                   expect=Expected(tensors={"argmax": (torch.int64, (n,)), "margin": (torch.float32, (n,))}))


def argmax_produced(pid: str, logits: torch.Tensor) -> Produced:
    """The argmax entry of prompt ``pid`` from the target's [T, V] float32 logits over its sequence."""
    return Produced(teacher_forced_tensors(logits), {"prompt_id": pid})


class TeacherForced:
    """(argmax, margin) per prompt, from the cache, else one causal target forward per prompt. ``completions``: the
    references stage's completions (the sequences)."""

    def __init__(self, inputs: Inputs, completions: Callable[[], dict[str, CompletionRecord]]) -> None:
        self.inputs = inputs
        self.completions = completions
        self._argmax: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, pid: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(argmax, top1 - top2 logit margin) of the target at every position of ``pid``'s prompt + completion.

        Under xdist the first call produces every selected prompt's (each worker starts at its own offset and takes
        what no other worker holds), instead of one prompt per test: the tests of different prompts land on
        different workers in no fixed order, and one lock per prompt would have the workers take turns on them."""
        if pid not in self._argmax:
            inp = self.inputs
            comps = self.completions()
            pids = [p.id for p in inp.prompts] if inp.worker_count > 1 and not self._argmax else [pid]
            reqs = {p: argmax_request(inp, p, comps[p].sequence) for p in pids}
            batches = [Batch([reqs[p]], self._produce(p, comps[p].sequence)) for p in pids]
            entries = inp.cache.ensure(batches, worker_index=inp.worker_index, worker_count=inp.worker_count)
            for p in pids:
                e = entries[reqs[p].key]
                self._argmax[p] = (e.tensors["argmax"], e.tensors["margin"])
        return self._argmax[pid]

    def _produce(self, pid: str, seq: list[int]) -> Callable[[list[Request]], list[Produced]]:
        """One causal target forward over ``seq`` on the evaluation backend and dtype."""
        inp, s = self.inputs, self.inputs.settings

        def produce(todo: list[Request]) -> list[Produced]:
            with inp.meter.timed("target_forward"), use_backend(s.eval_backend, s.torch_device), torch.no_grad():
                logits = inp.target.model(input_ids=torch.tensor([seq], device=inp.target.device)).logits[0].float()
            inp.meter.counts["target_forwards"] += 1
            return [argmax_produced(pid, logits)]
        return produce
