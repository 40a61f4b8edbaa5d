"""Where an option's value comes from: registering declared options on a command line (pytest's
``group.addoption`` / ``parser.addini`` or argparse's ``add_argument``) and reading each one's raw value from the
command line, the environment, the ini file or its default (precedence CLI > env > ini > default), parsed by
:func:`dflash_eval.options.values.parse_value` against the folder its source is relative to.

The defaults that point at this repository's bundled fixtures apply only when the root directory is a checkout of
this project (:func:`in_repo`). :func:`dflash_eval.options.settings.add_options` and
:func:`dflash_eval.options.settings.resolve` apply this to the suite's options.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dflash_eval.errors import ConfigError
from dflash_eval.options.declaration import REQUIRED, OptionSpec
from dflash_eval.options.values import parse_value

__all__ = ["gather", "in_repo", "register_options"]

_PROJECT_NAME = re.compile(r'^name\s*=\s*["\']dflash-eval["\']\s*$', re.MULTILINE)


def in_repo(root: Path) -> bool:
    """Whether ``root`` is a checkout of this project (its ``pyproject.toml`` names the project ``dflash-eval``):
    only there do the defaults that point at the bundled ``fixtures/`` apply."""
    try:
        return bool(_PROJECT_NAME.search((Path(root) / "pyproject.toml").read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError):
        return False


def register_options(options: Sequence[OptionSpec], add_argument: Callable[..., Any], *,
                     add_ini: Callable[..., Any] | None = None, skip: Iterable[str] = (),
                     strict_choices: bool = False, command: str = "run") -> None:
    """Register each of ``options`` that ``command`` honours (but those in ``skip``); see
    :func:`dflash_eval.options.settings.add_options`."""
    skip = set(skip)
    for spec in options:
        if spec.name in skip or not spec.applies_to(command):
            continue
        where = f"env {spec.env}, ini {spec.ini}; default: {spec.shown_default}" if add_ini else f"env {spec.env}"
        kw: dict[str, Any] = {"default": None, "dest": spec.name, "help": f"{spec.help} [{where}]".replace("%", "%%")}
        if spec.kind == "bool":
            kw.update(action="store_const", const=True)
        elif spec.kind == "ints":
            kw.update(action="append", metavar="N[,N...]")
        elif spec.kind == "choice" and strict_choices:
            kw.update(choices=spec.choices)
        elif spec.kind == "choice":
            kw.update(metavar="{" + ",".join(spec.choices) + "}")
        add_argument(spec.flag, **kw)
        if add_ini is not None:
            add_ini(spec.ini, help=f"{spec.help} (same as {spec.flag})", type="string", default="")


def _required_error(required: list[OptionSpec], root: Path) -> ConfigError:
    return ConfigError(
        " and ".join(s.flag for s in required) + f" required: {root} is not a checkout of the dflash-eval "
        "repository, so there is no bundled default; give " + ", ".join(
            f"{s.flag} PATH (or env {s.env})" for s in required))


def gather(options: Sequence[OptionSpec], cli: Callable[[str], Any], *, environ: Mapping[str, str],
           invocation_dir: Path, root: Path, ini: Callable[[str], Any] | None = None,
           ini_dir: Path | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(parsed value, origin) of each option: CLI > env > ini > default, each parsed against its source's folder
    (``invocation_dir`` for CLI and env, ``ini_dir`` or ``root`` for the ini file, ``root`` for the defaults).
    Outside a checkout of this repository an option without a default there is one ConfigError naming them all."""
    parsed: dict[str, Any] = {}
    origins: dict[str, str] = {}
    repo, required = in_repo(root), []
    for spec in options:
        raw, env = cli(spec.name), environ.get(spec.env)
        ini_raw = ini(spec.ini) if ini is not None else None
        if raw is not None:
            base, origins[spec.name] = invocation_dir, "cli"
        elif env is not None and env != "":
            raw, base, origins[spec.name] = env, invocation_dir, "env"
        elif ini_raw not in (None, "", []):
            raw, base, origins[spec.name] = ini_raw, ini_dir or root, "ini"
        else:
            raw, base, origins[spec.name] = spec.default_for(repo), root, "default"
            if raw is REQUIRED:
                required.append(spec)
                continue
        parsed[spec.name] = parse_value(spec, raw, base)
    if required:
        raise _required_error(required, root)
    return parsed, origins
