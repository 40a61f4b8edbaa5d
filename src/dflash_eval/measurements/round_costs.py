"""The costs of a speculative round and of a plain decoding step, timed on the run's device and dtype: the
``round_costs`` measurement (the arithmetic from them to speed: :mod:`dflash_eval.metrics.speedup`).

Everything is timed on the run's own target (its device, dtype and linear-attention backend) with a KV / recurrent
cache prefilled to the run's context length (:func:`dflash_eval.metrics.speedup.mean_context`, rounded up to a
multiple of 64 tokens: the prefill's tokens are the run's own reference sequences), and on a drafter of the run's
drafter config, built with fresh random weights at the run's dtype (what a part costs depends on the shapes, not on
the weights). The parts are timed round-robin, every part once a round, ``WARMUP`` rounds untimed, then ``REPEATS``
timed (``torch.cuda.synchronize`` before and after each on CUDA; a fresh copy of the prefilled cache for each
forward, copied outside the timing), so that on a shared machine every part's timings spread over the same stretch of
time; a part's cost is the median, its ``spread`` the interquartile range over the median:

- ``step``: one plain greedy decoding step: a target forward over 1 token, its argmax, read on the host;
- the server-style loop's stages, each the method of :class:`dflash_eval.metrics.server_loop.ServerLoop` the loop runs,
  on a request prefilled to the context length: ``draft`` (the drafter's block pass against its kept context keys
  and values, lm_head); ``build`` (the chain's argmax) and ``tree_build[N]`` (DDTree-N's top-N and best-first
  tree); ``verify`` (the forward's inputs and the target forward over the chain's B tokens, every token's
  linear-attention state kept) and ``tree_verify[N]`` (the same over the N + 1 tokens of a DDTree-N tree the loop
  built from a drafted block, under its mask; a tree verify costs what its size costs, whatever its shape:
  :mod:`dflash_eval.target.tree_verify`); ``accept`` and ``tree_accept[N]`` (the target's tokens read on the host,
  the walk down the block or tree); ``commit`` of 1 and of B tokens (the accepted states, the KV cut, the drafter's
  context append);
- the recompute loop's own parts: ``draft_full`` (the drafter's block pass recomputing its context's keys and
  values), ``forward_b`` and ``forward_2`` (plain target forwards over the block's B and 2 tokens: its verify, and
  its commit of 1 to B tokens costed through 1, 2 and B tokens), ``project`` (the projection of 1 and of B committed
  positions' features), ``snapshot`` (a copy of the whole target cache before each verify).

One cache entry holds the costs, keyed by the target, the drafter config, the block size and budgets, the context
length, the device kind (on a CPU also its model and torch's thread count), the dtype, the backend, the library
versions, :data:`~dflash_eval.cache.code_version.CODE_VERSION` and :data:`COSTS_VERSION`: every later run and every
checkpoint of the same drafter shape reads it back. A timing is a real measurement of the machine: under
``--cache-only`` nothing is timed, and on a CPU the costs timed with another thread count serve (a warm ``-n 0`` run
after a cold ``-n 2`` one, whose workers had one thread each; the device's name in the reports says how many); a
miss is refused. On the bundled fixtures on a CPU it takes a second or two.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.common.progress import Progress
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.model import DFlashDrafter, block_ids, draft_logits
from dflash_eval.measurements.registry import Measurement, Plan, Subject
from dflash_eval.metrics.online_loop import cache_keyword
from dflash_eval.metrics.server_loop import Decoding, ServerLoop, Verification
from dflash_eval.metrics.speedup import RoundCosts, context_bucket, mean_context
from dflash_eval.target.backends import use_backend
from dflash_eval.target.head import TargetHead
from dflash_eval.target.loader import Target
from dflash_eval.target.provenance import device_kind, device_name
from dflash_eval.target.tree_verify import VerifyTree

__all__ = ["RoundCostsMeasurement", "ROUND_COSTS", "REPEATS", "WARMUP", "COSTS_VERSION", "measure_round_costs",
           "cpu_model", "context_tokens"]

#: Timed runs of each part (the median is its cost) ...
REPEATS = 7
#: ... after this many untimed ones (allocations, kernel selection, caches warmed).
WARMUP = 1
#: The version of what :func:`measure_round_costs` times, in the entry's key: raised when a part is added or timed
#: differently (the costs are keyed by it, not by the τ code's ``CODE_VERSION``).
COSTS_VERSION = 4


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else :func:`platform.processor`): a CPU's costs are keyed by it."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(fn: Callable[[Any], object], dev: torch.device, *, setup: Callable[[], Any] | None = None,
           repeats: int = REPEATS, warmup: int = WARMUP) -> list[float]:
    """Seconds of ``repeats`` runs of ``fn(setup())`` after ``warmup`` untimed ones (``setup`` untimed; the device
    synchronised around each run)."""
    out = []
    for i in range(warmup + repeats):
        arg = setup() if setup is not None else None
        _sync(dev)
        t0 = time.perf_counter()
        fn(arg)
        _sync(dev)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def _median_spread(xs: list[float]) -> tuple[float, float]:
    """The median and the interquartile range over the median."""
    med = statistics.median(xs)
    if len(xs) < 2 or med <= 0:
        return med, math.nan
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return med, (q[2] - q[0]) / med


def _fresh(d: Decoding, cache: Any, length: int) -> Decoding:
    """A copy of the decoding ``d`` at its start with a copy of ``cache`` (the drafter's context shared, cut back to
    ``length`` positions): the setup of a timed stage that changes the request, made outside the timing."""
    d.context.truncate(length)
    return Decoding(copy.deepcopy(cache), d.context, d.start, d.bonus, [d.bonus])


def context_tokens(sequences: list[list[int]], n: int) -> list[int]:
    """``n`` token ids from the run's reference sequences, concatenated in order and repeated as needed."""
    pool = [t for s in sequences for t in s] or [0]
    return (pool * (n // len(pool) + 1))[:n]


#: A timed part: its name, what it runs (given its setup's value) and its setup (None: none).
Part = tuple[str, Callable[[Any], object], Callable[[], Any] | None]


def _tree_parts(loop: ServerLoop, d0: Decoding, logits: Tensor, n: int, tree: VerifyTree, ver: Verification,
                fresh: Callable[[], Decoding]) -> list[Part]:
    """DDTree-``n``'s stages: building its tree from the drafted ``logits``, verifying ``tree`` (on a fresh request
    each time), walking down it along the target's tokens of ``ver`` (its verify)."""

    def build(_: object) -> VerifyTree:
        return loop.build(d0, logits, n)

    def verify(d: Decoding) -> Verification:
        return loop.verify(d, tree)

    def accept(_: object) -> tuple[list[int], int]:
        return loop.accept(d0, tree, ver)

    return [(f"tree_build_{n}", build, None), (f"tree_verify_{n}", verify, fresh), (f"tree_accept_{n}", accept, None)]


@torch.no_grad()
def measure_round_costs(target: Target, config: DrafterConfig, head: TargetHead, *, context_len: int,
                        budgets: tuple[int, ...], backend: str, tokens: list[int], repeats: int = REPEATS,
                        warmup: int = WARMUP, report: Callable[[int], None] | None = None) -> RoundCosts:
    """Time every part of a round and a plain step (module docstring) at ``context_len`` on ``target``'s device
    and dtype, with a drafter of ``config`` (fresh random weights); ``tokens``: at least ``context_len`` token ids
    to prefill with; ``report(k)``: called after the k-th round of every part."""
    t_start = time.perf_counter()
    model, dev = target.model, target.device
    b, L = config.block_size, context_len
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(0)
        drafter = DFlashDrafter(config).to(device=dev, dtype=target.dtype).eval()
    kw = cache_keyword(model)
    loop = ServerLoop(target, drafter, head, backend=backend, max_new_tokens=2 * b)
    ids = torch.tensor(tokens[:L], dtype=torch.long, device=dev)
    with loop.running():
        d0 = loop.prefill(ids)  # the request at the context length: its caches, the drafter's context, a bonus token
        context = drafter.project_context(loop.features())[None]  # [1, L, H]: what the recompute loop drafts from
        logits = loop.draft(d0)
        trees = {n: loop.build(d0, logits, n) for n in (None, *budgets)}
        verified = {}
        for n, tree in trees.items():  # each tree's verify once: what its accept reads and the chain's commits keep
            dv = _fresh(d0, d0.cache, L)
            verified[n] = (loop.verify(dv, tree), dv.cache)
    chain, (ver, chain_cache) = trees[None], verified[None]
    cache0, feats, block = d0.cache, ver.features, list(chain.tokens)
    fresh = lambda: _fresh(d0, cache0, L)  # noqa: E731 - the setup of every timed verify
    verified_chain = lambda: _fresh(d0, chain_cache, L)  # noqa: E731 - the setup of every timed commit
    fresh_cache = lambda: copy.deepcopy(cache0)  # noqa: E731 - the setup of every timed plain target forward
    first = torch.tensor([[d0.bonus]], device=dev)
    starts = torch.tensor([[L]], device=dev)
    blocks = block_ids(first[0], b, config.mask_token_id)[None]  # [1, 1, B]

    def at_start() -> Decoding:  # the setup of the timed draft: the request, its drafter context cut back to L
        d0.context.truncate(L)
        return d0

    def step(cache: Any) -> None:  # a plain decoding step
        int(model(first, **{kw: cache}, use_cache=True).logits[0, -1].argmax())

    def forward(n: int) -> Callable[[Any], object]:  # a plain forward over the block's first n tokens
        t = torch.tensor([block[:n]], device=dev)
        return lambda c: model(t, **{kw: c}, use_cache=True)

    def commit(n: int) -> Callable[[Any], object]:  # the chain's commit of its first n tokens
        return lambda d: loop.commit(d, chain, ver, list(range(n)), block[min(n, b - 1)])

    server: list[Part] = [
        ("draft", loop.draft, at_start),
        ("build", lambda _: loop.build(d0, logits, None), None),
        ("verify", lambda d: loop.verify(d, chain), fresh),
        ("accept", lambda _: loop.accept(d0, chain, ver), None),
        ("commit_1", commit(1), verified_chain),
        ("commit_b", commit(b), verified_chain)]
    for n in budgets:
        server += _tree_parts(loop, d0, logits, n, trees[n], verified[n][0], fresh)
    recompute: list[Part] = [
        ("draft_full", lambda _: draft_logits(drafter, head, context, blocks, starts)[0, 0].argmax(-1), None),
        ("forward_2", forward(2), fresh_cache),
        ("forward_b", forward(b), fresh_cache),
        ("project_1", lambda _: drafter.project_context(feats[-1:]), None),
        ("project_b", lambda _: drafter.project_context(feats), None),
        ("snapshot", lambda _: copy.deepcopy(cache0), None)]
    # Round-robin: every part once a round, so that each part's timings spread over the same stretch of time (on a
    # shared machine a part timed in a quiet moment and another in a busy one would not compare).
    times: dict[str, list[float]] = {name: [] for name in ["step"] + [p[0] for p in server + recompute]}
    for i in range(warmup + repeats):
        keep = i >= warmup
        with use_backend(backend, dev):  # plain decoding: no features captured
            xs = _timed(step, dev, setup=fresh_cache, repeats=1, warmup=0)
        if keep:
            times["step"] += xs
        with loop.running():  # the speculative loops capture the drafter's target layers
            for name, fn, setup in server + recompute:
                xs = _timed(fn, dev, setup=setup, repeats=1, warmup=0)
                if keep:
                    times[name] += xs
        if report is not None:
            report(i + 1)
    d0.context.truncate(L)
    med = {k: _median_spread(v) for k, v in times.items()}
    c = {k: m for k, (m, _) in med.items()}
    return RoundCosts(
        device=device_name(dev), device_kind=device_kind(dev), dtype=str(target.dtype).removeprefix("torch."),
        backend=backend, threads=torch.get_num_threads(), context_len=L, block_size=b, repeats=repeats,
        warmup=warmup, step=c["step"], draft=c["draft"], build=c["build"], verify=c["verify"], accept=c["accept"],
        commit=(c["commit_1"], c["commit_b"]), tree_build={n: c[f"tree_build_{n}"] for n in budgets},
        tree_verify={n: c[f"tree_verify_{n}"] for n in budgets},
        tree_accept={n: c[f"tree_accept_{n}"] for n in budgets}, draft_full=c["draft_full"], snapshot=c["snapshot"],
        project=(c["project_1"], c["project_b"]), forward_2=c["forward_2"], forward_b=c["forward_b"],
        spread={k: s for k, (_, s) in med.items()}, seconds=time.perf_counter() - t_start)


def rounds_count(repeats: int = REPEATS, warmup: int = WARMUP) -> int:
    """How many rounds of every part :func:`measure_round_costs` runs (progress)."""
    return warmup + repeats


class RoundCostsMeasurement(Measurement[None, tuple[RoundCosts, bool]]):
    """The costs of a round and of a plain step on the run's device (module docstring); no parameters."""

    name: ClassVar[str] = "round_costs"
    kind: ClassVar[str] = "round_costs"

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[None]:
        subject.check_drafter()  # a drafter that does not fit the target has no round to time
        inp, s = subject.inputs, subject.settings
        config = subject.checkpoint.config
        budgets = tuple(sorted(set(s.ddtree_budget)))
        comps = subject.completions()
        prompts = inp.prompts
        lengths = [(len(comps[p.id].prompt_ids), len(comps[p.id].output_ids)) for p in prompts]
        ctx = context_bucket(mean_context(lengths))
        dev = s.torch_device
        fields: dict[str, Any] = {
            "target": inp.target_identity, "drafter_config": config.to_dict(), "block_size": config.block_size,
            "budgets": list(budgets), "context_len": ctx, **inp.platform_fields(s.torch_dtype),
            "backend": s.eval_backend, "code": CODE_VERSION, "costs": COSTS_VERSION,
            "repeats": REPEATS, "warmup": WARMUP}
        alternatives: tuple[Request, ...] = ()
        if dev.type == "cpu":  # a CPU's speed is its model's and its threads'
            fields.update(cpu=cpu_model(), threads=torch.get_num_threads())
            if s.cache_only:  # never timed under --cache-only: the costs timed with another thread count serve
                alternatives = tuple(
                    Request(self.kind, {**fields, "threads": t}, what=f"the round costs timed with {t} threads")
                    for t in range(1, max(os.cpu_count() or 1, fields["threads"]) + 1) if t != fields["threads"])

        def produce(todo: list[Request]) -> list[Produced]:
            prog = Progress("round costs (timing)", rounds_count(), inp.progress, unit="rounds")
            with inp.meter.timed("round_costs"):
                costs = measure_round_costs(
                    inp.target, config, inp.head, context_len=ctx, budgets=budgets, backend=s.eval_backend,
                    tokens=context_tokens([comps[p.id].sequence for p in prompts], ctx + 1), report=prog.reach)
            prog.reach(prog.total)
            return [Produced({"seconds": torch.tensor([costs.seconds], dtype=torch.float64)},
                             {"costs": costs.to_dict()})]

        req = Request(self.kind, fields, what=f"the costs of a speculative round on {device_kind(dev)}",
                      alternatives=alternatives)
        return Plan([Batch([req], produce)], {"costs": req})

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[None],
               params: Mapping[str, Any]) -> tuple[RoundCosts, bool]:
        """The costs and whether they were read from the cache (True) or timed in this process (False)."""
        entry = entries["costs"]
        return RoundCosts.from_dict(entry.meta["costs"]), not entry.produced


#: The built-in measurement, reached by reference: ``ev.measure(ROUND_COSTS)``.
ROUND_COSTS = RoundCostsMeasurement()
