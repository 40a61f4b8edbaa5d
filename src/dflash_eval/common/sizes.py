"""Memory sizes as options give them: ``512MiB``, ``2GiB``, ``1.5GB`` (parsed without torch, so option checks stay
fast) and printed back in binary units."""

from __future__ import annotations

import re

from dflash_eval.errors import ConfigError

__all__ = ["format_memory", "parse_memory"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*$")


def parse_memory(text: str | int, *, flag: str = "--chunk-memory") -> int:
    """Bytes of a memory size: a number with an optional unit (B, KiB, MiB, GiB, TiB; K/M/G/T are binary too; kB,
    MB, GB, TB decimal), e.g. ``512MiB``, ``2G``, ``1.5GB``. A ConfigError naming ``flag`` for anything else."""
    if isinstance(text, int):
        value, unit = float(text), ""
    else:
        m = _MEMORY.match(str(text))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"{flag}: {text!r} is not a memory size; give a number with an optional unit, e.g. "
                              "512MiB, 2GiB, 1.5GB")
        value, unit = float(m.group(1)), m.group(2).lower()
    size = int(value * _UNITS[unit])
    if size < 1:
        raise ConfigError(f"{flag} must be at least 1 byte, got {text!r}")
    return size


def format_memory(size: int) -> str:
    """``1 GiB``, ``64 MiB``, ``1.5 KiB``: the largest binary unit that leaves a number >= 1."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:g} {unit}"
    return f"{size} B"
