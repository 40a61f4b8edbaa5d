"""GPU memory of the τ stage at Qwen3.6-27B widths, against the number of prompts and ``--chunk-memory``.

The τ stage (:func:`dflash_eval.metrics.tau.simulate_tau`, the suite's lock-step chain + DDTree simulation) on a
random DFlash drafter at 27B widths (hidden 5120, 5 layers reading 5 target layers, bf16) with the target's
embedding and lm_head (vocabulary 248 320, bf16), on prompts of ``--prompt-len`` + ``--new-tokens`` tokens whose
features are made on the host when their chunk is simulated (as the suite reads them from its cache:
:class:`~dflash_eval.metrics.tau_chunks.LazyItems`). For each (prompts, chunk memory) it reports the peak CUDA
memory allocated above the resident weights (``torch.cuda.max_memory_allocated``), the peak reserved by the caching
allocator, the host's peak RSS, the chunks and the wall time; one row simulates every prompt at once (no chunks), as
the suite did before prompt chunks.

No target model runs: features and tokens are random (a random drafter accepts about nothing, so every prompt
takes the most rounds, one per new token: the slowest case, and memory does not depend on what is accepted).

Run on a CUDA machine::

    python benchmarks/gpu_tau_memory.py --out $OUT/gpu_tau_memory.json
    python benchmarks/gpu_tau_memory.py --prompts 2,4 --new-tokens 256 --device cpu --vocab 4096   # a quick check
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dflash_eval.common.sizes import format_memory, parse_memory  # noqa: E402
from dflash_eval.drafter.config import DrafterConfig  # noqa: E402
from dflash_eval.drafter.model import DFlashDrafter  # noqa: E402
from dflash_eval.metrics.tau import simulate_tau  # noqa: E402
from dflash_eval.metrics.tau_chunks import LazyItems, bytes_per_token, plan_chunks  # noqa: E402
from dflash_eval.target.head import TargetHead  # noqa: E402


def drafter_config(a: argparse.Namespace) -> DrafterConfig:
    return DrafterConfig(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                         vocab_size=a.vocab, block_size=a.block_size,
                         target_layer_ids=tuple(range(1, 1 + 12 * a.features, 12)), mask_token_id=a.vocab - 1,
                         num_target_layers=64)


def build(a: argparse.Namespace, device: torch.device) -> tuple[DFlashDrafter, TargetHead]:
    torch.manual_seed(0)
    with torch.device(device):
        drafter = DFlashDrafter(drafter_config(a)).to(torch.bfloat16).eval()
        emb = torch.nn.Embedding(a.vocab, a.hidden, dtype=torch.bfloat16)
        head = torch.nn.Linear(a.hidden, a.vocab, bias=False, dtype=torch.bfloat16)
    for p in [*drafter.parameters(), *emb.parameters(), *head.parameters()]:
        p.requires_grad_(False)
        p.normal_(0.0, 0.02)
    for n, p in drafter.named_parameters():
        if n.endswith("norm.weight"):
            p.fill_(1.0)
    return drafter, TargetHead(embed_tokens=emb, lm_head=head)


def items(n: int, a: argparse.Namespace) -> LazyItems:
    """``n`` prompts whose features [T, L*H] (bf16, host) and tokens are made when their chunk asks for them."""
    t = a.prompt_len + a.new_tokens
    width = a.features * a.hidden

    def load(i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        g = torch.Generator().manual_seed(1000 + i)
        feats = torch.randn(t, width, generator=g, dtype=torch.float32).to(torch.bfloat16)
        return feats, torch.randint(0, a.vocab - 1, (t,), generator=g), a.prompt_len

    return LazyItems([t] * n, load)


def measure(drafter: DFlashDrafter, head: TargetHead, n: int, memory: int | None, a: argparse.Namespace,
            device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        resident = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    sims = simulate_tau(drafter, head, items(n, a), tuple(a.budgets), memory=memory)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    t = a.prompt_len + a.new_tokens
    row: dict[str, Any] = {
        "prompts": n, "tokens": n * t, "chunk_memory": format_memory(memory) if memory else "none (one simulation)",
        "chunks": len(plan_chunks([t] * n, bytes_per_token(drafter), memory)),
        "wall_s": round(wall, 1), "mean_chain_tau": round(sum(s.chain.tau for s in sims) / len(sims), 4),
        "host_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    if cuda:
        row["cuda_peak_above_weights_gib"] = round((torch.cuda.max_memory_allocated() - resident) / 2**30, 3)
        row["cuda_peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="3,12,48", help="comma-separated numbers of prompts")
    ap.add_argument("--chunk-memory", default="2GiB,512MiB", help="comma-separated --chunk-memory values")
    ap.add_argument("--unchunked", type=int, default=12, help="prompts of the one row without chunks (0: none)")
    ap.add_argument("--prompt-len", type=int, default=200, help="prompt tokens of every prompt")
    ap.add_argument("--new-tokens", type=int, default=2048, help="reference completion tokens of every prompt")
    ap.add_argument("--hidden", type=int, default=5120, help="hidden size (target and drafter)")
    ap.add_argument("--intermediate", type=int, default=17408, help="drafter MLP width")
    ap.add_argument("--layers", type=int, default=5, help="drafter layers")
    ap.add_argument("--features", type=int, default=5, help="target layers the drafter reads")
    ap.add_argument("--heads", type=int, default=32, help="drafter attention heads")
    ap.add_argument("--kv-heads", type=int, default=8, help="drafter key/value heads")
    ap.add_argument("--head-dim", type=int, default=128, help="drafter head dim")
    ap.add_argument("--vocab", type=int, default=248320, help="target vocabulary")
    ap.add_argument("--block-size", type=int, default=16, help="drafter block size")
    ap.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=[8], help="DDTree budgets")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    device = torch.device(a.device)
    drafter, head = build(a, device)
    weights = sum(p.numel() * p.element_size() for p in [*drafter.parameters(), *head.embed_tokens.parameters(),
                                                           *head.lm_head.parameters()])
    per_token = bytes_per_token(drafter)
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "config": drafter_config(a).to_dict(), "budgets": a.budgets,
            "weights_gib": round(weights / 2**30, 3), "bytes_per_token": per_token,
            "prompt_tokens": a.prompt_len + a.new_tokens}
    print(json.dumps(info), flush=True)
    rows: list[dict[str, Any]] = []
    plan: list[tuple[int, int | None]] = []
    for k, mem in enumerate(parse_memory(m) for m in a.chunk_memory.split(",")):
        plan += [(int(x), mem) for x in a.prompts.split(",")]
        if k == 0 and a.unchunked:  # right after the first chunk size: the comparison that matters most
            plan.append((a.unchunked, None))
    for n, mem in plan:
        rows.append(measure(drafter, head, n, mem, a, device))
        if a.out:  # after every row, so that a run cut short by a time limit keeps what it measured
            a.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = a.out.with_suffix(".tmp")
            tmp.write_text(json.dumps({"info": info, "rows": rows}, indent=1) + "\n")
            tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
