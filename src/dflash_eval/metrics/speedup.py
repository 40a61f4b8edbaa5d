"""From τ to speed: predicted speed-up and tokens/s of each decoding strategy on the device the costs were measured on.

τ (accepted tokens per verification round) is what the suite measures; what a researcher decides on is speed. A
round of speculative decoding costs more than a plain decoding step: the drafter's block pass, a target forward over
more tokens, the work around them. With the costs of one round and of one plain step measured on the run's own
device and dtype (:class:`RoundCosts`, measured by :mod:`dflash_eval.measurements.round_costs`)::

    speed-up(τ)  = τ x step / round(τ)          tokens/s(τ) = τ / round(τ) = speed-up(τ) / step

``step`` is one plain greedy decoding step of the target (a forward over one token with its cache, the argmax);
``round(τ)`` is the sum of the round's parts (:func:`round_parts`), for two loops this project runs and measures:

- ``server`` (the prediction the reports lead with, and the one ``--speedup-floor`` gates): the server-style loop,
  :mod:`dflash_eval.metrics.server_loop`, which runs the loop as a serving engine does. The drafter keeps its
  context's keys and values and appends the committed positions'; the target verifies the block (chain: B tokens) or
  the tree (DDTree-N: N + 1 tokens under the tree's attention mask) in one forward, its linear-attention (Gated
  DeltaNet) layers keeping every node's state; the accepted node's state becomes the request's and the KV cache is
  cut back to the accepted path, so nothing is run again. Its parts are its stages, timed as they run
  (:mod:`dflash_eval.measurements.round_costs`): ``draft`` (the block pass, lm_head), ``build`` (the chain's argmax,
  or DDTree's top-N and best-first tree), ``verify`` (its inputs and the forward), ``accept`` (the target's tokens read
  on the host, the walk down the tree), ``commit`` (the accepted states, the KV cut, the drafter's context append of
  the τ committed positions). ``benchmarks/bench_speedup.py`` measures this loop end to end against plain decoding.
- ``loop`` (the recompute loop, :mod:`dflash_eval.metrics.online_loop`, chain only): the drafter recomputes its
  context's keys and values every round (``draft_full``), the target cache is copied before the verify
  (``snapshot``), the block is verified by a plain forward (``forward_b``) and the τ committed tokens are run again
  from the copy (``commit``); ``project`` is the projection of their features.

Costs that depend on how many tokens a round commits (``commit``, ``project``) are measured at 1 and at B tokens and
interpolated linearly at τ; the recompute loop's commit forward at 1, 2 and B tokens, piecewise linearly (a target
forward over 2 tokens can cost much more than over 1: on a CPU, transformers' fallback of the linear-attention layers
runs one token by the recurrent rule and more by the chunked one, padded to a chunk). Every cost is a median of
repeated timings at one context length, the token-weighted mean position of the run's completions
(:func:`mean_context`): the costs that grow with the context (attention over the KV cache) are linear in it, so
their mean over a generation is their value at the mean position.

The confidence interval carries τ's over: ``round(τ)`` grows with τ more slowly than τ itself (only the commit-sized
parts do), so the speed-up is increasing in τ and the interval of mean τ over prompts (the t 95 % CI of the
per-category table) maps through the formula to an interval of the speed-up at mean τ with the same coverage. It does
not include the timing noise, reported beside the costs (``spread``: the interquartile range over the median).

What the prediction leaves out (batching and concurrency, a server's scheduler and HTTP overheads, CUDA graphs,
sampling at temperature > 0): ``docs/speedup.md``.

eval.json's ``speedup`` block is one typed value, :class:`Speedup`, made by :func:`speedup_block` of the
predictions and the measured costs themselves (no dict between): its ``costs`` are the :class:`RoundCosts` (the one
costs type: eval.json holds a NaN as null, the budgets' keys as strings, the pairs as lists), its ``strategies`` and
``loop`` the :class:`Prediction` records, its ``pooled`` and ``models`` :class:`PooledSpeed` and :class:`LoopModel`.
Each record writes itself (``to_dict``: eval.json's layout, key for key) and reads itself back strictly
(``from_dict``: a key it does not know or lacks is one ResultKeyError naming its path). :func:`speedup_digest` reads
the typed block into the few numbers the history, the trackers and the gate keep.

Example::

    costs = RoundCosts.from_dict(data["speedup"]["costs"])
    p = predict(costs, "chain", 4.3, (4.1, 4.5))
    print(p.speedup, p.speedup_ci, p.tokens_per_s)
    block = speedup_block(costs, (4.3, (4.1, 4.5)), {8: (4.6, (4.3, 4.9))})
    print(block.best, block.strategies["chain"].speedup, speedup_digest(block))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

from dflash_eval.errors import ResultKeyError

__all__ = ["LOOPS", "MODELS", "RoundCosts", "Prediction", "round_parts", "predict", "mean_context", "context_bucket",
           "strategy_name", "budget_of", "speedup_block", "best_strategy", "ASSUMPTIONS", "speedup_digest",
           "NEAR_BEST", "LoopModel", "PooledSpeed", "Speedup"]

Loop = Literal["server", "loop"]
T = TypeVar("T")
#: A CI of mean τ: [low, high] (a bound None or NaN: unknown), or None.
TauCI = Sequence[float | None] | None
#: The two ways of running the speculative loop a round's cost is predicted for (module docstring).
LOOPS: tuple[Loop, ...] = ("server", "loop")

#: What each model's numbers are, in eval.json's ``speedup.models`` and the reports' labels: the loop a model is the
#: cost of, and how it was checked (docs/speedup.md has the measurements).
MODELS: dict[Loop, dict[str, str]] = {
    "server": {"name": "server-style loop", "module": "dflash_eval.metrics.server_loop",
               "what": "the drafter keeps its context's keys and values; one target forward verifies the chain's "
                       "block or DDTree's tree, keeping every node's linear-attention state; nothing is run again",
               "checked": "its stages are what is timed; benchmarks/bench_speedup.py measures the loop end to end "
                          "against plain decoding, per strategy (docs/speedup.md)"},
    "loop": {"name": "recompute loop", "module": "dflash_eval.metrics.online_loop",
             "what": "the drafter recomputes its context every round; the target's cache is copied before the verify "
                     "and the committed tokens are run again",
             "checked": "benchmarks/bench_speedup.py measures it end to end against plain decoding (chain only)"},
}

#: What the prediction assumes, in eval.json's ``speedup.assumptions`` (docs/speedup.md explains each).
ASSUMPTIONS = (
    "batch size 1: one request decoding alone, no other request sharing the forwards",
    "costs measured with this implementation (transformers' modeling code, eager PyTorch, no CUDA graphs); a serving "
    "engine's own kernels, graphs and scheduler change every part",
    "the server-style loop: one forward verifies the chain's B tokens or DDTree-N's N + 1 (the tree's mask on the "
    "attention layers); the linear-attention layers keep every node's state, each node's root path run through the "
    "backend's recurrent kernel as a sequence of its own; the accepted node's state becomes the request's",
    "costs at one context length, the token-weighted mean position of the run's completions",
    "greedy verification; τ from the offline simulation on the run's references",
)


def _lerp(pair: Sequence[float], tau: float, block_size: int) -> float:
    """The cost of committing ``tau`` tokens, from its costs at 1 and at ``block_size`` tokens (``pair``): linear in
    between, clamped to [1, B]."""
    lo, hi = float(pair[0]), float(pair[1])
    if block_size <= 1 or math.isnan(tau):
        return lo
    f = (min(max(tau, 1.0), float(block_size)) - 1.0) / (block_size - 1)
    return lo + (hi - lo) * f


def strategy_name(budget: int | None) -> str:
    """``chain`` (budget None) or ``ddtree-<N>``: a strategy's name in eval.json and the reports."""
    return "chain" if budget is None else f"ddtree-{budget}"


def budget_of(strategy: str) -> int | None:
    """The DDTree budget of a strategy's name (None: the chain)."""
    return None if strategy == "chain" else int(strategy.removeprefix("ddtree-"))


@dataclass(frozen=True)
class RoundCosts:
    """Seconds of each part of a round and of a plain decoding step on one device, dtype and context length; each
    the median of ``repeats`` timings after ``warmup`` untimed ones (module docstring). ``spread``: per part, the
    interquartile range of its timings over their median.

    The server-style loop's stages (:class:`~dflash_eval.metrics.server_loop.ServerLoop`): ``draft``; the chain's
    ``build``, ``verify``, ``accept``; DDTree-N's ``tree_build[N]``, ``tree_verify[N]``, ``tree_accept[N]``;
    ``commit`` of 1 and of B tokens. The recompute loop's own parts: ``draft_full``, ``project`` (1 and B tokens),
    ``snapshot``, the plain target forwards over 2 and B tokens (``forward_2``, ``forward_b``)."""

    device: str
    device_kind: str
    dtype: str
    backend: str
    threads: int
    context_len: int
    block_size: int
    repeats: int
    warmup: int
    step: float
    draft: float
    build: float
    verify: float
    accept: float
    commit: tuple[float, float]
    tree_build: dict[int, float] = field(default_factory=dict)
    tree_verify: dict[int, float] = field(default_factory=dict)
    tree_accept: dict[int, float] = field(default_factory=dict)
    draft_full: float = math.nan
    snapshot: float = math.nan
    project: tuple[float, float] = (math.nan, math.nan)
    forward_2: float = math.nan  # a plain target forward over 2 tokens (the recompute loop's commit of one draft)
    forward_b: float = math.nan  # over B tokens (the recompute loop's verify)
    spread: dict[str, float] = field(default_factory=dict)
    seconds: float = math.nan  # the measurement's own wall time

    @property
    def budgets(self) -> tuple[int, ...]:
        return tuple(sorted(self.tree_verify))

    @property
    def plain_tokens_per_s(self) -> float:
        """Tokens per second of plain greedy decoding (one token a step)."""
        return 1.0 / self.step if self.step > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        """eval.json's ``speedup.costs`` (and the cache entry's): every field, the budgets' keys as strings, the pairs
        as lists, a part not timed as NaN (strict JSON writes it as null)."""
        d = asdict(self)
        for k in ("tree_verify", "tree_build", "tree_accept"):
            d[k] = {str(b): v for b, v in d[k].items()}
        d["commit"], d["project"] = list(self.commit), list(self.project)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RoundCosts:
        """The costs of :meth:`to_dict`, as eval.json or the cache entry holds them (strict JSON: a NaN written as
        null, read back as NaN; the budgets' keys as ints, the pairs as tuples); ResultKeyError naming a key it does
        not know or lacks."""
        ResultKeyError.check(d, _COSTS_KEYS)
        kw: dict[str, Any] = dict(d)
        for k in ("tree_verify", "tree_build", "tree_accept"):
            kw[k] = {int(b): _num(v) for b, v in kw[k].items()}
        for k in ("commit", "project"):
            kw[k] = tuple(_num(x) for x in kw[k])
        for k in ("step", "draft", "build", "verify", "accept", "draft_full", "snapshot", "forward_2", "forward_b",
                  "seconds"):
            kw[k] = _num(kw[k])
        kw["spread"] = {k: _num(v) for k, v in kw["spread"].items()}
        return cls(**kw)


#: The keys of eval.json's ``speedup.costs`` (:meth:`RoundCosts.to_dict`: every field).
_COSTS_KEYS = tuple(f.name for f in fields(RoundCosts))


def _num(v: object) -> float:
    """A number as eval.json holds it (strict JSON: NaN written as null)."""
    return math.nan if v is None else float(v)  # type: ignore[arg-type]  # a JSON number


def _recommit(costs: RoundCosts, tau: float) -> float:
    """The recompute loop's commit forward over τ tokens on average: piecewise linear through its costs at 1
    (``step``), 2 (``forward_2``) and B (``forward_b``) tokens (without ``forward_2``: linear from 1 to B)."""
    b = costs.block_size
    if b <= 2 or math.isnan(costs.forward_2):
        return _lerp((costs.step, costs.forward_b), tau, b)
    if tau <= 2:
        return _lerp((costs.step, costs.forward_2), tau, 2)
    return costs.forward_2 + (costs.forward_b - costs.forward_2) * (min(tau, float(b)) - 2.0) / (b - 2)


def round_parts(costs: RoundCosts, budget: int | None, tau: float, loop: Loop = "server") -> dict[str, float]:
    """Seconds of each part of one round of ``budget``'s strategy (None: the chain) committing ``tau`` tokens on
    average (module docstring); their sum is the round's cost. KeyError for a budget the costs were not measured
    for; ValueError for a DDTree in the ``loop`` model (the recompute loop runs the chain only)."""
    b = costs.block_size
    if loop == "loop":
        if budget is not None:
            raise ValueError("the recompute loop runs the chain only: no loop cost of a DDTree round")
        return {"draft": costs.draft_full, "project": _lerp(costs.project, tau, b), "snapshot": costs.snapshot,
                "verify": costs.forward_b, "accept": costs.accept, "commit": _recommit(costs, tau)}
    if budget is None:
        parts = {"draft": costs.draft, "build": costs.build, "verify": costs.verify, "accept": costs.accept}
    else:
        parts = {"draft": costs.draft, "build": costs.tree_build[budget], "verify": costs.tree_verify[budget],
                 "accept": costs.tree_accept[budget]}
    parts["commit"] = _lerp(costs.commit, tau, b)
    return parts


def _speedup(costs: RoundCosts, budget: int | None, tau: float, loop: Loop) -> tuple[float, float]:
    """(speed-up, round seconds) at ``tau``."""
    if tau is None or math.isnan(tau):
        return math.nan, math.nan
    r = sum(round_parts(costs, budget, tau, loop).values())
    return tau * costs.step / r, r


R = TypeVar("R", bound="_FlatRecord")


class _FlatRecord:
    """A dataclass eval.json holds as an object of all its fields, each written and each needed (:class:`Prediction`,
    :class:`PooledSpeed`, :class:`LoopModel`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        """The record of :meth:`to_dict`; ResultKeyError naming a key it does not know or lacks."""
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]  # every subclass is a dataclass
        ResultKeyError.check(d, names)
        return cls(**{n: d[n] for n in names})


@dataclass(frozen=True)
class Prediction(_FlatRecord):
    """One strategy's predicted speed (module docstring; eval.json's ``speedup.strategies`` and ``speedup.loop``
    entries): τ with its CI, the round's cost and parts, the speed-up over plain decoding and the tokens per second,
    each with the interval τ's CI maps to."""

    strategy: str
    loop: str
    tau: float
    tau_ci: list[float]
    round_s: float
    parts: dict[str, float]
    speedup: float
    speedup_ci: list[float]
    tokens_per_s: float
    tokens_per_s_ci: list[float]


def _interval(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def predict(costs: RoundCosts, strategy: str, tau: float, tau_ci: TauCI = None,
            loop: Loop = "server") -> Prediction:
    """The predicted speed of ``strategy`` (``chain`` or ``ddtree-<N>``) at mean τ ``tau`` with its CI ``tau_ci``
    (NaN bounds: none; the interval maps through the formula, which increases with τ)."""
    budget = budget_of(strategy)
    lo, hi = _interval(tau_ci or (None, None))
    # τ lies in [1, B] (every round commits the target's own token, at most B): a t interval of few prompts may
    # reach past either end, which no drafter's τ can
    lo, hi = (x if math.isnan(x) else min(max(x, 1.0), float(costs.block_size)) for x in (lo, hi))
    s, r = _speedup(costs, budget, tau, loop)
    s_lo, s_hi = _speedup(costs, budget, lo, loop)[0], _speedup(costs, budget, hi, loop)[0]
    per_s = costs.plain_tokens_per_s
    parts = round_parts(costs, budget, tau, loop) if not math.isnan(tau) else {}
    return Prediction(strategy, loop, tau, [lo, hi], r, parts, s, [s_lo, s_hi], s * per_s, [s_lo * per_s, s_hi * per_s])


def mean_context(lengths: Sequence[tuple[int, int]]) -> float:
    """The token-weighted mean position at which the target decodes the completions: for each (prompt tokens P,
    completion tokens N) the positions P .. P + N - 1, every token weighted alike (NaN when there is none)."""
    tokens = sum(n for _, n in lengths)
    if tokens <= 0:
        return math.nan
    return sum(n * (p + (n - 1) / 2) for p, n in lengths) / tokens


#: Strategies predicted within this share of the best one are named beside it (``near_best``): the timings' own
#: noise (a few per cent on a shared machine: benchmarks.md) does not tell them apart.
NEAR_BEST = 0.05

#: The context lengths costs are measured at are rounded up to a multiple of this many tokens: runs whose
#: completions differ by a few tokens share one cache entry (attention's cost changes by far less over 64 tokens).
CONTEXT_STEP = 64


def context_bucket(mean: float, step: int = CONTEXT_STEP) -> int:
    """The context length the costs are measured at: ``mean`` rounded up to a multiple of ``step`` (at least one)."""
    if math.isnan(mean) or mean <= 0:
        return step
    return int(math.ceil(mean / step) * step)


def best_strategy(predictions: Mapping[str, Prediction]) -> str | None:
    """The strategy with the highest predicted speed-up (None when none is a number)."""
    known = {k: p.speedup for k, p in predictions.items() if not math.isnan(p.speedup)}
    return max(known, key=lambda k: known[k]) if known else None


@dataclass(frozen=True)
class LoopModel(_FlatRecord):
    """What a predicted speed-up's loop is (eval.json's ``speedup.models``, :data:`MODELS`): its name, the module
    that runs it, what it keeps and runs again, and how the model was checked."""

    name: str
    module: str
    what: str
    checked: str


@dataclass(frozen=True)
class PooledSpeed(_FlatRecord):
    """A strategy's predicted speed at its pooled τ (no CI; eval.json's ``speedup.pooled`` entries)."""

    tau: float | None
    speedup: float | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class Speedup:
    """eval.json's ``speedup`` (made by :func:`speedup_block`): the device, the round's costs, every strategy's
    prediction, the best, the recompute loop's chain, the pooled speeds, the models and assumptions, the floor and
    its verdict (``passed``: :func:`dflash_eval.metrics.verdict.speedup_floor_part`'s, None until it is judged)."""

    device: str
    device_kind: str
    dtype: str
    backend: str
    threads: int | None
    context_len: int
    block_size: int
    plain_tokens_per_s: float | None
    costs: RoundCosts
    cached: bool
    strategies: dict[str, Prediction]
    best: str | None
    near_best: list[str]
    best_budget: int | None
    loop: dict[str, Prediction]
    pooled: dict[str, PooledSpeed]
    models: dict[str, LoopModel]
    assumptions: list[str]
    floor: float | None
    passed: bool | None

    def to_dict(self) -> dict[str, Any]:
        """The block as eval.json holds it, key for key in the fields' order (strict JSON writes a NaN as null)."""
        return {"device": self.device, "device_kind": self.device_kind, "dtype": self.dtype, "backend": self.backend,
                "threads": self.threads, "context_len": self.context_len, "block_size": self.block_size,
                "plain_tokens_per_s": self.plain_tokens_per_s, "costs": self.costs.to_dict(), "cached": self.cached,
                "strategies": {k: p.to_dict() for k, p in self.strategies.items()}, "best": self.best,
                "near_best": list(self.near_best), "best_budget": self.best_budget,
                "loop": {k: p.to_dict() for k, p in self.loop.items()},
                "pooled": {k: p.to_dict() for k, p in self.pooled.items()},
                "models": {k: m.to_dict() for k, m in self.models.items()}, "assumptions": list(self.assumptions),
                "floor": self.floor, "passed": self.passed}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Speedup:
        """The block of :meth:`to_dict` (eval.json's ``speedup``); ResultKeyError naming the path of the first key
        it, or a record inside it, does not know or lacks (``strategies.chain.round_s``, ``costs.forward_b``)."""
        ResultKeyError.check(d, _SPEEDUP_KEYS)
        try:
            costs = RoundCosts.from_dict(d["costs"])
        except ResultKeyError as exc:
            raise exc.under("costs") from None
        return cls(device=d["device"], device_kind=d["device_kind"], dtype=d["dtype"], backend=d["backend"],
                   threads=d["threads"], context_len=d["context_len"], block_size=d["block_size"],
                   plain_tokens_per_s=d["plain_tokens_per_s"], costs=costs, cached=d["cached"],
                   strategies=_each(Prediction.from_dict, d["strategies"], "strategies"), best=d["best"],
                   near_best=list(d["near_best"]), best_budget=d["best_budget"],
                   loop=_each(Prediction.from_dict, d["loop"], "loop"),
                   pooled=_each(PooledSpeed.from_dict, d["pooled"], "pooled"),
                   models=_each(LoopModel.from_dict, d["models"], "models"), assumptions=list(d["assumptions"]),
                   floor=d["floor"], passed=d["passed"])


#: The keys of eval.json's ``speedup`` (:meth:`Speedup.to_dict`: every field).
_SPEEDUP_KEYS = tuple(f.name for f in fields(Speedup))


def _each(read: Callable[[Mapping[str, Any]], T], items: Mapping[str, Any], key: str) -> dict[str, T]:
    """``{name: read(item)}`` of a block's mapping of records under ``key``; ResultKeyError naming the record's path
    (``strategies.chain.round_s``)."""
    out = {}
    for k, v in items.items():
        try:
            out[k] = read(v)
        except ResultKeyError as exc:
            raise exc.under(str(k)).under(key) from None
    return out


def speedup_block(costs: RoundCosts, chain: tuple[float, TauCI], ddtree: Mapping[int, tuple[float, TauCI]], *,
                  floor: float | None = None, cached: bool = False,
                  pooled: Mapping[str, float] | None = None) -> Speedup:
    """eval.json's ``speedup`` as the typed block, made of the predictions and ``costs`` themselves: the costs, every
    strategy's prediction (``strategies``: chain and each DDTree budget of ``ddtree`` that the costs hold, the
    ``server`` model: the server-style loop), the chain under the recompute loop (``loop``), what each model is
    (``models``), the best strategy and the best DDTree budget, the floor (``passed``, the floor's verdict, is filled
    in by :func:`dflash_eval.metrics.verdict.speedup_floor_part`; None until then). ``chain`` and ``ddtree``
    give mean τ (the macro mean over prompts: the speed-up of a typical request) and its CI; ``pooled`` (by
    strategy): the pooled τ (accepted tokens / rounds over every round), whose speed-up is that of the prompt set's
    total throughput, every token weighted alike (``pooled``: τ, speed-up and tokens/s, without a CI)."""
    preds = {"chain": predict(costs, "chain", *chain)}
    for b, (tau, ci) in sorted(ddtree.items()):
        if b in costs.tree_verify:
            preds[strategy_name(b)] = predict(costs, strategy_name(b), tau, ci)
    trees = {k: p for k, p in preds.items() if k != "chain"}
    best_tree, best = best_strategy(trees), best_strategy(preds)
    top = preds[best].speedup if best else math.nan
    near = [k for k, p in preds.items() if k != best and p.speedup >= (1 - NEAR_BEST) * top]
    return Speedup(
        device=costs.device, device_kind=costs.device_kind, dtype=costs.dtype, backend=costs.backend,
        threads=costs.threads, context_len=costs.context_len, block_size=costs.block_size,
        plain_tokens_per_s=costs.plain_tokens_per_s, costs=costs, cached=cached, strategies=preds, best=best,
        near_best=near, best_budget=budget_of(best_tree) if best_tree else None,
        loop={"chain": predict(costs, "chain", *chain, loop="loop")},
        pooled={k: PooledSpeed(t, (p := predict(costs, k, t)).speedup, p.tokens_per_s)
                for k, t in (pooled or {}).items() if k in preds},
        models={k: LoopModel(**v) for k, v in MODELS.items()}, assumptions=list(ASSUMPTIONS), floor=floor,
        passed=None)


def speedup_digest(block: Speedup | None) -> dict[str, Any] | None:
    """The prediction in a few numbers, as the training history, the trackers and the gate keep it: the device, the
    chain's speed-up with its CI and tokens/s, plain decoding's tokens/s, each DDTree budget's speed-up, the best
    strategy and budget, the floor and its verdict (None without a block)."""
    if block is None:
        return None
    st = block.strategies
    chain = st["chain"] if "chain" in st else None
    ci: Sequence[float | None] = (None if chain is None else chain.speedup_ci) or [None, None]
    return {"device": block.device, "dtype": block.dtype, "context_len": block.context_len,
            "chain": None if chain is None else chain.speedup,
            "chain_ci95": list(ci),
            "tokens_per_s": None if chain is None else chain.tokens_per_s,
            "plain_tokens_per_s": block.plain_tokens_per_s,
            "ddtree": {str(budget_of(k)): p.speedup for k, p in st.items() if k != "chain"},
            "best": block.best, "best_budget": block.best_budget, "floor": block.floor, "passed": block.passed}
