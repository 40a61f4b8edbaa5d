"""The drafting stage of a new checkpoint: every start drafted (table) vs only the visited starts (lock-step).

On the suite's reference completions and features (read from ``--cache-dir``, produced there first if missing),
times, side by side and alternating (``--repeat`` rounds, best of each kept), for the chain and every DDTree
budget of the suite:

- before: every start of every prompt drafted as the suite did before the lock-step simulation (256 starts per
  forward grouped by prompt and padded to the longest group with duplicate rows, the context's keys and values
  recomputed in every forward; reproduced here with the same drafting primitive), then rows looked up;
- table: :func:`dflash_eval.metrics.tau.draft_table` (every start, no padding rows, context keys and values once), then
  :func:`~dflash_eval.metrics.tau.chain_tau` / :func:`~dflash_eval.metrics.tau.ddtree_tau` look the rows up;
- lock-step: :func:`dflash_eval.metrics.tau.simulate_tau`, drafting only the (prompt, start) pairs some path visits.

Two workloads: the evaluation side (chain and every DDTree budget, top-k = the largest budget) and a chain-only
simulation (top-1), which the drift tests run once per other side of each comparison (``--drift-sides``, 2 on a
CPU: the torch-recurrent and bf16 features). The stage total is one of the first plus ``--drift-sides`` of the
second. Prints times, ratios, blocks drafted, and whether every prompt's acceptance lengths agree.

Run (bundled fixtures, CPU; reuses the suite's cache when it is warm, else fills it first)::

    .venv/bin/python benchmarks/bench_drafting.py --cache-dir .dflash_cache torch_threads=1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from dflash_eval.drafter import block_ids, draft_logits
from dflash_eval.metrics.tau import DraftTable, chain_tau, ddtree_tau, draft_table, simulate_tau
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession


def _items(session: EvalSession) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    ev = session.evaluation
    feats = ev.features(session.inputs.eval_side)
    comps = ev.completions()
    dt = next(ev.drafter.parameters()).dtype
    return [(torch.cat([feats[p.id][i] for i in ev.layer_ids], dim=-1).to(dt),
             torch.tensor(comps[p.id].sequence, dtype=torch.long), len(comps[p.id].prompt_ids))
            for p in session.inputs.prompts]


def _before(drafter: Any, head: Any, items: list, top_k: int, chunk: int = 256) -> list[DraftTable]:
    """Every start drafted the earlier way: chunks of 256 (prompt, start) pairs, grouped by prompt, padded to the
    largest group with duplicate rows; the context keys and values are recomputed by every forward."""
    b = drafter.config.block_size
    t_max = max(int(f.shape[0]) for f, _, _ in items)
    ctx = torch.stack([torch.cat([c, c.new_zeros(t_max - c.shape[0], c.shape[1])])
                       for c in (drafter.project_context(f) for f, _, _ in items)])
    pairs = [(i, s) for i, (_, t, p) in enumerate(items) for s in range(p, int(t.shape[0]) - 1)]
    ids: list[list[torch.Tensor]] = [[] for _ in items]
    lps: list[list[torch.Tensor]] = [[] for _ in items]
    for c0 in range(0, len(pairs), chunk):
        by_item: dict[int, list[int]] = {}
        for i, s in pairs[c0:c0 + chunk]:
            by_item.setdefault(i, []).append(s)
        order = sorted(by_item)
        r_max = max(len(v) for v in by_item.values())
        starts = torch.tensor([by_item[i] + [by_item[i][-1]] * (r_max - len(by_item[i])) for i in order])
        firsts = torch.stack([items[i][1][starts[n]] for n, i in enumerate(order)])
        blocks = block_ids(firsts, b, drafter.config.mask_token_id)
        logp = torch.log_softmax(draft_logits(drafter, head, ctx[order], blocks, starts), dim=-1)
        top_lp, top_ids = logp.topk(top_k, dim=-1)
        for n, i in enumerate(order):
            ids[i].append(top_ids[n, :len(by_item[i])].cpu())
            lps[i].append(top_lp[n, :len(by_item[i])].cpu())
    return [DraftTable(t, p, torch.cat(ids[i]), torch.cat(lps[i]), b) for i, (_, t, p) in enumerate(items)]


def _lookup(tables: list[DraftTable], budgets: tuple[int, ...]) -> list[tuple[list[int], dict]]:
    return [(chain_tau(t).accept_lengths, {b: ddtree_tau(t, b).accept_lengths for b in budgets}) for t in tables]


def _lockstep(drafter: Any, head: Any, items: list, budgets: tuple[int, ...]) -> tuple[list, int]:
    sims = simulate_tau(drafter, head, items, budgets)
    return ([(r.chain.accept_lengths, {b: t.accept_lengths for b, t in r.ddtree.items()}) for r in sims],
            sum(r.drafted for r in sims))


def workload(drafter: Any, head: Any, items: list, budgets: tuple[int, ...], repeat: int) -> dict[str, Any]:
    """The three ways, alternating ``repeat`` times; the best time of each, blocks drafted, agreement."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    k = max(budgets, default=1)
    ways = {"before": lambda: (_lookup(_before(drafter, head, items, k), budgets), None),
            "table": lambda: (_lookup(draft_table(drafter, head, items, top_k=k), budgets), None),
            "lockstep": lambda: _lockstep(drafter, head, items, budgets)}
    times: dict[str, list[float]] = {w: [] for w in ways}
    out: dict[str, Any] = {}
    for _ in range(repeat):
        for name, run in ways.items():
            sync()
            t0 = time.perf_counter()
            out[name] = run()
            sync()
            times[name].append(time.perf_counter() - t0)
    taus = {w: out[w][0] for w in ways}
    agree = sum(taus["before"][n] == taus["table"][n] == taus["lockstep"][n] for n in range(len(items)))
    return {"budgets": list(budgets), "times": times, "best": {w: min(v) for w, v in times.items()},
            "blocks": {"before": sum(int(t.shape[0]) - 1 - p for _, t, p in items), "lockstep": out["lockstep"][1]},
            "identical": agree}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", default=".dflash_cache", help="the suite's cache (completions and features)")
    ap.add_argument("--repeat", type=int, default=2, help="alternating rounds of the three ways; the best of each")
    ap.add_argument("--budgets", default=None, help="DDTree budgets, comma-separated (default: the suite's)")
    ap.add_argument("--drift-sides", type=int, default=2, help="chain-only simulations the drift tests add")
    ap.add_argument("--out", default=None, help="write the numbers to this JSON file")
    ap.add_argument("options", nargs="*", help="more suite options as name=value (e.g. generation_batch=1, "
                                               "torch_threads=1, prompts=humaneval:4)")
    args = ap.parse_args(argv)
    values: dict[str, Any] = {"cache_dir": args.cache_dir, "device": "cpu" if not torch.cuda.is_available() else "auto"}
    values.update(dict(o.split("=", 1) for o in args.options))
    session = EvalSession(EvalSettings.from_mapping(values), worker=("master", 0, 1))
    budgets = tuple(int(b) for b in args.budgets.split(",")) if args.budgets else tuple(session.settings.ddtree_budget)
    items = _items(session)
    drafter, head = session.evaluation.drafter, session.inputs.head
    with torch.no_grad():
        _lockstep(drafter, head, items[:1], budgets)  # warm-up
        evals = workload(drafter, head, items, budgets, args.repeat)
        chain = workload(drafter, head, items, (), args.repeat)
    d = args.drift_sides
    stage = {w: evals["best"][w] + d * chain["best"][w] for w in evals["best"]}
    res = {"prompts": len(items), "threads": torch.get_num_threads(), "device": str(drafter.fc.weight.device),
           "eval_side": evals, "chain_only": chain, "drift_sides": d, "stage_s": stage,
           "stage_speedup_vs_before": stage["before"] / stage["lockstep"],
           "stage_speedup_vs_table": stage["table"] / stage["lockstep"]}
    print(f"{len(items)} prompts, {res['threads']} threads on {res['device']}; best of {args.repeat} alternating runs")
    for label, w in ((f"chain + DDTree {list(budgets)}", evals), ("chain only", chain)):
        print(f"  {label}: identical acceptance lengths {w['identical']}/{len(items)} prompts")
        for name in ("before", "table", "lockstep"):
            blocks = w["blocks"]["lockstep" if name == "lockstep" else "before"]
            print(f"    {name:9s} {w['best'][name]:7.2f} s  {blocks:6d} starts drafted   runs "
                  + ", ".join(f"{t:.2f}" for t in w["times"][name]))
        print(f"    before / lock-step = {w['best']['before'] / w['best']['lockstep']:.1f}x, "
              f"table / lock-step = {w['best']['table'] / w['best']['lockstep']:.1f}x")
    print(f"  drafting stage (eval side + {d} chain-only drift sides): before {stage['before']:.2f} s, table "
          f"{stage['table']:.2f} s, lock-step {stage['lockstep']:.2f} s: {res['stage_speedup_vs_before']:.1f}x cheaper "
          f"than before, {res['stage_speedup_vs_table']:.1f}x than the table")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    ok = evals["identical"] == chain["identical"] == len(items)
    return 0 if ok else 1

if __name__ == "__main__":
    raise SystemExit(main())
