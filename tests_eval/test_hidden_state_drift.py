"""Hidden-state drift between the evaluation backend and the reference backend (the one the drafter was trained
on), asked as two separate questions whose test names say which one failed.

Does the drift matter for this drafter? (acceptance; the gate)

- ``test_drift_within_budget[<comparison>-L<layer>]``: the worst prompt's relative L2 error at this target layer,
  times ``--drift-budget-safety``, is below the drafter's drift budget: the injected relative feature error at
  which the fitted mean τ drop over the prompts reaches ``--drift-budget-tol``
  (:mod:`dflash_eval.metrics.drift_budget`, measured on this run's reference features and cached). Below the lower
  end of the budget's CI it passes, above the upper end it fails, in between it is skipped as inconclusive (or
  decided on the estimate with ``--drift-budget-conclusive``).
- ``test_functional_drift_accept_len[<comparison>-<prompt>]``: |acceptance length with eval features - with
  reference features| within ``--drift-accept-tol``.

Did the numerics change? (regression detection; a failure also says whether the change matters for τ)

- ``test_drift_regression[<comparison>-<prompt>-L<layer>]``: relative L2 error and cosine of the features within
  the tight regression tolerance (``--drift-rel-tol`` / ``--drift-cos-tol``).
- ``test_fingerprint_regression[L<layer>]``: summary statistics and a random-projection sketch of every target
  layer's features of a fixed text on the evaluation backend against
  ``golden/fingerprints/<device kind>-<backend>-<dtype>.json`` (catches drift across library upgrades; 1e-4
  relative); record with ``--update-fingerprints``; without a golden for the run's kind it skips.

On a CPU-only machine (fla cannot run) the comparisons are torch chunked vs torch recurrent and bf16 vs fp32; the
fla comparison is skipped with a reason saying fla was not checked. ``--kernel-fault`` perturbs the evaluation's
kernels to see the gate fail. (No test name here contains "tau".)
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from dflash_eval.errors import DFlashEvalError
from dflash_eval.metrics.drift import fingerprint_change
from dflash_eval.metrics.drift_budget import gate_reason, impact
from dflash_eval.metrics.verdict import FAIL, INCONCLUSIVE, tau_agrees
from dflash_eval.pytest_plugin import SetupError, collect, safe_id, setup_error_param
from dflash_eval.target.backends import split_backend
from dflash_eval.target.loader import TargetDir


def _marks(c):
    """fla comparisons (with or without a kernel fault) need fla's CUDA kernels: ``-m fla`` / ``-m gpu`` select them
    (``-m "not gpu"`` drops them)."""
    fla = "fla" in (split_backend(c.a.backend)[0], split_backend(c.b.backend)[0])
    return [pytest.mark.fla, pytest.mark.gpu] if fla else []


def _comparison_params(s, *, per_prompt: bool, per_layer: bool) -> list:
    """One param per comparison x prompt (``per_prompt``) x target layer (``per_layer``), ids like
    ``<comparison>-<prompt>-L<layer>``; a skipped comparison gives one skipped param (the other arguments None)."""
    axes = ([[(p.id, f"-{p.id}") for p in s.inputs.prompts]] if per_prompt else []) + (
        [[(i, f"-L{i}") for i in s.evaluation.layer_ids]] if per_layer else [])
    out = []
    for c in s.inputs.comparisons:
        if c.skip_reason:
            out.append(pytest.param(c.name, *[None] * len(axes), id=safe_id(c.name),
                                    marks=[pytest.mark.skip(reason=c.skip_reason), *_marks(c)]))
            continue
        out += [pytest.param(c.name, *(v for v, _ in combo), id=safe_id(c.name + "".join(x for _, x in combo)),
                             marks=_marks(c)) for combo in itertools.product(*axes)]
    return out


_PARAMS = {"test_drift_regression": ("comparison,prompt_id,layer", dict(per_prompt=True, per_layer=True)),
           "test_drift_within_budget": ("comparison,layer", dict(per_prompt=False, per_layer=True)),
           "test_functional_drift_accept_len": ("comparison,prompt_id", dict(per_prompt=True, per_layer=False))}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    name = metafunc.function.__name__
    if name in _PARAMS:
        argnames, axes = _PARAMS[name]
        params, err = collect(config, lambda sess: _comparison_params(sess, **axes))
        metafunc.parametrize(argnames, [pytest.param(SetupError(err), *[None] * argnames.count(","), id="setup-error")]
                             if err else params)
    elif name == "test_fingerprint_regression":
        layers, err = collect(config, lambda s: TargetDir(s.settings.target_model).num_layers)
        metafunc.parametrize("layer", [setup_error_param(err)] if err else
                             [pytest.param(i, id=f"L{i}") for i in range(layers)])


def _impact(eval_session, rel_err: float, *, bound: bool = False) -> str:
    """The τ impact of a feature error, from the drafter's drift budget (measured now if not yet)."""
    try:
        return impact(rel_err, eval_session.drift_budget(), bound=bound)
    except DFlashEvalError as exc:
        return f"τ impact: unknown (the drift budget could not be measured: {type(exc).__name__}: {exc})"


@pytest.fixture(scope="session")
def budget_share(request, eval_session) -> None:
    """Under xdist, when this run includes the gate: every worker that runs drift tests first takes its share of the
    drift budget's ladder levels (the workers measure them side by side), instead of the one worker that happens to
    get the gate tests measuring all of them while the others have nothing left to do."""
    if eval_session.inputs.worker_count > 1 and any(
            getattr(it, "originalname", "") == "test_drift_within_budget" for it in request.session.items):
        try:
            eval_session.drift_budget()
        except DFlashEvalError:
            pass  # the gate tests report it


def test_drift_within_budget(comparison, layer, eval_session, reference_completions) -> None:
    """The gate: this comparison's drift at this layer is small enough not to matter for the drafter's τ: drift x
    safety below the lower end of the budget's CI passes, above its upper end fails, inside it is inconclusive (a
    skip naming the numbers), unless --drift-budget-conclusive decides it on the budget's estimate."""
    if isinstance(comparison, SetupError):
        comparison.fail()
    g = eval_session.drift_gate(comparison)[layer]
    b = eval_session.drift_budget()
    c = eval_session.drift(comparison).comparison
    if g.outcome == INCONCLUSIVE:
        pytest.skip(gate_reason(g, b, f"{c.a.label} vs {c.b.label}, target layer {layer}"))
    if g.outcome == FAIL:
        pytest.fail(gate_reason(g, b, f"{c.a.label} vs {c.b.label}, target layer {layer}"), pytrace=False)


def test_functional_drift_accept_len(comparison, prompt_id, eval_session, drafter, reference_completions,
                                     budget_share) -> None:
    if isinstance(comparison, SetupError):
        comparison.fail()
    d = eval_session.drift(comparison)
    a, b = d.accept[prompt_id]
    c = d.comparison
    assert not (math.isnan(a) or math.isnan(b)), f"prompt {prompt_id!r}: no speculative rounds to compare"
    assert tau_agrees(a, b, c.accept_tol), (
        f"prompt {prompt_id!r}: acceptance length with {c.a.label} features {a:.3f} vs with {c.b.label} features "
        f"{b:.3f}: |diff| {abs(a - b):.3f} > tol {c.accept_tol}")


def test_drift_regression(comparison, prompt_id, layer, eval_session, reference_completions, budget_share) -> None:
    """Regression detection: the two sides' features agree within the tight per-layer tolerance."""
    if isinstance(comparison, SetupError):
        comparison.fail()
    d = eval_session.drift(comparison)
    st = d.stats[prompt_id][layer]
    c = d.comparison
    if st.passed:
        return
    pytest.fail(f"numerics regression (the numerics differ beyond the regression tolerance): {c.a.label} vs "
                f"{c.b.label}, prompt {prompt_id!r}, target layer {layer}: rel_err {st.rel_err:.3e} (tol "
                f"{st.rel_tol:.1e}), cos {st.cos:.6f} (tol {st.cos_tol}), max |diff| {st.max_abs:.3e}; "
                f"{_impact(eval_session, st.rel_err)}", pytrace=False)


def test_fingerprint_regression(layer, eval_session) -> None:
    """Regression detection: the features of a fixed text, per target layer, equal the golden recorded for this
    run's device kind, evaluation backend and dtype (catches numerics that change with torch, triton, fla or
    transformers)."""
    if isinstance(layer, SetupError):
        layer.fail()
    from dflash_eval.golden.writer import FINGERPRINT_DIR, fingerprint_path

    s = eval_session.settings
    fp = eval_session.store.fingerprint()
    path = fingerprint_path(s.golden_dir, fp["device_kind"], fp["backend"], fp["dtype"])
    record = ("`dflash-eval record` with this run's options (or --update-fingerprints in this run's pytest command: "
              "its --device, --hidden-state-backend and --dtype pick the file)")
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
    change = fingerprint_change(want, got)
    if change.changed:
        moved = [int(i) for i, w in golden["layers"].items() if fingerprint_change(w, fp["layers"].get(i, {})).changed]
        keys = ("torch", "triton", "fla", "transformers")
        was = {k: golden.get("versions", {}).get(k) for k in keys}
        now = {k: fp["versions"].get(k) for k in keys}
        fault = f" (this run's kernels carry --kernel-fault {fp['kernel_fault']})" if fp.get("kernel_fault") else ""
        pytest.fail(f"fingerprint regression: the numerics changed since the golden was recorded ({path}){fault}: "
                    f"target layer {layer}: {change.describe()}; layers that moved: {sorted(moved)}; versions at "
                    f"recording {was}, now {now}; " + _probe_change(golden.get("kernel_probe"), fp["kernel_probe"])
                    + _fingerprint_impact(eval_session, layer, want, got, change), pytrace=False)


def _probe_change(was: dict | None, now: dict) -> str:
    """Which kernels' probe digests (dflash_eval.target.kernel_probe) differ from the golden's; nothing for a golden
    recorded without them."""
    if not was:
        return ""
    moved = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    return (f"kernel probe against the golden's: the output of {', '.join(moved)} changed; " if moved
            else "kernel probe: every kernel's output as at recording; ")


def _fingerprint_impact(eval_session, layer: int, want: dict, got: dict, change) -> str:
    """τ impact of a changed fingerprint: none for a layer the drafter does not read; otherwise judged on the
    sketch's estimate of the relative feature change, or (a golden without a sketch) on the RMS change, a lower
    bound of it (| ||a|| - ||b|| | <= ||a - b||)."""
    read = eval_session.evaluation.layer_ids
    if layer not in read:
        return f"τ impact: none directly (the drafter reads target layers {list(read)}, not {layer})"
    if change.rel_change is not None:
        return _impact(eval_session, change.rel_change)
    bound = abs(got["rms"] - want["rms"]) / want["rms"] if want.get("rms") and got.get("rms") is not None else 0.0
    return _impact(eval_session, bound, bound=True)
