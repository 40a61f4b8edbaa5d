"""Target feature extraction for the drafter: ``hidden_states[i + 1]`` of each target layer id, concatenated.

Only the requested layers are kept: forward hooks on the decoder layers capture the outputs that the HF
``hidden_states`` tuple would hold at index ``i + 1``, and the forward stops right after the deepest requested
layer (no lm_head, no later layers). For ``i == num_layers - 1`` HF's entry is AFTER the final norm, and so is
ours (a checkpoint pointing there is flagged by :mod:`dflash_eval.drafter.checks`). :class:`LayerCapture` holds
the hooks; :func:`layer_features` and the online loop both capture through it.

Example::

    feats, prov = extract_features(target, ids, [1, 3, 5], backend="torch")   # [T, 3*H]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from dflash_eval.errors import ArchitectureMismatch
from dflash_eval.target.backends import use_backend
from dflash_eval.target.provenance import provenance

if TYPE_CHECKING:
    from dflash_eval.target.loader import Target

__all__ = ["LayerCapture", "StopForward", "decoder_parts", "extract_features", "layer_features"]


class StopForward(Exception):
    """Raised by the deepest hook of a stopping :class:`LayerCapture` to skip the layers after it."""


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """(base model, decoder layers, final norm) of a transformers causal LM."""
    get_decoder = getattr(model, "get_decoder", None)
    base = get_decoder() if get_decoder is not None else getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise ArchitectureMismatch(f"{type(model).__name__}: cannot find decoder layers and final norm")
    return base, layers, norm


class LayerCapture:
    """Forward hooks that record ``hidden_states[i + 1]`` of the given target layers on every forward.

    The one place where target features are taken from a model: :func:`layer_features` (one forward, stopped
    after the deepest layer) and the online loop (hooks kept on across prefill, verify and commit forwards,
    each forward overwriting the previous record) both capture through it. Use as a context manager; the hooks
    are removed on exit.

    Example::

        with LayerCapture(model, (1, 3)) as cap:
            model(ids[None])
            feats = cap.features()  # [1, T, 2*H]
    """

    def __init__(self, model: nn.Module, layer_ids: Sequence[int], *, stop_after_deepest: bool = False) -> None:
        """Hook ``layer_ids`` of ``model``; with ``stop_after_deepest`` the deepest hook ends the forward by raising
        :class:`StopForward` (the caller catches it)."""
        _, layers, norm = decoder_parts(model)
        n_layers = len(layers)
        for i in layer_ids:
            if not 0 <= i < n_layers:
                raise ArchitectureMismatch(f"target layer id {i} out of range: the target has {n_layers} layers")
        self.layer_ids = tuple(layer_ids)
        wanted = sorted(set(self.layer_ids))
        self._shallowest = wanted[0]
        self._outputs: dict[int, Tensor] = {}
        self._handles: list[Any] = []
        for i in wanted:
            stop = stop_after_deepest and i == wanted[-1]
            mod = norm if i == n_layers - 1 else layers[i]  # HF's last hidden_states entry is after the final norm
            self._handles.append(mod.register_forward_hook(self._hook(i, stop)))

    def _hook(self, i: int, stop: bool) -> Callable[[nn.Module, tuple[Any, ...], Tensor | tuple[Tensor, ...]], None]:
        def hook(_mod: nn.Module, _inp: tuple[Any, ...], out: Tensor | tuple[Tensor, ...]) -> None:
            self._outputs[i] = (out[0] if isinstance(out, tuple) else out).detach()
            if stop:
                raise StopForward

        return hook

    def per_layer(self) -> dict[int, Tensor]:
        """``{i: [N, T, H]}`` of the last forward, in ``layer_ids`` order. With a device_map the layers live on
        several GPUs: every feature is brought to the shallowest captured layer's device."""
        dev = self._outputs[self._shallowest].device
        return {i: self._outputs[i].to(dev) for i in self.layer_ids}

    def features(self) -> Tensor:
        """The last forward's features concatenated in ``layer_ids`` order: [N, T, L*H]."""
        return torch.cat(list(self.per_layer().values()), dim=-1)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> LayerCapture:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@torch.no_grad()
def layer_features(model: nn.Module, input_ids: Tensor, layer_ids: list[int] | tuple[int, ...]) -> dict[int, Tensor]:
    """Per-layer features ``{i: hidden_states[i+1]}`` for [N, T] (or [T]) ids, each [N, T, H] (or [T, H])."""
    squeeze = input_ids.dim() == 1
    ids = input_ids[None] if squeeze else input_ids
    base, _, _ = decoder_parts(model)
    with LayerCapture(model, layer_ids, stop_after_deepest=True) as cap:
        try:
            base(input_ids=ids.to(model.device), use_cache=False)  # type: ignore[arg-type]  # transformers' .device, seen through nn.Module.__getattr__
        except StopForward:
            pass
    return {i: (t[0] if squeeze else t) for i, t in cap.per_layer().items()}


def extract_features(
    target: Target,
    input_ids: Tensor,
    layer_ids: list[int] | tuple[int, ...],
    *,
    backend: str = "auto",
) -> tuple[Tensor, dict[str, Any]]:
    """Concatenated features [.., T, L*H] of ``layer_ids`` under ``backend``, plus provenance.

    ``target`` is a :class:`dflash_eval.target.loader.Target` (or anything with ``model``, ``device``, ``dtype``).
    """
    with use_backend(backend, target.device) as info:
        per_layer = layer_features(target.model, input_ids, layer_ids)
    feats = torch.cat([per_layer[i] for i in layer_ids], dim=-1)
    prov = provenance(backend=info.name, dtype=target.dtype, device=target.device, kernel=info.chunk_impl,
                      layer_ids=list(layer_ids))
    return feats, prov
