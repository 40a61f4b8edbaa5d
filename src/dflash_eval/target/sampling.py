"""The target's sampling at temperature > 0: logits processing and seeded, position-indexed random draws.

Processing (:func:`process_logprobs`) follows the order in which SGLang's speculative verification prepares the
target's probabilities (``build_dflash_verify_target_probs``: temperature, softmax, top-k renormalised, then top-p
on the renormalised top-k probabilities), which is also transformers' warper order (temperature, top-k, top-p,
min-p), then min-p (``p < min_p * p_max`` removed, as transformers' ``MinPLogitsWarper`` and SGLang's sampler do;
SGLang's DFlash verification does not apply min-p). Where the two libraries differ, this module follows the
engine's verifier and says so in ``docs/temperature.md``: the top-p boundary (a token is kept when the probability
mass strictly before it, in descending order, is at most ``top_p``, SGLang's rule; transformers removes a token when
the mass of the tokens at or below it is at most ``1 - top_p``, which differs only at exact equality), and top-k
ties (every token equal to the k-th largest logit is kept, as transformers' ``TopKLogitsWarper``). Defaults are
SGLang's (``top_k`` -1 = all, ``top_p`` 1, ``min_p`` 0), not transformers' ``GenerationConfig`` (``top_k`` 50).

Draws (:func:`gumbel_noise`): a token is drawn by the Gumbel-max trick, ``argmax(logp + g)``, with ``g`` a
function of (stream seed, absolute position, token id) only, the scheme of SGLang's seeded sampler
(``multinomial_with_seed``: a 32-bit murmur-style hash of seed, position and column, turned into Gumbel noise in
float64). So the token drawn at a position depends on the logits there and on nothing drawn before: reference
generation and the online speculative loop, given the same stream seed, consume the same random number at every
position (the condition under which offline and online τ agree exactly, ``docs/temperature.md``). A stream is
one (run seed, prompt, sample index) triple (:func:`stream_seed`).

Temperature below :data:`GREEDY_EPS` (SGLang's sampling epsilon) or ``top_k == 1`` is greedy: plain argmax.

Example::

    params = SamplingParams(temperature=0.6, top_p=0.95)
    ids = sample_tokens(logits, params, seeds=torch.tensor([stream_seed(0, "p1", 0)]), positions=torch.tensor([57]))
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from dflash_eval.target.sampling_params import GREEDY_EPS, SamplingParams

__all__ = ["GREEDY_EPS", "SamplingParams", "process_logprobs", "gumbel_noise", "sample_tokens", "stream_seed",
           "SeededSampler"]

_M32 = 0xFFFFFFFF


def process_logprobs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Log-probabilities [n, V] (float32) of the processed distribution: -inf outside the kept tokens, the kept
    ones renormalised (module docstring for the order and the boundary rules)."""
    x = logits.float() / max(params.temperature, GREEDY_EPS)
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    lp = torch.log_softmax(x, dim=-1)
    if params.top_p < 1.0:
        sp, idx = lp.exp().sort(dim=-1, descending=True)
        before = sp.cumsum(dim=-1) - sp  # mass strictly before each token
        drop = torch.zeros_like(before, dtype=torch.bool).scatter_(-1, idx, before > params.top_p)
        lp = torch.log_softmax(lp.masked_fill(drop, float("-inf")), dim=-1)
    if params.min_p > 0.0:
        top = lp.max(dim=-1, keepdim=True).values
        lp = torch.log_softmax(lp.masked_fill(lp < top + torch.log(torch.tensor(params.min_p)), float("-inf")),
                               dim=-1)
    return lp


def _mul32(a: Tensor, c: int) -> Tensor:
    """``(a * c) mod 2**32`` for 32-bit ``a`` held in int64, in halves so that no product overflows."""
    lo, hi = c & 0xFFFF, c >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & _M32


def _rotl(x: Tensor, r: int) -> Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h: Tensor, k: Tensor) -> Tensor:
    k = _mul32(_rotl(_mul32(k & _M32, 0xCC9E2D51), 15), 0x1B873593)
    h = _rotl(h ^ k, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _M32


def _fmix(h: Tensor) -> Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def gumbel_noise(seeds: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """Gumbel noise [n, V] (float64): row i a function of (``seeds[i]``, ``positions[i]``, token id) alone."""
    dev = seeds.device
    s = seeds.to(torch.int64)[:, None]
    cols = torch.arange(vocab, device=dev, dtype=torch.int64)[None, :]
    h = _mix(torch.zeros_like(s), s & _M32)
    h = _mix(h, (s >> 32) & _M32)
    h = _mix(h, positions.to(device=dev, dtype=torch.int64)[:, None] & _M32)
    h = _fmix(_mix(h.expand(-1, vocab), cols.expand(s.shape[0], -1)))
    u = (h.to(torch.float64) + 0.5) / 4294967296.0  # in (0, 1), never 0 or 1
    return -torch.log(-torch.log(u))


def sample_tokens(logits: Tensor, params: SamplingParams, *, seeds: Tensor, positions: Tensor) -> Tensor:
    """The target's token [n] (long) at each row: argmax when greedy, else the Gumbel-max draw of the processed
    distribution with the row's stream seed at the row's absolute position."""
    if params.greedy:
        return logits.argmax(dim=-1)
    lp = process_logprobs(logits, params).to(torch.float64)
    return (lp + gumbel_noise(seeds.to(logits.device), positions.to(logits.device), lp.shape[-1])).argmax(dim=-1)


def stream_seed(seed: int, prompt_id: str, sample: int) -> int:
    """The stream seed of one (run seed, prompt id, sample index): 31 bits (an SGLang ``sampling_seed``), stable
    across processes and selections."""
    digest = hashlib.sha256(f"{int(seed)}\x00{prompt_id}\x00{int(sample)}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class SeededSampler:
    """A transformers ``LogitsProcessor`` that turns greedy ``generate`` into seeded sampling: each row's scores
    become 0 at :func:`sample_tokens`'s draw and -inf elsewhere, so the greedy step picks the draw.

    ``prompt_lens[i]``: row i's real prompt length; ``width``: the padded prompt width; a row's next token sits at
    absolute position ``prompt_lens[i] + (cur_len - width)`` (the position count of its own sequence)."""

    def __init__(self, params: SamplingParams, seeds: list[int], prompt_lens: list[int], width: int) -> None:
        self.params, self.width = params, width
        self.seeds = torch.tensor(seeds, dtype=torch.int64)
        self.prompt_lens = torch.tensor(prompt_lens, dtype=torch.int64)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        pos = self.prompt_lens + (input_ids.shape[1] - self.width)
        ids = sample_tokens(scores, self.params, seeds=self.seeds, positions=pos)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, ids[:, None].to(scores.device), 0.0)
