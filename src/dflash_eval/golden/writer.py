"""The only writer of the golden folder: τ floors, the feature fingerprint, and (through syrupy) the reference
completion snapshots.

- ``--update-tau-floors`` rewrites the floors file from a finished run's τ minus ``--tau-margin`` (at
  ``--temperature`` > 0 minus a margin from each prompt's spread over samples, ``--tau-margin-sigmas``;
  :func:`update_floors`);
- ``--update-fingerprints`` rewrites ``<golden>/fingerprints/<device kind>-<backend>-<dtype>.json``, the golden
  per-layer fingerprint of the run's device kind, evaluation backend and dtype (:func:`update_fingerprint`);
- ``--snapshot-update`` lets syrupy rewrite ``<golden>/snapshots/<target dir name>/<test module>/<test>.json``
  through :class:`GoldenJSONExtension` (one sorted JSON file per assertion; the target's folder name keeps the
  snapshots of different targets apart).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syrupy.extensions.json import JSONSnapshotExtension

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.metrics.floors import load_floors, make_floors
from dflash_eval.metrics.sampled_tau import row_margins

if TYPE_CHECKING:
    from syrupy.location import PyTestLocation

    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.blocks import FingerprintBlock
    from dflash_eval.session.run_result import RunResult

__all__ = ["GoldenJSONExtension", "golden_extension", "update_floors", "update_fingerprint", "write_floors",
           "fingerprint_path", "FINGERPRINT_DIR"]

FINGERPRINT_DIR = "fingerprints"


class GoldenJSONExtension(JSONSnapshotExtension):
    """JSON snapshots stored under ``<golden_dir>/snapshots/<target_name>/`` (not ``__snapshots__``); use the
    subclass that :func:`golden_extension` makes for a run's folders."""

    golden_dir: Path = Path("golden")
    target_name: str = "target"

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return str(Path(cls.golden_dir) / "snapshots" / cls.target_name / test_location.basename)


@functools.cache
def golden_extension(golden_dir: Path, target_name: str) -> type[GoldenJSONExtension]:
    """The snapshot extension for one run's golden folder and target (one class per pair, so syrupy sees one
    extension per location; no process-wide state, so runs in one process do not leak into each other)."""
    return type("GoldenJSONExtension", (GoldenJSONExtension,),
                {"golden_dir": Path(golden_dir), "target_name": target_name or "target"})


def write_floors(path: str | Path, doc: dict[str, Any]) -> None:
    atomic_write_text(Path(path), json.dumps(doc, indent=2, sort_keys=False) + "\n")


def update_floors(run: RunResult, settings: EvalSettings) -> Path:
    """Rewrite the floors file from the run's merged result (measured τ minus ``settings.tau_margin``), with the
    run's τ-relevant settings as its context."""
    prev = load_floors(settings.floors_file).raw
    pr = run.prompts
    doc = make_floors(
        {p: r.tau for p, r in pr.items()},
        {int(b): {p: r.ddtree[b] for p, r in pr.items() if b in r.ddtree}
         for b in sorted({b for r in pr.values() for b in r.ddtree}, key=int)},
        margin=settings.tau_margin, context={} if run.context is None else run.context.to_dict(),
        drafter=None if run.drafter is None else run.drafter.fingerprint, previous=prev,
        margins=row_margins(pr, settings.tau_margin_sigmas), sigmas=settings.tau_margin_sigmas)
    write_floors(settings.floors_file, doc)
    return Path(settings.floors_file)


def fingerprint_path(golden_dir: Path, device_kind: str, backend: str, dtype: str) -> Path:
    """Where the golden fingerprint of one (device kind, backend, dtype) lives, e.g.
    ``golden/fingerprints/nvidia-h200-fla-bfloat16.json``."""
    slug = re.sub(r"[^a-z0-9.]+", "-", f"{device_kind}-{backend}-{dtype}".lower()).strip("-")
    return Path(golden_dir) / FINGERPRINT_DIR / f"{slug}.json"


def update_fingerprint(fingerprint: FingerprintBlock, golden_dir: Path) -> Path:
    """Rewrite the golden fingerprint of the fingerprint's own device kind, backend and dtype."""
    path = fingerprint_path(golden_dir, fingerprint.device_kind, fingerprint.backend, fingerprint.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(fingerprint.to_dict(), indent=1, sort_keys=True) + "\n")
    return path
