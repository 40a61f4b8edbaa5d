"""Hidden-state drift between the evaluation backend and the reference backend (the one the drafter was trained
on), and its functional effect on the acceptance length.

- ``test_hidden_state_drift[<comparison>-<prompt>-L<layer>]``: relative L2 error and cosine of the features
  within tolerance (``--drift-rel-tol`` / ``--drift-cos-tol``).
- ``test_functional_drift_accept_len[<comparison>-<prompt>]``: |acceptance length with eval features - with
  reference features| within ``--drift-accept-tol``.
- ``test_feature_fingerprint[L<layer>]``: summary statistics of every target layer's features of a fixed text on
  the evaluation backend against ``golden/fingerprints/<device kind>-<backend>-<dtype>.json`` (catches drift across
  library upgrades); record with ``--update-fingerprints``; without a golden for the run's kind it skips.

On a CPU-only machine (fla cannot run) the comparisons are torch chunked vs torch recurrent and bf16 vs fp32; the
fla comparison is skipped with a reason saying fla was not checked. (No test name here contains "tau".)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dflash_eval.pytest_plugin import SetupError, collect, safe_id, setup_error_param
from dflash_eval.target import TargetDir


def _marks(c):
    """fla comparisons need fla's CUDA kernels: ``-m fla`` / ``-m gpu`` select them (``-m "not gpu"`` drops them)."""
    return [pytest.mark.fla, pytest.mark.gpu] if "fla" in (c.a.backend, c.b.backend) else []


def _drift_params(s):
    out = []
    for c in s.inputs.comparisons:
        if c.skip_reason:
            out.append(pytest.param(c.name, None, None, id=safe_id(c.name),
                                    marks=[pytest.mark.skip(reason=c.skip_reason), *_marks(c)]))
            continue
        for p in s.inputs.prompts:
            for layer in s.evaluation.layer_ids:
                out.append(pytest.param(c.name, p.id, layer, id=safe_id(f"{c.name}-{p.id}-L{layer}"), marks=_marks(c)))
    return out


def _accept_params(s):
    out = []
    for c in s.inputs.comparisons:
        if c.skip_reason:
            out.append(pytest.param(c.name, None, id=safe_id(c.name),
                                    marks=[pytest.mark.skip(reason=c.skip_reason), *_marks(c)]))
            continue
        out += [pytest.param(c.name, p.id, id=safe_id(f"{c.name}-{p.id}"), marks=_marks(c)) for p in s.inputs.prompts]
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    name = metafunc.function.__name__
    if name == "test_hidden_state_drift":
        params, err = collect(config, _drift_params)
        metafunc.parametrize("comparison,prompt_id,layer",
                             [pytest.param(SetupError(err), None, None, id="setup-error")] if err else params)
    elif name == "test_functional_drift_accept_len":
        params, err = collect(config, _accept_params)
        metafunc.parametrize("comparison,prompt_id",
                             [pytest.param(SetupError(err), None, id="setup-error")] if err else params)
    elif name == "test_feature_fingerprint":
        layers, err = collect(config, lambda s: _num_layers(s))
        metafunc.parametrize("layer", [setup_error_param(err)] if err else
                             [pytest.param(i, id=f"L{i}") for i in range(layers)])


def _num_layers(s) -> int:
    return TargetDir(s.settings.target_model).num_layers


def test_hidden_state_drift(comparison, prompt_id, layer, eval_session, reference_completions) -> None:
    if isinstance(comparison, SetupError):
        comparison.fail()
    d = eval_session.drift(comparison)
    st = d.stats[prompt_id][layer]
    c = d.comparison
    msg = (f"{c.a.label} vs {c.b.label}, prompt {prompt_id!r}, target layer {layer}: rel_err {st.rel_err:.3e} "
           f"(tol {st.rel_tol:.1e}), cos {st.cos:.6f} (tol {st.cos_tol}), max |diff| {st.max_abs:.3e}")
    assert st.passed, msg


def test_functional_drift_accept_len(comparison, prompt_id, eval_session, reference_completions) -> None:
    if isinstance(comparison, SetupError):
        comparison.fail()
    d = eval_session.drift(comparison)
    a, b = d.accept[prompt_id]
    c = d.comparison
    assert not (math.isnan(a) or math.isnan(b)), f"prompt {prompt_id!r}: no speculative rounds to compare"
    assert abs(a - b) <= c.accept_tol, (
        f"prompt {prompt_id!r}: acceptance length with {c.a.label} features {a:.3f} vs with {c.b.label} features "
        f"{b:.3f}: |diff| {abs(a - b):.3f} > tol {c.accept_tol}")


def _moved(want: dict, got: dict) -> dict[str, tuple[float, float | None]]:
    """The statistics of one layer that differ from the golden by more than 1e-4 relative."""
    return {k: (want[k], got.get(k)) for k in want
            if got.get(k) is None or abs(got[k] - want[k]) > 1e-4 * max(1.0, abs(want[k]))}


def test_feature_fingerprint(layer, eval_session) -> None:
    """Regression detection: the features of a fixed text, per target layer, equal the golden recorded for this
    run's device kind, evaluation backend and dtype (catches numerics that change with torch, triton, fla or
    transformers)."""
    if isinstance(layer, SetupError):
        layer.fail()
    from dflash_eval.golden import FINGERPRINT_DIR, fingerprint_path

    s = eval_session.settings
    fp = eval_session.store.fingerprint()
    path = fingerprint_path(s.golden_dir, fp["device_kind"], fp["backend"], fp["dtype"])
    record = ("`pytest tests_eval -k fingerprint --update-fingerprints` with this run's --device, "
              "--hidden-state-backend and --dtype")
    if s.update_fingerprints:
        pytest.skip(f"recorded: --update-fingerprints writes {path} at the end of the session; nothing was checked")
    if not path.is_file():
        have = sorted(p.name for p in (Path(s.golden_dir) / FINGERPRINT_DIR).glob("*.json"))
        pytest.skip(f"no golden fingerprint for device kind {fp['device_kind']!r}, backend {fp['backend']!r}, dtype "
                    f"{fp['dtype']!r} ({path}; goldens here: {have}): not checked; record it with {record}")
    golden = json.loads(path.read_text())
    if golden.get("target") != eval_session.inputs.target_identity:
        pytest.skip(f"golden fingerprint {path} was recorded for target {str(golden.get('target'))[:12]}, "
                    f"this target is {eval_session.inputs.target_identity[:12]}: not comparable")
    if golden.get("tokens") != fp["tokens"]:
        pytest.skip(f"golden fingerprint {path} was recorded with other token ids of its text (another tokenizer?)")
    want, got = golden["layers"].get(str(layer)), fp["layers"][str(layer)]
    assert want is not None, f"golden fingerprint {path} has no layer {layer}"
    bad = _moved(want, got)
    if bad:
        moved = [int(i) for i, w in golden["layers"].items() if _moved(w, fp["layers"].get(i, {}))]
        keys = ("torch", "triton", "fla", "transformers")
        was = {k: golden.get("versions", {}).get(k) for k in keys}
        now = {k: fp["versions"].get(k) for k in keys}
        pytest.fail(f"target layer {layer} features changed since the golden {path} was recorded: "
                    + ", ".join(f"{k}: golden {w:.6g}, now {g}" for k, (w, g) in bad.items())
                    + f"; layers that moved: {sorted(moved)}; versions at recording {was}, now {now}", pytrace=False)
