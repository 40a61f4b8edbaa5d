"""Benchmark: peak memory (RSS) and time of the eval suite against the number of prompts and tokens, side by side.

Builds (in a temporary folder, or ``--keep DIR``) a random Qwen3.5 hybrid target with the project's own builders
(:mod:`dflash_eval.testing.tiny`: hidden ``--hidden``, ``--layers`` layers, 3 linear : 1 full attention), two
random drafters reading the same ``--features`` target layers, and ``max(--sizes)`` distinct prompts. Then, for
each size N of ``--sizes``, each configuration in its own ``pytest tests_eval -n 0`` subprocess, whose peak RSS is
the child's own ``ru_maxrss`` (``os.wait4``):

1. ``full``: the whole suite, cold (a fresh cache: completions generated, features extracted, τ, drift, budget),
   with ``--tau-floor 1.0`` and ``--snapshot-update`` into a golden folder of its own (a new target has no records);
2. ``tau-new``: ``-k tau`` of a second drafter (same target layers) on the cache ``full`` filled: features read
   from the cache, τ not memoised for it: the drafter's whole work;
3. ``tau-warm``: the same ``-k tau`` again (τ memoised too).

``--tokens`` adds, for the first size, the same three runs at other ``--max-new-tokens`` (the tokens sweep). Prints
one row per run: prompts, new tokens, total tokens (prompt + completion, from eval.json), peak RSS, wall seconds,
the stage split (generation, feature forwards, drafting, drift budget), terminal lines (of them ``SKIPPED``) and
the exit status; then the least-squares line RSS = a + b x tokens per configuration, and, given ``--compare
JSON`` (an earlier run's ``--json``), its rows beside these. ``--tree DIR`` runs another checkout's ``src`` and
``tests_eval`` (e.g. ``git archive`` of an earlier commit) on the same target and prompts.

Run (the full suite at 512 prompts takes long on a small machine; ``--sizes 8,32`` is a quick look)::

    .venv/bin/python benchmarks/bench_memory.py --json benchmarks/results/memory-now.json
    .venv/bin/python benchmarks/bench_memory.py --compare benchmarks/results/memory-before.json -- --chunk-memory=64MiB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("generation", "target_forward", "drafting", "drift_budget")
CONFIGS = ("full", "tau-new", "tau-warm")


def build(work: Path, a: argparse.Namespace) -> tuple[Path, Path, Path]:
    """The random target and the two drafters (same target layers, other seeds)."""
    import torch

    from dflash_eval.drafter import DFlashDrafter, save_drafter
    from dflash_eval.testing.tiny import build_random_target, random_drafter_config

    target = work / "target"
    if not (target / "config.json").is_file():
        build_random_target(target, hidden_size=a.hidden, num_hidden_layers=a.layers, intermediate_size=2 * a.hidden,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=a.hidden // 4,
                            linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=a.hidden // 8,
                            linear_value_head_dim=a.hidden // 8)
    drafters = []
    for seed, name in ((1, "drafter"), (2, "drafter_new")):
        out = work / name
        if not (out / "config.json").is_file():
            torch.manual_seed(seed)
            save_drafter(DFlashDrafter(random_drafter_config(target, num_features=a.features)).eval(), out)
        drafters.append(out)
    return target, drafters[0], drafters[1]


def write_prompts(path: Path, n: int) -> Path:
    """``n`` distinct prompts: the bundled prompt texts in turn, each numbered (so no two share token ids)."""
    texts = [json.loads(line)["text"] for line in (ROOT / "fixtures" / "prompts.jsonl").read_text().splitlines()
             if line.strip()]
    path.write_text("".join(json.dumps({"id": f"p{i:04d}", "category": "code",
                                        "text": f"# {i}\n{texts[i % len(texts)]}"}) + "\n" for i in range(n)))
    return path


def run_pytest(tree: Path, args: list[str], log: Path, timeout: float) -> tuple[int, float, int]:
    """(exit status, wall seconds, peak RSS bytes of the pytest process) of ``pytest tests_eval ARGS`` in ``tree``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join([str(tree / "src"), *filter(None, [env.get("PYTHONPATH")])]),
               PYTHONDONTWRITEBYTECODE="1", DFLASH_EVAL_PROGRESS="1", DFLASH_EVAL_PROGRESS_EVERY="30",
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-p", "no:cacheprovider", "-n", "0", *args]
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:  # wait4 for this child's own rusage; polled, so the timeout holds
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss * 1024


def one_run(a: argparse.Namespace, work: Path, paths: tuple[Path, Path, Path], n: int, new_tokens: int,
            config: str) -> dict[str, Any]:
    """One configuration's run and what it measured."""
    target, drafter, drafter_new = paths
    tag = f"n{n}-t{new_tokens}"
    cache, report = work / f"cache-{tag}", work / f"report-{tag}-{config}"
    if config == "full":
        shutil.rmtree(cache, ignore_errors=True)
    args = ["--target-model", str(target), "--prompts", str(write_prompts(work / f"prompts-{n}.jsonl", n)),
            "--max-new-tokens", str(new_tokens), "--cache-dir", str(cache), "--report-dir", str(report),
            "--device", "cpu", "--torch-threads", "1", "--tau-floor", "1.0"]
    if config == "full":
        args += ["--drafter", str(drafter), "--snapshot-update", "--golden-dir", str(work / f"golden-{tag}"),
                 "--floors-file", str(work / f"golden-{tag}" / "tau_floors.json")]
    else:
        args += ["--drafter", str(drafter_new), "-k", "tau"]
    log = work / f"log-{tag}-{config}.txt"
    rc, wall, rss = run_pytest(a.tree or ROOT, [*args, *a.extra], log, a.timeout)
    lines = log.read_text(errors="replace").splitlines()
    data = json.loads((report / "eval.json").read_text()) if (report / "eval.json").is_file() else {}
    timings = data.get("timings", {}).get("sum", {})
    tokens = sum(int(p.get("prompt_tokens", 0)) + int(p.get("completion_tokens", 0))
                 for p in data.get("prompts", {}).values())
    return {"config": config, "prompts": n, "new_tokens": new_tokens, "tokens": tokens, "rc": rc,
            "peak_rss_mib": rss / 2**20, "wall_s": wall, "stages": {k: float(timings.get(k, 0.0)) for k in STAGES},
            "lines": len(lines), "skipped_lines": sum(line.startswith("SKIPPED") for line in lines),
            "mean_tau": data.get("mean_tau"),
            "drift_budget": (data.get("drift_budget") or {}).get("budget"),
            "outcomes": data.get("tests", {}).get("outcomes", {}), "log": str(log)}


def fit(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Least squares RSS MiB = a + b x tokens over ``rows`` (None with fewer than 2 distinct token counts)."""
    pts = [(r["tokens"], r["peak_rss_mib"]) for r in rows if r["tokens"]]
    if len({x for x, _ in pts}) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return my - b * mx, b


def show(rows: list[dict[str, Any]], before: list[dict[str, Any]] | None) -> None:
    old = {(r["config"], r["prompts"], r["new_tokens"]): r for r in before or []}
    print("\n| config | prompts | new tokens | tokens | peak RSS MiB | wall s | generation s | features s | "
          "drafting s | drift budget s | lines (SKIPPED) | rc |" + (" before: RSS MiB | before: wall s |" if old
                                                                     else ""))
    print("|" + "---|" * (12 + 2 * bool(old)))
    for r in rows:
        s = r["stages"]
        b = old.get((r["config"], r["prompts"], r["new_tokens"]))
        extra = f" {b['peak_rss_mib']:.0f} | {b['wall_s']:.1f} |" if b else (" - | - |" if old else "")
        print(f"| {r['config']} | {r['prompts']} | {r['new_tokens']} | {r['tokens']} | {r['peak_rss_mib']:.0f} | "
              f"{r['wall_s']:.1f} | {s['generation']:.1f} | {s['target_forward']:.1f} | {s['drafting']:.1f} | "
              f"{s['drift_budget']:.1f} | {r['lines']} ({r['skipped_lines']}) | {r['rc']} |{extra}")
    for label, rs in (("now", rows), ("before", before or [])):
        for config in CONFIGS:
            line = fit([r for r in rs if r["config"] == config])
            if line:
                print(f"{label:6s} {config:9s} RSS = {line[0]:.0f} MiB + {line[1] * 2**20 / 1e3:.2f} kB x tokens")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,32,128,512", help="comma-separated numbers of prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="new tokens of every size's runs")
    ap.add_argument("--tokens", default="", help="comma-separated other --max-new-tokens, run at the first size")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size of the random target")
    ap.add_argument("--layers", type=int, default=8, help="layers of the random target")
    ap.add_argument("--features", type=int, default=5, help="target layers each drafter reads")
    ap.add_argument("--tree", type=Path, default=None, help="another checkout whose src and tests_eval run")
    ap.add_argument("--keep", type=Path, default=None, help="work (and keep) in this folder, not a temporary one")
    ap.add_argument("--json", type=Path, default=None, help="write the rows to this JSON file")
    ap.add_argument("--compare", type=Path, default=None, help="an earlier --json: its rows beside these")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one pytest run may take")
    ap.add_argument("extra", nargs="*", help="extra pytest arguments (after --)")
    a = ap.parse_args(argv)
    work = a.keep or Path(tempfile.mkdtemp(prefix="dflash-bench-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "src"))
    paths = build(work, a)
    plan = [(int(n), a.max_new_tokens) for n in a.sizes.split(",")]
    plan += [(plan[0][0], int(t)) for t in a.tokens.split(",") if t.strip()]
    rows = []
    print(f"work dir {work}; target hidden {a.hidden}, {a.layers} layers; drafters read {a.features} layers; "
          f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus", flush=True)
    for n, t in plan:
        for config in a.configs.split(","):
            r = one_run(a, work, paths, n, t, config)
            rows.append(r)
            print(f"{config:9s} {n:4d} prompts x {t:4d} new tokens: peak RSS {r['peak_rss_mib']:7.0f} MiB, "
                  f"{r['wall_s']:7.1f} s, rc={r['rc']}, {r['lines']} lines; load {os.getloadavg()[0]:.2f}", flush=True)
            if a.json:
                a.json.parent.mkdir(parents=True, exist_ok=True)
                a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows},
                                             indent=1))
    before = json.loads(a.compare.read_text())["rows"] if a.compare else None
    show(rows, before)
    if a.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["rc"] in (0, 1) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
