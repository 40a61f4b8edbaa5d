"""The local target's check of an SGLang server's sampled completions, before any of them is cached.

A sampled completion cannot be compared with the target's argmax; what can be checked is whether its tokens are
plausible draws of the target's processed distribution ``q`` (temperature, top-k, top-p, min-p of the run:
:func:`dflash_eval.target.sampling.process_logprobs`). Every completion is teacher-forced through the local target
(right-padded batches, as the greedy check does, :mod:`dflash_eval.serving.server_check`) and, per completion:

- **support**: tokens outside the support of ``q`` (removed by top-k / top-p / min-p) cannot be drawn; more than
  ``max(1, SERVER_MAX_DISAGREEMENT x tokens)`` of them refuse the server (a bf16 server can move a token across a
  filter's boundary, hence the slack, as for the greedy check's near-ties);
- **likelihood**: with ``s_t = log q_t(x_t)`` the log-probability of the served token at position t, a draw from
  ``q_t`` has ``E[s_t] = -H(q_t)`` (the entropy) and variance ``V_t = sum q log^2 q - H^2``, whatever was drawn
  before. So ``z = sum_t (s_t + H_t) / sqrt(sum_t V_t)`` (over the in-support tokens) is a sum of martingale
  differences scaled to unit variance: about standard normal for a server that samples the target, and far below
  zero for one whose tokens the target finds improbable (other weights, another tokenizer). ``z <``
  :data:`MIN_LIKELIHOOD_Z` refuses the server. With the positions' variances taken as given, ``z`` has mean 0
  and variance 1, so by Cantelli's inequality a draw of the right model reaches -8 with probability at most
  ``1 / (1 + 8^2) = 1.5 %`` whatever the distributions, and far less where the normal approximation holds (a
  completion of more than a few tokens); a server that serves other weights sits tens of units below it
  (``tests/test_sglang_sampled.py``).

One error names the prompt, the sample, what failed and the worst token; nothing of the fetch is cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dflash_eval.errors import EvalError
from dflash_eval.serving.server_check import SERVER_MAX_DISAGREEMENT, teacher_forced_rows
from dflash_eval.target.sampling import process_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dflash_eval.inputs.run_inputs import Inputs
    from dflash_eval.target.sampling_params import SamplingParams

__all__ = ["MIN_LIKELIHOOD_Z", "SampleFit", "check_sampled_completions", "sample_fit"]

#: Below this likelihood z-score (module docstring) a sampled completion is refused.
MIN_LIKELIHOOD_Z = -8.0


@dataclass(frozen=True)
class SampleFit:
    """How well one served completion fits the target's processed distribution (module docstring)."""

    item: str
    n_tokens: int
    outside: list[int]  # completion positions whose token is outside the support of q
    z: float  # the likelihood z-score over the in-support tokens
    mean_logq: float  # mean log q of the served tokens (in support)
    mean_expected: float  # mean of -H(q) at those positions
    worst: int  # completion position of the least likely in-support token (-1: none)
    worst_logq: float

    @property
    def refused(self) -> bool:
        return len(self.outside) > max(1, int(SERVER_MAX_DISAGREEMENT * self.n_tokens)) or self.z < MIN_LIKELIHOOD_Z


def sample_fit(item: str, ids: list[int], logq: torch.Tensor) -> SampleFit:
    """The fit of the served ``ids`` to ``logq`` [len(ids), V] (the processed log-probabilities at the positions
    that predict them; -inf outside the support)."""
    lq = logq.double()
    tok = torch.tensor(ids, dtype=torch.long, device=lq.device)
    s = lq.gather(1, tok[:, None])[:, 0]
    inside = torch.isfinite(s)
    q = lq.exp()
    plogp = torch.where(q > 0, q * lq, torch.zeros_like(q))
    neg_h = plogp.sum(-1)  # E[log q(x)] = -H
    var = (torch.where(q > 0, q * lq * lq, torch.zeros_like(q)).sum(-1) - neg_h * neg_h).clamp_min(0.0)
    dev = (s - neg_h)[inside]
    total_var = float(var[inside].sum())
    num = float(dev.sum()) if dev.numel() else 0.0
    if total_var > 0:
        z = num / math.sqrt(total_var)
    else:  # every position deterministic: any deviation is a token the target never draws there
        z = 0.0 if num > -1e-6 else -math.inf
    n_in = int(inside.sum())
    worst, worst_lq = -1, 0.0
    if n_in:
        masked = torch.where(inside, s, torch.full_like(s, math.inf))
        worst = int(masked.argmin())
        worst_lq = float(masked[worst])
    return SampleFit(item, len(ids), torch.nonzero(~inside).flatten().tolist(), z,
                     float(s[inside].mean()) if n_in else math.nan,
                     float(neg_h[inside].mean()) if n_in else math.nan, worst, worst_lq)


def _describe(fit: SampleFit, ids: list[int], tokenizer: PreTrainedTokenizerBase) -> str:
    def token(t: int) -> str:
        try:
            return repr(tokenizer.decode([t]))
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode a lone id: the id alone says enough
            return "?"

    if len(fit.outside) > max(1, int(SERVER_MAX_DISAGREEMENT * fit.n_tokens)):
        k = fit.outside[0]
        return (f"{len(fit.outside)} of its {fit.n_tokens} tokens lie outside the support of the target's processed "
                f"distribution (first at completion token {k}: {ids[k]} {token(ids[k])}, which top-k / top-p / "
                "min-p remove there)")
    k = fit.worst
    return (f"its tokens are implausible draws of the target's processed distribution: likelihood z-score "
            f"{fit.z:.1f} (refused below {MIN_LIKELIHOOD_Z:g}; about N(0, 1) for the right model), mean log q "
            f"{fit.mean_logq:.2f} per token where draws of the target average {fit.mean_expected:.2f}; least likely "
            f"token at completion position {k}: {ids[k]} {token(ids[k])} with log q {fit.worst_logq:.2f}")


def check_sampled_completions(inputs: Inputs, items: list[tuple[str, list[int], list[int]]], params: SamplingParams,
                              url: str) -> list[SampleFit]:
    """Teacher-force every (item name, prompt ids, served completion ids) of ``items`` through ``inputs.target``
    and raise :class:`EvalError` if any completion is refused (module docstring); else return their fits."""
    if not items:
        return []
    s = inputs.settings
    by_item = {name: c for name, _, c in items}
    fits = {name: sample_fit(name, ids, process_logprobs(lg, params))
            for name, ids, lg in teacher_forced_rows(inputs, items)}
    bad = [fits[name] for name, _, _ in items if fits[name].refused]
    if bad:
        f = bad[0]
        others = f"; also refused: {[b.item for b in bad[1:]]}" if len(bad) > 1 else ""
        raise EvalError(
            f"{url} does not sample the target {s.target_model}: its sampled completion {f.item} (--temperature "
            f"{params.temperature:g}, top-k {params.top_k}, top-p {params.top_p:g}, min-p {params.min_p:g}): "
            f"{_describe(f, by_item[f.item], inputs.tokenizer)}{others}; {len(items) - len(bad)} of the "
            f"{len(items)} completions of this fetch fit. Other weights, another tokenizer, other sampling settings "
            "on the server's side, or a replica behind the URL that serves something else? No completion cached")
    return [fits[name] for name, _, _ in items]
