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

Sources (:data:`SOURCES`): ``chain`` the offline simulation on the reference (eval.json row ``histogram``),
``online`` the real speculative loop (``--online-tau``: row ``online.histogram``), ``server`` an SGLang server
running the drafter (row ``server_histogram``, when the server reports one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["SOURCES", "histogram", "position_rates", "pool", "acceptance_block", "row_histograms",
           "acceptance_table"]

SOURCES = ("chain", "online", "server")


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


def row_histograms(row: Mapping[str, Any]) -> dict[str, list[int]]:
    """The histograms an eval.json prompt row carries, by source."""
    out: dict[str, list[int]] = {}
    if row.get("histogram") is not None:
        out["chain"] = list(row["histogram"])
    online = row.get("online") or {}
    if online.get("histogram") is not None:
        out["online"] = list(online["histogram"])
    if row.get("server_histogram") is not None:
        out["server"] = list(row["server_histogram"])
    return out


def acceptance_table(prompts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per category and ``"all"``: per source, the pooled :func:`acceptance_block` of its prompts' rounds."""
    groups: dict[str, dict[str, list[list[int]]]] = {}
    for row in prompts.values():
        for cat in (str(row.get("category", "prompt")), "all"):
            for src, h in row_histograms(row).items():
                groups.setdefault(cat, {}).setdefault(src, []).append(h)
    return {cat: {src: acceptance_block(pool(hs)) for src, hs in sorted(by.items(), key=lambda kv: SOURCES.index(
        kv[0]))} for cat, by in groups.items()}
