"""The verdicts across checkpoints (dflash_eval.training_loop.trend), on synthetic runs whose truth is known:
equally good checkpoints (a checkpoint effect shared by the prompts plus per-prompt noise, as two checkpoints of one
run differ) are failed as regressions at most about once in 100 checkpoints, where the paired interval over the
prompts alone fails many; a 10 % drop of τ at one step is caught; the Monte Carlo limits hold their level against
an independent simulation; and the edge cases: the first checkpoints, missing prompts, records without a step,
earlier regressions, identical earlier checkpoints."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from dflash_eval.training_loop import trend
from dflash_eval.training_loop.history import CheckpointRecord
from dflash_eval.training_loop.trend import paired, regression, regression_limit

PROMPTS = 16
LEVEL = 4.6
# as measured on the bundled drafter with 5 % relative weight noise per checkpoint (benchmarks/
# bench_checkpoint_verdicts.py): checkpoint means spread by about 0.065, half of it shared by every prompt
SIGMA_C = 0.045  # the checkpoint effect: what every prompt of one checkpoint shares
SIGMA_E = 0.18  # per prompt and checkpoint


def rec(step: int | None, taus: dict[str, float], drafter: str | None = None) -> CheckpointRecord:
    vals = [v for v in taus.values() if not math.isnan(v)]
    mean = statistics.fmean(vals) if vals else math.nan
    return CheckpointRecord(step=step, time="", drafter=drafter or f"run/step_{step}", fingerprint="",
                            settings_digest="d", mean_tau=mean, mean_tau_ci95=[math.nan, math.nan], mean_ddtree={},
                            mean_ddtree_ci95={}, mean_floor=None, categories={}, prompts=taus)


def run(rng: random.Random, steps: int = 20, *, drops: dict[int, float] | None = None, rise: float = 0.0,
        prompts: int = PROMPTS) -> list[dict[str, float]]:
    """Per-prompt τ of ``steps`` checkpoints: prompt means around LEVEL, a checkpoint effect, per-prompt noise;
    ``drops``: step index -> relative drop of that checkpoint; ``rise``: τ added per step."""
    mu = [LEVEL + rng.gauss(0, 1.0) for _ in range(prompts)]
    out = []
    for k in range(steps):
        c = rng.gauss(0, SIGMA_C) + rise * k
        taus = {f"p{i}": mu[i] + c + rng.gauss(0, SIGMA_E) for i in range(prompts)}
        f = 1 - (drops or {}).get(k, 0.0)
        out.append({p: f * t for p, t in taus.items()})
    return out


def judge(seq: list[dict[str, float]], window: int = 4) -> list[CheckpointRecord]:
    done: list[CheckpointRecord] = []
    for k, taus in enumerate(seq):
        done.append(rec(100 * (k + 1), taus).judged(done, window))
    return done


def prompts_only(record: CheckpointRecord, earlier: list[CheckpointRecord], z: float = 1.96) -> bool:
    """The paired interval over the prompts alone against the best earlier checkpoint (z 1.96: the rule before)."""
    if not earlier:
        return False
    d = paired(record.prompts, max(earlier, key=lambda r: r.mean_tau).prompts)
    return d.mean + z * d.se < 0


# ------------------------------------------------------------------------------------------------ false alarms
def test_equally_good_checkpoints_are_rarely_failed():
    rng = random.Random(1)
    seqs = [run(rng) for _ in range(100)]
    per_seq = [sum(r.regression is not None for r in judge(s)) for s in seqs]
    judged = 100 * 19
    assert sum(per_seq) / judged <= 0.015, per_seq  # about once in 100 checkpoints at most
    assert sum(n > 1 for n in per_seq) <= 3, per_seq  # more than one in a run of 20: rare
    # the paired interval over the prompts alone takes the checkpoints' own differences for regressions
    old = sum(prompts_only(rec(0, s[k]), [rec(0, t) for t in s[:k]]) for s in seqs for k in range(1, 20))
    assert old / judged > 0.1


def test_more_prompts_do_not_turn_the_checkpoints_own_differences_into_regressions():
    """With 200 prompts the prompts' noise is small beside the checkpoint effect: an interval over the prompts,
    even corrected for 19 comparisons (z 3.3), fails equally good checkpoints; σ measured from the run does not."""
    rng = random.Random(3)
    seqs = [run(rng, prompts=200) for _ in range(30)]
    judged = 30 * 19
    new = sum(r.regression is not None for s in seqs for r in judge(s))
    bonferroni = sum(prompts_only(rec(0, s[k]), [rec(0, t) for t in s[:k]], z=3.3) for s in seqs for k in range(1, 20))
    assert new / judged <= 0.02 and bonferroni / judged > 0.2, (new, bonferroni)


# ------------------------------------------------------------------------------------------------ detection
@pytest.mark.parametrize("at", [9, 14, 19])
def test_a_ten_percent_drop_at_one_step_is_caught(at):
    rng = random.Random(2 + at)
    caught = 0
    for _ in range(40):
        recs = judge(run(rng, drops={at: 0.10}))
        caught += recs[at].regression is not None
        assert sum(r.regression is not None for i, r in enumerate(recs) if i != at) <= 2
    assert caught >= 38


def test_the_message_names_the_comparison_the_difference_the_limit_and_the_correction():
    recs = judge(run(random.Random(5), 10, drops={9: 0.10}))
    msg = recs[9].regression
    assert msg is not None
    assert msg.startswith("below the run's recent level beyond the noise between checkpoints: paired Δ -0.")
    assert f"over {PROMPTS} prompts against the mean of the last 9 checkpoints (step 100 .. step 900; τ " in msg
    assert "99 % upper limit -0." in msg and " < 0 (Δ + " in msg
    assert "σ: the root mean square of 8 successive checkpoint differences" in msg
    assert "the limit for one checkpoint against the mean of 9, σ measured from them" in msg


def test_the_numbers_behind_the_verdict_are_the_verdicts():
    """regression_test gives what the message says: the stretch, Δ, the limit, the upper end; None before any."""
    rng = random.Random(14)
    for drops in ({}, {11: 0.10}):
        recs = judge(run(rng, 14, drops=drops))
        for k, r in enumerate(recs):
            t = trend.regression_test(r, recs[:k])
            if k == 0:
                assert t is None
                continue
            kept = k - sum(x.regression is not None for x in recs[:k])
            assert t is not None and len(t.stretch) == min(kept, trend.WINDOW)
            assert (t.upper is None) == (k < 3) and t.regression == (r.regression is not None)
            if r.regression:
                assert f"upper limit {t.upper:+.3f} < 0" in r.regression and f"paired Δ {t.delta.mean:+.3f}" in \
                    r.regression


def second_drops(seed: int) -> tuple[int, int]:
    """Of 30 runs with 10 % drops at steps 10 and 15: how often the first is caught, and the second after it."""
    rng = random.Random(seed)
    first = second = 0
    for _ in range(30):
        recs = judge(run(rng, drops={9: 0.10, 14: 0.10}))
        if recs[9].regression is not None:
            first += 1
            second += recs[14].regression is not None
            assert recs[10].regression is None  # back to the run's level
    return first, second


def test_a_second_drop_after_a_first_is_caught_too(monkeypatch):
    """An earlier regression is left out of σ and of the comparisons: it does not hide the next one."""
    first, second = second_drops(6)
    assert first >= 26 and second >= 0.85 * first
    monkeypatch.setattr(trend, "_kept", trend.step_order)  # the first drop counted as noise
    first, second = second_drops(6)
    assert second < 0.6 * first


def test_a_slow_decline_is_caught_against_the_best():
    recs = judge(run(random.Random(7), 20, rise=-0.05))
    assert any(r.regression for r in recs[8:])


# ------------------------------------------------------------------------------------------------ the limits
def _independent_rate(limit: float, w: int, n: int, seed: int) -> float:
    rng = random.Random(seed)
    hits = 0
    for _ in range(n):
        x = [rng.gauss(0, 1) for _ in range(w + 1)]
        e = x[:w]
        d = [b - a for a, b in zip(e, e[1:])]
        hits += (statistics.fmean(e) - x[w]) / math.sqrt(statistics.fmean([v * v for v in d])) > limit
    return hits / n


@pytest.mark.parametrize("w", [3, 7, trend.WINDOW])
def test_the_regression_limit_holds_its_level_in_an_independent_simulation(w):
    c = regression_limit(w)
    assert c == regression_limit(w)  # seeded: the same limit on every call, run and machine
    rate = _independent_rate(c, w, 20_000, seed=w)
    assert abs(rate - trend.ALPHA_REGRESSION) < 0.0035, rate  # 5 binomial standard errors


def test_the_gain_limit_holds_its_level_in_an_independent_simulation():
    recent, before = 4, 6
    c = trend.gain_limit(recent, before)
    rng = random.Random(11)
    hits = 0
    n = 20_000
    for _ in range(n):
        b = [rng.gauss(0, 1) for _ in range(before)]
        r = [rng.gauss(0, 1) for _ in range(recent)]
        groups = [[y - x for x, y in zip(g, g[1:])] for g in (b, r)]  # not across the boundary
        ss = sum((v - statistics.fmean(g)) ** 2 for g in groups for v in g)  # each about its mean
        hits += (max(r) - b[-1]) / math.sqrt(ss / sum(len(g) - 1 for g in groups)) > c
    assert abs(hits / n - trend.ALPHA_GAIN) < 0.008, hits / n


def test_limits_refuse_sizes_they_cannot_calibrate():
    with pytest.raises(ValueError, match="w >= 3"):
        regression_limit(2)
    with pytest.raises(ValueError, match="a gain limit needs"):
        trend.gain_limit(2, 1)


# ------------------------------------------------------------------------------------------------ edge cases
def test_the_first_checkpoints():
    seq = run(random.Random(8), 3, drops={1: 0.5, 2: 0.5})
    recs = judge(seq)
    assert recs[0].regression is None and recs[0].plateau is None  # nothing to compare with
    assert recs[1].regression is None  # one earlier checkpoint: σ cannot be measured yet
    assert regression(rec(3, seq[2]), [rec(1, seq[0])]) is None


def test_missing_prompts_pair_over_the_prompts_both_have():
    rng = random.Random(9)
    seq = run(rng, 8)
    earlier = judge(seq[:7])
    gone = {p: t for i, (p, t) in enumerate(seq[7].items()) if i >= 4}  # 4 prompts not evaluated
    dropped = {p: 0.85 * t for p, t in gone.items()}
    dropped["p5"] = math.nan  # a prompt without a speculative round
    msg = regression(rec(800, dropped), earlier)
    assert msg is not None and "over 11 prompts" in msg
    assert regression(rec(800, {"other": 1.0}), earlier) is None  # no prompt in common: not judged
    holes = [{p: t for p, t in taus.items() if p != f"p{k}"} for k, taus in enumerate(seq)]  # each lacks one
    assert all(r.regression is None for r in judge(holes))


def test_records_without_a_step_are_judged_in_the_order_written():
    seq = run(random.Random(10), 8, drops={7: 0.10})
    done: list[CheckpointRecord] = []
    for k, taus in enumerate(seq):
        done.append(rec(None, taus, drafter=f"ckpt-{k}").judged(done, 4))
    assert all(r.regression is None for r in done[:7])
    assert done[7].regression is not None and done[7].regression.startswith("below the run's recent level")
    assert "against the mean of the last 7 checkpoints (ckpt-0 .. ckpt-6; τ " in done[7].regression
    # a stepped record is compared with the earlier steps and with every record without one
    assert trend.earlier_than(rec(5, seq[0]), [rec(4, seq[0]), rec(6, seq[0]), rec(None, seq[0])]) == [
        rec(4, seq[0]), rec(None, seq[0])]


def test_identical_earlier_checkpoints_leave_the_prompts_noise_as_the_floor():
    rng = random.Random(12)
    base = run(rng, 1)[0]
    earlier = judge([base] * 5)
    assert all(r.regression is None for r in earlier)
    jitter = {p: t + rng.gauss(-0.005, 0.05) for p, t in base.items()}
    assert regression(rec(600, jitter), earlier) is None  # σ = 0, yet a jitter of the prompts is no regression
    lower = {p: t - 0.3 + rng.gauss(0, 0.05) for p, t in base.items()}
    msg = regression(rec(600, lower), earlier)
    assert msg is not None and ("the prompts' standard error of Δ: the 4 successive checkpoint differences "
                                "are all 0") in msg


# ------------------------------------------------------------------------------------------------ plateau
def test_plateau_noticed_on_a_flat_run_not_on_a_rising_one():
    rng = random.Random(13)
    flat = judge(run(rng, 12))
    assert flat[3].plateau is None  # fewer than K + 1 checkpoints
    assert sum(r.plateau is not None for r in flat[4:]) >= 7
    note = flat[-1].plateau
    assert note is not None and note.startswith("plateau: no gain beyond noise over the last 4 checkpoints")
    assert "(step 900 .. step 1200) over the best of the 8 before them (step 100 .. step 800): the largest, " in note
    assert "95 % limit for the best of 4 over one checkpoint" in note
    rising = judge(run(rng, 12, rise=0.2))  # 2 x the checkpoint means' spread a step
    assert all(r.plateau is None for r in rising)
    assert all(r.regression is None for r in rising)
