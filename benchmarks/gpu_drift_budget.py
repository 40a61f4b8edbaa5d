"""GPU lane for the drift budget: every number docs/drift-budget.md needs from a CUDA machine with fla, in one run.

Run on the GPU (fla installed; see docs/gpu-lab.md; about 5-8 minutes on one H200 with a cold cache)::

    python benchmarks/gpu_drift_budget.py --out $OUT          # or: OUT=... bash scripts/gpu_lane.sh budget

Smoke test on a CPU (fla cannot run: torch-recurrent stands in for it, 4 prompts); the CPU proxy of stage 4 (the
bf16-minus-fp32 direction amplified); the subset sensitivity of budgets already in eval.json files::

    .venv/bin/python benchmarks/gpu_drift_budget.py --out /tmp/budget_smoke --num-prompts 4 --quick
    .venv/bin/python benchmarks/gpu_drift_budget.py --out /tmp/amp --backend torch --dtypes fp32 \
        --amplify bf16-vs-fp32 --quick
    .venv/bin/python benchmarks/gpu_drift_budget.py --subsets-of reports/eval.json

For each target dtype (bf16, fp32), with fla as the evaluation backend and torch as the drafter's reference
backend, on the suite's default prompts and cache layout (:class:`dflash_eval.session.eval_session.EvalSession`):

1. the bundled drafter's drift budget (every ladder level: injected error, mean τ, mean |Δτ|, CI) and the time
   it took to measure;
2. the fla-vs-torch drift per target layer (worst and mean prompt), the gate's margin per layer, and the
   per-prompt functional τ difference;
3. the budget's sensitivity: the rule applied to prompt subsets of several sizes (first N, and random subsets)
   from the per-prompt |Δτ| (a prompt's noise does not depend on the selection), and (bf16) other noise seeds;
4. (bf16) the measured fla-minus-torch direction amplified, ``torch + α (fla - torch)``, against isotropic noise
   of the same injected error: how much worse real drift is per unit error (what the safety factor must cover);
5. the suite itself with fla: ``test_drift_within_budget`` / ``test_drift_regression`` outcomes, and the
   fault-injection hook (``--kernel-fault noise:1e-3`` under the budget, ``noise:3`` over it).

Writes ``$OUT/drift_budget_gpu.json`` (rewritten after every stage, so a timeout keeps what finished) and
``$OUT/drift_budget_gpu.log``; suite reports under ``$OUT/suite_*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dflash_eval.metrics.drift_budget import Perturbation, perturb_layers  # noqa: E402
from dflash_eval.metrics.drift_fit import fit_budget  # noqa: E402
from dflash_eval.metrics.tau import simulate_tau  # noqa: E402
from dflash_eval.options.settings import EvalSettings  # noqa: E402
from dflash_eval.session.blocks import DriftBudgetBlock  # noqa: E402
from dflash_eval.session.eval_session import EvalSession  # noqa: E402
from dflash_eval.target.backends import fla_available  # noqa: E402
from dflash_eval.target.provenance import device_name, library_versions  # noqa: E402

ALPHAS = (1, 3, 10, 30, 100, 300)


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out, self.data = out, {"versions": library_versions(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        out.mkdir(parents=True, exist_ok=True)
        self.log_path = out / "drift_budget_gpu.log"

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def save(self) -> None:
        tmp = self.out / ".drift_budget_gpu.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "drift_budget_gpu.json")


def settings(a: argparse.Namespace, dtype: str, **extra: Any) -> EvalSettings:
    return EvalSettings.from_mapping({"dtype": dtype, "hidden_state_backend": a.backend, "reference_backend": "torch",
                                      "cache_dir": a.cache, "num_prompts": a.num_prompts,
                                      "allow_settings_mismatch": True, **extra}, base=ROOT)


def drift_and_gate(sess: EvalSession) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in sess.inputs.comparisons:
        if c.skip_reason:
            out[c.name] = {"skipped": c.skip_reason}
            continue
        d = sess.drift(c.name)
        layers = {}
        for i, g in sess.drift_gate(c.name).items():
            errs = [d.stats[p][i].rel_err for p in d.stats]
            coss = [d.stats[p][i].cos for p in d.stats]
            layers[str(i)] = {**g.to_json(), "min_cos": min(coss), "median_rel_err": sorted(errs)[len(errs) // 2]}
        dt = [abs(a - b) for a, b in d.accept.values()]
        out[c.name] = {"a": c.a.label, "b": c.b.label, "layers": layers,
                       "abs_dtau": {"mean": sum(dt) / len(dt), "max": max(dt)}}
    return out


def subset_budgets(levels: list[dict[str, Any]], tol: float, sizes: list[int], draws: int,
                   seed: int = 0) -> dict[str, Any]:
    """The budget fitted on prompt subsets of each size (first N, and ``draws`` random subsets), from eval.json's
    ``drift_budget.levels`` (per-prompt signed drops; a prompt's noise does not depend on the selection): the
    estimate's spread and how often the full set's estimate lies in the subset's CI."""
    ids = list(levels[0]["drop"]) if levels else []
    rng = random.Random(seed)

    def fit(sub: list[str]) -> tuple[float, float, float]:
        f = fit_budget([lv["injected_rel_err"] for lv in levels],
                       [[math.nan if lv["drop"][p] is None else lv["drop"][p] for p in sub] for lv in levels], tol)
        return f.budget, f.ci_low, f.ci_high

    out: dict[str, Any] = {}
    full = fit(ids)[0] if ids else math.nan
    for size in [n for n in sizes if n <= len(ids)]:
        rand = [fit(rng.sample(ids, size)) for _ in range(draws)]
        est = sorted(r[0] for r in rand)
        out[str(size)] = {"full_set": full, "first_n": fit(ids[:size])[0], "random_min": est[0],
                          "random_median": est[len(est) // 2], "random_max": est[-1],
                          "full_in_subset_ci": sum(1 for _, lo, hi in rand if lo <= full <= hi) / len(rand)}
    return out


def amplified(sess: EvalSession, name: str) -> list[dict[str, Any]]:
    """τ with ``b + α (a - b)`` (a comparison's measured drift direction, e.g. torch + α (fla - torch)) vs isotropic
    noise of the same injected error (mean over prompts and layers), both against τ on ``b``'s features."""
    ev, inp = sess.evaluation, sess.inputs
    c = inp.comparison(name)
    fa, fb = ev.features(c.a), ev.features(c.b)  # a = eval side (fla), b = reference side (torch)
    comps, prompts = ev.completions(), inp.prompts
    drafter, head, dt = ev.drafter, inp.head, next(ev.drafter.parameters()).dtype
    base = ev.tau_for(c.b, ())
    rows = []
    for alpha in ALPHAS:
        items, errs = [], []
        for p in prompts:
            parts = []
            for i in ev.layer_ids:
                ref = fb[p.id][i].float()
                x = (ref + alpha * (fa[p.id][i].float() - ref)).to(dt)
                parts.append(x)
                errs.append(float((x.double() - ref.to(dt).double()).norm() / ref.to(dt).double().norm()))
            items.append((torch.cat(parts, -1), torch.tensor(comps[p.id].sequence), len(comps[p.id].prompt_ids)))
        tau = [r.chain.tau for r in simulate_tau(drafter, head, items)]
        err = sum(errs) / len(errs)
        noise = Perturbation("noise", size=err)
        n_items = [(perturb_layers(fb[p.id], noise, seed=0, prompt_id=p.id, dtype=dt)[0],
                    torch.tensor(comps[p.id].sequence), len(comps[p.id].prompt_ids)) for p in prompts]
        ntau = [r.chain.tau for r in simulate_tau(drafter, head, n_items)]
        b = [base[p.id].chain.tau for p in prompts]
        rows.append({"alpha": alpha, "injected_rel_err": err,
                     "real": {"mean_tau": sum(tau) / len(tau),
                              "mean_abs_dtau": sum(abs(x - y) for x, y in zip(tau, b)) / len(b),
                              "max_abs_dtau": max(abs(x - y) for x, y in zip(tau, b))},
                     "isotropic": {"mean_tau": sum(ntau) / len(ntau),
                                   "mean_abs_dtau": sum(abs(x - y) for x, y in zip(ntau, b)) / len(b),
                                   "max_abs_dtau": max(abs(x - y) for x, y in zip(ntau, b))}})
    return rows


def suite(a: argparse.Namespace, rec: Recorder, name: str, dtype: str, *args: str) -> dict[str, Any]:
    report = a.out / f"suite_{name}"
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-q", "-p", "no:cacheprovider", "--dtype", dtype,
           "--hidden-state-backend", a.backend, "--reference-backend", "torch", "--allow-settings-mismatch",
           "--cache-dir", str(a.cache), "--report-dir", str(report), *args]
    if a.num_prompts:
        cmd += ["--num-prompts", str(a.num_prompts)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.suite_timeout,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep +
                                   os.environ.get("PYTHONPATH", "")})
    except subprocess.TimeoutExpired as exc:
        rec.log(f"suite {name}: timed out after {a.suite_timeout} s")
        return {"cmd": " ".join(cmd[1:]), "rc": "timeout", "output_tail": str(exc.stdout)[-2000:]}
    (a.out / f"suite_{name}.log").write_text(proc.stdout + "\n" + proc.stderr)
    data = json.loads((report / "eval.json").read_text()) if (report / "eval.json").is_file() else {}
    res = {"cmd": " ".join(cmd[1:]), "rc": proc.returncode, "s": round(time.perf_counter() - t0, 1),
           "counts": data.get("tests", {}).get("counts"), "drift_gate": data.get("drift_gate"),
           "budget": (data.get("drift_budget") or {}).get("budget")}
    rec.log(f"suite {name}: rc {proc.returncode}, {res['counts']}, {res['s']} s")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_out")))
    ap.add_argument("--cache", type=Path, default=Path("/tmp/budget_cache"))
    ap.add_argument("--num-prompts", type=int, default=None, help="first N of the default prompts (default: all)")
    ap.add_argument("--backend", default=None, help="evaluation backend (default: fla with CUDA and fla, else "
                    "torch-recurrent as a CPU stand-in)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[1, 2], help="extra noise seeds (first dtype)")
    ap.add_argument("--subset-sizes", type=int, nargs="*", default=[4, 8, 16, 24])
    ap.add_argument("--draws", type=int, default=50, help="random prompt subsets per size")
    ap.add_argument("--suite-timeout", type=float, default=300.0)
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp32"], help="target dtypes (the first one gets the "
                    "sensitivity and amplification stages)")
    ap.add_argument("--amplify", default=None, help="comparison whose drift direction is amplified (default: the "
                    "evaluation backend vs torch; on a CPU e.g. bf16-vs-fp32 with --backend torch --dtypes fp32)")
    ap.add_argument("--quick", action="store_true", help="first dtype only, no extra seeds, no suite runs")
    ap.add_argument("--subsets-of", type=Path, nargs="*", default=None, metavar="EVAL_JSON",
                    help="only print the prompt-subset sensitivity of the budgets in these eval.json files (no model)")
    a = ap.parse_args(argv)
    if a.subsets_of:
        for path in a.subsets_of:
            b = json.loads(path.read_text())["drift_budget"]
            print(json.dumps({"report": str(path), "budget": b["budget"], "seed": b["seed"], "subsets": subset_budgets(
                b["levels"], b["tol"], a.subset_sizes, a.draws)}, indent=1))
        return 0
    a.backend = a.backend or ("fla" if torch.cuda.is_available() and fla_available() else "torch-recurrent")
    a.seeds = [] if a.quick else a.seeds
    a.out = a.out.resolve()
    rec = Recorder(a.out)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rec.data.update(device=device_name(dev), backend=a.backend, cache=str(a.cache), num_prompts=a.num_prompts)
    rec.log(f"device {rec.data['device']}, evaluation backend {a.backend}, reference torch")
    sessions = {}
    for dtype in a.dtypes[:1] if a.quick else a.dtypes:  # the core numbers first, the extras after
        sess = sessions[dtype] = EvalSession(settings(a, dtype))
        part: dict[str, Any] = rec.data.setdefault(dtype, {})
        t0 = time.perf_counter()
        sess.tau_results  # noqa: B018 - completions, features and τ first, so the budget time is the budget's own
        part["prepare_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        budget = sess.drift_budget()
        part["budget_s"] = round(time.perf_counter() - t0, 2)
        part["budget"] = DriftBudgetBlock.of(budget).to_dict()
        rec.log(f"{dtype}: {budget.describe()} in {part['budget_s']} s")
        part["drift"] = drift_and_gate(sess)
        part["subsets"] = subset_budgets(part["budget"]["levels"], budget.tol, a.subset_sizes, a.draws)
        rec.save()
    sess, part = sessions[a.dtypes[0]], rec.data[a.dtypes[0]]
    part["seeds"] = {}
    for seed in a.seeds:
        b = EvalSession(dataclasses.replace(sess.settings, drift_budget_seed=seed)).drift_budget()
        js = DriftBudgetBlock.of(b).to_dict()
        part["seeds"][str(seed)] = {"budget": b.budget, "lower_bound": b.lower_bound, "levels": js["levels"],
                                    "subsets": subset_budgets(js["levels"], b.tol, a.subset_sizes, a.draws)}
        rec.log(f"{a.dtypes[0]} seed {seed}: budget {b.budget:.3g}")
        rec.save()
    amp = a.amplify or next((c.name for c in sess.inputs.comparisons if not c.skip_reason
                             and c.a.backend == a.backend and c.b.backend == "torch"), None)
    if amp is not None:
        part["amplified"] = {"comparison": amp, "rows": amplified(sess, amp)}
        rec.log(f"{a.dtypes[0]} amplified {amp}: " + ", ".join(
            f"α{r['alpha']} err {r['injected_rel_err']:.2e} real {r['real']['mean_abs_dtau']:.3f} iso "
            f"{r['isotropic']['mean_abs_dtau']:.3f}" for r in part["amplified"]["rows"]))
        rec.save()
    if not a.quick:
        sel = "within_budget or drift_regression or functional_drift"
        runs = {"bf16": ("bf16", "-k", sel), "fp32": ("fp32", "-k", sel),
                "fault_under": ("bf16", "-k", "within_budget", "--kernel-fault", "noise:1e-3"),
                "fault_over": ("bf16", "-k", "within_budget", "--kernel-fault", "noise:3")}
        rec.data["suite"] = {}
        for name, (dtype, *args) in runs.items():
            rec.data["suite"][name] = suite(a, rec, name, dtype, *args)
            rec.save()
    rec.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    rec.save()
    rec.log(f"wrote {a.out / 'drift_budget_gpu.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
