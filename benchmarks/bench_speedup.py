"""Predicted against measured speed-up, per strategy: the suite's prediction (round costs timed by the ``round_costs``
measurement, the arithmetic of :mod:`dflash_eval.metrics.speedup`) beside the loops it models, timed end to end against
plain greedy decoding of the same target on the same prompts, in one process, warm:

- the server-style loop (:mod:`dflash_eval.metrics.server_loop`: the drafter keeps its context's keys and values, one
  target forward verifies the chain's block or DDTree-N's tree, the linear-attention layers keep every node's state,
  the KV cache is cut back to the accepted path), for the chain and each DDTree budget: the ``server`` model, the one
  the reports lead with;
- the recompute loop (:mod:`dflash_eval.metrics.online_loop`, chain only): the ``loop`` model.

For every prompt, ``--repeat`` times, alternating (plain, then every loop): plain greedy decoding (a forward over one
token with the cache, its argmax, read on the host; stopping at EOS and at ``--max-new-tokens`` like the references)
and each loop; each one's prefill (the prompt's forward, and for the server-style loop the drafter's context of the
prompt) is timed alone and subtracted, so what is compared is decoding. The round costs are timed again beside every
repeat (the same moment of the machine). Each prompt keeps its median over the repeats.

Measured speed-up of a strategy = plain decoding's seconds per token / the loop's, pooled over prompts (every token
weighted alike; per prompt too: median and range). Predicted: the model at the loop's own pooled τ (accepted tokens /
rounds), from the costs timed beside (``predicted / measured``: the model's error) and from the suite's costs (timed
once, as a run reports them); and the suite's report at the offline pooled τ. Correctness beside it: how many prompts
decode to plain greedy's tokens, and how many have every round's acceptance equal to the offline simulation's.

Run (bundled fixtures, CPU, one thread; a fresh cache under --cache-dir is filled first)::

    .venv/bin/python benchmarks/bench_speedup.py --cache-dir /tmp/bench_speedup_cache --threads 1 --repeat 2

On a GPU (``--device cuda``, bf16 by default there; ``torch.cuda.synchronize`` around every timing), with any target
and drafter directories, e.g. random ones at Qwen3.6-27B widths built by ``--build-wide DIR`` (a few layers: see
``--wide-layers``)::

    python benchmarks/bench_speedup.py --device cuda --json out.json
    python benchmarks/bench_speedup.py --device cuda --build-wide /tmp/wide --json wide.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dflash_eval.measurements.round_costs import context_tokens, measure_round_costs
from dflash_eval.metrics.near_tie import TOP_K, Divergence, TopTokens, first_divergence, judge
from dflash_eval.metrics.online_loop import cache_keyword, online_generate
from dflash_eval.metrics.server_loop import ServerLoop
from dflash_eval.metrics.speedup import RoundCosts, budget_of, predict, round_parts, strategy_name
from dflash_eval.metrics.tau import simulate_tau
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_result import speedup_summary
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.target.backends import use_backend
from dflash_eval.target.hidden_states import extract_features

ROOT = Path(__file__).resolve().parents[1]

#: Qwen3.6-27B's widths (its config.json): hidden 5120, 64 layers (3 Gated DeltaNet : 1 attention), GDN 16 key and
#: 48 value heads of 128, attention 24 query and 4 KV heads of 256, MLP 17408; the drafter's 5 target layers, B = 16.
WIDE = dict(hidden_size=5120, intermediate_size=17408, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
            linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _seconds(fn: Callable[[], Any], dev: torch.device) -> tuple[Any, float]:
    _sync(dev)
    t0 = time.perf_counter()
    out = fn()
    _sync(dev)
    return out, time.perf_counter() - t0


@torch.no_grad()
def plain_decode(target: Any, prompt_ids: list[int], max_new_tokens: int, backend: str) -> list[int]:
    """Plain greedy decoding: the tokens (the first from the prefill, never EOS, as the references)."""
    from transformers import DynamicCache

    model, dev, eos = target.model, target.device, target.eos_token_id
    kw = cache_keyword(model)
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    with use_backend(backend, dev):
        cache = DynamicCache(config=model.config)
        logits = model(ids[None], **{kw: cache}, use_cache=True).logits[0, -1]
        if eos is not None:
            logits[eos] = float("-inf")
        tok = int(logits.argmax())
        out = [tok]
        while len(out) < max_new_tokens and tok != eos:
            tok = int(model(torch.tensor([[tok]], device=dev), **{kw: cache}, use_cache=True).logits[0, -1].argmax())
            out.append(tok)
    return out


@torch.no_grad()
def plain_prefill(target: Any, prompt_ids: list[int], backend: str) -> None:
    """The prefill forward of plain decoding alone."""
    from transformers import DynamicCache

    model, dev = target.model, target.device
    with use_backend(backend, dev):
        cache = DynamicCache(config=model.config)
        int(model(torch.tensor([prompt_ids], device=dev), **{cache_keyword(model): cache},
                  use_cache=True).logits[0, -1].argmax())


@torch.no_grad()
def parting(target: Any, prompt_id: str, prompt_ids: list[int], plain: list[int], got: list[int],
            backend: str) -> Divergence | None:
    """Where a loop's tokens first leave plain greedy decoding's, judged by the target's own logits there
    (teacher-forced on the shared prefix): a named near tie or a divergence (None: no parting)."""
    k = first_divergence(plain, got)
    if k is None or k >= min(len(plain), len(got)):
        return None
    ids = torch.tensor([prompt_ids + plain[:k]], device=target.device)
    with use_backend(backend, target.device):
        logits = target.model(ids).logits[0, -1].float()
    val, idx = logits.topk(TOP_K)
    top = TopTokens(tuple(idx.tolist()), tuple(val.tolist()))
    return judge(prompt_id, "plain decoding", k, len(prompt_ids) + k, plain[k], got[k], top, target.dtype)


def _prefill_of(key: str) -> str:
    """Whose prefill a method's decoding time is measured without: the recompute loop's, else the server-style's."""
    return "recompute" if key == "recompute" else "server"


def median_costs(all_costs: list[RoundCosts]) -> RoundCosts:
    """Part by part, the median of several measurements of the costs (the same device, shapes and context)."""
    first = all_costs[0]
    out: dict[str, Any] = {}
    for name in ("step", "draft", "build", "verify", "accept", "draft_full", "snapshot", "forward_2", "forward_b"):
        out[name] = statistics.median(getattr(c, name) for c in all_costs)
    for name in ("commit", "project"):
        out[name] = tuple(statistics.median(getattr(c, name)[i] for c in all_costs) for i in (0, 1))
    for name in ("tree_build", "tree_verify", "tree_accept"):
        out[name] = {b: statistics.median(getattr(c, name)[b] for c in all_costs) for b in first.budgets}
    return replace(first, **out, seconds=sum(c.seconds for c in all_costs))


def build_wide(out: Path, layers: int, block_size: int, vocab: int) -> tuple[Path, Path, Path]:
    """A random target at Qwen3.6-27B widths with ``layers`` layers, a random drafter for it (5 target layers when
    there are enough, B = ``block_size``) and a prompt file, written under ``out`` (bf16)."""
    from dflash_eval.drafter import DFlashDrafter, save_drafter
    from dflash_eval.testing.tiny import build_random_target, random_drafter_config

    tdir, ddir = out / "target", out / "drafter"
    if not (tdir / "config.json").is_file():
        build_random_target(tdir, vocab_size=vocab, num_hidden_layers=layers, dtype=torch.bfloat16, **WIDE)
    if not (ddir / "config.json").is_file():
        torch.manual_seed(1)
        cfg = random_drafter_config(tdir, num_features=min(5, layers - 1), num_hidden_layers=1,
                                    block_size=block_size)
        save_drafter(DFlashDrafter(cfg), ddir, dtype=torch.bfloat16)
    prompts = out / "prompts.jsonl"
    words = ("def add(a, b): return a + b. The quick brown fox jumps over the lazy dog. for i in range(10): "
             "print(i * i). class Point: def __init__(self, x, y): self.x = x").split()
    prompts.write_text("".join(json.dumps({"id": f"wide-{i}", "text": " ".join(words[i:] + words[:i]) * 3}) + "\n"
                               for i in range(8)))
    return tdir, ddir, prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-model", default=str(ROOT / "fixtures" / "target"))
    ap.add_argument("--drafter", default=str(ROOT / "fixtures" / "drafter"))
    ap.add_argument("--prompts", default=str(ROOT / "fixtures" / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ddtree-budget", default="8,16,32", help="DDTree budgets to measure, comma-separated")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    ap.add_argument("--repeat", type=int, default=2, help="decodings of each prompt by each method (median kept)")
    ap.add_argument("--cache-dir", default="/tmp/bench_speedup_cache")
    ap.add_argument("--build-wide", default=None, metavar="DIR",
                    help="build (once) and use a random target at Qwen3.6-27B widths and a drafter for it in DIR")
    ap.add_argument("--wide-layers", type=int, default=8, help="layers of the --build-wide target")
    ap.add_argument("--warm-pass", action=argparse.BooleanOptionalAction, default=None,
                    help="decode every prompt once with every method before timing (default: on a GPU, where the "
                         "first forward of a shape compiles or autotunes kernels)")
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.build_wide:
        a.target_model, a.drafter, a.prompts = map(str, build_wide(Path(a.build_wide), a.wide_layers, 16, 4096))
    budgets = [int(b) for b in a.ddtree_budget.split(",") if b.strip()]
    opts: dict[str, Any] = {"target_model": a.target_model, "drafter": a.drafter, "prompts": a.prompts,
                            "max_new_tokens": a.max_new_tokens, "ddtree_budget": a.ddtree_budget, "device": a.device,
                            "dtype": a.dtype, "cache_dir": a.cache_dir, "witness_prompts": 0, "tau_floor": 1.0}
    if a.num_prompts:
        opts["num_prompts"] = a.num_prompts
    session = EvalSession(EvalSettings.from_mapping(opts), progress=None)
    s, inp, ev = session.settings, session.inputs, session.evaluation
    tau = session.tau_summary()
    t0 = time.perf_counter()
    block = speedup_summary(ev, tau).to_dict()  # eval.json's speedup block, as the output file keeps it
    cost_s = time.perf_counter() - t0
    costs, _ = ev.measure("round_costs")
    target, drafter, head, backend, dev = inp.target, ev.drafter, inp.head, s.eval_backend, inp.target.device
    comps = session.completions()
    strategies: list[int | None] = [None, *budgets]
    loop = ServerLoop(target, drafter, head, backend=backend, max_new_tokens=s.max_new_tokens, stop_at_eos=True)
    tokens = context_tokens([comps[p.id].sequence for p in inp.prompts], costs.context_len + 1)
    warm = comps[inp.prompts[0].id].prompt_ids
    plain_decode(target, warm, 4, backend)  # warm-up: first calls allocate and select (or compile) kernels
    with loop.running():
        for b in strategies:
            loop.generate(warm, budget=b, max_blocks=2)
    online_generate(target, drafter, head, warm, max_new_tokens=8, backend=backend, stop_at_eos=True)
    if a.warm_pass if a.warm_pass is not None else dev.type == "cuda":
        for p in inp.prompts:  # every shape each method meets, compiled (and autotuned) before anything is timed
            ids = comps[p.id].prompt_ids
            plain_decode(target, ids, s.max_new_tokens, backend)
            plain_prefill(target, ids, backend)
            with loop.running():
                for b in strategies:
                    loop.generate(ids, budget=b)
            online_generate(target, drafter, head, ids, max_new_tokens=s.max_new_tokens, backend=backend,
                            stop_at_eos=True)
        measure_round_costs(target, drafter.config, head, context_len=costs.context_len, budgets=tuple(budgets),
                            backend=backend, tokens=tokens, repeats=1)

    # the offline simulation on the references, every strategy: what each round's acceptance must equal
    items = []
    for p in inp.prompts:
        seq = torch.tensor(comps[p.id].sequence)
        feats, _ = extract_features(target, seq, drafter.config.target_layer_ids, backend=backend)
        items.append((feats, seq, len(comps[p.id].prompt_ids)))
    offline = simulate_tau(drafter, head, items, budgets=budgets)

    def decode_once(ids: list[int], times: dict[str, list[float]], pre: dict[str, list[float]],
                    results: dict[str, Any]) -> list[int]:
        """Decode ``ids`` once by every method, adding each one's seconds to ``times`` and its prefill's to ``pre``
        and its result to ``results``; returns plain decoding's tokens."""
        plain, t = _seconds(lambda: plain_decode(target, ids, s.max_new_tokens, backend), dev)
        times["plain"].append(t)
        pre["plain"].append(_seconds(lambda: plain_prefill(target, ids, backend), dev)[1])
        with loop.running():
            for b in strategies:
                results[strategy_name(b)], t = _seconds(lambda b=b: loop.generate(ids, budget=b), dev)
                times[strategy_name(b)].append(t)
            pre["server"].append(_seconds(lambda: loop.prefill(ids), dev)[1])
        results["recompute"], t = _seconds(
            lambda: online_generate(target, drafter, head, ids, max_new_tokens=s.max_new_tokens, backend=backend,
                                    stop_at_eos=True), dev)
        times["recompute"].append(t)
        pre["recompute"].append(_seconds(lambda: online_generate(
            target, drafter, head, ids, max_new_tokens=1, backend=backend), dev)[1])
        return plain

    rows: dict[str, list[dict[str, Any]]] = {strategy_name(b): [] for b in strategies}
    rows["recompute"] = []
    timed: list[RoundCosts] = []
    for n, p in enumerate(inp.prompts):
        ids = comps[p.id].prompt_ids
        times: dict[str, list[float]] = {k: [] for k in ["plain", *rows]}
        pre: dict[str, list[float]] = {"plain": [], "server": [], "recompute": []}
        results: dict[str, Any] = {}
        for _ in range(a.repeat):  # the costs timed again beside each decoding: the same moment of the machine
            timed.append(measure_round_costs(target, drafter.config, head, context_len=costs.context_len,
                                             budgets=tuple(budgets), backend=backend, tokens=tokens))
            plain = decode_once(ids, times, pre, results)
        base = statistics.median(times["plain"]) - statistics.median(pre["plain"])
        per_round = {k: (statistics.median(times[k]) - statistics.median(pre[_prefill_of(k)])) / max(1, r.tau.rounds)
                     for k, r in results.items()}
        print(f"  prompt {p.id}: plain {1e3 * base / max(1, len(plain) - 1):.3f} ms/token; "
              + ", ".join(f"{k} {1e3 * v:.3f} ms/round" for k, v in per_round.items()), flush=True)
        for key, res in results.items():
            prefill = statistics.median(pre[_prefill_of(key)])
            budget = None if key == "recompute" else budget_of(key)
            off = offline[n].chain if budget is None else offline[n].ddtree[budget]
            part = parting(target, p.id, ids, plain, res.tokens, backend)
            rows[key].append({
                "parting": None if part is None else part.to_dict(),
                "prompt": p.id, "prompt_tokens": len(ids), "plain_tokens": len(plain) - 1,
                "tokens": len(res.tokens) - 1, "same_tokens": res.tokens == plain,
                "same_rounds": res.tau.accept_lengths == off.accept_lengths, "rounds": res.tau.rounds,
                "accepted": sum(res.tau.accept_lengths), "offline_rounds": off.rounds,
                "offline_accepted": sum(off.accept_lengths), "plain_decode_s": max(1e-9, base),
                "decode_s": max(1e-9, statistics.median(times[key]) - prefill),
                "target_tokens": getattr(res, "target_tokens", None)})

    beside = median_costs(timed)
    kind = "CPU" if dev.type == "cpu" else torch.cuda.get_device_name(dev)
    print(f"bench_speedup on {kind}: {costs.device}, {costs.dtype}, backend {costs.backend}, {len(inp.prompts)} "
          f"prompts x {s.max_new_tokens} new tokens, {a.repeat} repeats, context bucket {costs.context_len}; round "
          f"costs timed in {costs.seconds:.2f} s ({cost_s:.2f} s with the prediction)")
    print(f"  plain step: timed beside {1e3 * beside.step:.3f} ms, the suite's {1e3 * costs.step:.3f} ms")
    header = (f"  {'strategy':<22s} {'same tokens':>11s} {'rounds=offline':>14s} {'τ loop':>7s} {'τ offline':>9s} "
              f"{'measured':>9s} {'predicted':>9s} {'pred/meas':>9s} {'suite pred':>10s} {'pred/meas':>9s} "
              f"{'round ms meas':>13s} {'round ms pred':>13s}")
    print(header)
    summary: dict[str, Any] = {}
    for key, rs in rows.items():
        ok = [r for r in rs if r["plain_tokens"] > 0 and r["rounds"] > 0]
        if not ok:
            continue
        plain_per_tok = sum(r["plain_decode_s"] for r in ok) / sum(r["plain_tokens"] for r in ok)
        per_tok = sum(r["decode_s"] for r in ok) / sum(r["tokens"] for r in ok)
        measured = plain_per_tok / per_tok
        per_prompt = [(r["plain_decode_s"] / r["plain_tokens"]) / (r["decode_s"] / r["tokens"]) for r in ok]
        tau_loop = sum(r["accepted"] for r in ok) / sum(r["rounds"] for r in ok)
        tau_off = sum(r["offline_accepted"] for r in ok) / sum(r["offline_rounds"] for r in ok)
        model, strategy = ("loop", "chain") if key == "recompute" else ("server", key)
        pred = predict(beside, strategy, tau_loop, loop=model)
        suite = predict(costs, strategy, tau_off, loop=model)
        round_meas = sum(r["decode_s"] for r in ok) / sum(r["rounds"] for r in ok)
        # the plain step measured in the decoding against the timed one scales the round: compare like with like
        round_pred = pred.round_s * (plain_per_tok / beside.step)
        label = "chain (recompute loop)" if key == "recompute" else f"{key} (server-style)"
        print(f"  {label:<22s} {sum(r['same_tokens'] for r in ok):>5d}/{len(ok):<5d} "
              f"{sum(r['same_rounds'] for r in ok):>7d}/{len(ok):<6d} {tau_loop:7.3f} {tau_off:9.3f} "
              f"{measured:8.3f}x {pred.speedup:8.3f}x {pred.speedup / measured:9.3f} {suite.speedup:9.3f}x "
              f"{suite.speedup / measured:9.3f} {1e3 * round_meas:13.3f} {1e3 * round_pred:13.3f}")
        parts_at = [Divergence.from_dict(r["parting"]) for r in ok if r["parting"]]
        for d in parts_at:
            print(f"      {'near tie' if d.near_tie else 'DIVERGENCE'}: {d.describe()}")
        summary[key] = {"near_ties": sum(d.near_tie for d in parts_at),
                        "divergences": sum(not d.near_tie for d in parts_at), "model": model, "strategy": strategy,
                        "measured_speedup": measured, "per_prompt_speedup": per_prompt, "tau_loop_pooled": tau_loop,
                        "tau_offline_pooled": tau_off, "same_tokens": sum(r["same_tokens"] for r in ok),
                        "same_rounds": sum(r["same_rounds"] for r in ok),
                        "prompts": len(ok), "predicted_beside": pred.to_dict(), "predicted_suite": suite.to_dict(),
                        "ratio_beside": pred.speedup / measured, "ratio_suite": suite.speedup / measured,
                        "round_measured_s": round_meas, "plain_step_measured_s": plain_per_tok}
        parts = round_parts(beside, budget_of(strategy), tau_loop, model)
        print("      predicted parts (ms): " + ", ".join(f"{k} {1e3 * v:.3f}" for k, v in parts.items()))
    print("  the suite's report (macro τ, the headline): " + ", ".join(
        f"{k} {v['speedup']:.3f}x" for k, v in block["strategies"].items()))
    if a.json:
        out = {"device": kind, "costs": costs.to_dict(), "costs_beside": beside.to_dict(), "rows": rows,
               "summary": summary, "speedup_block": block, "args": vars(a)}
        Path(a.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
