"""Benchmark: false regressions and missed drops of the verdicts across checkpoints, the rule before and after, side by
side, on checkpoints evaluated for real through ``Evaluator.evaluate``.

Checkpoints (the bundled drafter, ``fixtures/drafter``, on the first ``--num-prompts`` bundled prompts):

- **equivalent sequences** (``--seeds`` of them, ``--steps`` checkpoints each): the bundled drafter with independent
  relative weight noise ``w * (1 + noise * N(0, 1))`` per element at every step (``--noise``, default 5 %), so that
  no checkpoint is worse than another in expectation: every regression judged in them is a false one;
- **drop sequences**: the same sequences with the checkpoint at one position (``--drop-at``, each position its own
  sequence) replaced by a drafter whose τ is about 10 % lower (``--drop``): one more seed of the same noise,
  times ``(1 + r * N(0, 1))`` on every weight, ``r`` calibrated per seed by bisection on its measured mean τ
  against the mean of its equivalent sequence (each calibration step one evaluation; the measured drop is printed);
- a **rising sequence** (``--rising``, 0 to skip): extra noise of one direction, the sequence's own, its size ``r``
  shrinking linearly to 0 over the steps (from ``--rising-top``, by default 3 x the median calibrated r): a smooth
  path from a weaker drafter to the bundled one, as training moves, plus every checkpoint's independent noise. τ
  rises: no regression and no plateau should be judged while it does.

Every checkpoint is evaluated once (one ``Evaluator``, the live module, ``evaluate(module, step=...)``) and its
per-prompt chain τ kept in ``--record`` (``benchmarks/results/checkpoint-verdicts-<device>.json``; JSON, written
atomically after each evaluation: an interrupted run resumes where it stopped, a second run judges again without
evaluating). The verdicts are then applied offline to the
recorded per-prompt τ, as :class:`~dflash_eval.training_loop.history.History` judges them when a record is appended:

- ``old``: the rule before: worse than the best earlier checkpoint (highest mean τ) when the percentile-bootstrap
  95 % CI of the paired mean difference (this - best) lies below 0;
- ``t+bonf``: paired t interval over the prompts against every earlier checkpoint, Bonferroni over the k
  comparisons (one-sided 1 %): the prompts' noise alone, corrected for the selection;
- ``new``: :func:`dflash_eval.training_loop.trend.regression` (docs/training-loop.md): against the mean of the
  run's last 11 checkpoints, the noise between checkpoints measured from their successive differences.

Then ``--synthetic`` runs of the normal model fitted to the recorded equivalent runs (a checkpoint effect and
per-prompt noise), with the recorded number of prompts and with 200, judged by ``t+bonf`` and ``new``.

Run (the record of ``--device cuda`` evaluations is committed: with it nothing is evaluated)::

    .venv/bin/python benchmarks/bench_checkpoint_verdicts.py --seeds 12 --rising 0 --device cuda

Evaluating from scratch takes about 5 minutes on a GPU; on the shared 2-core CPU (``--device cpu``, another
record) one to two minutes per checkpoint under load.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

Taus = dict[str, float]


# ------------------------------------------------------------------------------------------------ checkpoints
class Checkpoints:
    """Noisy copies of the bundled drafter, evaluated through one Evaluator, their per-prompt τ recorded."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.path = Path(a.record)
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        want = {"noise": a.noise, "num_prompts": a.num_prompts, "max_new_tokens": a.max_new_tokens,
                "device": a.device, "dtype": a.dtype}
        if self.data.get("setup", want) != want:
            raise SystemExit(f"{self.path}: recorded with {self.data['setup']}, asked for {want}: pass another "
                             "--record or the same options")
        self.data["setup"] = want
        self.data.setdefault("taus", {})
        self._ev: Any = None
        self._base: Any = None

    def _evaluator(self) -> Any:
        if self._ev is None:
            from dflash_eval import Evaluator
            from dflash_eval.drafter import read_checkpoint

            work = Path(self.a.work or tempfile.mkdtemp(prefix="bench_checkpoint_verdicts-"))
            opts = {"target_model": str(ROOT / "fixtures" / "target"),
                    "prompts": str(ROOT / "fixtures" / "prompts.jsonl"), "num_prompts": str(self.a.num_prompts),
                    "max_new_tokens": str(self.a.max_new_tokens), "cache_dir": str(self.a.cache_dir or work / "cache"),
                    "report_dir": str(work / "reports"), "device": self.a.device, "dtype": self.a.dtype}
            self._ev = Evaluator(opts)
            self._base = read_checkpoint(ROOT / "fixtures" / "drafter")
        return self._ev

    def _drafter(self, seed: int, step: int, extra: float, fixed: bool) -> Any:
        import torch

        from dflash_eval.drafter import build_drafter

        self._evaluator()
        m = build_drafter(self._base, dtype="fp32")
        g = torch.Generator().manual_seed(1_000_003 * seed + step)
        h = torch.Generator().manual_seed(2_000_029 * seed + (0 if fixed else step))
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 + self.a.noise * torch.randn(p.shape, generator=g))
                if extra:
                    p.mul_(1 + extra * torch.randn(p.shape, generator=h))
        return m.train()

    def taus(self, seed: int, step: int, extra: float = 0.0, *, fixed: bool = False) -> Taus:
        """Per-prompt chain τ of the drafter with noise seed (``seed``, ``step``) and ``extra`` noise (recorded);
        ``fixed``: the extra noise's direction is the sequence's own, the same at every step."""
        key = f"{seed}/{step}/{extra:.6g}" + ("/fixed" if fixed else "")
        if key not in self.data["taus"]:
            from dflash_eval.common.atomic import atomic_write_text

            t0 = time.perf_counter()
            result = self._evaluator().evaluate(self._drafter(seed, step, extra, fixed), step=step)
            assert result.tau is not None
            self.data["taus"][key] = {p: r.tau for p, r in result.tau.prompts.items()}
            atomic_write_text(self.path, json.dumps(self.data, indent=0, sort_keys=True))
            print(f"  evaluated seed {seed} step {step} extra {extra:.4g}: mean τ "
                  f"{mean(self.data['taus'][key]):.4f} ({time.perf_counter() - t0:.1f} s)", flush=True)
        return {p: float(v) for p, v in self.data["taus"][key].items()}


def mean(taus: Taus) -> float:
    vals = [v for v in taus.values() if not math.isnan(v)]
    return statistics.fmean(vals) if vals else math.nan


def calibrate_drop(cp: Checkpoints, seed: int, level: float, target: float, start: float) -> tuple[float, Taus]:
    """Extra noise ``r`` whose drafter (seed ``seed``, step 0: a noise draw no sequence uses) has mean τ about
    ``(1 - target) * level``: bisection on r, at most 7 evaluations, within 1.5 points of the target."""
    lo, hi, r = 0.0, None, start
    best: tuple[float, float, Taus] | None = None
    for _ in range(7):
        taus = cp.taus(seed, 0, r)
        drop = 1 - mean(taus) / level
        if best is None or abs(drop - target) < abs(best[0] - target):
            best = (drop, r, taus)
        if abs(drop - target) <= 0.015:
            break
        if drop < target:
            lo = r
            r = 2 * r if hi is None else (r + hi) / 2
        else:
            hi = r
            r = (lo + r) / 2
    assert best is not None
    return best[1], best[2]


# ------------------------------------------------------------------------------------------------ rules
def records(taus: Sequence[Taus], label: str) -> list[Any]:
    from dflash_eval.training_loop.history import CheckpointRecord

    nan = math.nan
    return [CheckpointRecord(step=100 * (k + 1), time="", drafter=f"{label}/step_{100 * (k + 1)}", fingerprint="",
                             settings_digest="bench", mean_tau=mean(t), mean_tau_ci95=[nan, nan], mean_ddtree={},
                             mean_ddtree_ci95={}, mean_floor=None, categories={}, prompts=dict(t))
            for k, t in enumerate(taus)]


def _bootstrap_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap 95 % CI of the mean the old rule used (its code, seed and resample count)."""
    if len(values) == 1:
        return values[0], values[0]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.025 * (resamples - 1))], means[int(round(0.975 * (resamples - 1)))]


def _diffs(a: Any, b: Any) -> list[float]:
    return [a.prompts[p] - b.prompts[p] for p in a.prompts
            if p in b.prompts and not math.isnan(a.prompts[p]) and not math.isnan(b.prompts[p])]


def old_rule(rec: Any, earlier: list[Any]) -> bool:
    usable = [r for r in earlier if not math.isnan(r.mean_tau)]
    if not usable:
        return False
    d = _diffs(rec, max(usable, key=lambda r: r.mean_tau))
    return bool(d) and _bootstrap_ci(d)[1] < 0


def t_bonferroni_rule(rec: Any, earlier: list[Any]) -> bool:
    from scipy.stats import t  # the benchmark's own reference rule: scipy only here

    from dflash_eval.training_loop.trend import ALPHA_REGRESSION as alpha

    for r in earlier:
        d = _diffs(rec, r)
        if len(d) < 2:
            continue
        se = statistics.stdev(d) / math.sqrt(len(d))
        if statistics.fmean(d) + t.ppf(1 - alpha / len(earlier), len(d) - 1) * se < 0:
            return True
    return False


def judge(taus: Sequence[Taus], label: str, window: int, *, old: bool = True) -> dict[str, list[Any]]:
    """Each checkpoint of the sequence judged against those before it: regression flags of each rule (``old``
    False: not the old rule, whose bootstrap is slow), the new rule's plateau notices (and the new rule's records,
    for the messages)."""
    recs = records(taus, label)
    out: dict[str, list[Any]] = {"old": [], "t+bonf": [], "new": [], "plateau": [], "records": []}
    judged: list[Any] = []
    for k, r in enumerate(recs):
        out["old"].append(old and old_rule(r, recs[:k]))
        out["t+bonf"].append(t_bonferroni_rule(r, recs[:k]))
        j = r.judged(judged, window)
        judged.append(j)
        out["new"].append(j.regression is not None)
        out["plateau"].append(j.plateau is not None)
        out["records"].append(j)
    return out


# ------------------------------------------------------------------------------------------------ synthetic runs
def anova(seq: Sequence[Taus]) -> tuple[float, float]:
    """The variance of a run's checkpoint means and the per-prompt residual variance (checkpoints x prompts, the
    prompts every checkpoint has)."""
    ps = sorted(set.intersection(*(set(t) for t in seq)))
    x = [[t[p] for p in ps] for t in seq]
    k, n = len(x), len(ps)
    rows = [statistics.fmean(r) for r in x]
    cols = [statistics.fmean(r[j] for r in x) for j in range(n)]
    grand = statistics.fmean(rows)
    mse = math.fsum((x[i][j] - rows[i] - cols[j] + grand) ** 2 for i in range(k) for j in range(n)) / (
        (k - 1) * (n - 1))
    return statistics.variance(rows), mse


def noise_model(seqs: Sequence[Sequence[Taus]]) -> tuple[float, float]:
    """σ_c (the checkpoint effect every prompt shares) and σ_e (per prompt and checkpoint) of equivalent runs, by
    a two-way analysis of variance of each run (:func:`anova`), averaged over the runs."""
    vc, ve = [], []
    for seq in seqs:
        vm, mse = anova(seq)
        n = len(set.intersection(*(set(t) for t in seq)))
        ve.append(mse)
        vc.append(max(0.0, vm - mse / n))
    return math.sqrt(statistics.fmean(vc)), math.sqrt(statistics.fmean(ve))


def synthetic(runs: int, steps: int, prompts: int, sigma_c: float, sigma_e: float, seed: int) -> list[list[Taus]]:
    """Equivalent runs of the normal model: prompt means around 4.6 (spread 1), a checkpoint effect, per-prompt
    noise."""
    rng = random.Random(seed)
    out = []
    for _ in range(runs):
        mu = [4.6 + rng.gauss(0, 1) for _ in range(prompts)]
        out.append([{f"p{i}": m + c + rng.gauss(0, sigma_e) for i, m in enumerate(mu)}
                    for c in (rng.gauss(0, sigma_c) for _ in range(steps))])
    return out


# ------------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="independent equivalent sequences")
    ap.add_argument("--steps", type=int, default=20, help="checkpoints per sequence")
    ap.add_argument("--noise", type=float, default=0.05, help="relative weight noise of every checkpoint")
    ap.add_argument("--num-prompts", type=int, default=16, help="the first N bundled prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per reference completion")
    ap.add_argument("--device", default="auto", help="the suite's --device")
    ap.add_argument("--dtype", default="auto", help="the suite's --dtype")
    ap.add_argument("--drop", type=float, default=0.10, help="the relative τ drop of the dropped checkpoint")
    ap.add_argument("--drop-at", default="5,6,8,10,15,20", help="positions (1-based) the dropped checkpoint takes")
    ap.add_argument("--rising", type=int, default=1, help="rising sequences (0: none)")
    ap.add_argument("--rising-top", type=float, default=None,
                    help="extra noise of the rising sequence's first checkpoint (default: 3 x the median calibrated r)")
    ap.add_argument("--synthetic", type=int, default=1000,
                    help="synthetic equivalent runs of the normal model fitted to the recorded ones (0: none)")
    ap.add_argument("--window", type=int, default=4, help="K of the plateau notice")
    ap.add_argument("--record", default=None,
                    help="JSON of every evaluated checkpoint's per-prompt τ (read, extended, rewritten; default "
                         "benchmarks/results/checkpoint-verdicts-<device>.json)")
    ap.add_argument("--cache-dir", default=None, help="the suite's cache (default: one in the work folder)")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--verbose", action="store_true", help="print every new-rule verdict message")
    a = ap.parse_args()
    a.record = a.record or str(ROOT / "benchmarks" / "results" / f"checkpoint-verdicts-{a.device}.json")
    cp = Checkpoints(a)
    positions = [int(x) for x in a.drop_at.split(",") if x.strip()]
    steps = range(1, a.steps + 1)

    eq = {s: [cp.taus(s, k) for k in steps] for s in range(a.seeds)}
    drops: dict[int, tuple[float, float, Taus]] = {}
    r = 0.05
    for s in range(a.seeds):
        level = statistics.fmean(mean(t) for t in eq[s])
        r, taus = calibrate_drop(cp, s, level, a.drop, r)
        drops[s] = (r, 1 - mean(taus) / level, taus)
    rising = {}
    top = a.rising_top if a.rising_top is not None else 3 * statistics.median(r for r, _, _ in drops.values())
    for i in range(a.rising):
        s = 100 + i
        rising[s] = [cp.taus(s, k, round(top * (1 - k / a.steps), 6), fixed=True) for k in steps]

    cols = ("old", "t+bonf", "new")
    print(f"\n## Equivalent sequences: {a.seeds} x {a.steps} checkpoints, {a.noise:.0%} relative weight noise, "
          f"{a.num_prompts} prompts")
    print("| seed | mean τ range | SD of the means (prompts' share of their variance) | false regressions old | "
          "t+bonf | new | plateau notices (new) |\n|---|---|---|---|---|---|---|")
    tot = dict.fromkeys(cols, 0)
    for s, seq in eq.items():
        v = judge(seq, f"eq{s}", a.window)
        means = [mean(t) for t in seq]
        for c in cols:
            tot[c] += sum(v[c])
        flagged = {c: [100 * (k + 1) for k, f in enumerate(v[c]) if f] for c in cols}
        vm, mse = anova(seq)
        share = mse / len(set.intersection(*(set(t) for t in seq))) / vm
        print(f"| {s} | {min(means):.3f}-{max(means):.3f} | {math.sqrt(vm):.3f} ({share:.2f}) | "
              f"{sum(v['old'])} {flagged['old'] or ''} | "
              f"{sum(v['t+bonf'])} | {sum(v['new'])} {flagged['new'] or ''} | {sum(v['plateau'])} of "
              f"{a.steps - a.window} |")
        if a.verbose:
            for rec in v["records"]:
                print(f"    step {rec.step} τ {rec.mean_tau:.4f} {rec.regression or ''} {rec.plateau or ''}")
    n_judged = a.seeds * (a.steps - 1)
    print(f"| all | | | {tot['old']} of {n_judged} | {tot['t+bonf']} | {tot['new']} | |")

    print(f"\n## Drop sequences: the checkpoint at one position replaced by one about {a.drop:.0%} lower")
    print("| seed | extra noise r | measured drop | caught at positions: old | t+bonf | new | false regressions "
          "elsewhere old/t+bonf/new |\n|---|---|---|---|---|---|---|")
    caught = {c: dict.fromkeys(positions, 0) for c in cols}
    for s, seq in eq.items():
        r, drop, taus = drops[s]
        at = {c: [] for c in cols}
        other = dict.fromkeys(cols, 0)
        for pos in positions:
            v = judge([*seq[:pos - 1], taus, *seq[pos:]], f"drop{s}", a.window)
            for c in cols:
                caught[c][pos] += v[c][pos - 1]
                other[c] = max(other[c], sum(v[c]) - v[c][pos - 1])
                if v[c][pos - 1]:
                    at[c].append(pos)
            if a.verbose:
                print(f"    seed {s} position {pos}: {v['records'][pos - 1].regression}")
        print(f"| {s} | {r:.4g} | {-100 * drop:+.1f} % | {at['old']} | {at['t+bonf']} | {at['new']} | "
              f"{'/'.join(str(other[c]) for c in cols)} |")
    print("\n| position | caught old | t+bonf | new |\n|---|---|---|---|")
    for pos in positions:
        print(f"| {pos} | {' | '.join(f'{caught[c][pos]} of {a.seeds}' for c in cols)} |")

    if a.synthetic and eq:
        sc, se = noise_model(list(eq.values()))
        print(f"\n## Synthetic equivalent runs: σ_c {sc:.4f} (the checkpoint effect), σ_e {se:.4f} (per prompt), "
              f"fitted to the {a.seeds} recorded runs; {a.steps} checkpoints each")
        print("| prompts | runs | false regressions t+bonf | new | runs with 2 or more (new) |\n|---|---|---|---|---|")
        for n, runs in ((a.num_prompts, a.synthetic), (200, max(1, a.synthetic // 5))):
            vs = [judge(seq, "syn", a.window, old=False) for seq in synthetic(runs, a.steps, n, sc, se, seed=n)]
            total = runs * (a.steps - 1)
            new = [sum(v["new"]) for v in vs]
            print(f"| {n} | {runs} | {sum(sum(v['t+bonf']) for v in vs) / total:.2%} | {sum(new) / total:.2%} | "
                  f"{sum(x >= 2 for x in new)} (most in one run: {max(new)}) |")

    for s, seq in rising.items():
        v = judge(seq, f"rise{s}", a.window)
        means = [mean(t) for t in seq]
        print(f"\n## Rising sequence (seed {s}): mean τ {' '.join(f'{m:.2f}' for m in means)}")
        print(f"false regressions old {sum(v['old'])}, t+bonf {sum(v['t+bonf'])}, new {sum(v['new'])}; plateau "
              f"notices (new) at steps {[100 * (k + 1) for k, f in enumerate(v['plateau']) if f]}")
        if a.verbose:
            for rec in v["records"]:
                print(f"    step {rec.step} τ {rec.mean_tau:.4f} {rec.plateau or ''}")


if __name__ == "__main__":
    main()
