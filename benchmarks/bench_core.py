"""Core benchmark: offline τ vs the online speculative loop on the same prompts, and feature extraction speed.

Run (on the bundled fixtures, CPU):

    .venv/bin/python benchmarks/bench_core.py --num-prompts 8 --max-new-tokens 128

Prints, side by side in one run: wall time of offline τ (features forward + the lock-step simulation that drafts,
batched over prompts, only the starts the chain visits) and of the online loop (target verifies each block) for
the same prompts, their ratio, whether per-prompt τ agree, and target feature-extraction throughput in tokens/s.
The offline drafting is also timed the earlier way (every start drafted, then looked up) for comparison.
Reference completions are produced first, in one batch (not timed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dflash_eval.drafter import TargetSpec, build_drafter, read_checkpoint
from dflash_eval.metrics.online_loop import online_generate
from dflash_eval.metrics.tau import chain_tau, draft_table, simulate_tau
from dflash_eval.metrics.tau_result import macro_tau
from dflash_eval.target.generation import greedy_generate_batch
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import extract_features
from dflash_eval.target.loader import load_target

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "fixtures" / "target"), help="target model directory")
    ap.add_argument("--drafter", default=str(ROOT / "fixtures" / "drafter"), help="drafter directory or .pt")
    ap.add_argument("--prompts", default=str(ROOT / "fixtures" / "prompts.jsonl"), help="prompts JSONL")
    ap.add_argument("--num-prompts", type=int, default=8, help="how many prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="completion length")
    ap.add_argument("--dtype", default="fp32", help="target/drafter dtype")
    ap.add_argument("--backend", default="auto", help="linear-attention backend")
    ap.add_argument("--repeat", type=int, default=2, help="alternating rounds of offline and online; best of each")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args()

    target = load_target(args.target, dtype=args.dtype)
    head = TargetHead.from_model(target.model)
    drafter = build_drafter(read_checkpoint(args.drafter), device=target.device, dtype=args.dtype,
                            spec=TargetSpec.from_target(target))
    lines = [json.loads(x) for x in Path(args.prompts).read_text().splitlines() if x.strip()][: args.num_prompts]
    prompts = [target.tokenizer(p["text"], add_special_tokens=False)["input_ids"] for p in lines]
    refs = greedy_generate_batch(target, prompts, args.max_new_tokens, backend=args.backend, stop_at_eos=False)
    seqs = [torch.tensor(p + r) for p, r in zip(prompts, refs)]
    layer_ids = drafter.config.target_layer_ids

    items = [(s, len(p)) for s, p in zip(seqs, prompts)]

    def offline_tau() -> tuple[list, float, float]:
        t0 = time.perf_counter()
        feats = [extract_features(target, s, layer_ids, backend=args.backend)[0] for s, _ in items]
        t1 = time.perf_counter()
        taus = [r.chain for r in simulate_tau(drafter, head, [(f, s, p) for f, (s, p) in zip(feats, items)])]
        return taus, t1 - t0, time.perf_counter() - t1

    def every_start() -> tuple[list, float]:
        feats = [extract_features(target, s, layer_ids, backend=args.backend)[0] for s, _ in items]
        t0 = time.perf_counter()
        tables = draft_table(drafter, head, [(f, s, p) for f, (s, p) in zip(feats, items)])
        return [chain_tau(t) for t in tables], time.perf_counter() - t0

    def online_tau() -> tuple[list, float]:
        t0 = time.perf_counter()
        res = [online_generate(target, drafter, head, p, max_new_tokens=args.max_new_tokens, backend=args.backend)
               for p in prompts]
        return res, time.perf_counter() - t0

    # Warm-up (first-call costs of each code path), then --repeat alternating rounds; the best of each is kept.
    extract_features(target, seqs[0][:16], layer_ids, backend=args.backend)
    simulate_tau(drafter, head, [(extract_features(target, seqs[0][:24], layer_ids, backend=args.backend)[0],
                                  seqs[0][:24], 16)])
    online_generate(target, drafter, head, prompts[0], max_new_tokens=4, backend=args.backend)
    t_feat = t_draft = t_table = t_online = float("inf")
    for _ in range(args.repeat):
        offline, tf, td = offline_tau()
        t_feat, t_draft = min(t_feat, tf), min(t_draft, td)
        table_taus, tt = every_start()
        t_table = min(t_table, tt)
        online, to = online_tau()
        t_online = min(t_online, to)
    t_offline = t_feat + t_draft

    tokens = sum(int(s.numel()) for s in seqs)
    agree = sum(o.tau.accept_lengths == f.accept_lengths for o, f in zip(online, offline))
    parity = sum(o.tokens == r for o, r in zip(online, refs))
    res = {
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "device": str(target.device),
        "dtype": args.dtype, "threads": torch.get_num_threads(),
        "offline_s": t_offline, "offline_features_s": t_feat, "offline_drafter_s": t_draft, "online_s": t_online,
        "offline_drafter_every_start_s": t_table,
        "every_start_same_tau": all(a.accept_lengths == b.accept_lengths for a, b in zip(offline, table_taus)),
        "online_over_offline": t_online / t_offline, "tau_offline": macro_tau(offline),
        "tau_online": macro_tau([o.tau for o in online]), "per_prompt_tau_agree": f"{agree}/{len(prompts)}",
        "online_greedy_parity": f"{parity}/{len(prompts)}", "feature_tokens_per_s": tokens / t_feat,
    }
    print(f"{'':28}{'offline':>12}{'online':>12}")
    print(f"{'wall time (s)':28}{t_offline:12.2f}{t_online:12.2f}   online/offline = {res['online_over_offline']:.1f}x")
    print(f"{'mean chain tau':28}{res['tau_offline']:12.3f}{res['tau_online']:12.3f}"
          f"   per-prompt agree {agree}/{len(prompts)}")
    print(f"offline split: features {t_feat:.2f}s, drafter+loop {t_draft:.2f}s (every start drafted instead: "
          f"{t_table:.2f}s, same τ {res['every_start_same_tau']}); online greedy parity {parity}/{len(prompts)}")
    print(f"feature extraction: {res['feature_tokens_per_s']:.0f} tokens/s "
          f"({tokens} tokens, {target.device}, {args.dtype})")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
