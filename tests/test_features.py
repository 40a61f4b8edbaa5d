"""Feature extraction pins the ``hidden_states[i + 1]`` convention and keeps only requested layers."""

from __future__ import annotations

import torch

from dflash_eval.features import extract_features, layer_features
from dflash_eval.target import Target


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
    from dflash_eval.head import TargetHead

    full = TargetHead.from_model(tiny_target.model)
    part = TargetHead.from_pretrained(tiny_target_dir, dtype="fp32")
    assert torch.equal(part.embed_tokens.weight, full.embed_tokens.weight)
    assert torch.equal(part.lm_head.weight, full.lm_head.weight)
    ids = torch.tensor([1, 2, 3])
    h = part.embed(ids)
    torch.testing.assert_close(part.logits(h), full.logits(h))
