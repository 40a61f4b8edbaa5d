"""The local target's check of an SGLang server's sampled completions, before any of them is cached.

A sampled completion cannot be compared with the target's argmax; what can be checked is whether its tokens are
draws of the target's processed distribution ``q`` (temperature, top-k, top-p, min-p of the run:
:func:`dflash_eval.target.sampling.process_logprobs`), neither too improbable (other weights, another tokenizer,
too high a temperature, an ignored truncation) nor too probable (greedy answers to a sampled request, too low a
temperature, a truncation that was not asked: what a proxy that drops ``sampling_params`` keys serves). Every
completion of a fetch is teacher-forced through the local target (right-padded batches, as the greedy check does,
:mod:`dflash_eval.references.server_check`), so ``q`` is the local target's: a server in another precision draws from
a slightly other distribution, which the thresholds below leave room for (``docs/temperature.md``).

- **Support**: tokens outside the support of ``q`` (removed by top-k / top-p / min-p) cannot be drawn; more than
  ``max(1, SERVER_MAX_DISAGREEMENT x tokens)`` of them in one completion refuse the server (a bf16 server can move
  a token across a filter's boundary, hence the slack, as for the greedy check's near-ties).
- **Likelihood score**: with ``s_t = log q_t(x_t)`` the log-probability of the served token at completion position
  t, a draw from ``q_t`` has ``E[s_t] = -H(q_t)`` (the entropy) and variance ``V_t = sum q log^2 q - H(q_t)^2``,
  whatever was drawn before. So ``D = sum_t (s_t + H_t)`` over the in-support tokens of a set of completions is a
  sum of martingale differences, and ``z = D / sqrt(sum_t V_t)`` is about standard normal for a server that samples
  ``q``. ``D`` is the score statistic of the tempered family ``q^b / Z(b)`` at ``b = 1`` (its derivative in ``b``),
  so it is the locally most powerful test against a server that samples at another temperature, in either
  direction: a sharper sampler (``b > 1``: greedy, a lower temperature, an extra truncation) draws the likelier
  tokens, ``z >> 0``; a flatter one (a higher temperature, other weights) the unlikelier ones, ``z << 0``.
  Positions where ``q`` is (nearly) deterministic have ``s_t + H_t ~ 0`` and ``V_t ~ 0``: they neither add evidence
  nor dilute it.

The score is taken twice: per completion (``z`` of its own tokens; refused below :data:`SAMPLE_Z_FLAT` or above
:data:`SAMPLE_Z_SHARP`: one completion of another replica) and pooled over the whole fetch (``Z`` of every token of
every completion fetched in one go; refused below :data:`FETCH_Z_FLAT` or above :data:`FETCH_Z_SHARP`), where a
small effect per token, too small to show in one completion, adds up: on the bundled target at T 0.6, greedy
completions of 16 tokens score about +2.5 to +3 each, four of them about +5 together. The left tail of the score is
heavy (an improbable token is a large negative term), hence the flat thresholds far out. The right tail is light where
many positions share the variance, since each term is at most ``b_t = log max q_t + H_t``; where a few positions
carry it (a moderately likely argmax over a flat tail) it is not, so a sharp score refuses only where Freedman's
inequality with the largest ``b_t`` also bounds its chance for a right server by :data:`SHARP_GUARANTEE`
(:func:`freedman_tail`), whatever the distributions. The thresholds come from false-refusal rates measured on
seeded draws of the bundled target (``benchmarks/bench_sample_check.py``; numbers and commands in
``docs/temperature.md``).

One error names what failed (support, too sharp, too flat), where (the sample ``prompt#k``, or the fetch and its
most extreme sample), the score and its threshold, and diagnostics (mean log q against the draws' expectation, the
share of tokens that are the target's argmax against the share draws would have); nothing of the fetch is cached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dflash_eval.errors import EvalError
from dflash_eval.references.server_check import SERVER_MAX_DISAGREEMENT, teacher_forced_rows
from dflash_eval.target.sampling import process_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dflash_eval.inputs.run_inputs import Inputs
    from dflash_eval.target.sampling_params import SamplingParams

__all__ = ["FETCH_Z_FLAT", "FETCH_Z_SHARP", "SAMPLE_Z_FLAT", "SAMPLE_Z_SHARP", "SHARP_GUARANTEE", "FetchFit",
           "Refusal", "SampleFit", "TokenScores", "check_sampled_completions", "describe", "fetch_fit",
           "fit_of_scores", "freedman_tail", "sample_fit", "sharp", "token_scores"]

#: Below this likelihood z-score one completion is refused as too flat (improbable tokens: other weights, a higher
#: temperature). Its left tail is heavy, hence far out; by Cantelli's inequality a right draw reaches -8 with
#: probability at most 1 / (1 + 8^2) whatever the distributions.
SAMPLE_Z_FLAT = -8.0
#: Above this likelihood z-score one completion is refused as too sharp (greedy, a lower temperature).
SAMPLE_Z_SHARP = 5.0
#: Below this z-score pooled over a fetch's tokens the fetch is refused as too flat.
FETCH_Z_FLAT = -6.0
#: Above this z-score pooled over a fetch's tokens the fetch is refused as too sharp.
FETCH_Z_SHARP = 4.0
#: A score refuses as too sharp only where Freedman's bound (:func:`freedman_tail`) puts the chance of reaching it
#: for a right server at most this, whatever the target's distributions.
SHARP_GUARANTEE = 1e-3

TOO_SHARP = "too sharp"
TOO_FLAT = "too flat"
OUTSIDE = "outside the support"


@dataclass(frozen=True)
class SampleFit:
    """How well one served completion fits the target's processed distribution (module docstring)."""

    item: str
    n_tokens: int
    outside: list[int]  # completion positions whose token is outside the support of q
    score: float  # sum over the in-support tokens of log q(x) + H(q)
    variance: float  # sum over the in-support tokens of Var_q[log q]
    mean_logq: float  # mean log q of the served tokens (in support)
    mean_expected: float  # mean of -H(q) at those positions
    n_argmax: int  # in-support tokens that are the argmax of q
    expected_argmax: float  # their expected number for draws of q (the sum of max q)
    worst: int  # completion position of the least likely in-support token (-1: none)
    worst_logq: float
    max_gain: float  # the largest score term a draw could add at one of its positions: max_t log max q_t + H_t

    @property
    def n_inside(self) -> int:
        return self.n_tokens - len(self.outside)

    @property
    def z(self) -> float:
        """The likelihood z-score of this completion's in-support tokens (module docstring)."""
        return _z(self.score, self.variance)

    @property
    def outside_refused(self) -> bool:
        return len(self.outside) > max(1, int(SERVER_MAX_DISAGREEMENT * self.n_tokens))

    @property
    def refused(self) -> bool:
        """Whether this completion alone refuses the server."""
        return self.outside_refused or self.z < SAMPLE_Z_FLAT or sharp(self.z, self.max_gain, self.variance,
                                                                       SAMPLE_Z_SHARP)


def freedman_tail(z: float, max_gain: float, variance: float) -> float:
    """Freedman's bound on the chance that a martingale whose terms are at most ``max_gain`` and whose variances sum
    to ``variance`` reaches ``z`` standard deviations: ``exp(-z^2 / (2 (1 + b z / 3)))``, ``b = max_gain /
    sqrt(variance)``. It holds for any distributions, where the normal tail needs many comparable terms."""
    if variance <= 0 or z <= 0:
        return 1.0
    b = max(0.0, max_gain) / math.sqrt(variance)
    return math.exp(-z * z / (2.0 * (1.0 + b * z / 3.0)))


def sharp(z: float, max_gain: float, variance: float, threshold: float) -> bool:
    """Whether a score of ``z`` refuses as too sharp: above ``threshold`` and past :data:`SHARP_GUARANTEE` by
    Freedman's bound (:func:`freedman_tail`), so that a few positions of heavy right tail (a moderately likely
    argmax over a flat tail) cannot make a right server look sharp."""
    return z > threshold and freedman_tail(z, max_gain, variance) <= SHARP_GUARANTEE


def _z(score: float, variance: float) -> float:
    if variance > 0:
        return score / math.sqrt(variance)
    # every position deterministic: any deviation is a token the target never draws there
    return 0.0 if score > -1e-6 else -math.inf


@dataclass(frozen=True)
class Refusal:
    """One reason to refuse a fetch: ``what`` (:data:`OUTSIDE`, :data:`TOO_SHARP`, :data:`TOO_FLAT`) of one
    completion (``pooled`` False) or of the whole fetch (``pooled`` True, ``fit`` its most extreme completion)."""

    what: str
    pooled: bool
    z: float
    threshold: float
    fit: SampleFit


@dataclass(frozen=True)
class FetchFit:
    """The fits of every completion of one fetch and the pooled likelihood score (module docstring)."""

    samples: tuple[SampleFit, ...]

    @property
    def score(self) -> float:
        return sum(f.score for f in self.samples)

    @property
    def variance(self) -> float:
        return sum(f.variance for f in self.samples)

    @property
    def z(self) -> float:
        """The likelihood z-score pooled over every in-support token of the fetch."""
        return _z(self.score, self.variance)

    @property
    def n_tokens(self) -> int:
        return sum(f.n_inside for f in self.samples)

    @property
    def max_gain(self) -> float:
        return max((f.max_gain for f in self.samples), default=0.0)

    def refusals(self) -> list[Refusal]:
        """Why the fetch is refused, most telling first (empty: accepted): completions with tokens outside the
        support, then completions too flat or too sharp on their own, then the pooled score."""
        out = [Refusal(OUTSIDE, False, f.z, math.nan, f) for f in self.samples if f.outside_refused]
        for f in sorted(self.samples, key=lambda f: -abs(f.z)):
            if f.z < SAMPLE_Z_FLAT:
                out.append(Refusal(TOO_FLAT, False, f.z, SAMPLE_Z_FLAT, f))
            elif sharp(f.z, f.max_gain, f.variance, SAMPLE_Z_SHARP):
                out.append(Refusal(TOO_SHARP, False, f.z, SAMPLE_Z_SHARP, f))
        z = self.z
        if self.samples and z < FETCH_Z_FLAT:
            out.append(Refusal(TOO_FLAT, True, z, FETCH_Z_FLAT, min(self.samples, key=lambda f: f.z)))
        elif self.samples and sharp(z, self.max_gain, self.variance, FETCH_Z_SHARP):
            out.append(Refusal(TOO_SHARP, True, z, FETCH_Z_SHARP, max(self.samples, key=lambda f: f.z)))
        return out

    @property
    def refused(self) -> bool:
        return bool(self.refusals())


@dataclass(frozen=True)
class TokenScores:
    """Per-position terms of the likelihood score (float64 tensors of one shape, the positions'): ``logq`` of the
    served token (-inf outside the support), ``neg_entropy`` (E[log q] = -H), ``variance`` (Var_q[log q]) and
    ``top_logq`` (log q of the argmax)."""

    logq: torch.Tensor
    neg_entropy: torch.Tensor
    variance: torch.Tensor
    top_logq: torch.Tensor


def token_scores(logq: torch.Tensor, ids: torch.Tensor) -> TokenScores:
    """The score terms of the served ``ids`` [...] under ``logq`` [..., V] (the processed log-probabilities at the
    positions that predict them; -inf outside the support), any leading shape."""
    lq = logq.double()
    s = lq.gather(-1, ids.to(device=lq.device, dtype=torch.long)[..., None])[..., 0]
    q = lq.exp()
    finite = q > 0
    neg_h = torch.where(finite, q * lq, torch.zeros_like(q)).sum(-1)
    var = (torch.where(finite, q * lq * lq, torch.zeros_like(q)).sum(-1) - neg_h * neg_h).clamp_min(0.0)
    return TokenScores(s, neg_h, var, lq.max(-1).values)


def fit_of_scores(item: str, sc: TokenScores) -> SampleFit:
    """One completion's :class:`SampleFit` from its positions' :class:`TokenScores` (1-D)."""
    s, neg_h, var, top = (t.detach().double().cpu() for t in (sc.logq, sc.neg_entropy, sc.variance, sc.top_logq))
    inside = torch.isfinite(s)
    n_in = int(inside.sum())
    worst, worst_lq = -1, 0.0
    if n_in:
        masked = torch.where(inside, s, torch.full_like(s, math.inf))
        worst = int(masked.argmin())
        worst_lq = float(masked[worst])
    si, hi, ti = s[inside], neg_h[inside], top[inside]
    return SampleFit(item, int(s.numel()), torch.nonzero(~inside).flatten().tolist(),
                     float((si - hi).sum()), float(var[inside].sum()),
                     float(si.mean()) if n_in else math.nan, float(hi.mean()) if n_in else math.nan,
                     int((si >= ti).sum()), float(ti.exp().sum()), worst, worst_lq,
                     float((ti - hi).max()) if n_in else 0.0)


def sample_fit(item: str, ids: Sequence[int], logq: torch.Tensor) -> SampleFit:
    """The fit of the served ``ids`` to ``logq`` [len(ids), V] (the processed log-probabilities at the positions
    that predict them; -inf outside the support)."""
    return fit_of_scores(item, token_scores(logq, torch.tensor(list(ids), dtype=torch.long)))


def fetch_fit(fits: Sequence[SampleFit]) -> FetchFit:
    """The pooled fit of one fetch's completions."""
    return FetchFit(tuple(fits))


def _token(tokenizer: PreTrainedTokenizerBase, t: int) -> str:
    try:
        return repr(tokenizer.decode([t]))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode a lone id: the id alone says enough
        return "?"


def _diagnostics(n: int, score: float, mean_logq: float, mean_expected: float, n_argmax: int,
                 expected_argmax: float) -> str:
    share = n_argmax / n if n else math.nan
    expected = expected_argmax / n if n else math.nan
    return (f"mean log q {mean_logq:.3f} per token where draws of the target average {mean_expected:.3f}; "
            f"{share:.0%} of its {n} tokens are the target's argmax where draws would have {expected:.0%}")


def describe(r: Refusal, fetch: FetchFit, ids: Sequence[int], tokenizer: PreTrainedTokenizerBase) -> str:
    """One refusal in words: the direction, the sample, the score and its threshold, and diagnostics."""
    f = r.fit
    if r.what == OUTSIDE:
        k = f.outside[0]
        return (f"sampled completion {f.item}: {len(f.outside)} of its {f.n_tokens} tokens lie outside the support of "
                f"the target's processed distribution (first at completion token {k}: {ids[k]} "
                f"{_token(tokenizer, ids[k])}, which top-k / top-p / min-p remove there): an ignored truncation?")
    if r.what == TOO_SHARP:
        why = ("its tokens are likelier than draws of the target's processed distribution: greedy answers, a lower "
               "temperature, or a truncation that was not asked (a proxy that drops sampling_params keys?)")
    else:
        why = ("its tokens are unlikelier than draws of the target's processed distribution: other weights, another "
               "tokenizer, a higher temperature, or a truncation ignored")
    if r.pooled:
        n = fetch.n_tokens
        mean_lq = sum(s.mean_logq * s.n_inside for s in fetch.samples if s.n_inside) / max(1, n)
        mean_ex = sum(s.mean_expected * s.n_inside for s in fetch.samples if s.n_inside) / max(1, n)
        diag = _diagnostics(n, fetch.score, mean_lq, mean_ex, sum(s.n_argmax for s in fetch.samples),
                            sum(s.expected_argmax for s in fetch.samples))
        return (f"{r.what} over the fetch: {why}; likelihood z-score {r.z:+.1f} "
                f"pooled over the {len(fetch.samples)} completions of the fetch (refused "
                f"{'above' if r.what == TOO_SHARP else 'below'} {r.threshold:+g}; about N(0, 1) for a server that "
                f"samples the target); {diag}; its {'sharpest' if r.what == TOO_SHARP else 'flattest'} sample "
                f"{f.item} scores {f.z:+.1f} on its own")
    diag = _diagnostics(f.n_inside, f.score, f.mean_logq, f.mean_expected, f.n_argmax, f.expected_argmax)
    worst = ""
    if r.what == TOO_FLAT and f.worst >= 0:
        k = f.worst
        worst = (f"; least likely token at completion position {k}: {ids[k]} {_token(tokenizer, ids[k])} with log q "
                 f"{f.worst_logq:.2f}")
    return (f"sampled completion {f.item} {r.what}: {why}; likelihood z-score {r.z:+.1f} (refused "
            f"{'above' if r.what == TOO_SHARP else 'below'} {r.threshold:+g}; about N(0, 1) for a server that samples "
            f"the target); {diag}{worst}")


def check_sampled_completions(inputs: Inputs, items: list[tuple[str, list[int], list[int]]], params: SamplingParams,
                              url: str) -> FetchFit:
    """Teacher-force every (item name, prompt ids, served completion ids) of ``items`` (one fetch) through
    ``inputs.target`` and raise :class:`EvalError` if the fetch is refused (module docstring); else return its
    fit."""
    if not items:
        return FetchFit(())
    s = inputs.settings
    by_item = {name: c for name, _, c in items}
    fits = {name: sample_fit(name, ids, process_logprobs(lg, params))
            for name, ids, lg in teacher_forced_rows(inputs, items)}
    fetch = FetchFit(tuple(fits[name] for name, _, _ in items))
    refusals = fetch.refusals()
    if refusals:
        r = refusals[0]
        others = ""
        if len(refusals) > 1:
            others = "; also: " + ", ".join(f"{o.fit.item if not o.pooled else 'the fetch'} {o.what} "
                                            f"({'z ' + format(o.z, '+.1f') if o.what != OUTSIDE else 'support'})"
                                            for o in refusals[1:])
        raise EvalError(
            f"{url} does not sample the target {s.target_model} as asked (--temperature {params.temperature:g}, "
            f"top-k {params.top_k}, top-p {params.top_p:g}, min-p {params.min_p:g}): "
            f"{describe(r, fetch, by_item[r.fit.item], inputs.tokenizer)}{others}. Other weights, another tokenizer, "
            "other sampling settings on the server's side, or a replica behind the URL that serves something else? "
            "No completion of this fetch cached")
    return fetch
