"""Benchmark: how stable the drift gate's outcome is across budget seeds and prompt orders (not a timed test).

The gate (``test_drift_within_budget``) compares each comparison's worst measured drift x safety with the drafter's
drift budget and its CI (:mod:`dflash_eval.metrics.drift_budget`). This benchmark measures the budget through the
same code path (``EvalSession.drift_budget()``: the cached per-level entries of τ under each perturbation, then
:meth:`DriftBudget.build` and :func:`gate_check`) for ``--seeds`` budget seeds on every bundled prompt, and judges
the gate for each seed and prompt order:

- **orders**: order 0 is the bundled order; order k > 0 a permutation of the bundled prompts seeded with k. From an
  order, ``--num-prompts 6`` selects its first 6 prompts and measures the budget on its first 32
  (``--drift-budget-min-prompts``), ``all`` selects and measures on all of them. A prompt's noise is seeded by its
  id (not by its place), so a selection's τ under each level is the full set's re-indexed; the benchmark checks
  that against a real ``--num-prompts 6`` session (the bundled order, the first seed) before it relies on it.
- **cases**: (a) the bundled drafter against its own CPU drift comparisons (bf16 vs fp32, torch vs its recurrent
  form), its budget read along the bf16-minus-fp32 direction amplified (the largest drift): must pass every time;
  (b) a copy of the bundled drafter with 5 % relative Gaussian noise on every weight (a new weight-noise draw per
  budget seed) against the same drift: must pass; (c) the bundled drafter under ``--kernel-fault noise:1``
  (relative noise of size 1 on the delta-rule output, a fault that measurably lowers τ), its budget measured in
  that run as the gate measures it (along the fault's own drift direction, the run's only comparison) and judged
  against the fault's drift: must fail every time; ``--extra-faults`` adds other faults for information. The budget
  is the fit of the amplified drift levels, which do not depend on the seed: the seeds move only the isotropic
  (secondary) axis, reported in its own column, and the weight noise of (b).
- **8 against all**: the budget measured on the first 8 prompts of an order against the one on all of them: do
  their CIs overlap, and does each estimate lie in the other's CI?

Prints one table (counts of pass / inconclusive / fail per case and selection; budget estimates and CI ends) and
writes the per-seed numbers to ``--out``. Run (budgets are cached in ``--cache``; on a 2-core CPU each new seed
costs a few seconds for the bundled drafter (its noise levels only) and 10-20 s for a noisy drafter, ``--jobs``
spreads the seeds over processes)::

    .venv/bin/python benchmarks/bench_gate_stability.py --seeds 20 --orders 3 --extra-faults noise:0.1
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_budget_prompts import noisy_drafter  # noqa: E402

from dflash_eval.metrics.drift_budget import Direction, DriftBudget, gate_check  # noqa: E402
from dflash_eval.metrics.drift_ladder import parse_ladder  # noqa: E402
from dflash_eval.options.settings import EvalSettings  # noqa: E402
from dflash_eval.session.eval_session import EvalSession  # noqa: E402

MIN_PROMPTS = 32  # --drift-budget-min-prompts' default: the budget's prompts of a small selection
SELECTIONS = {"6 prompts": 6, "all": None}


def settings(args: argparse.Namespace, **kw: Any) -> EvalSettings:
    values = {"cache_dir": str(args.cache), "device": args.device, "dtype": "fp32", "hidden_state_backend": "torch",
              **kw}
    if args.ladder:
        values["drift_budget_ladder"] = args.ladder
    return EvalSettings.from_mapping(values, base=ROOT)


def measure(job: tuple[argparse.Namespace, str, int]) -> dict[str, Any]:
    """One drafter's budget levels for one seed on every bundled prompt (a worker process)."""
    import torch

    args, case, seed = job
    torch.set_num_threads(args.threads)
    kw: dict[str, Any] = {"drift_budget_seed": seed}
    if case.startswith("fault "):  # the budget of a run under this kernel fault (its own drift direction)
        kw["kernel_fault"] = case.removeprefix("fault ")
    if case == "noisy":
        kw["drafter"] = str(noisy_drafter(ROOT / "fixtures" / "drafter", args.work / f"noisy_drafter_{seed}",
                                          args.weight_noise, seed=seed))
    t0 = time.perf_counter()
    b = EvalSession(settings(args, **kw), worker=("master", 0, 1)).drift_budget()
    return {"case": case, "seed": seed, "s": time.perf_counter() - t0, "ids": b.prompt_ids, "base_tau": b.base_tau,
            "ladder": ",".join(lv.perturbation.label.replace("drift ", "").replace("noise ", "").replace("round ", "")
                               for lv in b.levels),
            "labels": [lv.perturbation.label for lv in b.levels], "axis_text": b.axis_text,
            "direction": b.direction.to_json() if b.direction else None,
            "taus": [lv.tau for lv in b.levels], "injected": [lv.injected for lv in b.levels],
            "injected_by_prompt": [lv.injected_by_prompt for lv in b.levels]}


def drifts(args: argparse.Namespace, fault: str | None) -> dict[str, dict[int, dict[str, float]]]:
    """Per comparison, layer and prompt: the relative feature error the gate judges."""
    s = EvalSession(settings(args, **({"kernel_fault": fault} if fault else {})), worker=("master", 0, 1))
    out: dict[str, dict[int, dict[str, float]]] = {}
    for c in s.inputs.comparisons:
        if c.skip_reason:
            continue
        d = s.drift(c.name)
        out[c.name] = {i: {p: st[i].rel_err for p, st in d.stats.items()} for i in s.evaluation.layer_ids}
    return out


def budget_on(m: dict[str, Any], ids: list[str], tol: float, safety: float) -> DriftBudget:
    """The budget of measurement ``m`` on the prompts ``ids`` (re-indexed: a prompt's τ and injected error do not
    depend on the others; each prompt's injected error enters as its mean over layers, which averages to the same
    level mean)."""
    at = {p: i for i, p in enumerate(m["ids"])}
    ix = [at[p] for p in ids]
    d = m.get("direction")
    return DriftBudget.build(drafter=m["case"], base="torch/float32", prompt_ids=ids,
                             base_tau=[m["base_tau"][i] for i in ix], ladder=parse_ladder(m["ladder"]),
                             taus=[[t[i] for i in ix] for t in m["taus"]],
                             injected=[[[per[i]] for i in ix] for per in m["injected_by_prompt"]], tol=tol,
                             safety=safety, seed=m["seed"], spec=m["ladder"],
                             direction=Direction(d["comparison"], d["reference"], d["other"], d["drift"],
                                                 tuple(d.get("candidates", {}).items())) if d else None)


def gate(budget: DriftBudget, drift: dict[str, dict[int, dict[str, float]]], selected: list[str]) -> str:
    """The run's gate outcome over every comparison and layer (fail > inconclusive > pass), on the selection."""
    outcomes = {gate_check(name, layer, {p: per[p] for p in selected}, budget).outcome
                for name, layers in drift.items() for layer, per in layers.items()}
    return "fail" if "fail" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"


def order_of(ids: list[str], k: int) -> list[str]:
    out = list(ids)
    if k:
        random.Random(k).shuffle(out)
    return out


def check_reindexing(args: argparse.Namespace, m: dict[str, Any]) -> str:
    """A real ``--num-prompts 6`` session (budget on the first 32) against the re-indexed full measurement."""
    b = EvalSession(settings(args, drift_budget_seed=m["seed"], num_prompts=6), worker=("master", 0, 1)).drift_budget()
    at = {p: i for i, p in enumerate(m["ids"])}
    same = all(lv.tau == [m["taus"][k][at[p]] for p in b.prompt_ids] for k, lv in enumerate(b.levels))
    return (f"re-indexing check (seed {m['seed']}, --num-prompts 6: budget on {len(b.prompt_ids)} prompts): "
            + ("τ of every level equals the full measurement's" if same else "DIFFERS"))


def fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="budget seeds 0..N-1")
    ap.add_argument("--orders", type=int, default=3, help="prompt orders: the bundled one and N-1 permutations")
    ap.add_argument("--cache", type=Path, default=ROOT / ".dflash_cache")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_gate_stability"), help="noisy drafters go here")
    ap.add_argument("--weight-noise", type=float, default=0.05)
    ap.add_argument("--fault", default="noise:1", help="the over-budget --kernel-fault of case (c)")
    ap.add_argument("--extra-faults", default="", help="comma-separated faults reported for information")
    ap.add_argument("--ladder", default=None, help="--drift-budget-ladder (default: the option's default)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (fp32 and the torch backend either way)")
    ap.add_argument("--jobs", type=int, default=1, help="processes measuring seeds side by side")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--cases", default="pristine,noisy", help="drafters whose budgets are measured")
    ap.add_argument("--out", type=Path, default=None, help="write the per-seed numbers here (JSON)")
    ap.add_argument("--dump", type=Path, default=None, help="write the measurements (τ per seed, level and prompt; "
                    "the drifts) here, for --from-dump")
    ap.add_argument("--from-dump", type=Path, default=None, help="judge the measurements of an earlier --dump "
                    "instead of measuring")
    ap.add_argument("--drift-here", action="store_true", help="with --from-dump: judge the drifts measured here "
                    "(--device) instead of the dump's")
    ap.add_argument("--tol", type=float, default=None, help="--drift-budget-tol (default: the option's)")
    args = ap.parse_args(argv)
    args.cache, args.work = args.cache.resolve(), args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    s0 = settings(args)
    tol, safety = s0.drift_budget_tol, s0.drift_budget_safety
    cases = args.cases.split(",")
    if args.from_dump:  # the table again from an earlier run's measurements (e.g. with another --tol)
        dump = json.loads(args.from_dump.read_text())
        clean, faults = dump["clean"], dump["faults"]
        meas = {(m["case"], m["seed"]): m for m in dump["measurements"]}
        clean = {c: {int(i): per for i, per in layers.items()} for c, layers in clean.items()}
        faults = {f: {c: {int(i): per for i, per in layers.items()} for c, layers in d.items()}
                  for f, d in faults.items()}
        if args.drift_here:  # the drifts of this machine's comparisons (e.g. bf16 vs fp32 on a CPU)
            clean = drifts(args, None)
            faults = {f: drifts(args, f) for f in [args.fault, *[x for x in args.extra_faults.split(",") if x]]}
    else:
        clean = drifts(args, None)  # warms completions and features before the workers start
        faults = {f: drifts(args, f) for f in [args.fault, *[x for x in args.extra_faults.split(",") if x]]}
        jobs = [(args, case, seed) for case in cases + [f"fault {f}" for f in faults] for seed in range(args.seeds)]
        meas = {}
        with (cf.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) if args.jobs > 1
              else _Inline()) as pool:  # spawn: torch's thread pools do not survive a fork
            for m in pool.map(measure, jobs):
                meas[(m["case"], m["seed"])] = m
                print(f"measured {m['case']} seed {m['seed']}: {m['s']:.0f} s", flush=True)
                if args.dump:  # after each seed: a run cut short keeps what it measured
                    args.dump.write_text(json.dumps({"clean": clean, "faults": faults,
                                                     "measurements": list(meas.values())}))
        print(check_reindexing(args, meas[(cases[0], 0)]), flush=True)
    if args.tol is not None:
        tol = args.tol
    rows: list[dict[str, Any]] = []
    plan = [("(a) bundled drafter", "pristine", "clean", clean), ("(b) drafter + 5 % weight noise", "noisy", "clean",
                                                                  clean)]
    plan = [p for p in plan if p[1] in cases]
    plan += [(f"(c) --kernel-fault {f}" if f == args.fault else f"--kernel-fault {f}", f"fault {f}", f, d)
             for f, d in faults.items() if any(c == f"fault {f}" for c, _ in meas)]
    agree = {"overlap": 0, "8_in_all": 0, "all_in_8": 0, "n": 0}
    notes: list[str] = []
    print("| case | selection | seeds x orders | pass | inconclusive | fail | budget median (min–max) | lowest CI "
          "low | highest CI high | worst drift x safety | isotropic axis: median (min–max) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for label, case, _, drift in plan:
        for sel_name, n_sel in SELECTIONS.items():
            out = {"pass": 0, "inconclusive": 0, "fail": 0}
            budgets, lows, highs, iso = [], [], [], []
            seeds = sorted(seed for c, seed in meas if c == case)
            for seed in seeds:
                m = meas[(case, seed)]
                for k in range(args.orders):
                    ids = order_of(m["ids"], k)
                    selected = ids if n_sel is None else ids[:n_sel]
                    budget_ids = ids if n_sel is None else ids[:max(n_sel, MIN_PROMPTS)]
                    b = budget_on(m, budget_ids, tol, safety)
                    out[gate(b, drift, selected)] += 1
                    budgets.append(b.budget)
                    iso.append(b.secondary.fit.budget if b.secondary else math.nan)
                    lows.append(b.ci[0])
                    highs.append(b.ci[1])
                    rows.append({"case": label, "selection": sel_name, "seed": seed, "order": k, "budget": b.budget,
                                 "ci": list(b.ci), "status": b.fit.status, "outcome": gate(b, drift, selected)})
                    if label.startswith("(a)") and sel_name == "all":
                        b8 = budget_on(m, ids[:8], tol, safety)
                        agree["n"] += 1
                        agree["overlap"] += b8.ci[0] <= b.ci[1] and b.ci[0] <= b8.ci[1]
                        agree["8_in_all"] += b.ci[0] <= b8.budget <= b.ci[1]
                        agree["all_in_8"] += b8.ci[0] <= b.budget <= b8.ci[1]
                        if seed == seeds[0]:
                            notes.append(f"order {k}, seed {seed}: first 8 prompts {b8.budget_text()}, all "
                                         f"{len(ids)} {b.budget_text()}")
            worst = max(max(per.values()) for layers in drift.values() for per in layers.values())
            print(f"| {label} | {sel_name} | {len(seeds)} x {args.orders} | {out['pass']} | {out['inconclusive']} | "
                  f"{out['fail']} | {fmt(statistics.median(budgets))} ({fmt(min(budgets))}–{fmt(max(budgets))}) | "
                  f"{fmt(min(lows))} | {fmt(max(highs))} | {worst * safety:.3g} | {fmt(statistics.median(iso))} "
                  f"({fmt(min(iso))}–{fmt(max(iso))}) |", flush=True)
    print("", *notes, sep="\n")
    first = meas[(cases[0], 0)]
    print(f"\nbudget axis of {cases[0]}: {first.get('axis_text', 'isotropic')}")
    n_all = len(first["ids"])
    print(f"\nbudget on the first 8 prompts against all {n_all}, bundled drafter, {agree['n']} seed x order pairs: "
          f"CIs overlap {agree['overlap']}, the 8-prompt estimate inside the full set's CI {agree['8_in_all']}, the "
          f"full estimate inside the 8-prompt CI {agree['all_in_8']}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "agree_8_vs_all": agree}, indent=1))
    return 0


class _Inline:
    """``map`` in this process (``--jobs 1``)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Any, items: list[Any]) -> Any:
        return map(fn, items)


if __name__ == "__main__":
    raise SystemExit(main())
