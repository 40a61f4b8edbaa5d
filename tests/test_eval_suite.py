"""End-to-end tests of the eval suite (tests_eval/) on a tiny random model, run in-process with pytest's
``pytester`` (the suite's modules copied into a fresh directory with a conftest that loads the plugin).

Covers: a cold run under ``-n 2`` produces every cache entry exactly once and both workers' results reach the
report; a warm ``--cache-only`` run computes nothing and reaches the same verdicts; a corrupted entry is reported
and recomputed; ``--cache-only`` on an empty cache fails with the cause; a drafter that does not fit the target
fails with the cause and writes no cache entry; ``-k tau`` selects exactly the τ tests.

Run: ``pytest tests/test_eval_suite.py -p no:cacheprovider``
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest
import torch

from dflash_eval.drafter import load_config_file

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env_dirs(tiny_target_dir, tiny_drafter_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("suite")
    prompts = d / "prompts.jsonl"
    # "code-tau-2": a prompt id containing "tau" must not pull non-τ tests into `-k tau`.
    prompts.write_text("".join(json.dumps({"id": i, "category": "c", "text": t}) + "\n" for i, t in
                               [("p-0", "def add(a, b):"), ("p-1", "The quick brown fox"),
                                ("code-tau-2", "for i in range(10):")]))
    return {"target": tiny_target_dir, "drafter": tiny_drafter_dir, "prompts": prompts, "root": d}


@pytest.fixture
def suite(pytester, env_dirs, suite_checkout):
    """A directory holding the suite's test modules; ``suite(cache, *args, name=...)`` runs it in-process and
    returns (RunResult, eval.json path)."""
    suite_checkout("--snapshot-warn-unused")

    def run(cache: Path, *args: str, name: str = "run", drafter: Path | None = None):
        out = env_dirs["root"] / name
        res = pytester.runpytest_inprocess(
            "tests_eval", "-q", "--target-model", str(env_dirs["target"]),
            "--drafter", str(drafter or env_dirs["drafter"]), "--prompts", str(env_dirs["prompts"]),
            "--max-new-tokens", "24", "--cache-dir", str(cache), "--report-dir", str(out / "reports"),
            "--golden-dir", str(env_dirs["root"] / "golden"),
            "--floors-file", str(env_dirs["root"] / "golden" / "tau_floors.json"), *args)
        return res, out / "reports" / "eval.json"

    return run


def productions(cache):
    log = Path(cache) / "v1" / "produce.log"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []


def verdicts(eval_json):
    d = json.loads(Path(eval_json).read_text())
    return {p: (r["tau"], r["passed"]) for p, r in d["prompts"].items()}, d


def test_cold_xdist_then_warm_cache_only(suite, env_dirs):
    cache = env_dirs["root"] / "cache"
    res, ej = suite(cache, "-n", "2", "--update-tau-floors", "--update-fingerprints", "--snapshot-update",
                    name="cold")
    assert res.ret == 0, res.stdout.str()
    prods = productions(cache)
    dup = [k for k, n in collections.Counter((p["kind"], p["key"]) for p in prods).items() if n > 1]
    assert prods and not dup, f"entries produced twice: {dup}"
    assert {p["kind"] for p in prods} >= {"completion", "features"}
    cold, data = verdicts(ej)
    assert list(cold) == ["p-0", "p-1", "code-tau-2"] and data["drift"] and data["tests"]["counts"].get("passed")
    assert {"gw0", "gw1"} <= set(data["timings"]["per_worker"])  # both workers' results reached the controller

    res, ej = suite(cache, "-n", "0", "--cache-only", name="warm")
    assert res.ret == 0, res.stdout.str()
    assert len(productions(cache)) == len(prods), "a warm --cache-only run produced entries"
    if not torch.cuda.is_available():  # what the run did not check, where the user looks (no -ra in this run)
        verdict = res.stdout.str().split("dflash-eval verdict", 1)[1]
        assert re.search(r"tests? not checked \(below\)", verdict.splitlines()[1]), verdict
        assert "not checked: fla not checked: " in verdict, verdict
        skipped = json.loads(ej.read_text())["not_checked"]
        assert any(g["reason"].startswith("fla not checked: ") for g in skipped), skipped
        md = (ej.parent / "eval.md").read_text()
        assert "\n### Not checked\n" in md and "\n- fla not checked: " in md
    warm, _ = verdicts(ej)
    assert warm == cold


def test_corrupted_entry_is_recomputed_and_cache_only_miss_fails(suite, env_dirs):
    cache = env_dirs["root"] / "cache2"
    res, _ = suite(cache, "-k", "tau", "--tau-floor", "1.0", name="fill")
    assert res.ret == 0, res.stdout.str()
    n = len(productions(cache))
    victim = next((cache / "v1" / "completion").rglob("data.safetensors"))
    victim.write_bytes(victim.read_bytes()[:100])
    res, _ = suite(cache, "-k", "tau", "--tau-floor", "1.0", "--cache-only", name="co")
    out = res.stdout.str()
    assert res.ret != 0 and "corrupted" in out and "--cache-only" in out
    res, _ = suite(cache, "-k", "tau", "--tau-floor", "1.0", "-W", "default", name="fix")
    out = res.stdout.str()
    assert res.ret == 0, out
    assert "corrupted" in out and len(productions(cache)) == n + 1

    empty = env_dirs["root"] / "empty-cache"
    res, _ = suite(empty, "-k", "tau", "--tau-floor", "1.0", "--cache-only", name="miss")
    out = res.stdout.str()
    assert res.ret != 0 and "cache miss" in out and "--cache-only" in out
    assert not list(empty.rglob("manifest.json"))


def test_drafter_that_does_not_fit_fails_with_cause_and_writes_nothing(suite, env_dirs, tmp_path):
    bad = tmp_path / "bad_drafter"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((env_dirs["drafter"] / "model.safetensors").read_bytes())
    cfg = load_config_file(env_dirs["drafter"] / "config.json").to_dict()
    cfg["dflash_config"]["target_layer_ids"] = [0, 1, 99]
    (bad / "config.json").write_text(json.dumps(cfg))
    cache = tmp_path / "cache"
    res, _ = suite(cache, "-k", "tau or architecture", "--tau-floor", "1.0", name="bad", drafter=bad)
    out = res.stdout.str()
    assert res.ret != 0
    failed = {r.nodeid for r in res.reprec.getreports("pytest_runtest_logreport") if r.failed}
    assert "tests_eval/test_checkpoint.py::test_architecture_check[target_layer_ids_range]" in failed
    assert "99" in out and "does not fit" in out
    assert not list(cache.rglob("manifest.json")), "a cache entry was written for an unusable drafter"


def test_k_tau_selects_exactly_the_tau_tests(suite, env_dirs):
    def collected(*args: str) -> list[str]:
        res, _ = suite(env_dirs["root"] / "c", "--collect-only", *args, name="collect")
        assert res.ret == 0, res.stdout.str()
        return [item.nodeid for item in res.reprec.getcalls("pytest_collection_finish")[0].session.items]

    ids = collected("-k", "tau")
    assert ids and all(i.startswith("tests_eval/test_tau.py::") for i in ids), ids
    assert [i for i in collected() if "tau" in i.lower()] == ids
