"""Rows of a data set on local disk, in the formats people keep evaluation sets in; nothing is downloaded.

- a Hugging Face ``datasets`` directory written by ``save_to_disk``: a ``Dataset`` (``state.json`` listing Arrow
  stream files) or a ``DatasetDict`` (``dataset_dict.json`` and one such folder per split);
- a dataset repository snapshot (e.g. ``huggingface-cli download openai/gsm8k --repo-type dataset --local-dir D``):
  the split's ``.parquet`` / ``.jsonl`` / ``.json`` / ``.arrow`` files found under the folder (a ``<config>/``
  subfolder first, files named ``<split>.<ext>`` or ``<split>-<shard>.<ext>``);
- a single ``.parquet``, ``.arrow``, ``.jsonl`` or ``.json`` (an array of objects, or JSON lines) file.

Parquet and Arrow need ``pyarrow`` (``pip install 'dflash-eval[sets]'``); JSON needs nothing. Errors name the path
and what was expected there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from dflash_eval.errors import ConfigError, json_problem

__all__ = ["read_rows", "DATA_SUFFIXES"]

DATA_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json")
_META_FILES = {"state.json", "dataset_info.json", "dataset_dict.json", "dataset_infos.json"}


def _pyarrow(path: Path) -> ModuleType:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as exc:
        raise ConfigError(f"reading {path} needs pyarrow, which is not installed: pip install 'dflash-eval[sets]' "
                          "(or pip install pyarrow); JSON/JSONL files need nothing extra") from exc
    return pyarrow


def _read_arrow(path: Path) -> list[dict[str, Any]]:
    pa = _pyarrow(path)
    try:
        with pa.memory_map(str(path), "r") as src:
            try:
                table = pa.ipc.open_stream(src).read_all()  # what datasets writes
            except pa.ArrowInvalid:
                src.seek(0)
                table = pa.ipc.open_file(src).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{path}: not a readable Arrow file ({exc})") from exc
    return table.to_pylist()


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    pa = _pyarrow(path)
    try:
        return pa.parquet.read_table(str(path)).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{path}: not a readable Parquet file ({exc})") from exc


def _read_json(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if path.suffix == ".json" and text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # JSON lines in a .json file
        rows: list[Any] | None
        if isinstance(data, list):
            rows = data
        elif isinstance(data, dict) and isinstance(data.get("data", data.get("rows")), list):
            rows = data.get("data", data.get("rows"))
        elif data is not None and not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON array of objects (or JSON lines), got {type(data).__name__}")
        else:
            rows = None
        if rows is not None:
            for n, r in enumerate(rows, start=1):
                if not isinstance(r, dict):
                    raise ConfigError(f"{path}: element {n} is {type(r).__name__}, expected an object")
            return rows
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s:
            continue
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not valid JSON ({json_problem(exc)})") from exc
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        rows.append(obj)
    return rows


def _read_file(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".arrow":
        return _read_arrow(path)
    if suffix in (".jsonl", ".json"):
        return _read_json(path)
    raise ConfigError(f"{path}: unknown data file type {suffix!r}; expected one of {', '.join(DATA_SUFFIXES)} or a "
                      "datasets directory")


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _saved_dataset(folder: Path) -> list[dict[str, Any]]:
    """A ``Dataset.save_to_disk`` folder: the Arrow files listed in state.json, in order."""
    state = _load_json(folder / "state.json")
    files = [f["filename"] for f in state.get("_data_files", []) if isinstance(f, dict) and "filename" in f]
    if not files:
        files = sorted(p.name for p in folder.glob("*.arrow"))
    if not files:
        raise ConfigError(f"{folder}: state.json lists no data files and there is no .arrow file (an incomplete "
                          "save_to_disk folder?)")
    rows: list[dict[str, Any]] = []
    for name in files:
        if not (folder / name).is_file():
            raise ConfigError(f"{folder}/{name}: listed in state.json but missing")
        rows += _read_arrow(folder / name)
    return rows


def _pick_split(splits: list[str], split: str | None, where: Path) -> str:
    if split is not None and split in splits:
        return split
    if len(splits) == 1 and split is None:
        return splits[0]
    raise ConfigError(f"{where}: " + (f"no split {split!r}; " if split else "several splits; ") +
                      f"it has {splits} (name one: a split in the set definition, or 'split' in a YAML/TOML set file)")


def _snapshot_files(folder: Path, split: str | None, config: str | None) -> list[Path]:
    root = folder / config if config and (folder / config).is_dir() else folder
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES
                   and p.name not in _META_FILES
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))  # no .cache/ etc.
    if not files:
        raise ConfigError(f"{folder}: no data files ({', '.join(DATA_SUFFIXES)}) and no datasets save_to_disk "
                          "metadata (state.json / dataset_dict.json)")
    if split:
        pat = re.compile(rf"^{re.escape(split)}([-_.].*)?\.[a-z]+$", re.IGNORECASE)
        named = [p for p in files if pat.match(p.name) or p.parent.name == split]
        if named:
            files = named
    kinds = {p.suffix.lower() for p in files}
    parents = {p.parent for p in files}
    if len(files) > 1 and (len(kinds) > 1 or len(parents) > 1):
        listing = ", ".join(str(p.relative_to(folder)) for p in files[:8]) + (" ..." if len(files) > 8 else "")
        raise ConfigError(f"{folder}: cannot tell which files hold split {split!r}"
                          + (f" of config {config!r}" if config else "") + f": found {listing}; point at one file "
                          "or folder instead")
    return files


def read_rows(path: str | Path, *, split: str | None = None, config: str | None = None) -> list[dict[str, Any]]:
    """Every row of the data set at ``path`` as a dict (see module docstring for the layouts).

    Args:
        split: which split of a ``DatasetDict`` or repository snapshot (ignored for a single file or ``Dataset``).
        config: a repository snapshot's configuration subfolder (e.g. ``main`` for GSM8K), used when present.
    """
    path = Path(path)
    if path.is_file():
        return _read_file(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: not found")
    if (path / "state.json").is_file():
        return _saved_dataset(path)
    if (path / "dataset_dict.json").is_file():
        splits = _load_json(path / "dataset_dict.json").get("splits") or sorted(
            p.name for p in path.iterdir() if (p / "state.json").is_file())
        return _saved_dataset(path / _pick_split(list(splits), split, path))
    files = _snapshot_files(path, split, config)
    rows: list[dict[str, Any]] = []
    for f in files:
        rows += _read_file(f)
    return rows
