"""End-to-end tests of the eval suite (tests_eval/) on a tiny random model, run as pytest subprocesses.

Covers: a cold run under ``-n 2`` produces every cache entry exactly once; a warm ``--cache-only`` run computes
nothing and reaches the same verdicts; a corrupted entry is reported and recomputed; ``--cache-only`` on an empty
cache fails with the cause; a drafter that does not fit the target fails with the cause and writes no cache entry;
``-k tau`` selects exactly the τ tests.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def run_suite(dirs, cache, *args, name="run"):
    out = dirs["root"] / name
    cmd = [sys.executable, "-m", "pytest", "tests_eval", "-p", "no:cacheprovider", "-q",
           "--target-model", str(dirs["target"]), "--drafter", str(dirs.get("drafter_override", dirs["drafter"])),
           "--prompts", str(dirs["prompts"]), "--max-new-tokens", "24", "--cache-dir", str(cache),
           "--report-dir", str(out / "reports"), "--golden-dir", str(dirs["root"] / "golden"),
           "--floors-file", str(dirs["root"] / "golden" / "tau_floors.json"), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_EVAL_", "PYTEST_"))}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr, out / "reports" / "eval.json"


def productions(cache):
    log = Path(cache) / "v1" / "produce.log"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []


def verdicts(eval_json):
    d = json.loads(Path(eval_json).read_text())
    return {p: (r["tau"], r["passed"]) for p, r in d["prompts"].items()}, d


def test_cold_xdist_then_warm_cache_only(env_dirs):
    cache = env_dirs["root"] / "cache"
    rc, out, ej = run_suite(env_dirs, cache, "-n", "2", "--update-tau-floors", "--update-fingerprints",
                            "--snapshot-update", name="cold")
    assert rc == 0, out
    prods = productions(cache)
    dup = [k for k, n in collections.Counter((p["kind"], p["key"]) for p in prods).items() if n > 1]
    assert prods and not dup, f"entries produced twice: {dup}"
    assert {p["kind"] for p in prods} >= {"completion", "features"}
    cold, data = verdicts(ej)
    assert list(cold) == ["p-0", "p-1", "code-tau-2"] and data["drift"] and data["tests"]["counts"].get("passed")
    assert len(data["timings"]["per_worker"]) == 2  # both workers' results reached the controller

    rc, out, ej = run_suite(env_dirs, cache, "-n", "0", "--cache-only", name="warm")
    assert rc == 0, out
    assert len(productions(cache)) == len(prods), "a warm --cache-only run produced entries"
    warm, _ = verdicts(ej)
    assert warm == cold


def test_corrupted_entry_is_recomputed_and_cache_only_miss_fails(env_dirs):
    cache = env_dirs["root"] / "cache2"
    rc, out, _ = run_suite(env_dirs, cache, "-k", "tau", "--tau-floor", "1.0", name="fill")
    assert rc == 0, out
    n = len(productions(cache))
    victim = next((cache / "v1" / "completion").rglob("data.safetensors"))
    victim.write_bytes(victim.read_bytes()[:100])
    rc, out, _ = run_suite(env_dirs, cache, "-k", "tau", "--tau-floor", "1.0", "--cache-only", name="co")
    assert rc != 0 and "corrupted" in out and "--cache-only" in out
    rc, out, _ = run_suite(env_dirs, cache, "-k", "tau", "--tau-floor", "1.0", "-W", "default", name="fix")
    assert rc == 0, out
    assert "corrupted" in out and len(productions(cache)) == n + 1

    empty = env_dirs["root"] / "empty-cache"
    rc, out, _ = run_suite(env_dirs, empty, "-k", "tau", "--tau-floor", "1.0", "--cache-only", name="miss")
    assert rc != 0 and "cache miss" in out and "--cache-only" in out
    assert not list(empty.rglob("manifest.json"))


def test_drafter_that_does_not_fit_fails_with_cause_and_writes_nothing(env_dirs, tmp_path):
    bad = tmp_path / "bad_drafter"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((env_dirs["drafter"] / "model.safetensors").read_bytes())
    cfg = load_config_file(env_dirs["drafter"] / "config.json").to_dict()
    cfg["dflash_config"]["target_layer_ids"] = [0, 1, 99]
    (bad / "config.json").write_text(json.dumps(cfg))
    cache = tmp_path / "cache"
    rc, out, _ = run_suite({**env_dirs, "drafter_override": bad}, cache, "-k", "tau or architecture",
                           "--tau-floor", "1.0", name="bad")
    assert rc != 0
    assert "test_architecture_check[target_layer_ids_range]" in out and "99" in out and "does not fit" in out
    assert not list(cache.rglob("manifest.json")), "a cache entry was written for an unusable drafter"


def test_k_tau_selects_exactly_the_tau_tests(env_dirs):
    rc, out, _ = run_suite(env_dirs, env_dirs["root"] / "c", "--collect-only", "-k", "tau", name="collect")
    assert rc == 0, out
    ids = [line for line in out.splitlines() if "::" in line]
    assert ids and all(line.startswith("tests_eval/test_tau.py::") for line in ids), ids
    rc, out, _ = run_suite(env_dirs, env_dirs["root"] / "c", "--collect-only", name="collect-all")
    all_ids = [line for line in out.splitlines() if "::" in line]
    assert [i for i in all_ids if "tau" in i.lower()] == ids
