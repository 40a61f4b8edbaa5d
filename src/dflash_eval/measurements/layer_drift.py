"""The drift of one side's features against another's, per prompt and target layer: the ``layer_drift`` measurement.

Its value is :func:`~dflash_eval.metrics.drift.layer_drift` (relative L2 error, cosine, largest absolute difference)
of side ``a``'s features of every prompt's reference sequence against side ``b``'s, at each target layer the drafter
reads: what a drift comparison's statistics and the drift budget's direction read. One ``layer_drift`` cache entry
holds the three numbers of every prompt and layer (float64, bit for bit what the computation gave), keyed by the
exact feature entries of both sides (so by the kernels, and the witness token, they were extracted with),
:data:`~dflash_eval.cache.code_version.CODE_VERSION` and the run's platform fields: a warm run reads one entry
instead of every feature entry of both sides. The entry is derived (recomputed, not refused, under
``--cache-only``). Parameters: ``a`` and ``b`` (the sides).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from dflash_eval.cache.code_version import CODE_VERSION
from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.cache.store import CacheEntry
from dflash_eval.measurements.registry import Measurement, Plan, Subject
from dflash_eval.metrics.drift import LayerDrift, layer_drift

__all__ = ["LayerDrifts", "LAYER_DRIFT"]

#: The statistics of one layer comparison, each a [prompts, layers] float64 tensor of the entry.
_STATS = ("rel_err", "cos", "max_abs")


class LayerDrifts(Measurement[None, dict[str, dict[int, LayerDrift]]]):
    """Side ``a``'s features against side ``b``'s, by prompt and target layer (see module docstring)."""

    name: ClassVar[str] = "layer_drift"
    kind: ClassVar[str] = "layer_drift"

    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[None]:
        a, b = params["a"], params["b"]
        prompts, layers = subject.inputs.prompts, subject.layer_ids
        comps = subject.completions()
        fields = {
            "code": CODE_VERSION, "layers": list(layers), "sides": [a.label, b.label],
            **subject.inputs.platform_fields(subject.settings.torch_dtype),
            "features": [[[subject.store.key(comps[p.id].sequence, i, side) for i in layers] for p in prompts]
                         for side in (a, b)],
        }

        def produce(todo: list[Request]) -> list[Produced]:
            fa, fb = subject.features(a), subject.features(b)
            rows = [[layer_drift(fa[p.id][i], fb[p.id][i]) for i in layers] for p in prompts]
            tensors = {k: torch.tensor([[getattr(d, k) for d in row] for row in rows], dtype=torch.float64)
                       .reshape(len(prompts), len(layers)) for k in _STATS}
            return [Produced(tensors, {"prompt_ids": [p.id for p in prompts]})]

        def prepare(misses: list[Request]) -> None:  # every xdist worker extracts its share first (as τ does)
            subject.features(a)
            subject.features(b)

        shape = (len(prompts), len(layers))
        req = Request(self.kind, fields, expect=Expected(tensors={k: (torch.float64, shape) for k in _STATS}),
                      what=f"the drift of {a.label} against {b.label}", derived=True)
        return Plan([Batch([req], produce)], {"drift": req}, prepare=prepare)

    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[None],
               params: Mapping[str, Any]) -> dict[str, dict[int, LayerDrift]]:
        stats = {k: entries["drift"].tensors[k].tolist() for k in _STATS}
        return {p.id: {i: LayerDrift(rel_err=stats["rel_err"][n][k], cos=stats["cos"][n][k],
                                     max_abs=stats["max_abs"][n][k])
                       for k, i in enumerate(subject.layer_ids)}
                for n, p in enumerate(subject.inputs.prompts)}


#: The built-in measurement, reached by reference: ``ev.measure(LAYER_DRIFT, a=..., b=...)``.
LAYER_DRIFT = LayerDrifts()
