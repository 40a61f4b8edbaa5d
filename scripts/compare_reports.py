"""Compare two reports field by field (eval.json, gate.json, or a history.jsonl line by line), ignoring what
legitimately differs between runs (creation time, timings, cache read/write and lock-wait seconds).

Used to check that a refactor preserves behaviour: run the full default suite before and after on a cold cache
and compare the two reports. Exit 0 when they are equal, 1 with one line per differing field otherwise.

Run: ``python scripts/compare_reports.py before/eval.json after/eval.json [--ignore settings.cache_dir ...]``
(a ``.jsonl`` file is read as a list of its lines' objects: ``[0].time`` names the first line's ``time``, and
``*.time`` every line's; ``*`` matches a list index as well, e.g. ``checkpoints.*.seconds``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

IGNORED = ("created", "timings", "cache.*.read_s", "cache.*.write_s", "cache.*.lock_wait_s")


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether ``path`` matches a pattern (``*``: one level, a list index too: ``checkpoints.*.seconds``)."""
    parts = path.replace("[", ".[").lstrip(".").split(".")
    for pat in patterns:
        pp = pat.split(".")
        if len(parts) >= len(pp) and all(a == "*" or a == b for a, b in zip(pp, parts)):
            return True
    return False


def diff(a: Any, b: Any, path: str = "", ignore: list[str] | None = None) -> list[str]:
    """Every field where ``a`` and ``b`` differ, as ``path: a != b`` lines (NaN equals NaN; dict order ignored)."""
    ignore = list(IGNORED) + list(ignore or [])
    if path and _ignored(path, ignore):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                if not _ignored(p, ignore):
                    out.append(f"{p}: only in {'after' if k not in a else 'before'}")
                continue
            out += diff(a[k], b[k], p, ignore)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]", ignore)]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def load(path: Path) -> Any:
    """A JSON file's value, or a JSON-lines file (``.jsonl``) as the list of its lines' values."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                    help="a dotted field to ignore (``*`` matches one level), e.g. settings.cache_dir")
    ns = ap.parse_args(argv)
    lines = diff(load(ns.before), load(ns.after), ignore=ns.ignore)
    for line in lines:
        print(line)
    print(f"{len(lines)} differing field(s) (ignored: {', '.join(IGNORED + tuple(ns.ignore))})")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
