"""Target feature extraction for the drafter: ``hidden_states[i + 1]`` of each target layer id, concatenated.

Only the requested layers are kept: forward hooks on the decoder layers capture the outputs that the HF
``hidden_states`` tuple would hold at index ``i + 1``, and the forward stops right after the deepest requested
layer (no lm_head, no later layers). For ``i == num_layers - 1`` HF's entry is AFTER the final norm, and so is
ours (a checkpoint pointing there is flagged by :mod:`dflash_eval.validate`).

Example::

    feats, prov = extract_features(target, ids, [1, 3, 5], backend="torch")   # [T, 3*H]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dflash_eval.backends import use_backend
from dflash_eval.errors import ArchitectureMismatch
from dflash_eval.provenance import provenance

__all__ = ["decoder_parts", "extract_features", "layer_features"]


class _StopForward(Exception):
    """Raised by the last hook to skip the layers after the deepest requested one."""


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """(base model, decoder layers, final norm) of a transformers causal LM."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise ArchitectureMismatch(f"{type(model).__name__}: cannot find decoder layers and final norm")
    return base, layers, norm


@torch.no_grad()
def layer_features(model: nn.Module, input_ids: Tensor, layer_ids: list[int] | tuple[int, ...]) -> dict[int, Tensor]:
    """Per-layer features ``{i: hidden_states[i+1]}`` for [N, T] (or [T]) ids, each [N, T, H] (or [T, H])."""
    squeeze = input_ids.dim() == 1
    ids = input_ids[None] if squeeze else input_ids
    base, layers, norm = decoder_parts(model)
    n_layers = len(layers)
    for i in layer_ids:
        if not 0 <= i < n_layers:
            raise ArchitectureMismatch(f"target layer id {i} out of range: the target has {n_layers} layers")
    wanted = sorted(set(layer_ids))
    deepest = wanted[-1]
    captured: dict[int, Tensor] = {}
    handles = []

    def hook_for(i: int, stop: bool) -> Any:
        def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
            captured[i] = (out[0] if isinstance(out, tuple) else out).detach()
            if stop:
                raise _StopForward

        return hook

    for i in wanted:
        if i == n_layers - 1:  # HF's last hidden_states entry is after the final norm
            handles.append(norm.register_forward_hook(hook_for(i, True)))
        else:
            handles.append(layers[i].register_forward_hook(hook_for(i, i == deepest)))
    try:
        base(input_ids=ids.to(model.device), use_cache=False)
    except _StopForward:
        pass
    finally:
        for h in handles:
            h.remove()
    # With a device_map the layers live on several GPUs: bring every feature to the first layer's device.
    first = captured[wanted[0]].device
    return {i: (captured[i][0] if squeeze else captured[i]).to(first) for i in layer_ids}


def extract_features(
    target: Any,
    input_ids: Tensor,
    layer_ids: list[int] | tuple[int, ...],
    *,
    backend: str = "auto",
) -> tuple[Tensor, dict[str, Any]]:
    """Concatenated features [.., T, L*H] of ``layer_ids`` under ``backend``, plus provenance.

    ``target`` is a :class:`dflash_eval.target.Target` (or anything with ``model``, ``device``, ``dtype``).
    """
    with use_backend(backend, target.device) as info:
        per_layer = layer_features(target.model, input_ids, layer_ids)
    feats = torch.cat([per_layer[i] for i in layer_ids], dim=-1)
    prov = provenance(backend=info.name, dtype=target.dtype, device=target.device, kernel=info.chunk_impl,
                      layer_ids=list(layer_ids))
    return feats, prov
