"""syrupy extension that keeps the reference-completion snapshots under ``golden/`` (not ``__snapshots__``).

Files land in ``<golden dir>/snapshots/<target dir name>/<test module name>/<test name>.json`` (one sorted JSON
file per assertion; the last folder keeps the test module's name so syrupy relates snapshots to their module;
the target's folder name keeps the snapshots of different targets apart). Update with
``pytest tests_eval/test_reference_completions.py --snapshot-update``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from syrupy.extensions.json import JSONSnapshotExtension

__all__ = ["GoldenJSONExtension", "GOLDEN_DIR"]

GOLDEN_DIR: Path = Path(__file__).resolve().parents[2] / "golden"  # set from --golden-dir by the plugin
TARGET_NAME: str = "target"  # set from --target-model by the plugin


class GoldenJSONExtension(JSONSnapshotExtension):
    """JSON snapshots stored under the golden folder."""

    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        return str(Path(GOLDEN_DIR) / "snapshots" / TARGET_NAME / test_location.basename)
