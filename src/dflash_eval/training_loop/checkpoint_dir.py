"""The drafter checkpoints of a training output folder, in step order, and whether one is completely written.

A checkpoint is a folder holding ``model.safetensors`` (or ``model.safetensors.index.json`` and its shards), or a
``.pt`` / ``.safetensors`` file, directly inside the folder (or matched by a glob). Its step comes from its name
(``step_20000``, ``step-20000``, ``checkpoint-20000``, ``global_step20000``, ``epoch_1_step_20000``; the last
number after one of those words), else from its own metadata: ``trainer_state.json`` (``global_step``) or a
``step`` / ``global_step`` field of ``config.json`` in the folder. Without a step it sorts after those with one,
by modification time.

:func:`is_complete` is what ``--watch`` asks before reading one: every weight file whole (a safetensors file's
size equals its header's length plus its last tensor's end; a ``.pt`` is a zip archive whose central directory is
readable at its end) and the index's shards all present. A checkpoint still being written fails it; the watch also
waits until the files' sizes and times stopped changing (:func:`stamp`).
"""

from __future__ import annotations

import glob as globlib
import json
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Found", "find_checkpoints", "step_from_name", "step_of", "is_complete", "stamp", "weight_files"]

_STEP = re.compile(r"(?:global_step|checkpoint|step|iter)[-_]?(\d+)", re.IGNORECASE)
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


@dataclass(frozen=True)
class Found:
    """A checkpoint and its step (None: none found in its name or metadata)."""

    path: Path
    step: int | None


def step_from_name(name: str) -> int | None:
    """The step in a checkpoint's file or folder name (the last ``step``/``checkpoint``/``global_step`` number)."""
    base = Path(name).name
    for suffix in _WEIGHT_SUFFIXES:
        base = base.removesuffix(suffix)
    hits = _STEP.findall(base)
    return int(hits[-1]) if hits else None


def _json_step(path: Path, keys: tuple[str, ...]) -> int | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    for key in keys:
        v = data.get(key) if isinstance(data, dict) else None
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def step_of(path: Path) -> int | None:
    """The step of a checkpoint: from its name, else from its folder's ``trainer_state.json`` or ``config.json``."""
    step = step_from_name(path.name)
    if step is not None or not path.is_dir():
        return step
    return _json_step(path / "trainer_state.json", ("global_step", "step")) or \
        _json_step(path / "config.json", ("global_step", "step"))


def _is_checkpoint(path: Path) -> bool:
    if path.is_dir():
        return (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    return path.is_file() and path.suffix in _WEIGHT_SUFFIXES and not path.name.startswith(".")


def weight_files(path: Path) -> list[Path]:
    """The files a checkpoint's weights are in (the folder's config.json too)."""
    if not path.is_dir():
        return [path]
    files = [p for p in (path / "config.json", path / "model.safetensors", path / "model.safetensors.index.json")
             if p.is_file()]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, AttributeError):
            shards = []
        files += [path / s for s in shards]
    return files


def find_checkpoints(root: Path | None = None, *, patterns: list[str] | tuple[str, ...] = ()) -> list[Found]:
    """The checkpoints directly inside ``root`` and those matched by ``patterns`` (globs, ``**`` allowed), in
    step order; a path found twice is listed once."""
    paths: dict[Path, None] = {}
    if root is not None:
        for p in sorted(Path(root).iterdir()):
            if _is_checkpoint(p):
                paths[p.absolute()] = None
    for pat in patterns:
        for hit in sorted(globlib.glob(str(Path(pat).expanduser()), recursive=True)):
            if _is_checkpoint(Path(hit)):
                paths[Path(hit).absolute()] = None
    found = [Found(p, step_of(p)) for p in paths]

    def order(f: Found) -> tuple[bool, int, float, str]:
        mtime = max((q.stat().st_mtime for q in weight_files(f.path) if q.exists()), default=0.0)
        return (f.step is None, f.step or 0, mtime, str(f.path))

    return sorted(found, key=order)


def _safetensors_whole(path: Path) -> bool:
    """The file is as long as its header says: 8-byte header length, the JSON header, then every tensor's bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return False
            (n,) = struct.unpack("<Q", head)
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size == 8 + n + end
    except (OSError, ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError):
        return False


def _file_whole(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return _safetensors_whole(path)
    if path.suffix in (".pt", ".pth"):
        return zipfile.is_zipfile(path)  # torch.save's format: the central directory is written last
    if path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
            return True
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return False
    return path.is_file()


def is_complete(path: Path) -> bool:
    """Whether every weight file of the checkpoint is whole (see module docstring)."""
    if path.is_dir() and not (path / "config.json").is_file():
        return False  # the config is written beside the weights; without it the folder is not finished
    files = weight_files(path)
    return bool(files) and all(f.is_file() and _file_whole(f) for f in files)


def stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime_ns) of each of the checkpoint's files: unchanged between two looks = no writer active."""
    out = []
    for f in weight_files(path):
        try:
            st = f.stat()
        except FileNotFoundError:
            continue
        out.append((f.name, st.st_size, st.st_mtime_ns))
    return tuple(out)
