"""The golden fingerprint's random-projection sketch: a fixed projection, an unbiased estimate of the relative L2
change of a layer's features, and the comparison that says which statistics moved."""

from __future__ import annotations

import pytest
import torch

from dflash_eval.metrics.drift import (
    FINGERPRINT_TOL,
    SKETCH_DIM,
    fingerprint,
    fingerprint_change,
    layer_drift,
    sketch,
    sketch_rel_err,
)


def test_the_projection_is_fixed_and_linear() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(12, 64), torch.randn(12, 64)
    assert sketch(a) == sketch(a.clone())  # no RNG state involved
    assert len(sketch(a)) == 12 * SKETCH_DIM
    both = torch.tensor(sketch(a + 2 * b), dtype=torch.float64)
    assert torch.allclose(both, torch.tensor(sketch(a), dtype=torch.float64) + 2 * torch.tensor(sketch(b),
                                                                                              dtype=torch.float64))
    assert sketch(torch.zeros(3, 64)) == [0.0] * 3 * SKETCH_DIM


@pytest.mark.parametrize("rel", [1e-5, 1e-3, 3e-2, 0.5])
def test_the_sketch_estimates_the_relative_change(rel: float) -> None:
    torch.manual_seed(1)
    f = torch.randn(40, 256, dtype=torch.float64) * 2 + 0.3
    g = f + rel * f.pow(2).mean().sqrt() * torch.randn_like(f)
    true = layer_drift(g, f).rel_err
    est = sketch_rel_err(sketch(g), sketch(f))
    assert abs(est / true - 1) < 0.25, (est, true)  # 640 projections: a spread of about 4 %


def test_fingerprint_change_names_what_moved() -> None:
    torch.manual_seed(2)
    f = torch.randn(20, 128)
    want = fingerprint(f)
    same = fingerprint_change(want, fingerprint(f.clone()))
    assert not same.changed and same.rel_change == 0.0
    moved = fingerprint_change(want, fingerprint(f + 0.01 * torch.randn_like(f)))
    assert moved.changed and moved.rel_change > FINGERPRINT_TOL and "estimated relative change" in moved.describe()
    old = {k: v for k, v in want.items() if k != "sketch"}  # a golden recorded before sketches
    legacy = fingerprint_change(old, fingerprint(f * 1.01))
    assert legacy.rel_change is None and set(legacy.moved) >= {"rms", "std"} and legacy.changed
    with pytest.raises(ValueError, match="different sizes"):
        sketch_rel_err([1.0, 2.0], [1.0])
