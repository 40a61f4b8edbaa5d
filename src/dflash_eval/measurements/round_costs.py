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
- ``verify``: the target forward over the B tokens of a chain block (the drafter's target layers captured, as a
  speculative loop needs them); ``tree_verify[N]``: over the N + 1 tokens of a DDTree-N tree (a tree the project's
  DDTree builds from a drafted block), with the tree's attention mask on the attention layers and depth-based
  positions; the linear-attention layers run the N + 1 tokens as a k-token forward (the cost a tree verify has when
  each node's recurrent state is advanced from its parent's: docs/speedup.md);
- ``draft``: the drafter's block pass against cached context keys and values, the target's lm_head, the argmax;
  ``draft_full``: the same recomputing the context's keys and values (as this project's online loop drafts);
- ``forward_2``: the target forward over 2 tokens (this project's online loop commits 1 to B tokens by a forward:
  costed through 1, 2 and B tokens);
- ``tree_build[N]``: the block's log-probs and top-N per slot, the best-first DDTree
  (:func:`dflash_eval.metrics.ddtree.build_ddtree`), its attention mask and positions on the device;
- ``accept`` and ``tree_accept[N]``: the target's argmax over the verified tokens read on the host, compared with
  the block or walked down the tree;
- ``append``: the drafter's context keys and values of 1 and of B newly committed positions; ``project``: the
  projection (fc + hidden_norm) of their features alone (the online loop's);
- ``state_select``: one copy of every linear-attention layer's conv and recurrent state (a server copies the
  accepted position's state into the request's); ``snapshot``: a copy of the whole target cache (the online loop's
  snapshot before each verify).

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
from dflash_eval.metrics.ddtree import TreeNode, build_ddtree
from dflash_eval.metrics.online_loop import cache_keyword
from dflash_eval.metrics.speedup import RoundCosts, context_bucket, mean_context
from dflash_eval.target.backends import use_backend
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import LayerCapture
from dflash_eval.target.loader import Target
from dflash_eval.target.provenance import device_kind, device_name, platform_fields

__all__ = ["RoundCostsMeasurement", "ROUND_COSTS", "REPEATS", "WARMUP", "COSTS_VERSION", "measure_round_costs",
           "tree_inputs", "cpu_model", "context_tokens"]

#: Timed runs of each part (the median is its cost) ...
REPEATS = 7
#: ... after this many untimed ones (allocations, kernel selection, caches warmed).
WARMUP = 1
#: The version of what :func:`measure_round_costs` times, in the entry's key: raised when a part is added or timed
#: differently (the costs are keyed by it, not by the τ code's ``CODE_VERSION``).
COSTS_VERSION = 3


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


def _state_tensors(cache: Any) -> list[Tensor]:
    """Every linear-attention layer's conv and recurrent state tensors of a transformers cache (none for a target
    without such layers)."""
    out: list[Tensor] = []
    for layer in getattr(cache, "layers", []):
        for attr in ("conv_states", "recurrent_states"):
            value = getattr(layer, attr, None)
            values = value.values() if isinstance(value, dict) else [value]
            out.extend(v for v in values if isinstance(v, Tensor))
    return out


#: The children of each index of a verified tree, by token (the root is index 0).
Children = dict[int, dict[int, int]]


def tree_inputs(nodes: list[TreeNode], root: int, start: int, context_len: int, dtype: torch.dtype,
                dev: torch.device) -> tuple[Tensor, Tensor, Tensor, Children]:
    """The verify inputs of a DDTree: token ids [1, k] (the root, then the nodes in order), positions [1, k] (the
    root at ``start``, a node at ``start + depth``), the additive attention mask [1, 1, k, context_len + k] of the
    attention layers (every node sees the context and its own ancestors, the root included, and itself), and the
    children of each tree index by token (the root is index 0, node i is index i + 1)."""
    k = len(nodes) + 1
    parent = [-1] + [nd.parent + 1 for nd in nodes]  # node parents are node indices (-1: the root)
    visible = torch.zeros(k, k, dtype=torch.bool)
    children: Children = {}
    for i in range(k):
        j = i
        while j >= 0:
            visible[i, j] = True
            j = parent[j] if j > 0 else -1
        if i > 0:
            children.setdefault(parent[i], {}).setdefault(nodes[i - 1].token, i)
    mask = torch.zeros(1, 1, k, context_len + k, dtype=dtype)
    mask[0, 0, :, context_len:] = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)
    ids = torch.tensor([[root] + [nd.token for nd in nodes]], dtype=torch.long)
    pos = torch.tensor([[start] + [start + nd.depth for nd in nodes]], dtype=torch.long)
    return ids.to(dev), pos.to(dev), mask.to(dev), children


def _walk(children: Mapping[int, Mapping[int, int]], post: list[int]) -> int:
    """Accepted drafts along the tree: from the root, descend to the child whose token is the target's token after
    the current node."""
    cur, acc = 0, 0
    while True:
        nxt = children.get(cur, {}).get(post[cur])
        if nxt is None:
            return acc
        cur, acc = nxt, acc + 1


def context_tokens(sequences: list[list[int]], n: int) -> list[int]:
    """``n`` token ids from the run's reference sequences, concatenated in order and repeated as needed."""
    pool = [t for s in sequences for t in s] or [0]
    return (pool * (n // len(pool) + 1))[:n]


def _tree_parts(model: Any, kw: str, head: TargetHead, logits: Tensor, n: int, bonus: int, context_len: int,
                dtype: torch.dtype, dev: torch.device, fresh: Callable[[], Any]
                ) -> list[tuple[str, Callable[[Any], object], Callable[[], Any] | None]]:
    """The timed parts of a DDTree-``n`` round: building the tree from the block's ``logits`` ([B-1, V]), the
    target's forward over it under its mask, the walk down it along the target's argmax."""
    top = max(1, min(n, head.vocab_size))

    def build(_: object) -> tuple[Tensor, Tensor, Tensor, Children]:
        lp, tk = logits.float().log_softmax(-1).topk(top, dim=-1)
        return tree_inputs(build_ddtree(tk.cpu(), lp.cpu(), n), bonus, context_len, context_len, dtype, dev)

    t_ids, t_pos, t_mask, children = build(None)
    masks = {"full_attention": t_mask, "linear_attention": None}

    def verify(c: Any) -> Tensor:
        return model(t_ids, **{kw: c}, use_cache=True, attention_mask=masks, position_ids=t_pos).logits[0]

    tver = verify(fresh())
    return [(f"tree_build_{n}", build, None), (f"tree_verify_{n}", verify, fresh),
            (f"tree_accept_{n}", lambda _: _walk(children, tver.argmax(-1).tolist()), None)]


@torch.no_grad()
def measure_round_costs(target: Target, config: DrafterConfig, head: TargetHead, *, context_len: int,
                        budgets: tuple[int, ...], backend: str, tokens: list[int], repeats: int = REPEATS,
                        warmup: int = WARMUP, report: Callable[[int], None] | None = None) -> RoundCosts:
    """Time every part of a round and a plain step (module docstring) at ``context_len`` on ``target``'s device
    and dtype, with a drafter of ``config`` (fresh random weights); ``tokens``: at least ``context_len`` + 1 token
    ids to prefill with; ``report(k)``: called after the k-th round of every part."""
    t_start = time.perf_counter()
    model, dev, dtype = target.model, target.device, target.dtype
    b, L = config.block_size, context_len
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(0)
        drafter = DFlashDrafter(config).to(device=dev, dtype=dtype).eval()
    kw = cache_keyword(model)
    ids = torch.tensor(tokens[: L + 1], dtype=torch.long, device=dev)
    from transformers import DynamicCache  # imported with the target's modeling code, when a model is timed

    layers = tuple(config.target_layer_ids)
    with use_backend(backend, dev):
        cache0 = DynamicCache(config=model.config)  # type: ignore[arg-type]  # transformers' config, through nn.Module
        with LayerCapture(model, layers) as cap:
            model(ids[None, :L], **{kw: cache0}, use_cache=True)
            feats = cap.features()[0].to(dev)  # [L, layers*H]
        ctx = drafter.project_context(feats)[None]  # [1, L, H] the projected context
        ckv = drafter.context_kv(ctx)
        feats = feats[-b:]  # [B, layers*H] as the features of committed positions (their values do not matter)
        fresh = lambda: copy.deepcopy(cache0)  # noqa: E731 - the setup of every timed target forward
        bonus = int(ids[L])
        block = block_ids(torch.tensor([bonus], device=dev), b, config.mask_token_id)[None]  # [1, 1, B]
        start = torch.tensor([[L]], device=dev)
        logits = draft_logits(drafter, head, ckv, block, start)[0, 0]  # [B-1, V]
        chain_block = block[0, 0].clone()
        chain_block[1:] = logits.argmax(-1)
        ver = model(chain_block[None], **{kw: fresh()}, use_cache=True).logits[0]  # [B, V]
        states = _state_tensors(cache0)
        copies = [torch.empty_like(t) for t in states]

        def step(cache: Any) -> None:  # a plain decoding step
            int(model(ids[None, L:L + 1], **{kw: cache}, use_cache=True).logits[0, -1].argmax())

        def accept(_: object) -> None:
            post = ver.argmax(-1)
            int((chain_block[1:] == post[:-1]).int().cumprod(0).sum())

        parts: list[tuple[str, Callable[[Any], object], Callable[[], Any] | None]] = [
            ("verify", lambda c: model(chain_block[None], **{kw: c}, use_cache=True), fresh),
            ("forward_2", lambda c: model(chain_block[None, :2], **{kw: c}, use_cache=True), fresh),
            ("draft", lambda _: draft_logits(drafter, head, ckv, block, start)[0, 0].argmax(-1), None),
            ("draft_full", lambda _: draft_logits(drafter, head, ctx, block, start)[0, 0].argmax(-1), None),
            ("accept", accept, None),
            ("append_1", lambda _: drafter.context_kv(drafter.project_context(feats[-1:])[None]), None),
            ("append_b", lambda _: drafter.context_kv(drafter.project_context(feats)[None]), None),
            ("project_1", lambda _: drafter.project_context(feats[-1:]), None),
            ("project_b", lambda _: drafter.project_context(feats), None),
            ("state_select", lambda _: [d.copy_(t) for d, t in zip(copies, states)], None),
            ("snapshot", lambda _: copy.deepcopy(cache0), None)]
        for n in budgets:
            parts += _tree_parts(model, kw, head, logits, n, bonus, L, dtype, dev, fresh)
        # Round-robin: every part once a round, so that each part's timings spread over the same stretch of time
        # (on a shared machine a part timed in a quiet moment and another in a busy one would not compare).
        times: dict[str, list[float]] = {name: [] for name in ["step"] + [p[0] for p in parts]}
        for i in range(warmup + repeats):
            keep = i >= warmup
            xs = _timed(step, dev, setup=fresh, repeats=1, warmup=0)  # no features captured: plain decoding
            if keep:
                times["step"] += xs
            with LayerCapture(model, layers):  # a speculative loop captures the drafter's target layers
                for name, fn, setup in parts:
                    xs = _timed(fn, dev, setup=setup, repeats=1, warmup=0)
                    if keep:
                        times[name] += xs
            if report is not None:
                report(i + 1)
    med = {k: _median_spread(v) for k, v in times.items()}
    c = {k: m for k, (m, _) in med.items()}
    return RoundCosts(
        device=device_name(dev), device_kind=device_kind(dev), dtype=str(dtype).removeprefix("torch."),
        backend=backend, threads=torch.get_num_threads(), context_len=L, block_size=b, repeats=repeats,
        warmup=warmup, step=c["step"], verify=c["verify"], draft=c["draft"], accept=c["accept"],
        append=(c["append_1"], c["append_b"]), state_select=c["state_select"],
        tree_verify={n: c[f"tree_verify_{n}"] for n in budgets}, tree_build={n: c[f"tree_build_{n}"] for n in budgets},
        tree_accept={n: c[f"tree_accept_{n}"] for n in budgets}, draft_full=c["draft_full"], snapshot=c["snapshot"],
        project=(c["project_1"], c["project_b"]), forward_2=c["forward_2"], spread={k: s for k, (_, s) in med.items()},
        seconds=time.perf_counter() - t_start)


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
            "budgets": list(budgets), "context_len": ctx, **platform_fields(s.torch_dtype, dev),
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
