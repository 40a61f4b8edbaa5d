"""One cause, one failure, end to end on copies of the bundled drafter (pytester, in-process, the bundled target and
three of its prompts):

- a drafter whose ``fc.weight`` is sized for 3 target layers while its config lists 4 is refused by the
  architecture check ``fc_shape``: that test is the run's one failure, every test that needs the drafter is skipped
  naming the check, the target-only tests (reference completions, hidden-state drift regression, fingerprints) run
  and pass, the run exits 1 with the cause at the end, and eval.json's verdict is not a pass; without the
  architecture test (``-k tau``) the run still exits 1 with the same message;
- a drafter config with a dflash_config key this evaluator does not implement is one usage error (exit 4) naming it;
- a drafter that proposes nothing the target accepts (random weights: τ about 1 on every prompt) fails
  ``test_mean_tau`` with that diagnosis, and the other τ tests are skipped pointing at it;
- a mask_token_id that is a valid id but not the target's mask token is a warning naming both ids, quoted in the τ
  failures it causes;
- a layout SGLang serves (``model.`` on some keys, fused q/k/v and gate/up, an embedding and an lm_head it skips)
  passes every architecture check, the skipped keys named once; two keys loading one parameter are the one failure
  ``test_architecture_check[state_dict_keys]``.

Run: ``pytest tests/test_drafter_refusal_suite.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_eval.metrics.verdict import NO_ACCEPTANCE

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER, GOLDEN = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter", ROOT / "golden"
SUBSET = "humaneval:3"
pytestmark = pytest.mark.slow


def _copy(dst: Path, *, cfg_edit=None, sd_edit=None) -> Path:  # type: ignore[no-untyped-def]
    shutil.copytree(DRAFTER, dst)
    if cfg_edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    if sd_edit is not None:
        save_file(sd_edit(load_file(str(dst / "model.safetensors"))), str(dst / "model.safetensors"))
    return dst


def _randomised(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(v.shape, generator=g) * v.float().std() + (v.float().mean() if v.dim() == 1 else 0))
            .to(v.dtype) for k, v in sd.items()}


@pytest.fixture(scope="module")
def drafters(tmp_path_factory: pytest.TempPathFactory, target_modules_imported: None) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("refusal")

    def four_layers(cfg: dict) -> None:  # fc.weight stays [H, 3 H]
        cfg["dflash_config"]["target_layer_ids"] = [1, 3, 5, 6]

    def mask(cfg: dict) -> None:
        cfg["dflash_config"]["mask_token_id"] = 2

    def value_scale(cfg: dict) -> None:
        cfg["dflash_config"]["attention_value_scale"] = 0.707

    return {"root": d, "fc": _copy(d / "fc_shape", cfg_edit=four_layers), "mask": _copy(d / "mask2", cfg_edit=mask),
            "random": _copy(d / "random", sd_edit=_randomised), "scale": _copy(d / "scale", cfg_edit=value_scale),
            "layout": _copy(d / "layout", sd_edit=_sglang_layout),
            "duplicate": _copy(d / "duplicate", sd_edit=lambda sd: {**sd, "model.norm.weight": sd["norm.weight"] + 1})}


def _sglang_layout(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The bundled weights as a converter for SGLang may write them: q/k/v and gate/up fused, ``model.`` on layer 1's
    keys, the target's embedding and lm_head carried along."""
    out = {k: v for k, v in sd.items() if not any(f".{p}." in k for p in ("k_proj", "v_proj", "up_proj"))}
    for k in [k for k in sd if ".q_proj." in k or ".gate_proj." in k]:
        part, fused, rest = (("q_proj", "qkv_proj", ("k_proj", "v_proj")) if ".q_proj." in k
                             else ("gate_proj", "gate_up_proj", ("up_proj",)))
        out[k.replace(part, fused)] = torch.cat([sd[k], *(sd[k.replace(part, r)] for r in rest)])
        del out[k]
    out = {(f"model.{k}" if k.startswith("layers.1.") else k): v for k, v in out.items()}
    rows = torch.zeros(4096, sd["norm.weight"].shape[0], dtype=sd["norm.weight"].dtype)
    return {**out, "model.embed_tokens.weight": rows, "lm_head.weight": rows.clone()}


@pytest.fixture
def suite(pytester, drafters, suite_checkout):  # type: ignore[no-untyped-def]
    suite_checkout("--snapshot-warn-unused")

    def run(drafter: Path, *args: str, report: str = "r"):  # type: ignore[no-untyped-def]
        res = pytester.runpytest_inprocess(
            "tests_eval", "-q", "-rs", "--target-model", str(TARGET), "--drafter", str(drafter), "--prompts", SUBSET,
            "--cache-dir", str(drafters["root"] / "cache"), "--golden-dir", str(GOLDEN),
            "--floors-file", str(GOLDEN / "tau_floors.json"),  # recorded floors (none: one usage error, no tests)
            "--report-dir", str(drafters["root"] / report), *args)
        return res, drafters["root"] / report / "eval.json"

    return run


def _reports(res):  # type: ignore[no-untyped-def]
    """{test name: (outcome, skip reason or None)}: setup errors count as "error"."""
    out = {}
    for r in res.reprec.getreports("pytest_runtest_logreport"):
        name = r.nodeid.split("::")[-1]
        if r.when == "call" or (r.when == "setup" and r.outcome != "passed"):
            outcome = "error" if r.when == "setup" and r.failed else r.outcome
            why = r.longrepr[2].removeprefix("Skipped: ") if r.skipped and isinstance(r.longrepr, tuple) else None
            out[name] = (outcome, why)
    return out


def test_fc_shape_refusal_is_one_failure(suite, drafters) -> None:  # type: ignore[no-untyped-def]
    res, ej = suite(drafters["fc"], report="fc")
    out = res.stdout.str()
    reps = _reports(res)
    failed = [n for n, (o, _) in reps.items() if o == "failed"]
    assert failed == ["test_architecture_check[fc_shape]"], out
    assert not [n for n, (o, _) in reps.items() if o == "error"], out
    skipped = {n: why for n, (o, why) in reps.items() if o == "skipped"}
    assert all(skipped.values()), skipped  # every skip has a reason
    refused = "the drafter was refused by architecture check fc_shape (see test_architecture_check[fc_shape])"
    for name in ("test_tau[humaneval-0]", "test_ddtree_tau[humaneval-0-ddtree8]", "test_mean_tau",
                 "test_functional_drift_accept_len[bf16-vs-fp32-humaneval-0]",
                 "test_drift_within_budget[bf16-vs-fp32-L6]"):
        assert skipped.get(name) == refused, (name, reps.get(name))
    for name in ("test_reference_completion[humaneval-0]", "test_teacher_forced_agreement[humaneval-0]",
                 "test_drift_regression[bf16-vs-fp32-humaneval-0-L6]", "test_fingerprint_regression[L0]"):
        assert reps[name][0] == "passed", (name, reps[name])  # target-only: they still run
    assert res.ret == 1
    assert out.count("sized for 3 target layers") >= 1
    assert "does not fit the target: refused by architecture check fc_shape" in out
    data = json.loads(ej.read_text())
    assert data["mean_passed"] is False and [c["check"] for c in data["drafter"]["refused"]] == ["fc_shape"]
    assert data["diagnoses"] and "fc_shape" in data["diagnoses"][0]

    res, ej = suite(drafters["fc"], "-k", "tau", report="fc_tau")  # the failing check's test is not selected
    reps = _reports(res)
    assert res.ret == 1 and all(o == "skipped" for o, _ in reps.values()), reps
    assert "refused by architecture check fc_shape" in res.stdout.str()
    assert json.loads(ej.read_text())["mean_passed"] is False


def test_unimplemented_dflash_config_key_is_one_usage_error(suite, drafters) -> None:  # type: ignore[no-untyped-def]
    res, _ = suite(drafters["scale"], report="scale")
    err = res.stderr.str()
    assert res.ret == 4 and err.count("'dflash_config.attention_value_scale' is 0.707") == 1, err
    assert str(drafters["scale"] / "config.json") in err


def test_tau_of_one_on_every_prompt_is_one_diagnosis(suite, drafters) -> None:  # type: ignore[no-untyped-def]
    res, ej = suite(drafters["random"], "-k", "tau", report="random")
    out = res.stdout.str()
    reps = _reports(res)
    assert [n for n, (o, _) in reps.items() if o == "failed"] == ["test_mean_tau"], out
    assert NO_ACCEPTANCE in out
    assert reps["test_tau[humaneval-0]"] == ("skipped", f"{NO_ACCEPTANCE.split(':')[0]}: reported once, by "
                                                        "test_mean_tau")
    assert all(o in ("skipped", "failed") for o, _ in reps.values()) and res.ret == 1
    assert NO_ACCEPTANCE in " ".join(json.loads(ej.read_text())["diagnoses"])


def test_mask_token_not_the_targets_is_named(suite, drafters) -> None:  # type: ignore[no-untyped-def]
    res, _ = suite(drafters["mask"], "-k", "tau or mask_token", report="mask")
    out = res.stdout.str()
    reps = _reports(res)
    assert reps["test_architecture_check[mask_token_match]"][0] == "passed"  # a warning, not a failure
    assert "UserWarning: mask_token_match: 'dflash_config.mask_token_id' 2 ('!')" in out
    assert "mask token '<|mask|>' is id 1" in out
    assert reps["test_mean_tau"][0] == "failed" and "architecture check mask_token_match warned" in out


def test_layout_sglang_serves_passes_the_architecture_checks(suite, drafters) -> None:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as caught:  # read before the run captures warnings (on stderr alone)
        warnings.simplefilter("always")
        res, _ = suite(drafters["layout"], "-k", "architecture_check", report="layout")
    reps = _reports(res)
    assert res.ret == 0 and len(reps) == 11 and all(o == "passed" for o, _ in reps.values()), res.stdout.str()
    skipped = [str(w.message) for w in caught if "load no drafter weight" in str(w.message)]
    assert len(skipped) == 1 and "2 tensor(s) of the checkpoint load no drafter weight and are skipped" in skipped[0]
    assert "'lm_head.weight' [4096, 256]" in skipped[0] and "'model.embed_tokens.weight' [4096, 256]" in skipped[0]


def test_two_keys_loading_one_parameter_are_one_failure(suite, drafters) -> None:  # type: ignore[no-untyped-def]
    res, _ = suite(drafters["duplicate"], "-k", "architecture_check", report="duplicate")
    reps = _reports(res)
    out = res.stdout.str()
    assert [n for n, (o, _) in reps.items() if o == "failed"] == ["test_architecture_check[state_dict_keys]"], out
    assert "keys 'model.norm.weight' and 'norm.weight' both load norm.weight" in out \
        or "keys 'norm.weight' and 'model.norm.weight' both load norm.weight" in out, out
