"""Greedy reference generation with the target itself (for machines without an SGLang server).

:func:`greedy_generate_batch` continues several prompts in one left-padded batch through ``model.generate``.
Left padding is exact for the hybrid (Gated DeltaNet) layers of transformers' Qwen3.5 models: their forward
multiplies the hidden states of padded positions by the 2-D attention mask before the input projections
(``apply_mask_to_padding_states``, fed by ``create_recurrent_attention_mask`` on every multi-token forward), so a
pad position's q, k, v are zero, the causal conv sees the same zeros a sequence start sees, and the recurrent state
stays exactly zero until the first real token (zero keys write nothing; decay of a zero state is zero). Full-
attention layers mask pad keys, and position ids count real tokens only. The result equals one-at-a-time greedy
up to floating-point summation order (the chunked delta rule's chunk boundaries move with the padding), which can
only flip a near-tie: ``benchmarks/bench_generation.py`` checks the ids against one-at-a-time generation.

On CUDA generation runs without cuDNN attention, as every forward of the target does
(:func:`dflash_eval.target.backends.attention_backends`): a left-padded batch is a case where torch would pick it,
and its per-shape plans cost more than the whole batch.

Example::

    outs = greedy_generate_batch(target, [ids_a, ids_b], 128, backend="torch")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dflash_eval.target.backends import attention_backends, use_backend
from dflash_eval.target.sampling import SamplingParams, SeededSampler

if TYPE_CHECKING:
    from dflash_eval.target.loader import Target

__all__ = ["greedy_generate", "greedy_generate_batch", "generation_groups"]


@torch.no_grad()
def greedy_generate_batch(
    target: Target,
    prompts: Sequence[list[int] | Tensor],
    max_new_tokens: int,
    *,
    backend: str = "auto",
    stop_at_eos: bool = True,
    cudnn_attention: bool = False,
    sampling: tuple[SamplingParams, list[int]] | None = None,
) -> list[list[int]]:
    """Greedy (argmax) continuations of ``prompts`` in one left-padded batch: the generated ids of each prompt,
    at most ``max_new_tokens``, each cut after its first EOS (included) when ``stop_at_eos``.

    Runs ``model.generate`` with the target's cache (chunked prefill, recurrent decode for hybrid layers) under
    the chosen linear-attention backend. A single prompt is not padded at all. ``cudnn_attention``: let torch pick
    cuDNN attention (off by default, see :func:`dflash_eval.target.backends.attention_backends`). ``sampling``:
    (params, one stream seed per prompt) to sample instead (:class:`~dflash_eval.target.sampling.SeededSampler`,
    position-indexed draws, so a row's tokens do not depend on the batch it is in); greedy params leave generation
    greedy.
    """
    if not prompts:
        return []
    from transformers import LogitsProcessorList

    rows = [torch.as_tensor(p, dtype=torch.long).flatten().cpu() for p in prompts]
    if any(r.numel() == 0 for r in rows):
        raise ValueError(f"empty prompt at index {next(i for i, r in enumerate(rows) if r.numel() == 0)}")
    eos = target.eos_token_id if stop_at_eos else None
    pad = eos if eos is not None else 0
    width = max(r.numel() for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for n, r in enumerate(rows):
        ids[n, width - r.numel():] = r
        mask[n, width - r.numel():] = 1
    extra: dict[str, Any] = {}
    if sampling is not None and not sampling[0].greedy:
        extra["logits_processor"] = LogitsProcessorList([SeededSampler(sampling[0], list(sampling[1]),
                                                                       [r.numel() for r in rows], width)])
    with use_backend(backend, target.device), attention_backends(target.device, cudnn_attention):
        out = target.model.generate(  # type: ignore[operator]  # transformers' method, seen through nn.Module.__getattr__
            ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=max_new_tokens,
            min_new_tokens=1,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
            **extra,
        )
    results = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]  # finished rows are filled with pad (= EOS) up to the longest
        results.append(row)
    return results


def greedy_generate(
    target: Target,
    prompt_ids: list[int] | Tensor,
    max_new_tokens: int,
    *,
    backend: str = "auto",
    stop_at_eos: bool = True,
) -> list[int]:
    """Greedy continuation of one prompt (:func:`greedy_generate_batch` of one, unpadded)."""
    return greedy_generate_batch(target, [prompt_ids], max_new_tokens, backend=backend, stop_at_eos=stop_at_eos)[0]


def generation_groups(lengths: dict[str, int], batch: int, min_groups: int = 1) -> list[list[str]]:
    """Split prompts (id -> prompt length) into ``ceil(n / batch)`` batches of at most ``batch`` prompts, longest
    first, so each batch holds prompts of similar length (little padding), balanced by padded size (a batch's
    prompt count x its longest prompt: what a left-padded batch costs), not by count alone. Deterministic in its
    inputs.

    ``min_groups``: at least this many batches (at most one per prompt): under xdist one per worker, so that no
    worker waits while another generates every completion in one batch."""
    if batch < 1:
        raise ValueError(f"generation batch must be >= 1, got {batch}")
    order = sorted(lengths, key=lambda p: (-lengths[p], p))
    n = len(order)
    n_groups = max(-(-n // batch), min(min_groups, n))
    if n_groups == 0:
        return []
    lens = [max(1, lengths[p]) for p in order]

    def split(cap: int) -> list[int] | None:
        """Start indices of the fewest contiguous batches whose padded size is <= cap (None: more than n_groups)."""
        starts, i = [], 0
        while i < n:
            starts.append(i)
            j = i + 1
            while j < n and j - i < batch and (j + 1 - i) * lens[i] <= cap:
                j += 1
            i = j
        return starts if len(starts) <= n_groups else None

    caps = sorted({k * lens[i] for i in range(n) for k in range(1, min(batch, n - i) + 1)})
    lo, hi = 0, len(caps) - 1
    while lo < hi:  # the smallest cap that needs no more than n_groups batches
        mid = (lo + hi) // 2
        if split(caps[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    starts = split(caps[lo]) or [0]
    while len(starts) < n_groups:  # fewer batches than asked for: halve the largest splittable one
        bounds = list(zip(starts, starts[1:] + [n]))
        a, b = max((ab for ab in bounds if ab[1] - ab[0] > 1), key=lambda ab: (ab[1] - ab[0]) * lens[ab[0]])
        starts = sorted(starts + [(a + b) // 2])
    return [order[a:b] for a, b in zip(starts, starts[1:] + [n])]
