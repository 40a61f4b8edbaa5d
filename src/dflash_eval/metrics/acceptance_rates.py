"""Per-position acceptance rates and acceptance-length histograms, per prompt, pooled per category and over a run,
for every source that counted speculative rounds.

A round's acceptance length is ``acc + 1`` (1..B). Draft slot k (1..B-1) is accepted in a round exactly when the
round's length is at least k + 1, so the per-position acceptance rate is

    rate_k = (rounds with length >= k + 1) / rounds,

the quantity vLLM's spec-decode metrics report per position (accepted at position k / drafts). Rates are
non-increasing in k; their sum plus one is the mean acceptance length (τ) of the pooled rounds. Histograms are
lists of round counts, index i = rounds of acceptance length i + 1; that is also the layout of an SGLang server's
``meta_info.spec_accept_histogram`` (index n = rounds that accepted n drafts), so server histograms pool as they are.
The last round of a response can be cut short by the end of the completion (it may not commit past it), which
lowers the rates of late slots a little for short completions, in every source alike.

Two τ of a set of responses, both reported, never to be compared with each other (docs/manual.md, "Macro and
pooled τ"): the **macro** τ, the mean over responses of each response's mean acceptance length (eval.json's
``mean_tau``: what z-lab's DFlash benchmark reports), and the **pooled** τ, accepted tokens over verification rounds
across every round of every response (:func:`pooled_tau`; eval.json's ``mean_tau_pooled`` and the ``tau`` of every
acceptance block here: what SGLang's ``spec_accept_length`` and SpecForge's benchmark report). Short responses with
few rounds weigh as much as long ones in the macro τ and less in the pooled one, so the two differ whenever τ varies
with length.

Sources (:data:`SOURCES`): ``chain`` the offline simulation on the reference (eval.json row ``histogram``),
``online`` the real speculative loop (``--online-tau``: row ``online.histogram``), ``server`` an SGLang server
running the drafter (row ``server_histogram``, when the server reports one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dflash_eval.metrics.tau_rows import PooledRow, TauRow

__all__ = ["SOURCES", "TAU_DEFINITIONS", "TAU_KINDS_NOTE", "histogram", "position_rates", "pool", "acceptance_block",
           "row_histograms", "acceptance_table", "pooled_tau", "pooled_means"]

SOURCES = ("chain", "online", "server")

#: What the two τ of a report are (gate.md and history.md say it under their tables; eval.md in its τ line).
TAU_KINDS_NOTE = ("τ (macro): the mean over prompts of each prompt's mean acceptance length, as z-lab's DFlash "
                  "benchmark reports it; pooled τ: accepted tokens / verification rounds over every round of every "
                  "prompt, as SGLang's spec_accept_length and SpecForge's benchmark report it. Compare each only with "
                  "its own kind.")
#: The two τ of a set of responses, as eval.json's ``tau_definitions`` names them.
TAU_DEFINITIONS = {
    "macro": "mean over prompts of each prompt's mean acceptance length (mean_tau, mean_ddtree, the categories' "
             "means; z-lab's DFlash benchmark)",
    "pooled": "accepted tokens / verification rounds over every round of every prompt (mean_tau_pooled, "
              "mean_ddtree_pooled, the acceptance blocks' tau; SGLang's spec_accept_length, SpecForge's benchmark)",
}


def histogram(accept_lengths: Iterable[int], block_size: int) -> list[int]:
    """Round counts per acceptance length 1..``block_size`` (longer lengths are counted as ``block_size``)."""
    counts = [0] * block_size
    for a in accept_lengths:
        counts[min(max(int(a), 1), block_size) - 1] += 1
    return counts


def position_rates(hist: Sequence[int]) -> list[float]:
    """rate_k for k = 1 .. len(hist) - 1 (module docstring); NaN for every k when there is no round."""
    total = sum(hist)
    if total == 0:
        return [math.nan] * max(0, len(hist) - 1)
    out, tail = [], total
    for i in range(1, len(hist)):
        tail -= hist[i - 1]
        out.append(tail / total)
    return out


def pool(hists: Iterable[Sequence[int]]) -> list[int]:
    """Element-wise sum of histograms of any lengths (shorter ones are zero-padded)."""
    out: list[int] = []
    for h in hists:
        out += [0] * (len(h) - len(out))
        for i, c in enumerate(h):
            out[i] += int(c)
    return out


def acceptance_block(hist: Sequence[int]) -> dict[str, Any]:
    """``{"rounds", "tau" (mean length of the pooled rounds), "histogram", "position_rates"}``."""
    rounds = sum(hist)
    tau = sum((i + 1) * c for i, c in enumerate(hist)) / rounds if rounds else math.nan
    return {"rounds": rounds, "tau": tau, "histogram": list(hist), "position_rates": position_rates(hist)}


def row_histograms(row: TauRow) -> dict[str, list[int]]:
    """The histograms a prompt row carries, by source."""
    out: dict[str, list[int]] = {"chain": list(row.histogram)}
    if row.online is not None:
        out["online"] = list(row.online.histogram)
    if row.server_histogram is not None:
        out["server"] = list(row.server_histogram)
    return out


def acceptance_table(prompts: Mapping[str, TauRow]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per category and ``"all"``: per source, the pooled :func:`acceptance_block` of its prompts' rounds."""
    groups: dict[str, dict[str, list[list[int]]]] = {}
    for row in prompts.values():
        for cat in (str(row.category), "all"):
            for src, h in row_histograms(row).items():
                groups.setdefault(cat, {}).setdefault(src, []).append(h)
    return {cat: {src: acceptance_block(pool(hs)) for src, hs in sorted(by.items(), key=lambda kv: SOURCES.index(
        kv[0]))} for cat, by in groups.items()}


def pooled_tau(accept_lengths: Iterable[Sequence[int]]) -> float:
    """Accepted tokens over verification rounds across every response's rounds (NaN without a round)."""
    total = rounds = 0
    for lens in accept_lengths:
        total += sum(int(a) for a in lens)
        rounds += len(lens)
    return total / rounds if rounds else math.nan


def pooled_means(prompts: Mapping[str, PooledRow]) -> tuple[float, dict[str, float]]:
    """The pooled τ of a run's prompt rows: chain (``accept_lengths``) and per DDTree budget
    (``ddtree_accept_lengths``)."""
    chain = pooled_tau(r.accept_lengths for r in prompts.values())
    budgets = sorted({b for r in prompts.values() for b in r.ddtree_accept_lengths}, key=int)
    return chain, {b: pooled_tau(r.ddtree_accept_lengths[b] if b in r.ddtree_accept_lengths else []
                                 for r in prompts.values()) for b in budgets}
