"""What the statistics and the τ rules read of a run's typed τ rows, as protocols the session's rows
(:mod:`dflash_eval.session.rows`) satisfy: the metrics never import the session, and never read eval.json's dicts.

- :class:`PooledRow`: a prompt's accept lengths, chain and per DDTree budget (the pooled τ).
- :class:`TauRow`: a prompt's τ row as the per-category, per-conversation and per-turn tables and the sampled means
  read it (:class:`~dflash_eval.session.rows.PromptRow`).
- :class:`GatedPrompt`, :class:`GatedCategory`: a prompt's and a category's row whose floors and verdict the τ rules
  fill (:func:`dflash_eval.metrics.verdict.judge_prompts`, :func:`dflash_eval.metrics.verdict.judge_categories`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = ["PooledRow", "OnlineRounds", "TauRow", "CategoryMean", "GatedPrompt", "GatedCategory"]


class PooledRow(Protocol):
    """A prompt's accept lengths of every round, chain and per DDTree budget (eval.json's string keys)."""

    @property
    def accept_lengths(self) -> Sequence[int]: ...
    @property
    def ddtree_accept_lengths(self) -> Mapping[str, Sequence[int]]: ...


class OnlineRounds(Protocol):
    """The online loop's rounds of a prompt (:class:`~dflash_eval.session.rows.OnlineRow`): its histogram and, at
    temperature > 0, its τ per sample."""

    @property
    def histogram(self) -> Sequence[int]: ...
    @property
    def sample_tau(self) -> Sequence[float] | None: ...


class TauRow(PooledRow, Protocol):
    """A prompt's τ row (:class:`~dflash_eval.session.rows.PromptRow`): its category, chain τ and each DDTree budget's,
    the histograms of its rounds (chain, online, the SGLang server's), a sampled run's τ per sample and the turn of a
    multi-turn conversation (None where the row has none)."""

    @property
    def category(self) -> str: ...
    @property
    def tau(self) -> float: ...
    @property
    def histogram(self) -> Sequence[int]: ...
    @property
    def ddtree(self) -> Mapping[str, float]: ...
    @property
    def samples(self) -> int | None: ...
    @property
    def sample_tau(self) -> Sequence[float] | None: ...
    @property
    def ddtree_sample_tau(self) -> Mapping[str, Sequence[float]] | None: ...
    @property
    def server_histogram(self) -> Sequence[int] | None: ...
    @property
    def conversation(self) -> str | None: ...
    @property
    def turn(self) -> int | None: ...
    @property
    def online(self) -> OnlineRounds | None: ...


class GatedPrompt(Protocol):
    """A prompt's row the τ rules judge: its chain τ and each DDTree budget's, read; its floors and verdict, written
    (``passed`` None: not gated)."""

    @property
    def tau(self) -> float: ...
    @property
    def ddtree(self) -> Mapping[str, float]: ...

    floor: float | None
    ddtree_floor: dict[str, float | None]
    passed: bool | None


class CategoryMean(Protocol):
    """A summary's mean (:class:`~dflash_eval.session.rows.Stat`)."""

    @property
    def mean(self) -> float: ...


class GatedCategory(Protocol):
    """A category's row the τ rules judge (:class:`~dflash_eval.session.rows.CategoryRow`): its chain and DDTree
    summaries, read; its floors and verdict, written."""

    @property
    def chain(self) -> CategoryMean: ...
    @property
    def ddtree(self) -> Mapping[str, CategoryMean]: ...

    floor: float | None
    ddtree_floor: dict[str, float | None]
    passed: bool | None
