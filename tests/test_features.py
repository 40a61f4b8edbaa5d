"""Feature extraction pins the ``hidden_states[i + 1]`` convention and keeps only requested layers."""

from __future__ import annotations

import torch

from dflash_eval.target.hidden_states import extract_features, layer_features
from dflash_eval.target.loader import Target


def test_plus_one_convention(tiny_target: Target) -> None:
    ids = torch.arange(5, 45)
    with torch.no_grad():
        hs = tiny_target.model(ids[None], output_hidden_states=True).hidden_states
    n = tiny_target.num_layers
    got = layer_features(tiny_target.model, ids, list(range(n)))
    for i in range(n):
        torch.testing.assert_close(got[i], hs[i + 1][0])
    # entry 0 (embeddings) is never what layer id 0 means
    assert not torch.allclose(got[0], hs[0][0])


def test_last_layer_is_post_norm_like_hf(tiny_target: Target) -> None:
    ids = torch.arange(3, 30)
    n = tiny_target.num_layers
    with torch.no_grad():
        last = tiny_target.model.model(ids[None]).last_hidden_state[0]
    torch.testing.assert_close(layer_features(tiny_target.model, ids, [n - 1])[n - 1], last)


def test_only_requested_layers_and_early_stop(tiny_target: Target) -> None:
    ids = torch.arange(3, 30)
    calls: list[int] = []
    hooks = [layer.register_forward_hook(lambda m, i, o, k=k: calls.append(k))
             for k, layer in enumerate(tiny_target.model.model.layers)]
    try:
        out = layer_features(tiny_target.model, ids, [1, 0])
    finally:
        for h in hooks:
            h.remove()
    assert set(out) == {0, 1}
    assert calls == [0, 1]  # layers after the deepest requested one never ran


def test_concatenation_order_and_provenance(tiny_target: Target) -> None:
    ids = torch.arange(3, 20)
    feats, prov = extract_features(tiny_target, ids, [2, 0], backend="torch")
    per = layer_features(tiny_target.model, ids, [0, 2])
    torch.testing.assert_close(feats, torch.cat([per[2], per[0]], dim=-1))
    assert prov["backend"] == "torch" and prov["dtype"] == "float32"
    assert prov["versions"]["torch"] == torch.__version__ and "transformers" in prov["versions"]


def test_head_read_selectively_equals_loaded_model(tiny_target: Target, tiny_target_dir) -> None:  # type: ignore[no-untyped-def]
    from dflash_eval.target.head import TargetHead

    full = TargetHead.from_model(tiny_target.model)
    part = TargetHead.from_pretrained(tiny_target_dir, dtype="fp32")
    assert torch.equal(part.embed_tokens.weight, full.embed_tokens.weight)
    assert torch.equal(part.lm_head.weight, full.lm_head.weight)
    ids = torch.tensor([1, 2, 3])
    h = part.embed(ids)
    torch.testing.assert_close(part.logits(h), full.logits(h))


def test_layer_capture_on_a_cached_forward_equals_layer_features(tiny_target: Target) -> None:
    """The capture the online loop keeps on its cached forwards gives exactly what layer_features gives."""
    from transformers import DynamicCache

    from dflash_eval.metrics.online_loop import cache_keyword
    from dflash_eval.target.hidden_states import LayerCapture

    ids = torch.arange(3, 30)
    layers = [2, 0, tiny_target.num_layers - 1]
    ref = layer_features(tiny_target.model, ids, layers)
    with torch.no_grad(), LayerCapture(tiny_target.model, layers) as cap:
        cache = {cache_keyword(tiny_target.model): DynamicCache(config=tiny_target.model.config)}
        tiny_target.model(ids[None], **cache, use_cache=True)
        per = cap.per_layer()
        feats = cap.features()
    assert list(per) == layers
    for i in layers:
        assert torch.equal(per[i][0], ref[i])
    assert torch.equal(feats[0], torch.cat([ref[i] for i in layers], dim=-1))


def test_online_loop_captures_the_same_prefill_features_as_layer_features(  # type: ignore[no-untyped-def]
        tiny_target: Target, tiny_drafter, tiny_head, monkeypatch) -> None:
    from dflash_eval.metrics.online_loop import online_generate
    from dflash_eval.target.hidden_states import LayerCapture

    seen: list[torch.Tensor] = []
    real = LayerCapture.features

    def spy(self: LayerCapture) -> torch.Tensor:
        out = real(self)
        seen.append(out)
        return out

    monkeypatch.setattr(LayerCapture, "features", spy)
    prompt = list(range(3, 23))
    online_generate(tiny_target, tiny_drafter, tiny_head, prompt, max_new_tokens=4, backend="torch")
    layers = list(tiny_drafter.config.target_layer_ids)
    ref = layer_features(tiny_target.model, torch.tensor(prompt), layers)
    assert seen, "the online loop took no features through LayerCapture"
    assert torch.equal(seen[0][0], torch.cat([ref[i] for i in layers], dim=-1))


def test_layer_capture_removes_its_hooks_and_checks_layer_ids(tiny_target: Target) -> None:
    import pytest

    from dflash_eval.errors import ArchitectureMismatch
    from dflash_eval.target.hidden_states import LayerCapture

    ids = torch.arange(3, 10)
    with LayerCapture(tiny_target.model, [1]) as cap, torch.no_grad():
        tiny_target.model(ids[None])
    first = cap.per_layer()[1]
    with torch.no_grad():
        tiny_target.model(ids[None] + 1)  # hooks are gone: nothing is recorded any more
    assert torch.equal(cap.per_layer()[1], first)
    with pytest.raises(ArchitectureMismatch, match="out of range"):
        LayerCapture(tiny_target.model, [tiny_target.num_layers])
