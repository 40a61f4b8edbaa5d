"""The probes of one run and the cache's registry of kernel digests: which kernel's output changed since cached
features or completions were made.

:class:`KernelProbes` runs :func:`dflash_eval.target.kernel_probe.probe` once per (backend, dtype, probe shape) of a
process and remembers each digest in ``<cache>/v1/kernel_probes/<context>.json`` (context = backend, dtype, device
kind, the probe model's config and the probe shape; the :data:`REGISTRY_SIZE` most recent digests, each with its
kernels' digests in call order). A cache entry keyed by another digest that the registry knows can then be explained
by the first kernel, in call order, whose output moved (:func:`kernel_change`, :func:`change_message`); the feature
store and the references stage warn with :class:`KernelOutputChanged` and produce the entry again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash_eval.cache.store import cache_key
from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.target.backends import split_backend
from dflash_eval.target.kernel_probe import ProbeResult, ProbeShape, probe
from dflash_eval.target.loader import TargetDir
from dflash_eval.target.provenance import device_kind

__all__ = ["KernelOutputChanged", "KernelProbes", "REGISTRY_SIZE", "change_message", "kernel_change"]

REGISTRY_SIZE = 16  # digests remembered per (backend, dtype, device kind, probe config, probe shape)


class KernelOutputChanged(UserWarning):
    """A kernel's output differs from the one cached entries were made with (they are made again)."""


def kernel_change(was: dict[str, str], now: ProbeResult) -> list[str]:
    """The kernels whose digest in ``now`` differs from ``was`` (kernel -> digest), in ``now``'s call order, then
    those probed in ``was`` alone: the first is the first kernel, in call order, whose output moved."""
    live = now.digests()
    changed = [k for k in live if was.get(k) != live[k]]
    return changed + [k for k in was if k not in live]


def change_message(result: ProbeResult, was: dict[str, str], changed: list[str], what: str) -> str:
    """``the conv1d kernel's output changed since these features were cached (...)``: the kind and function of the
    first kernel, in call order, whose output moved, and how many moved after it."""
    if not changed:
        return (f"the kernels' output changed since these {what} were cached (backend {result.backend!r}, "
                f"{result.dtype}, {result.device}, {result.shape.label}: the probe's digest differs, no kernel's "
                "does)")
    first = changed[0]
    k = result.kernels.get(first)
    kind = k.kind if k is not None else "a"
    detail = (f"{first} ({k.function if k is not None else 'not probed now'}): output digest "
              f"{str(was.get(first, 'none'))[:12]} -> {k.digest[:12] if k is not None else 'none'}")
    after = f"; {len(changed) - 1} kernel(s) after it changed too" if len(changed) > 1 else ""
    return (f"the {kind} kernel's output changed since these {what} were cached (backend {result.backend!r}, "
            f"{result.dtype}, {result.device}, {result.shape.label}: first changed in call order {detail}{after})")


@dataclass
class KernelProbes:
    """The probes of one run, one per (backend, dtype, probe shape), each run once per process on first use, and the
    cache's registry of the digests entries were made with (``<cache>/v1/kernel_probes/<context>.json``)."""

    target_dir: TargetDir
    device: torch.device | str
    registry_dir: Path | None = None
    record: bool = True  # False (--cache-only): the registry is read, never written
    results: dict[tuple[str, str, ProbeShape], ProbeResult] = field(default_factory=dict)
    changes: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def _key(backend: str, dtype: torch.dtype, shape: ProbeShape) -> tuple[str, str, ProbeShape]:
        return split_backend(backend)[0], str(dtype), shape

    def probed(self, backend: str, dtype: torch.dtype, shape: ProbeShape) -> bool:
        return self._key(backend, dtype, shape) in self.results

    def get(self, backend: str, dtype: torch.dtype, shape: ProbeShape) -> ProbeResult:
        """The probe of ``backend`` (its fault suffix dropped) in ``dtype`` at ``shape``, run on the first call."""
        key = self._key(backend, dtype, shape)
        if key not in self.results:
            self.results[key] = r = probe(self.target_dir, key[0], dtype, self.device, shape)
            self._register(r)
        return self.results[key]

    @property
    def seconds(self) -> float:
        """Every probe of this process: building and running the probe model, and the modeling module's import."""
        return sum(r.seconds + r.import_seconds for r in self.results.values())

    # ------------------------------------------------------------------------------------ registry
    def _registry_path(self, r: ProbeResult) -> Path | None:
        if self.registry_dir is None:
            return None
        config = {k: v for k, v in self.target_dir.text.items() if not k.startswith("_") and k not in (
            "name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype")}
        ctx = {"backend": r.backend, "dtype": r.dtype, "device_kind": device_kind(r.device), "config": config,
               "shape": r.shape.to_json()}
        return self.registry_dir / f"{cache_key('kernel_probe', ctx)[:32]}.json"

    def _read(self, path: Path | None) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text()) if path is not None else {}
        except (OSError, ValueError):
            data = {}
        return data if isinstance(data, dict) and isinstance(data.get("digests"), dict) else {"digests": {}}

    def _register(self, r: ProbeResult) -> None:
        """Remember ``r``'s digest (and its kernels' digests, in call order) in the registry; an unwritable cache
        costs only the message naming the changed kernel."""
        path = self._registry_path(r)
        data = self._read(path)
        if path is None or not self.record or r.digest in data["digests"]:
            return
        data["digests"][r.digest] = {"kernels": r.digests(), "seen": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        data["digests"] = dict(list(data["digests"].items())[-REGISTRY_SIZE:])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(data, indent=1) + "\n")
        except OSError:
            pass

    def earlier(self, backend: str, dtype: torch.dtype, shape: ProbeShape) -> dict[str, dict[str, str]]:
        """Digests other than the live one that entries of (backend, dtype, shape) may have been made with, the most
        recently registered first: digest -> kernel -> kernel digest (in call order)."""
        r = self.get(backend, dtype, shape)
        seen = self._read(self._registry_path(r))["digests"].items()
        return {d: dict(v.get("kernels", {})) for d, v in reversed(list(seen)) if d != r.digest and isinstance(v, dict)}

    def note_change(self, backend: str, dtype: torch.dtype, shape: ProbeShape, was_digest: str, was: dict[str, str],
                    what: str) -> str | None:
        """Record (once per process, probe and earlier digest) that cached ``what`` were made with kernels whose
        digest was ``was_digest``; returns the message the first time, None after."""
        r = self.get(backend, dtype, shape)
        if any(c["label"] == r.label and c["was"] == was_digest for c in self.changes):
            return None
        changed = kernel_change(was, r)
        msg = change_message(r, was, changed, what)
        first = r.kernels.get(changed[0]) if changed else None
        self.changes.append({"label": r.label, "backend": r.backend, "dtype": r.dtype, "shape": r.shape.to_json(),
                             "was": was_digest, "now": r.digest, "kernels": changed,
                             "first": changed[0] if changed else None,
                             "kinds": [first.kind] if first is not None else [], "what": what, "message": msg})
        return msg

    def to_json(self) -> dict[str, Any]:
        """eval.json's ``provenance.kernel_probe``."""
        return {"seconds": round(self.seconds, 6), "probes": [r.to_json() for r in self.results.values()],
                "changed": list(self.changes)}
