"""Floors recorded at temperature 0.6 with the margin derived from the spread over samples: the bundled drafter
passes them on every selection of 4 or more of the recorded prompts, a randomly initialised drafter of the same
config fails them on every such selection.

The recording is the suite's (:func:`dflash_eval.metrics.sampled_tau.spread_margin` per prompt,
:func:`dflash_eval.metrics.floors.make_floors`, written and read back as a floors file), the judging the verdict's
(:func:`dflash_eval.metrics.verdict.passes` against :class:`dflash_eval.metrics.floors.Floors` selected per
subset). The gated run uses the recording's seed (the seed is in the checked context), so its references are the
recording's: the comparison is paired.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest
import torch

from dflash_eval.drafter import (
    DFlashDrafter,
    TargetSpec,
    build_drafter,
    read_checkpoint,
)
from dflash_eval.metrics.floors import load_floors, make_floors
from dflash_eval.metrics.sampled_tau import spread_margin
from dflash_eval.metrics.tau import chain_tau, ddtree_tau, draft_table
from dflash_eval.metrics.verdict import passes
from dflash_eval.target.generation import greedy_generate_batch
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import extract_features
from dflash_eval.target.loader import load_target
from dflash_eval.target.sampling import SamplingParams, stream_seed

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROMPTS, SAMPLES, NEW_TOKENS, BUDGET, SIGMAS = 6, 6, 32, 8, 3.0


def _sample_taus(target, drafter, head, prompts, refs):  # type: ignore[no-untyped-def]
    """Per prompt, the chain and DDTree τ of every sample: ({pid: [τ]}, {pid: [τ]})."""
    chain: dict[str, list[float]] = {}
    tree: dict[str, list[float]] = {}
    for (pid, ids), outs in zip(prompts.items(), refs):
        items = []
        for out in outs:
            seq = torch.tensor(ids + out)
            feats, _ = extract_features(target, seq, drafter.config.target_layer_ids, backend="torch")
            items.append((feats, seq, len(ids)))
        tables = draft_table(drafter, head, items, top_k=BUDGET)
        chain[pid] = [chain_tau(t).tau for t in tables]
        tree[pid] = [ddtree_tau(t, BUDGET).tau for t in tables]
    return chain, tree


@pytest.fixture(scope="module")
def measured():  # type: ignore[no-untyped-def]
    if not (FIXTURES / "target" / "config.json").is_file():
        pytest.fail(f"bundled fixtures missing under {FIXTURES}: run python fixtures/build.py")
    target = load_target(FIXTURES / "target", device="cpu", dtype="fp32")
    ckpt = read_checkpoint(FIXTURES / "drafter")
    bundled = build_drafter(ckpt, dtype="fp32", spec=TargetSpec.from_target(target))
    torch.manual_seed(0)
    random_drafter = DFlashDrafter(ckpt.config).float().eval()
    head = TargetHead.from_model(target.model)
    rows = [json.loads(line) for line in (FIXTURES / "prompts.jsonl").read_text().splitlines() if line.strip()]
    prompts = {r["id"]: target.tokenizer(r["text"], add_special_tokens=False)["input_ids"] for r in rows[:PROMPTS]}
    pairs = [(pid, k) for pid in prompts for k in range(SAMPLES)]
    outs = greedy_generate_batch(target, [prompts[p] for p, _ in pairs], NEW_TOKENS, backend="torch",
                                 sampling=(SamplingParams(0.6), [stream_seed(0, p, k) for p, k in pairs]))
    refs = [outs[i * SAMPLES:(i + 1) * SAMPLES] for i in range(len(prompts))]
    return (_sample_taus(target, bundled, head, prompts, refs), _sample_taus(target, random_drafter, head, prompts,
                                                                             refs))


@pytest.mark.slow
def test_floors_at_t06_pass_the_bundled_drafter_and_fail_a_random_one(measured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (chain, tree), (rchain, rtree) = measured
    mean = {p: statistics.fmean(v) for p, v in chain.items()}
    tmean = {p: statistics.fmean(v) for p, v in tree.items()}
    margins = ({p: spread_margin(v, SIGMAS) for p, v in chain.items()},
               {BUDGET: {p: spread_margin(v, SIGMAS) for p, v in tree.items()}})
    doc = make_floors(mean, {BUDGET: tmean}, margin=0.25, context={"temperature": 0.6}, margins=margins,
                      sigmas=SIGMAS)
    path = tmp_path / "tau_floors_t0.6.json"
    path.write_text(json.dumps(doc))
    floors = load_floors(path)
    assert floors.raw["margins"]["chain"] == {p: round(m, 4) for p, m in sorted(margins[0].items())}
    assert all(floors.for_prompt(p) < mean[p] for p in mean if mean[p] > 1.0)  # a margin was subtracted
    assert any(floors.for_prompt(p) > 1.0 for p in mean), f"every floor is 1.0: {floors.chain}"
    rmean = {p: statistics.fmean(v) for p, v in rchain.items()}
    ids = list(mean)
    for n in range(4, len(ids) + 1):
        for sel in itertools.combinations(ids, n):
            f = floors.select({p: "code" for p in sel})
            for p in sel:  # the recorded drafter on the recording's references passes every prompt's floors
                assert passes(mean[p], f.for_prompt(p)) and passes(tmean[p], f.for_prompt(p, BUDGET)), p
            assert passes(statistics.fmean(mean[p] for p in sel), f.for_mean())
            assert passes(statistics.fmean(tmean[p] for p in sel), f.for_mean(BUDGET))
            r_chain = statistics.fmean(rmean[p] for p in sel)
            assert not passes(r_chain, f.for_mean()), (sel, r_chain, f.for_mean(), rchain, rtree)
