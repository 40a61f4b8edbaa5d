"""The drift statistics as a cached measurement (:mod:`dflash_eval.measurements.layer_drift`): what a comparison's
statistics and the drift budget's direction read is the features' own drift, bit for bit, read back by a later
session without reading one feature entry, and made again whenever a feature entry it was made from changes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dflash_eval.measurements.drafter_evaluation import DrafterEvaluation
from dflash_eval.metrics.drift import layer_drift
from dflash_eval.options.settings import EvalSettings
from dflash_eval.session.eval_session import EvalSession

COMPARISON = "torch-vs-torch-recurrent"


@pytest.fixture
def settings(tiny_target_dir, tiny_drafter_dir, tmp_path) -> EvalSettings:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "text": "def add(a, b):"}) + "\n" +
                       json.dumps({"id": "b", "text": "The quick brown fox"}) + "\n")
    return EvalSettings.from_mapping({"target_model": tiny_target_dir, "drafter": tiny_drafter_dir,
                                      "prompts": prompts, "cache_dir": tmp_path / "cache", "max_new_tokens": 12,
                                      "device": "cpu", "floors_file": tmp_path / "no_floors.json"})


def _session(s: EvalSettings) -> EvalSession:
    return EvalSession(s, worker=("master", 0, 1))


def _produced(s: EvalSettings) -> int:
    return sum(1 for x in _session(s).inputs.cache.productions() if x["kind"] == "layer_drift")


def test_the_cached_statistics_are_the_features_own_and_read_back_without_them(
        settings: EvalSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _session(settings)
    ev = first.evaluation
    c = first.inputs.comparison(COMPARISON)
    stats = ev.drift(COMPARISON).stats
    fa, fb = ev.features(c.a), ev.features(c.b)
    direct = {p: {i: layer_drift(fa[p][i], fb[p][i]) for i in ev.layer_ids} for p in ("a", "b")}
    assert {p: {i: s.rel_err for i, s in per.items()} for p, per in stats.items()} == \
        {p: {i: d.rel_err for i, d in per.items()} for p, per in direct.items()}
    assert _produced(settings) == 1

    def no_features(self: DrafterEvaluation, *args: object, **kwargs: object) -> None:
        raise AssertionError("a warm session read features for its drift statistics")

    monkeypatch.setattr(DrafterEvaluation, "features", no_features)
    warm = _session(settings)
    assert warm.evaluation.layer_drifts(c.a, c.b) == direct  # every float, bit for bit
    assert _produced(settings) == 1


def test_other_feature_entries_make_the_statistics_again(settings: EvalSettings) -> None:
    first = _session(settings)
    c = first.inputs.comparison(COMPARISON)
    before = first.evaluation.layer_drifts(c.a, c.b)
    longer = dataclasses.replace(settings, max_new_tokens=16)  # other reference sequences: other feature entries
    after = _session(longer).evaluation.layer_drifts(c.a, c.b)
    assert _produced(settings) == 2
    assert after != before
