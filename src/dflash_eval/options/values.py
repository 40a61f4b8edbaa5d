"""Parsing one option's raw value (a string from the command line, the environment or the ini file, or a typed
default) into its typed value; relative paths and ``--prompts`` file items are made absolute against a base folder
and normalised (:func:`dflash_eval.common.paths.normal_path`).

Used by :func:`dflash_eval.options.settings.resolve` and :meth:`dflash_eval.options.settings.EvalSettings.from_mapping`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_eval.common.paths import normal_path
from dflash_eval.errors import ConfigError
from dflash_eval.options.declaration import OptionSpec
from dflash_eval.prompts import resolve_spec_paths

__all__ = ["parse_value", "resolve_prompt_spec"]


def resolve_prompt_spec(raw: object, base: Path | None) -> str:
    """``--prompts`` with every relative path made absolute against ``base``
    (:func:`dflash_eval.prompts.resolve_spec_paths`)."""
    return resolve_spec_paths(raw, base)


def parse_value(spec: OptionSpec, raw: Any, base: Path | None) -> Any:
    if raw is None:
        return None
    if spec.kind == "bool":
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{spec.flag}: expected a boolean (1/0, true/false), got {raw!r}")
    if spec.kind == "ints":
        items: list[Any] = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        out: list[int] = []
        for it in items:
            for part in str(it).replace(",", " ").split():
                try:
                    out.append(int(part))
                except ValueError as exc:
                    raise ConfigError(f"{spec.flag}: expected integers, got {part!r}") from exc
        if not out or any(v < 1 for v in out):
            raise ConfigError(f"{spec.flag}: expected one or more integers >= 1, got {raw!r}")
        return tuple(dict.fromkeys(out))
    if spec.kind == "int":
        try:
            return int(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{spec.flag}: expected an integer, got {raw!r}") from exc
    if spec.kind == "float":
        try:
            return float(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{spec.flag}: expected a number, got {raw!r}") from exc
    if spec.kind == "path":
        p = Path(str(raw)).expanduser()
        return normal_path(p if p.is_absolute() or base is None else base / p)
    if spec.kind == "spec":
        return resolve_prompt_spec(raw, base)
    if spec.kind == "choice" and str(raw) not in spec.choices:
        if spec.name.endswith("backend"):
            raise ConfigError(f"{spec.flag}: unknown backend {raw!r}; choose one of {', '.join(spec.choices)}")
        raise ConfigError(f"{spec.flag}: unknown value {raw!r}; choose one of {', '.join(spec.choices)}")
    return str(raw)
