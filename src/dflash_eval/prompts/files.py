"""Prompt files in the suite's own schema: JSONL, one object a line (or a ``.json`` file holding a JSON array).

Each object has the prompt under ``"text"`` (or ``"prompt"``), or a conversation's user turns under ``"turns"``
(a list of strings; ``"prompt"`` may also be such a list), and optionally ``"id"`` and ``"category"``. Without an
id, the prompt is named ``<category>-<n>`` (n counts within the category, from 0); without a category,
``"prompt"``. Blank lines and lines starting with ``//`` are ignored. Ids must be unique and are used in test ids
(``test_tau[humaneval-3]``), so they are restricted to ``[A-Za-z0-9_.-]``. Errors name the file and line (the
array element for a JSON array).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError, json_problem
from dflash_eval.prompts.prompt import Prompt, make_prompt

__all__ = ["load_prompts", "parse_prompt_line"]

_RESERVED = ("id", "category", "text", "prompt", "turns")


def _check_object(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    text = obj["turns"] if "turns" in obj else obj.get("text", obj.get("prompt"))
    if isinstance(text, list):
        if not text or not all(isinstance(t, str) for t in text):
            raise ConfigError(f"{where}: 'turns' must be a non-empty list of strings (the user turns)")
        if not all(t.strip() for t in text):
            raise ConfigError(f"{where}: empty prompt text in 'turns'")
    elif not isinstance(text, str):
        raise ConfigError(f"{where}: missing string field 'text' (or 'prompt', or a list of strings 'turns')")
    elif not text.strip():
        raise ConfigError(f"{where}: empty prompt text")
    for key in ("id", "category"):
        if key in obj and not isinstance(obj[key], (str, int)):
            raise ConfigError(f"{where}: field '{key}' must be a string, got {type(obj[key]).__name__}")
    return obj


def parse_prompt_line(raw: str, *, source: str, line: int) -> dict[str, Any] | None:
    """Parse one JSONL line into a dict (None for blank/comment lines); ConfigError names ``source:line``."""
    s = raw.strip()
    if not s or s.startswith("//"):
        return None
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}:{line}: not valid JSON ({json_problem(exc)})") from exc
    return _check_object(obj, f"{source}:{line}")


def _objects(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """(line or element number, object) of a JSONL file, or of a ``.json`` file holding one JSON array."""
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            arr = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}: not valid JSON ({json_problem(exc)})") from exc
        return [(n, _check_object(o, f"{path}: element {n}")) for n, o in enumerate(arr, start=1)]
    out = []
    for n, raw in enumerate(text.splitlines(), start=1):
        obj = parse_prompt_line(raw, source=str(path), line=n)
        if obj is not None:
            out.append((n, obj))
    return out


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[Prompt]:
    """Read prompts from a JSONL file, in file order, keeping the first ``limit`` (all when None).

    A conversation (``"turns"``) is returned as one prompt; :func:`dflash_eval.prompts.expand_turns` splits it.

    Raises:
        ConfigError: the file is missing or unreadable, a line is not a JSON object with a non-empty ``text``,
            an id is duplicated or has characters outside ``[A-Za-z0-9_.-]``, or no prompt remains.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts file not found: {path} (pass --prompts FILE.jsonl)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read prompts file {path}: {exc}") from exc
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    per_cat: dict[str, int] = {}
    for n, obj in _objects(path, text):
        category = str(obj.get("category", "prompt"))
        pid = obj.get("id")
        if pid is None:
            pid = f"{category}-{per_cat.get(category, 0)}"
        pid = str(pid)
        per_cat[category] = per_cat.get(category, 0) + 1
        if pid in seen:
            raise ConfigError(f"{path}:{n}: duplicate prompt id {pid!r} (first on line {seen[pid]})")
        seen[pid] = n
        value = obj["turns"] if "turns" in obj else obj.get("text", obj.get("prompt"))
        extra = {k: v for k, v in obj.items() if k not in _RESERVED}
        prompts.append(make_prompt(pid, category, value, where=f"{path}:{n}", line=n, extra=extra))
    if not prompts:
        raise ConfigError(f"{path}: no prompts (the file is empty or only has blank/comment lines)")
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"--num-prompts must be >= 1, got {limit}")
        prompts = prompts[:limit]
    return prompts
