"""Evaluation prompts from a JSONL file, one JSON object per line, with errors that name the line.

Each line is an object with the prompt text under ``"text"`` (or ``"prompt"``) and optionally ``"id"`` and
``"category"``. Without an id, the prompt is named ``<category>-<n>`` (n counts within the category, from 0);
without a category, ``"prompt"``. Blank lines and lines starting with ``//`` are ignored. Ids must be unique and
are used in test ids (``test_tau[humaneval-3]``), so they are restricted to ``[A-Za-z0-9_.-]``.

Example::

    from dflash_eval.prompts import load_prompts
    prompts = load_prompts("fixtures/prompts.jsonl", limit=4)
    print([p.id for p in prompts])
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["Prompt", "load_prompts", "parse_prompt_line"]

_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: a stable id (used in test ids), a category and the raw text."""

    id: str
    category: str
    text: str
    line: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def parse_prompt_line(raw: str, *, source: str, line: int) -> dict[str, Any] | None:
    """Parse one JSONL line into a dict (None for blank/comment lines); ConfigError names ``source:line``."""
    s = raw.strip()
    if not s or s.startswith("//"):
        return None
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}:{line}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise ConfigError(f"{source}:{line}: expected a JSON object, got {type(obj).__name__}")
    text = obj.get("text", obj.get("prompt"))
    if not isinstance(text, str):
        raise ConfigError(f"{source}:{line}: missing string field 'text' (or 'prompt')")
    if not text.strip():
        raise ConfigError(f"{source}:{line}: empty prompt text")
    for key in ("id", "category"):
        if key in obj and not isinstance(obj[key], (str, int)):
            raise ConfigError(f"{source}:{line}: field '{key}' must be a string, got {type(obj[key]).__name__}")
    return obj


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[Prompt]:
    """Read prompts from a JSONL file, in file order, keeping the first ``limit`` (all when None).

    Raises:
        ConfigError: the file is missing or unreadable, a line is not a JSON object with a non-empty ``text``,
            an id is duplicated or has characters outside ``[A-Za-z0-9_.-]``, or no prompt remains.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts file not found: {path} (pass --prompts FILE.jsonl)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read prompts file {path}: {exc}") from exc
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    per_cat: dict[str, int] = {}
    for n, raw in enumerate(lines, start=1):
        obj = parse_prompt_line(raw, source=str(path), line=n)
        if obj is None:
            continue
        category = str(obj.get("category", "prompt"))
        pid = obj.get("id")
        if pid is None:
            pid = f"{category}-{per_cat.get(category, 0)}"
        pid = str(pid)
        per_cat[category] = per_cat.get(category, 0) + 1
        if not _ID_RE.match(pid):
            raise ConfigError(f"{path}:{n}: prompt id {pid!r} may only contain letters, digits, '_', '.', '-'")
        if pid in seen:
            raise ConfigError(f"{path}:{n}: duplicate prompt id {pid!r} (first on line {seen[pid]})")
        seen[pid] = n
        extra = {k: v for k, v in obj.items() if k not in ("id", "category", "text", "prompt")}
        prompts.append(Prompt(id=pid, category=category, text=obj.get("text", obj.get("prompt")), line=n, extra=extra))
    if not prompts:
        raise ConfigError(f"{path}: no prompts (the file is empty or only has blank/comment lines)")
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"--num-prompts must be >= 1, got {limit}")
        prompts = prompts[:limit]
    return prompts
