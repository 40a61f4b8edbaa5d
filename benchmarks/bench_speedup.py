"""Predicted against measured speed-up: the suite's prediction (round costs timed by the ``round_costs`` measurement,
the arithmetic of :mod:`dflash_eval.metrics.speedup`) next to this project's real speculative loop
(:func:`dflash_eval.metrics.online_loop.online_generate`) timed against plain greedy decoding of the same target on
the same prompts, in the same process, with the same implementation (transformers' modeling code, the run's backend),
warm.

For every prompt, ``--repeat`` times, alternating (plain, speculative, plain, ...): plain greedy decoding (a forward
over one token with the cache, its argmax, read on the host; stopping at EOS and at ``--max-new-tokens`` like the
references) and the online loop; the prefill (one forward over the prompt, with the drafter's layers captured as the
loop does) is timed alone and subtracted from both, so what is compared is decoding. Each prompt keeps its median
over the repeats. Measured speed-up = plain decoding's seconds per token / the loop's seconds per token, pooled over
prompts (every token weighted alike); per prompt too (median and range).

Predicted: the loop model (the chain round as this project's loop runs it: recomputed drafter context, a cache
snapshot, the committed tokens run again) at the loop's own pooled τ, and at the offline τ (macro mean over prompts,
the suite's headline); the server model (what the reports show first) is printed beside it, not measured here: no
server-style loop exists in this project. Also side by side, per part: the measured mean plain step against the
timed ``step``, the measured mean round against the predicted one.

Run (bundled fixtures, CPU, one thread; a fresh cache under --cache-dir is filled first)::

    .venv/bin/python benchmarks/bench_speedup.py --cache-dir /tmp/bench_speedup_cache --threads 1 --repeat 2

On a GPU (``--device cuda``, bf16 by default there; ``torch.cuda.synchronize`` around every timing), with any target
and drafter directories, e.g. random ones at other widths built with ``dflash_eval.testing.tiny``
(``build_random_target(out, hidden_size=..., num_hidden_layers=...)`` and ``random_drafter_config``)::

    python benchmarks/bench_speedup.py --device cuda --target-model /path/target --drafter /path/drafter
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dflash_eval.measurements.round_costs import context_tokens, measure_round_costs
from dflash_eval.metrics.online_loop import cache_keyword, online_generate
from dflash_eval.metrics.speedup import RoundCosts, predict, round_parts
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_result import speedup_summary
from dflash_eval.session.eval_session import EvalSession
from dflash_eval.target.backends import use_backend
from dflash_eval.target.hidden_states import LayerCapture

ROOT = Path(__file__).resolve().parents[1]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@torch.no_grad()
def plain_decode(target: Any, prompt_ids: list[int], max_new_tokens: int, backend: str) -> tuple[list[int], float]:
    """Plain greedy decoding: the tokens (the first from the prefill, never EOS, as the references) and the seconds
    of the whole generation, prefill included."""
    from transformers import DynamicCache

    model, dev, eos = target.model, target.device, target.eos_token_id
    kw = cache_keyword(model)
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    _sync(dev)
    t0 = time.perf_counter()
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
    _sync(dev)
    return out, time.perf_counter() - t0


@torch.no_grad()
def prefill_seconds(target: Any, prompt_ids: list[int], layers: tuple[int, ...], backend: str,
                    capture: bool) -> float:
    """Seconds of the prefill forward alone (with the drafter's layers captured when ``capture``)."""
    from transformers import DynamicCache

    model, dev = target.model, target.device
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    _sync(dev)
    t0 = time.perf_counter()
    with use_backend(backend, dev):
        cache = DynamicCache(config=model.config)
        if capture:
            with LayerCapture(model, layers):
                int(model(ids[None], **{cache_keyword(model): cache}, use_cache=True).logits[0, -1].argmax())
        else:
            int(model(ids[None], **{cache_keyword(model): cache}, use_cache=True).logits[0, -1].argmax())
    _sync(dev)
    return time.perf_counter() - t0


def median_costs(all_costs: list[RoundCosts]) -> RoundCosts:
    """Part by part, the median of several measurements of the costs (the same device, shapes and context)."""
    first = all_costs[0]
    out: dict[str, Any] = {}
    for name in ("step", "verify", "forward_2", "draft", "accept", "state_select", "draft_full", "snapshot"):
        out[name] = statistics.median(getattr(c, name) for c in all_costs)
    for name in ("append", "project"):
        out[name] = tuple(statistics.median(getattr(c, name)[i] for c in all_costs) for i in (0, 1))
    return replace(first, **out, seconds=sum(c.seconds for c in all_costs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-model", default=str(ROOT / "fixtures" / "target"))
    ap.add_argument("--drafter", default=str(ROOT / "fixtures" / "drafter"))
    ap.add_argument("--prompts", default=str(ROOT / "fixtures" / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ddtree-budget", default="4,8,16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    ap.add_argument("--repeat", type=int, default=2, help="decodings of each prompt by each method (median kept)")
    ap.add_argument("--cache-dir", default="/tmp/bench_speedup_cache")
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    opts: dict[str, Any] = {"target_model": a.target_model, "drafter": a.drafter, "prompts": a.prompts,
                            "max_new_tokens": a.max_new_tokens, "ddtree_budget": a.ddtree_budget, "device": a.device,
                            "dtype": a.dtype, "cache_dir": a.cache_dir, "witness_prompts": 0, "tau_floor": 1.0}
    if a.num_prompts:
        opts["num_prompts"] = a.num_prompts
    session = EvalSession(EvalSettings.from_mapping(opts), progress=None)
    s, inp, ev = session.settings, session.inputs, session.evaluation
    tau = session.tau_summary()
    t0 = time.perf_counter()
    block = speedup_summary(ev, tau)
    cost_s = time.perf_counter() - t0
    costs, _ = ev.measure("round_costs")
    target, drafter, head, backend = inp.target, ev.drafter, inp.head, s.eval_backend
    layers = tuple(drafter.config.target_layer_ids)
    comps = session.completions()
    rows: list[dict[str, Any]] = []
    timed: list[RoundCosts] = []
    tokens = context_tokens([comps[p.id].sequence for p in inp.prompts], costs.context_len + 1)
    warm = inp.prompts[0].id
    plain_decode(target, comps[warm].prompt_ids, 4, backend)  # warm-up: first calls allocate and select kernels
    online_generate(target, drafter, head, comps[warm].prompt_ids, max_new_tokens=8, backend=backend,
                    stop_at_eos=True)
    for p in inp.prompts:
        ids = comps[p.id].prompt_ids
        plain_t, spec_t, pre_plain, pre_spec = [], [], [], []
        for _ in range(a.repeat):  # the costs timed again beside each decoding: the same moment of the machine
            timed.append(measure_round_costs(target, drafter.config, head, context_len=costs.context_len, budgets=(),
                                             backend=backend, tokens=tokens))
            toks, t = plain_decode(target, ids, s.max_new_tokens, backend)
            plain_t.append(t)
            _sync(target.device)
            t1 = time.perf_counter()
            res = online_generate(target, drafter, head, ids, max_new_tokens=s.max_new_tokens, backend=backend,
                                  stop_at_eos=True)
            _sync(target.device)
            spec_t.append(time.perf_counter() - t1)
            pre_plain.append(prefill_seconds(target, ids, layers, backend, capture=False))
            pre_spec.append(prefill_seconds(target, ids, layers, backend, capture=True))
        n_plain, n_spec = len(toks) - 1, len(res.tokens) - 1  # tokens decoded after the prefill's
        rows.append({"prompt": p.id, "prompt_tokens": len(ids), "plain_tokens": n_plain, "spec_tokens": n_spec,
                     "same_tokens": toks == res.tokens, "rounds": res.tau.rounds,
                     "accepted": sum(res.tau.accept_lengths),
                     "plain_decode_s": max(1e-9, statistics.median(plain_t) - statistics.median(pre_plain)),
                     "spec_decode_s": max(1e-9, statistics.median(spec_t) - statistics.median(pre_spec))})
    ok = [r for r in rows if r["plain_tokens"] > 0 and r["rounds"] > 0]
    plain_per_tok = sum(r["plain_decode_s"] for r in ok) / sum(r["plain_tokens"] for r in ok)
    spec_per_tok = sum(r["spec_decode_s"] for r in ok) / sum(r["spec_tokens"] for r in ok)
    measured = plain_per_tok / spec_per_tok
    per_prompt = [(r["plain_decode_s"] / r["plain_tokens"]) / (r["spec_decode_s"] / r["spec_tokens"]) for r in ok]
    tau_online = sum(r["accepted"] for r in ok) / sum(r["rounds"] for r in ok)
    step_measured = plain_per_tok
    round_measured = sum(r["spec_decode_s"] for r in ok) / sum(r["rounds"] for r in ok)
    beside = median_costs(timed)
    pred_loop = predict(beside, "chain", tau_online, loop="loop")
    pred_loop_suite = predict(costs, "chain", tau_online, loop="loop")
    pred_server = block["strategies"]

    kind = "CPU" if target.device.type == "cpu" else torch.cuda.get_device_name(target.device)
    print(f"bench_speedup on {kind}: {costs.device}, {costs.dtype}, backend {costs.backend}, {len(ok)} prompts x "
          f"{s.max_new_tokens} new tokens, {a.repeat} repeats, context bucket {costs.context_len}; round costs timed "
          f"in {costs.seconds:.2f} s ({cost_s:.2f} s with the prediction)")
    print(f"  tokens identical (plain vs online loop): {sum(r['same_tokens'] for r in ok)}/{len(ok)} prompts")
    print(f"  τ: online loop pooled {tau_online:.3f}; offline macro mean {tau.mean_tau:.3f}")
    print(f"  costs: the suite's (timed once, before the decoding) and the median of {len(timed)} timed beside it")
    print(f"  plain step:  measured {1e3 * step_measured:8.2f} ms/token   timed beside {1e3 * beside.step:8.2f} ms "
          f"(ratio {beside.step / step_measured:.3f})   suite's {1e3 * costs.step:8.2f} ms")
    print(f"  loop round:  measured {1e3 * round_measured:8.2f} ms/round   predicted at online τ "
          f"{1e3 * pred_loop.round_s:8.2f} ms (ratio {pred_loop.round_s / round_measured:.3f})   suite's "
          f"{1e3 * pred_loop_suite.round_s:8.2f} ms")
    parts = round_parts(beside, None, tau_online, "loop")
    print("    predicted loop round parts (ms): " + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in parts.items()))
    print(f"  speed-up (chain, this project's online loop vs plain greedy, {kind}):")
    print(f"    measured            {measured:6.3f}x  (per prompt: median {statistics.median(per_prompt):.3f}x, "
          f"range {min(per_prompt):.3f}-{max(per_prompt):.3f}x)")
    print(f"    predicted, online τ {pred_loop.speedup:6.3f}x  (costs timed beside; predicted / measured "
          f"{pred_loop.speedup / measured:.3f})")
    print(f"    predicted, online τ {pred_loop_suite.speedup:6.3f}x  (the suite's costs; predicted / measured "
          f"{pred_loop_suite.speedup / measured:.3f})")
    pooled_off = predict(costs, "chain", block["pooled"]["chain"]["tau"], loop="loop")
    print(f"    predicted, offline pooled τ {pooled_off.speedup:.3f}x  (τ {pooled_off.tau:.3f}: the suite's rounds, "
          f"the suite's costs; predicted / measured {pooled_off.speedup / measured:.3f})")
    off = block["loop"]["chain"]
    print(f"    predicted, offline τ {off['speedup']:6.3f}x [{off['speedup_ci'][0]:.3f}, {off['speedup_ci'][1]:.3f}] "
          f"(the suite's report: macro τ {tau.mean_tau:.3f} and its CI, the suite's costs; a typical prompt's: "
          f"mean of the per-prompt measured speed-ups {statistics.fmean(per_prompt):.3f}x)")
    print("  server model (the reports' prediction; not measured here: no server-style loop in this project):")
    for k, v in pred_server.items():
        lo, hi = v["speedup_ci"]
        print(f"    {k:10s} τ {v['tau']:.3f}  speed-up {v['speedup']:.3f}x [{lo:.3f}, {hi:.3f}]  "
              f"{v['tokens_per_s']:.1f} tokens/s (plain {block['plain_tokens_per_s']:.1f})")
    print(f"  best strategy: {block['best']}; best DDTree budget: {block['best_budget']}")
    if a.json:
        out = {"device": kind, "costs": costs.to_dict(), "costs_beside": beside.to_dict(), "rows": rows,
               "measured_speedup": measured, "per_prompt_speedup": per_prompt, "tau_online_pooled": tau_online,
               "tau_offline_macro": tau.mean_tau, "predicted_loop_online_tau": pred_loop.to_dict(),
               "predicted_loop_online_tau_suite_costs": pred_loop_suite.to_dict(),
               "predicted_loop_offline_tau": block["loop"]["chain"],
               "predicted_loop_offline_pooled_tau": pooled_off.to_dict(), "step_measured_s": step_measured,
               "round_measured_s": round_measured, "speedup_block": block}
        Path(a.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
