"""The probes of one run and the cache's registry of kernel digests: which kernel's output changed since cached
features were extracted.

:class:`KernelProbes` runs :func:`dflash_eval.target.kernel_probe.probe` once per (backend, dtype) of a process and
remembers each digest in ``<cache>/v1/kernel_probes/<context>.json`` (context = backend, dtype, device kind and head
shapes; the :data:`REGISTRY_SIZE` most recent digests). A feature entry keyed by another digest that the registry
knows can then be explained kernel by kernel (:func:`kernel_change`, :func:`change_message`); the feature store
warns with :class:`KernelOutputChanged` and re-extracts.
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
from dflash_eval.target.kernel_probe import KERNEL_KINDS, ProbeResult, probe
from dflash_eval.target.loader import TargetDir
from dflash_eval.target.provenance import device_kind

__all__ = ["KernelOutputChanged", "KernelProbes", "REGISTRY_SIZE", "change_message", "kernel_change"]

REGISTRY_SIZE = 16  # digests remembered per (backend, dtype, device kind, shapes)


class KernelOutputChanged(UserWarning):
    """A kernel's output differs from the one cached features were extracted with (they are re-extracted)."""


def kernel_change(was: dict[str, str], now: ProbeResult) -> list[str]:
    """The kernels (names of :data:`KERNEL_KINDS`) whose digest in ``now`` differs from ``was`` (kernel ->
    digest), a kernel probed on one side only included."""
    live = {k: v.digest for k, v in now.kernels.items()}
    return sorted(k for k in set(was) | set(live) if was.get(k) != live.get(k))


def change_message(result: ProbeResult, was: dict[str, str], changed: list[str], what: str) -> str:
    """``the linear-attention kernel's output changed since these features were cached (...)``."""
    kinds = sorted({KERNEL_KINDS.get(k, k) for k in changed}, key=lambda k: k != "linear-attention")
    detail = "; ".join(f"{k} ({result.kernels[k].function if k in result.kernels else 'not probed now'}): output "
                       f"digest {str(was.get(k, 'none'))[:12]} -> "
                       f"{result.kernels[k].digest[:12] if k in result.kernels else 'none'}" for k in changed)
    return (f"the {' and the '.join(kinds)} kernel's output changed since these {what} were cached (backend "
            f"{result.backend!r}, {result.dtype}, {result.device}: {detail})")


@dataclass
class KernelProbes:
    """The probes of one run, one per (backend, dtype), each run once per process on first use, and the cache's
    registry of the digests features were extracted with (``<cache>/v1/kernel_probes/<context>.json``, context =
    backend, dtype, device kind and head shapes)."""

    target_dir: TargetDir
    device: torch.device | str
    registry_dir: Path | None = None
    record: bool = True  # False (--cache-only): the registry is read, never written
    results: dict[tuple[str, str], ProbeResult] = field(default_factory=dict)
    changes: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def _key(backend: str, dtype: torch.dtype) -> tuple[str, str]:
        return split_backend(backend)[0], str(dtype)

    def probed(self, backend: str, dtype: torch.dtype) -> bool:
        return self._key(backend, dtype) in self.results

    def get(self, backend: str, dtype: torch.dtype) -> ProbeResult:
        """The probe of ``backend`` (its fault suffix dropped) in ``dtype``, run on the first call."""
        key = self._key(backend, dtype)
        if key not in self.results:
            self.results[key] = r = probe(self.target_dir, key[0], dtype, self.device)
            self._register(r)
        return self.results[key]

    @property
    def seconds(self) -> float:
        """Every probe of this process: kernel calls and the modeling module's import."""
        return sum(r.seconds + r.import_seconds for r in self.results.values())

    # ------------------------------------------------------------------------------------ registry
    def _registry_path(self, r: ProbeResult) -> Path | None:
        if self.registry_dir is None:
            return None

        ctx = {"backend": r.backend, "dtype": r.dtype, "device_kind": device_kind(r.device),
               "shapes": r.shapes.to_json()}
        return self.registry_dir / f"{cache_key('kernel_probe', ctx)[:32]}.json"

    def _read(self, path: Path | None) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text()) if path is not None else {}
        except (OSError, ValueError):
            data = {}
        return data if isinstance(data, dict) and isinstance(data.get("digests"), dict) else {"digests": {}}

    def _register(self, r: ProbeResult) -> None:
        """Remember ``r``'s digest (and its kernels' digests) in the registry; an unwritable cache costs only the
        message naming the changed kernel."""
        path = self._registry_path(r)
        data = self._read(path)
        if path is None or not self.record or r.digest in data["digests"]:
            return
        data["digests"][r.digest] = {"kernels": {k: v.digest for k, v in r.kernels.items()},
                                     "functions": {k: v.function for k, v in r.kernels.items()},
                                     "seen": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        data["digests"] = dict(list(data["digests"].items())[-REGISTRY_SIZE:])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass

    def earlier(self, backend: str, dtype: torch.dtype) -> dict[str, dict[str, str]]:
        """Digests other than the live one that features of (backend, dtype) may have been extracted with, the most
        recently registered first: digest -> kernel -> kernel digest."""
        r = self.get(backend, dtype)
        seen = self._read(self._registry_path(r))["digests"].items()
        return {d: dict(v.get("kernels", {})) for d, v in reversed(list(seen)) if d != r.digest and isinstance(v, dict)}

    def note_change(self, backend: str, dtype: torch.dtype, was_digest: str, was: dict[str, str],
                    what: str) -> str | None:
        """Record (once per process and earlier digest) that cached ``what`` were extracted with kernels whose
        digest was ``was_digest``; returns the message the first time, None after."""
        r = self.get(backend, dtype)
        if any(c["label"] == r.label and c["was"] == was_digest for c in self.changes):
            return None
        changed = kernel_change(was, r)
        msg = change_message(r, was, changed, what)
        self.changes.append({"label": r.label, "backend": r.backend, "dtype": r.dtype, "was": was_digest,
                             "now": r.digest, "kernels": changed,
                             "kinds": sorted({KERNEL_KINDS.get(k, k) for k in changed}), "message": msg})
        return msg

    def to_json(self) -> dict[str, Any]:
        """eval.json's ``provenance.kernel_probe``."""
        return {"seconds": round(self.seconds, 6), "probes": [r.to_json() for r in self.results.values()],
                "changed": list(self.changes)}
