"""τ at temperature > 0: one prompt's τ over several sampled reference completions, its spread, and the margin of
floors recorded from it.

Each sample is a reference completion drawn from the target with its own stream seed
(:func:`dflash_eval.target.sampling.stream_seed`); the chain and DDTree loops are simulated on it exactly as on a
greedy reference (:mod:`dflash_eval.metrics.tau`), which equals the online loop in distribution
(``docs/temperature.md``). A prompt's τ is the mean of its samples' τ (:class:`SampledTau`); its rounds are the
samples' rounds pooled, so histograms and per-position acceptance rates are those of every sampled round.

Confidence intervals: over a prompt's samples (:func:`sample_ci`: skew-corrected t over the samples), and for a mean
over prompts the skew-corrected t interval over the prompt means with its moments taken from the samples too
(:func:`sampled_mean`, :func:`dflash_eval.metrics.stats.sampled_hall_t_interval`), which covers both stages of the
spread (:mod:`dflash_eval.metrics.sampled_ci`).

Floors at T > 0 (:func:`spread_margin`): ``k * sqrt(2) * sd / sqrt(S)``, ``sd`` the standard deviation of the
prompt's per-sample τ and ``S`` its samples: ``sqrt(2) * sd / sqrt(S)`` is the standard deviation of the difference
of two independent S-sample means of one drafter, so a drafter as good as the recorded one falls below its floor
with a probability of about that of a normal variable below ``-k``. A fixed margin (0.25 at T = 0) does not fit:
at T = 1 the bundled target's τ sits near 1 and 0.25 below it is no floor at all.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflash_eval.metrics.sampled_ci import sampled_mean, sampled_summary
from dflash_eval.metrics.stats import Summary, summarize
from dflash_eval.metrics.tau_result import TauResult
from dflash_eval.metrics.tau_rows import TauRow

__all__ = [
    "SampledTau",
    "pool_samples",
    "row_margins",
    "sample_ci",
    "sample_row",
    "sample_taus",
    "sampled_mean",
    "sampled_summary",
    "samples_for_width",
    "spread_margin",
]


@dataclass
class SampledTau(TauResult):
    """τ of one prompt over its samples: ``tau`` the mean of the samples' τ, ``accept_lengths`` their rounds pooled."""

    samples: list[TauResult] = field(default_factory=list)

    @property
    def tau(self) -> float:
        vals = self.sample_taus
        return statistics.fmean(vals) if vals else float("nan")

    @property
    def sample_taus(self) -> list[float]:
        return [s.tau for s in self.samples if s.rounds]

    @property
    def spread(self) -> float:
        """Standard deviation of the samples' τ (NaN with fewer than 2)."""
        vals = self.sample_taus
        return statistics.stdev(vals) if len(vals) > 1 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        ci = sample_ci(self.sample_taus)
        return {**super().to_dict(), "samples": len(self.samples), "sample_tau": self.sample_taus,
                "sample_ci95": [ci.ci_low, ci.ci_high], "sample_ci_method": ci.ci_method}


def pool_samples(samples: Sequence[TauResult], block_size: int, method: str) -> SampledTau:
    """One prompt's :class:`SampledTau` from its samples' results."""
    lens = [a for s in samples for a in s.accept_lengths]
    return SampledTau(lens, block_size, method, samples=list(samples))


def sample_ci(values: Sequence[float]) -> Summary:
    """Mean and skew-corrected t 95 % CI over one prompt's samples (method ``Hall t over samples``)."""
    return summarize(values, over="samples")


def sample_taus(results: Mapping[str, TauResult]) -> dict[str, list[float]]:
    """Each prompt's per-sample τ of a run at temperature > 0 (:attr:`SampledTau.sample_taus`; empty for a greedy
    run): what :func:`dflash_eval.metrics.stats.paired_difference` pairs sample by sample."""
    return {p: r.sample_taus for p, r in results.items() if isinstance(r, SampledTau)}


def spread_margin(sample_taus: Sequence[float], sigmas: float) -> float:
    """The floor margin of one prompt at T > 0 (module docstring); ValueError with fewer than 2 samples."""
    vals = [float(v) for v in sample_taus if not math.isnan(v)]
    if len(vals) < 2:
        raise ValueError(f"a margin from the spread over samples needs >= 2 samples of the prompt, got {len(vals)}; "
                         "record with --samples-per-prompt 2 or more")
    return sigmas * math.sqrt(2.0) * statistics.stdev(vals) / math.sqrt(len(vals))


def samples_for_width(per_prompt: Mapping[str, Sequence[float]], width: float, *, z: float = 1.96) -> int:
    """Samples per prompt for a 95 % CI of the mean τ over these prompts of total width ``width``: with ``n``
    prompts, the mean's variance is ``(var_between + mean within-prompt var / S) / n``; solved for S (the
    between-prompt part alone may already be wider: then no S suffices and -1 is returned)."""
    groups = [list(map(float, v)) for v in per_prompt.values() if len(v) > 1]
    n = len(groups)
    if n < 2:
        raise ValueError("needs >= 2 prompts with >= 2 samples each")
    within = statistics.fmean(statistics.variance(g) for g in groups)
    s_now = statistics.fmean(len(g) for g in groups)
    between = max(0.0, statistics.variance([statistics.fmean(g) for g in groups]) - within / s_now)
    budget = n * (width / (2 * z)) ** 2 - between
    return -1 if budget <= 0 else max(1, math.ceil(within / budget))


def sample_row(chain: TauResult, ddtree: Mapping[int, TauResult]) -> dict[str, Any]:
    """The eval.json prompt-row fields of a sampled prompt (none for a greedy one): its samples, their τ (chain and
    each DDTree budget) and the 95 % CI of the chain mean over them."""
    if not isinstance(chain, SampledTau):
        return {}
    ci = sample_ci(chain.sample_taus)
    return {"samples": len(chain.samples), "sample_tau": chain.sample_taus, "sample_ci95": [ci.ci_low, ci.ci_high],
            "sample_ci_method": ci.ci_method,
            "ddtree_sample_tau": {str(b): t.sample_taus for b, t in ddtree.items() if isinstance(t, SampledTau)}}


def row_margins(rows: Mapping[str, TauRow], sigmas: float) -> tuple[dict[str, float],
                                                                    dict[int, dict[str, float]]] | None:
    """Per-prompt floor margins (chain, and per DDTree budget) from the typed prompt rows of a sampled run
    (:func:`spread_margin`); None when the rows are greedy."""
    if not rows or not all(r.sample_tau is not None for r in rows.values()):
        return None
    chain = {p: spread_margin(r.sample_tau or [], sigmas) for p, r in rows.items()}
    dd: dict[int, dict[str, float]] = {}
    for p, r in rows.items():
        for b, vals in (r.ddtree_sample_tau or {}).items():
            dd.setdefault(int(b), {})[p] = spread_margin(vals, sigmas)
    return chain, dd

