"""False-refusal and detection rates of the check of a server's sampled references (references/server_sample_check.py).

Servers are simulated with the bundled target: each draws its completions (seeded multinomial draws, a fresh
stream for every batch: :class:`Draw`) at ITS sampling settings, and the check judges them, fetch by fetch,
against the ASKED settings with the local target's teacher-forced logits (the same forward, processing and
statistic as ``check_sampled_completions``). A correct server (asked = served) that is refused is a false
refusal; a server that samples otherwise and is accepted is a miss. A fetch has a shape PxSxL: P prompts (taken
in turn from the prompts file), S samples each, at most L new tokens (stopping at EOS, as a server does).

    .venv/bin/python benchmarks/bench_sample_check.py --shapes 2x2x16 --fetches 40 --alt-fetches 10       # CPU
    python3 benchmarks/bench_sample_check.py --device cuda --dtype fp32 --fetches 2000 --alt-fetches 200  # GPU

Prints, per scenario and shape side by side: fetches, the share refused (with a Clopper-Pearson 95 % upper bound
for the correct servers), the reasons, and quantiles of the pooled z-score; then the largest and smallest
per-completion z of the correct servers. ``--fits-out`` keeps every completion's fit (score, variance, ...) so that
``--fits-in`` re-judges them under the thresholds in the code without generating again.

Scenarios (asked T = --temperature, default 0.6): ``correct`` (served as asked), ``correct-top-p`` (asked and served
top-p 0.9), ``correct-bf16`` (served by a bfloat16 copy of the target: the numerics of another precision, judged by
the --dtype target: must pass), and servers that must be refused: ``greedy``, ``T/2``, ``T/10``, ``0.75T``, ``2T``,
``1.33T``, ``top-k-20-unasked``, ``top-p-0.9-unasked``, ``min-p-0.1-unasked`` (a truncation the request did not
ask), ``top-k-ignored`` (asked top-k 20, served without), ``shifted-ids`` (every token one id off) and
``other-weights`` (a copy of the target with noise of 1.0 x each tensor's spread added to its weights).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from scipy.stats import beta

from dflash_eval.references.server_check import teacher_forced_logits
from dflash_eval.references.server_sample_check import (
    FETCH_Z_FLAT,
    FETCH_Z_SHARP,
    SAMPLE_Z_FLAT,
    SAMPLE_Z_SHARP,
    SHARP_GUARANTEE,
    FetchFit,
    SampleFit,
    TokenScores,
    fit_of_scores,
    token_scores,
)
from dflash_eval.target.backends import use_backend
from dflash_eval.target.loader import Target, load_target
from dflash_eval.target.sampling import SamplingParams, process_logprobs, stream_seed

ROOT = Path(__file__).resolve().parents[1]
CORRECT = ("correct", "correct-top-p", "correct-bf16")


@dataclass(frozen=True)
class Scenario:
    name: str
    asked: SamplingParams
    served: SamplingParams
    server: str = "target"  # which model serves: target, bf16, other
    shift: bool = False

    @property
    def correct(self) -> bool:
        return self.name in CORRECT


def scenarios(t: float) -> list[Scenario]:
    a = SamplingParams(temperature=t)
    return [
        Scenario("correct", a, a),
        Scenario("correct-top-p", replace(a, top_p=0.9), replace(a, top_p=0.9)),
        Scenario("correct-bf16", a, a, server="bf16"),
        Scenario("greedy", a, SamplingParams(temperature=0.0)),
        Scenario("T/2", a, replace(a, temperature=t / 2)),
        Scenario("T/10", a, replace(a, temperature=t / 10)),
        Scenario("0.75T", a, replace(a, temperature=0.75 * t)),
        Scenario("2T", a, replace(a, temperature=2 * t)),
        Scenario("1.33T", a, replace(a, temperature=4 * t / 3)),
        Scenario("top-k-20-unasked", a, replace(a, top_k=20)),
        Scenario("top-p-0.9-unasked", a, replace(a, top_p=0.9)),
        Scenario("min-p-0.1-unasked", a, replace(a, min_p=0.1)),
        Scenario("top-k-ignored", replace(a, top_k=20), a),
        Scenario("shifted-ids", a, a, shift=True),
        Scenario("other-weights", a, a, server="other"),
    ]


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        p, s, n = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a fetch shape is PxSxL (prompts x samples x tokens), got {text!r}") from None
    if min(p, s, n) < 1:
        raise argparse.ArgumentTypeError(f"every part of the fetch shape {text!r} must be >= 1")
    return p, s, n


def other_weights(target: Target, scale: float, seed: int) -> Target:
    """A copy of ``target`` with Gaussian noise of ``scale`` x each floating tensor's spread added."""
    other = copy.deepcopy(target)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in other.model.parameters():
            if p.is_floating_point() and p.numel() > 1:
                noise = torch.randn(p.shape, generator=gen).to(p.device, p.dtype)
                p.add_(noise * float(p.float().std()) * scale)
    return other


class Draw:
    """A transformers ``LogitsProcessor`` that draws each row's next token from the processed distribution of
    ``params`` with ``torch.multinomial`` under a seeded generator (the suite's position-hashed draws,
    :class:`~dflash_eval.target.sampling.SeededSampler`, cost ten times more per step and are not what is measured
    here: any seeded draw of the distribution is): the drawn token scores 0, every other -inf."""

    def __init__(self, params: SamplingParams, generator: torch.Generator) -> None:
        self.params, self.generator = params, generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = process_logprobs(scores, self.params).exp()
        ids = torch.multinomial(probs, 1, generator=self.generator)
        return torch.full_like(scores, float("-inf")).scatter_(-1, ids, 0.0)


def sample_batch(server: Target, prompts: list[list[int]], length: int, params: SamplingParams, seed: int,
                 backend: str) -> list[list[int]]:
    """Completions of ``prompts`` (one left-padded batch, stopping at EOS as a server does) drawn by ``server`` at
    ``params`` (greedy params: argmax)."""
    from transformers import LogitsProcessorList  # heavy: only when generating

    eos = server.eos_token_id
    pad = eos if eos is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for n, p in enumerate(prompts):
        ids[n, width - len(p):] = torch.tensor(p)
        mask[n, width - len(p):] = 1
    extra = {}
    if not params.greedy:
        gen = torch.Generator(device=server.device).manual_seed(seed)
        extra["logits_processor"] = LogitsProcessorList([Draw(params, gen)])
    with use_backend(backend, server.device), torch.no_grad():
        out = server.model.generate(ids.to(server.device), attention_mask=mask.to(server.device),
                                    max_new_tokens=length, min_new_tokens=1, do_sample=False, eos_token_id=eos,
                                    pad_token_id=pad, **extra)
    rows = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos) + 1]
        rows.append(row)
    return rows


def judge_rows(check: Target, rows: list[tuple[list[int], list[int]]], asked: SamplingParams, backend: str,
               budget: int) -> list[tuple[SampleFit, list[int]]]:
    """Teacher-force (prompt, completion) rows through ``check`` in right-padded batches of at most ``budget``
    logits and return each completion's fit under ``asked`` (what ``check_sampled_completions`` computes)."""
    fits = []
    vocab = check.vocab_size
    i = 0
    while i < len(rows):
        width = max(len(p) + len(c) for p, c in rows[i:])
        n = max(1, budget // (width * vocab))
        chunk = rows[i:i + n]
        with use_backend(backend, check.device):
            logits = teacher_forced_logits(check.model, chunk, check.device)
        lens = [len(c) for _, c in chunk]
        lq = process_logprobs(torch.cat(logits), asked)
        ids = torch.tensor([t for _, c in chunk for t in c], dtype=torch.long, device=lq.device)
        sc = token_scores(lq, ids)
        parts = [torch.split(t.cpu(), lens) for t in (sc.logq, sc.neg_entropy, sc.variance, sc.top_logq)]
        for j, (_, c) in enumerate(chunk):
            fits.append((fit_of_scores(f"row{i + j}", TokenScores(*(p[j] for p in parts))), c))
        i += n
    return fits


def run_scenario(sc: Scenario, shape: tuple[int, int, int], n_fetch: int, seconds: float, models: dict[str, Target],
                 prompts: list[tuple[str, list[int]]], args: argparse.Namespace) -> list[list[SampleFit]]:
    """Up to ``n_fetch`` fetches of ``shape`` served by ``sc``'s server and judged by the check target, in generate
    calls of at most ``args.batch`` completions (whole fetches), none started after ``seconds``."""
    p_n, s_n, length = shape
    server = models[sc.server]
    vocab = server.vocab_size
    per_call = max(1, args.batch // (p_n * s_n))
    fetches: list[list[SampleFit]] = []
    t0 = time.perf_counter()
    while len(fetches) < n_fetch and time.perf_counter() - t0 < seconds:
        first = len(fetches)
        plan: list[tuple[int, str, list[int], int]] = []  # (fetch, prompt id, prompt ids, sample)
        for f in range(first, min(n_fetch, first + per_call)):
            for j in range(p_n):
                pid, ids = prompts[(f * p_n + j) % len(prompts)]
                plan.extend((f, pid, ids, k) for k in range(s_n))
        plan.sort(key=lambda r: -len(r[2]))  # similar lengths together: little padding
        seed = stream_seed(args.seed, f"{sc.name}/{shape}", first)  # every call its own stream
        outs = sample_batch(server, [r[2] for r in plan], length, sc.served, seed, args.backend)
        if sc.shift:
            outs = [[(t + 1) % vocab for t in o] for o in outs]
        outs = [o if o else [0] for o in outs]
        fits = judge_rows(models["target"], [(r[2], o) for r, o in zip(plan, outs)], sc.asked, args.backend,
                          args.logits_budget)
        done: dict[int, list[tuple[str, SampleFit]]] = {}
        for r, (fit, _) in zip(plan, fits):
            done.setdefault(r[0], []).append((f"{r[1]}#{r[3]}", replace(fit, item=f"{r[1]}#{r[3]}")))
        fetches.extend([fit for _, fit in sorted(done[f])] for f in sorted(done))
    return fetches


FIELDS = ("n_tokens", "score", "variance", "mean_logq", "mean_expected", "n_argmax", "expected_argmax", "n_outside",
          "max_gain")


def dump(results: dict[str, dict[str, list[list[SampleFit]]]]) -> dict:
    out: dict = {}
    for name, by_shape in results.items():
        for shape, fetches in by_shape.items():
            rows = [[f.n_tokens, f.score, f.variance, f.mean_logq, f.mean_expected, f.n_argmax, f.expected_argmax,
                     len(f.outside), f.max_gain] for fetch in fetches for f in fetch]
            out.setdefault(name, {})[shape] = {"sizes": [len(x) for x in fetches],  # completions of each fetch
                                               "fits": torch.tensor(rows, dtype=torch.float32)}
    return out


def undump(data: dict) -> dict[str, dict[str, list[list[SampleFit]]]]:
    results: dict[str, dict[str, list[list[SampleFit]]]] = {}
    for name, by_shape in data.items():
        for shape, d in by_shape.items():
            fits = [SampleFit(f"#{n}", int(r[0]), [0] * int(r[7]), float(r[1]), float(r[2]), float(r[3]),
                              float(r[4]), int(r[5]), float(r[6]), -1, 0.0, float(r[8]))
                    for n, r in enumerate(d["fits"].tolist())]
            fetches, i = [], 0
            for n in d["sizes"]:
                fetches.append(fits[i:i + n])
                i += n
            results.setdefault(name, {})[shape] = fetches
    return results


def upper95(k: int, n: int) -> float:
    """Clopper-Pearson one-sided 95 % upper bound of a rate seen k times in n."""
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def summarise(fetches: list[list[SampleFit]]) -> dict:
    verdicts = [FetchFit(tuple(f)).refusals() for f in fetches]
    zs = torch.tensor([FetchFit(tuple(f)).z for f in fetches], dtype=torch.float64)
    reasons: dict[str, int] = {}
    for v in verdicts:
        for r in v[:1]:
            key = f"{'fetch' if r.pooled else 'sample'} {r.what}"
            reasons[key] = reasons.get(key, 0) + 1
    k = sum(1 for v in verdicts if v)
    sample_z = torch.tensor([s.z for f in fetches for s in f], dtype=torch.float64)
    finite = zs[torch.isfinite(zs)]

    def q(x: torch.Tensor, p: float) -> float:
        return float(torch.quantile(x, p)) if x.numel() else math.nan

    return {"fetches": len(fetches), "refused": k, "rate": k / max(1, len(fetches)),
            "upper95": upper95(k, len(fetches)),
            "reasons": reasons, "z_mean": float(finite.mean()) if finite.numel() else math.nan,
            "z_sd": float(finite.std()) if finite.numel() > 1 else math.nan,
            "z_min": float(zs.min()), "z_q001": q(finite, 0.001), "z_median": q(finite, 0.5),
            "z_q999": q(finite, 0.999), "z_max": float(zs.max()),
            "sample_z_min": float(sample_z.min()), "sample_z_max": float(sample_z.max()), "samples": sample_z.numel(),
            "tokens": sum(s.n_inside for f in fetches for s in f)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "fixtures" / "target"), help="target model directory")
    ap.add_argument("--prompts", default=str(ROOT / "fixtures" / "prompts.jsonl"), help="prompts JSONL")
    ap.add_argument("--device", default="cpu", help="torch device of the server and the check")
    ap.add_argument("--dtype", default="fp32", help="dtype of the check's target (and of the servers but bf16)")
    ap.add_argument("--backend", default="auto", help="linear-attention backend")
    ap.add_argument("--temperature", type=float, default=0.6, help="the asked temperature T")
    ap.add_argument("--shapes", type=parse_shape, nargs="+", default=[(2, 2, 16), (1, 1, 128), (4, 8, 128)],
                    help="fetch shapes PxSxL (prompts x samples x max new tokens)")
    ap.add_argument("--fetches", type=int, default=40, help="fetches per shape of each correct server")
    ap.add_argument("--alt-fetches", type=int, default=10, help="fetches per shape of each other server")
    ap.add_argument("--seconds", type=float, default=math.inf,
                    help="start no generate call after this many seconds per shape of each correct server (3x for "
                         "'correct'): fewer fetches than --fetches on a slow machine")
    ap.add_argument("--alt-seconds", type=float, default=math.inf, help="likewise for each other server")
    ap.add_argument("--only", nargs="*", default=None, help="only these scenarios (names in the docstring)")
    ap.add_argument("--batch", type=int, default=64, help="completions per generate call")
    ap.add_argument("--logits-budget", type=int, default=2**28, help="most logits of one teacher-forced forward")
    ap.add_argument("--seed", type=int, default=0, help="run seed of the stream seeds")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    ap.add_argument("--fits-out", default=None, help="save every completion's fit here (torch.save)")
    ap.add_argument("--fits-in", default=None, help="judge the fits saved by --fits-out instead of generating")
    args = ap.parse_args()

    shape_name = {s: f"{s[0]}x{s[1]}x{s[2]}" for s in args.shapes}
    results: dict[str, dict[str, list[list[SampleFit]]]] = {}
    times: dict[str, float] = {}
    if args.fits_in:
        results = undump(torch.load(args.fits_in))
    else:
        target = load_target(args.target, device=args.device, dtype=args.dtype)
        models = {"target": target}
        lines = [json.loads(x) for x in Path(args.prompts).read_text().splitlines() if x.strip()]
        prompts = [(p["id"], target.tokenizer(p["text"], add_special_tokens=False)["input_ids"]) for p in lines]
        for sc in scenarios(args.temperature):
            if args.only is not None and sc.name not in args.only:
                continue
            if sc.server == "bf16" and "bf16" not in models:
                models["bf16"] = load_target(args.target, device=args.device, dtype="bf16")
            if sc.server == "other" and "other" not in models:
                models["other"] = other_weights(target, 1.0, args.seed)
            for shape in args.shapes:
                t0 = time.perf_counter()
                n = args.fetches if sc.correct else args.alt_fetches
                budget = (args.seconds if sc.correct else args.alt_seconds) * (3.0 if sc.name == "correct" else 1.0)
                got = run_scenario(sc, shape, n, budget, models, prompts, args)
                results.setdefault(sc.name, {})[shape_name[shape]] = got
                took = times[f"{sc.name} {shape_name[shape]}"] = time.perf_counter() - t0
                print(f"  {sc.name:>18} {shape_name[shape]:>8}: {len(got)} fetches in {took:.1f}s", flush=True)
                if args.fits_out:  # after every scenario: a run cut short keeps what it measured
                    torch.save(dump(results), args.fits_out + ".tmp")
                    Path(args.fits_out + ".tmp").replace(args.fits_out)

    print(f"\nthresholds: completion z in [{SAMPLE_Z_FLAT:g}, {SAMPLE_Z_SHARP:g}], fetch z in [{FETCH_Z_FLAT:g}, "
          f"{FETCH_Z_SHARP:g}], too sharp only where Freedman's bound <= {SHARP_GUARANTEE:g}; asked T "
          f"{args.temperature:g}")
    table = {name: {shape: summarise(f) for shape, f in by_shape.items()} for name, by_shape in results.items()}
    shapes = sorted({s for v in table.values() for s in v}, key=lambda s: [int(x) for x in s.split("x")])
    head = f"{'server':>18} |" + "|".join(f"{s:^36}" for s in shapes)
    print(head + "\n" + "-" * len(head))
    for name, by_shape in table.items():
        cells = []
        for s in shapes:
            r = by_shape.get(s)
            if r is None:
                cells.append(f"{'':36}")
                continue
            rate = f"{r['refused']}/{r['fetches']}"
            extra = f"<={r['upper95']:.1e}" if name in CORRECT else f"={r['rate']:.0%}"
            cells.append(f" {rate:>11} {extra:>9} z {r['z_median']:+6.1f} [{r['z_min']:+6.1f},{r['z_max']:+6.1f}]")
        print(f"{name:>18} |" + "|".join(cells))
    print("\nreasons (first refusal of each refused fetch):")
    for name, by_shape in table.items():
        for s, r in by_shape.items():
            if r["reasons"]:
                print(f"  {name:>18} {s:>8}: {r['reasons']}")
    print("\ncorrect servers: per-completion z range and pooled z quantiles")
    for name in CORRECT:
        for s, r in table.get(name, {}).items():
            print(f"  {name:>18} {s:>8}: {r['samples']} completions z in [{r['sample_z_min']:+.2f}, "
                  f"{r['sample_z_max']:+.2f}]; fetch z mean {r['z_mean']:+.3f} sd {r['z_sd']:.3f} "
                  f"q0.001 {r['z_q001']:+.2f} q0.999 {r['z_q999']:+.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"thresholds": {"sample": [SAMPLE_Z_FLAT, SAMPLE_Z_SHARP],
                                                              "fetch": [FETCH_Z_FLAT, FETCH_Z_SHARP]},
                                               "temperature": args.temperature, "results": table, "seconds": times},
                                              indent=1))


if __name__ == "__main__":
    main()
