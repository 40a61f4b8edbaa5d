"""What a cache entry must hold for the request that reads it, checked on every read by :meth:`Cache.read`.

A matching sha256 proves an entry is what was written, not that it answers the request: an entry written by other
code, copied between caches or edited by hand can carry a bf16 tensor under an fp32 key, another shape, or a
manifest produced for another request. :class:`Expected` names what the reader needs: the manifest's key fields
(equal to the request's), each tensor's dtype and shape (``None`` for a free axis), a subset of the manifest's
``meta`` (e.g. the provenance: backend, dtype, layer ids, library versions) and an optional content check (e.g.
token ids inside the vocabulary). :meth:`Expected.problem` returns what is wrong, or None; the cache treats a
problem like corruption (reported, removed and recomputed, or an error under ``--cache-only``).

Example::

    expect = Expected(fields=fields, tensors={"features": (torch.float32, (n_tokens, hidden))},
                      meta={"provenance": {"backend": "torch", "dtype": "float32", "layer_ids": [3]}})
    entry = cache.read("features", key, expect=expect)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Expected", "TensorSpec", "subset_mismatches"]

#: (dtype, shape): ``None`` for any dtype; a shape entry ``None`` for any size on that axis.
TensorSpec = tuple[torch.dtype | None, tuple[int | None, ...]]


def _plain(obj: Any) -> Any:
    """``obj`` as it comes back from the manifest's JSON (tuples become lists, keys strings)."""
    return json.loads(json.dumps(obj, sort_keys=True))


def subset_mismatches(want: Mapping[str, Any], got: Any, prefix: str = "") -> list[str]:
    """Every key of ``want`` whose value differs in ``got`` (nested mappings compared as subsets)."""
    out = []
    got = got if isinstance(got, Mapping) else {}
    for k, v in want.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.extend(subset_mismatches(v, got.get(k), name + "."))
        elif k not in got:
            out.append(f"{name} missing (expected {v!r})")
        elif got[k] != v:
            out.append(f"{name} is {got[k]!r}, expected {v!r}")
    return out


@dataclass(frozen=True)
class Expected:
    """What an entry must hold (see module docstring); every part is optional."""

    fields: Mapping[str, Any] | None = None
    tensors: Mapping[str, TensorSpec] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    validate: Callable[[dict[str, torch.Tensor], dict[str, Any]], str | None] | None = None

    def problem(self, manifest: dict[str, Any], tensors: dict[str, torch.Tensor]) -> str | None:
        """What is wrong with an entry (its manifest and tensors) for this request, or None."""
        if self.fields is not None:
            diffs = subset_mismatches(_plain(self.fields), manifest.get("fields"), "fields.")
            extra = sorted(set(manifest.get("fields") or {}) - set(self.fields))
            diffs += [f"fields.{k} not in the request" for k in extra]
            if diffs:
                return "its manifest was written for another request: " + "; ".join(diffs[:4])
        for name, (dtype, shape) in self.tensors.items():
            t = tensors.get(name)
            if t is None:
                return f"tensor {name!r} is missing (has {sorted(tensors)})"
            if dtype is not None and t.dtype != dtype:
                return f"tensor {name!r} is {t.dtype}, the request needs {dtype}"
            if len(t.shape) != len(shape) or any(w is not None and w != g for w, g in zip(shape, t.shape)):
                want = ["*" if s is None else s for s in shape]
                return f"tensor {name!r} has shape {list(t.shape)}, the request needs {want}"
        diffs = subset_mismatches(_plain(self.meta), manifest.get("meta"), "meta.")
        if diffs:
            return "its provenance does not match the request: " + "; ".join(diffs[:4])
        if self.validate is not None:
            return self.validate(tensors, manifest.get("meta") or {})
        return None
