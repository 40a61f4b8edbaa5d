"""Benchmark: a warm evaluation costs only drafter work, whatever the target's depth.

1. Builds (in a temp dir, deleted afterwards unless --keep DIR) a random Qwen3.5 target at a realistic width
   (default hidden 2048, 16 layers, vocab 32000, intermediate 6144, bf16: ~2.1 GB of weights, saved sharded with
   model.safetensors.index.json), a 1-layer copy with the same embedding / lm_head / final norm (its layer is the
   deep target's first full-attention layer), random drafters
   and 4 short prompts.
2. Cold runs (timed separately): ``pytest tests_eval -k tau`` on each target (reference completions generated,
   features extracted), then a drafter with other target_layer_ids on the deep target (only the missing layers
   are extracted; no generation).
3. Warm ``pytest tests_eval -k tau`` against the deep and the shallow target (interleaved repeats, median):
   the ratio deep / shallow should be close to 1.
4. ``dflash-eval gate`` with 3 new checkpoints in one process vs 3 separate ``pytest tests_eval -k tau`` runs
   (each side on its own copy of the warmed cache: features and completions cached, τ not yet memoised), and the
   same again fully warm.

Run (about 5-8 minutes on a 2-core CPU)::

    .venv/bin/python benchmarks/bench_warm.py [--keep /tmp/bench_warm] [--layers 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is", "for i in range(10):\n    print(",
           "class Stack:\n    def __init__(self):\n        "]


def build_targets(work: Path, a: argparse.Namespace) -> tuple[Path, Path, float]:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import Qwen3_5ForCausalLM

    from dflash_eval.common.dtypes import parse_dtype
    from dflash_eval.testing.tiny import build_tokenizer, qwen35_text_config

    deep, shallow = work / "target_deep", work / "target_1layer"
    deep.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(deep, vocab_size=300)
    cfg = qwen35_text_config(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, intermediate_size=a.intermediate,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(cfg).to(parse_dtype(a.dtype))
    model.save_pretrained(str(deep), max_shard_size="1GB")
    del model
    size = sum(f.stat().st_size for f in deep.glob("*.safetensors")) / 1e9
    # 1-layer copy: same embedding, lm_head, final norm and layer 0.
    shallow.mkdir(exist_ok=True)
    for f in deep.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("config.json",
                                                                                   "model.safetensors.index.json"):
            shutil.copy2(f, shallow / f.name)
    c = json.loads((deep / "config.json").read_text())
    # The one layer is the deep target's first full-attention layer (transformers' generation needs one).
    src = c["layer_types"].index("full_attention")
    c["num_hidden_layers"] = 1
    c["layer_types"] = ["full_attention"]
    (shallow / "config.json").write_text(json.dumps(c, indent=2))
    sd = {}
    for shard in sorted(deep.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as fh:
            for k in fh.keys():
                if not k.startswith("model.layers."):
                    sd[k] = fh.get_tensor(k)
                elif k.startswith(f"model.layers.{src}."):
                    sd["model.layers.0." + k.removeprefix(f"model.layers.{src}.")] = fh.get_tensor(k)
    save_file(sd, str(shallow / "model.safetensors"), metadata={"format": "pt"})
    return deep, shallow, size


def make_drafter(target: Path, out: Path, seed: int, layer_ids: tuple[int, ...]) -> Path:
    import torch

    from dflash_eval.drafter import DFlashDrafter, save_drafter
    from dflash_eval.testing.tiny import random_drafter_config

    torch.manual_seed(seed)
    cfg = random_drafter_config(target, num_features=len(layer_ids), target_layer_ids=layer_ids)
    save_drafter(DFlashDrafter(cfg).eval(), out)
    return out


def pytest_tau(target: Path, drafter: Path, cache: Path, report: Path, common: list[str]) -> tuple[float, int, str]:
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "-k", "tau",
           "--target-model", str(target), "--drafter", str(drafter), "--cache-dir", str(cache),
           "--report-dir", str(report), *common]
    return _run(cmd)


def _run(cmd: list[str]) -> tuple[float, int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["DFLASH_EVAL_PROGRESS"] = "0"
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, p.returncode, (p.stdout[-2500:] + p.stderr[-2500:])


def _check(what: str, rc: int, out: str) -> None:
    if rc != 0:
        print(f"!! {what} exited {rc}:\n{out}")


def stage_split(report: Path) -> str:
    try:
        s = json.loads((report / "eval.json").read_text())["timings"]["sum"]
    except (OSError, KeyError, ValueError):
        return ""
    keep = ("target_hash", "target_load", "head_load", "generation", "target_forward", "drafter_load", "drafting")
    return ", ".join(f"{k} {s[k]:.2f}s" for k in keep if s.get(k))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build in (and keep) this directory instead of a temp dir")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", default="bf16", help="dtype of the weights on disk (the suite runs fp32 on a CPU)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="warm runs per target (median reported)")
    ap.add_argument("--torch-threads", type=int, default=1)
    a = ap.parse_args(argv)
    work = a.keep or Path(tempfile.mkdtemp(prefix="dflash-bench-warm-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _bench(work, a)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def _bench(work: Path, a: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    deep, shallow, size = build_targets(work, a)
    shallow_size = (shallow / "model.safetensors").stat().st_size / 1e9
    print(f"targets built in {time.perf_counter() - t0:.1f} s: deep {a.layers} layers x hidden {a.hidden}, "
          f"vocab {a.vocab}, {size:.2f} GB on disk ({len(list(deep.glob('*.safetensors')))} shards + index); "
          f"1-layer copy {shallow_size:.2f} GB")
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": "code", "text": t}) + "\n"
                               for i, t in enumerate(PROMPTS)))
    d0 = make_drafter(deep, work / "drafter_L0", 1, (0,))  # fits both targets
    ids = tuple(sorted({1, a.layers // 2 - 1, a.layers - 3}))
    gate_drafters = [make_drafter(deep, work / f"ckpt_{n}", 10 + n, ids) for n in range(4)]
    common = ["--prompts", str(prompts), "--max-new-tokens", str(a.max_new_tokens), "--tau-floor", "1.0",
              "--device", "cpu", "--torch-threads", str(a.torch_threads)]
    cache = work / "cache"

    print("\n== cold runs (pytest tests_eval -k tau; completions generated, features extracted) ==")
    for name, tgt, dr in (("deep", deep, d0), ("1-layer", shallow, d0), ("deep, other layer ids", deep,
                                                                         gate_drafters[0])):
        wall, rc, out = pytest_tau(tgt, dr, cache, work / "rep", common)
        _check(f"cold {name}", rc, out)
        print(f"cold {name:24s} {wall:7.2f} s  rc={rc}  [{stage_split(work / 'rep')}]")

    print(f"\n== warm pytest tests_eval -k tau ({a.repeats} interleaved repeats, median) ==")
    times: dict[str, list[float]] = {"deep": [], "1-layer": []}
    for _ in range(a.repeats):
        for name, tgt in (("deep", deep), ("1-layer", shallow)):
            wall, rc, out = pytest_tau(tgt, d0, cache, work / f"rep_{name}", common)
            _check(f"warm {name}", rc, out)
            times[name].append(wall)
    for name, ts in times.items():
        print(f"warm {name:8s} median {statistics.median(ts):6.2f} s  (runs {', '.join(f'{t:.2f}' for t in ts)})"
              f"  [{stage_split(work / f'rep_{name}')}]")
    ratio = statistics.median(times["deep"]) / statistics.median(times["1-layer"])
    print(f"warm deep / 1-layer = {ratio:.2f}  (target: close to 1; the deep target is "
          f"{size / shallow_size:.1f}x larger on disk)")

    print("\n== 3 checkpoints: one `dflash-eval gate` vs 3 separate pytest -k tau runs ==")
    for label in ("features cached, τ not memoised", "fully warm (τ memoised)"):
        if label.startswith("features"):
            for side in ("gate", "sep"):
                shutil.copytree(cache, work / f"cache_{side}")
        ckpts = gate_drafters[1:]
        cmd = [sys.executable, "-m", "dflash_eval", "gate", "--quiet", "--target-model", str(deep),
               "--cache-dir", str(work / "cache_gate"), *common]
        for c in ckpts:
            cmd += ["--drafter", str(c)]
        g_wall, g_rc, g_out = _run(cmd)
        _check("gate", g_rc, g_out)
        sep = []
        for c in ckpts:
            wall, rc, out = pytest_tau(deep, c, work / "cache_sep", work / "rep_sep", common)
            _check("separate pytest", rc, out)
            sep.append(wall)
        print(f"[{label}] gate (1 process, 3 ckpts): {g_wall:6.2f} s rc={g_rc} | 3 x pytest: {sum(sep):6.2f} s "
              f"({', '.join(f'{t:.2f}' for t in sep)}) | separate / gate = {sum(sep) / g_wall:.2f}x")
    print("\ngate table (last run):")
    print("\n".join(line for line in g_out.splitlines() if line.strip() and not line.startswith("[")))
    print(f"\ntotal benchmark wall {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
