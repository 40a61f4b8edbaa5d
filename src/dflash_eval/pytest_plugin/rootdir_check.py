"""A warning when a suite option's value, given as a separate argument, moved pytest's rootdir.

pytest chooses its rootdir (and ini file) before plugins register their options, and takes every unknown argument
that names an existing path for a test path: ``pytest --pyargs dflash_eval.tests_eval --target-model
../myrepo/models/x`` makes the common ancestor of the current folder and ``../myrepo/models/x`` (or an ini file
found above the model) the rootdir. The defaults that are relative to the rootdir (``reports/``, ``.dflash_cache/``,
``golden/``) then land there, and a run meant to be warm is cold. ``dflash-eval run`` joins option and value itself;
under plain pytest :func:`moved_rootdir` names what happened and where reports and the cache go, as a
``PytestConfigWarning`` at start-up (shown in the warnings summary; an error under ``-W error``).

The rootdir pytest would have chosen without those values is asked from pytest's own rootdir logic
(``_pytest.config.findpaths.determine_setup``); where that cannot be called, a rootdir other than the current
folder counts as moved.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.errors import DFlashEvalError
from dflash_eval.options.settings import OPTIONS
from dflash_eval.pytest_plugin.state import settings_from_config

__all__ = ["moved_rootdir", "warn_moved_rootdir"]

_ROOT_RELATIVE = ("report_dir", "cache_dir", "golden_dir", "floors_file")
_SHOWN = {"report_dir": "reports go to", "cache_dir": "the cache to", "golden_dir": "golden files are read from",
          "floors_file": "τ floors from"}


def _taken_values(config: pytest.Config) -> list[tuple[str, str]]:
    """(flag, value) of every suite option given as ``--flag VALUE`` whose value names an existing path."""
    takes_value = {o.flag for o in OPTIONS if o.kind != "bool"}
    args, here = list(config.invocation_params.args), Path(config.invocation_params.dir)
    return [(a, args[i + 1]) for i, a in enumerate(args[:-1])
            if a in takes_value and not args[i + 1].startswith("-") and (here / args[i + 1]).exists()]


def _rootdir_without_them(config: pytest.Config) -> Path | None:
    """The rootdir pytest's own logic gives for this command line's real test arguments, or None where it cannot be
    asked (its signature differs between pytest releases)."""
    try:
        from _pytest.config.findpaths import determine_setup

        real = [str(a) for a in config.args] if config.args_source == pytest.Config.ArgsSource.ARGS else []
        given: dict[str, Any] = {"inifile": config.option.inifilename, "args": real, "rootdir_cmd_arg": None,
                                 "invocation_dir": Path(config.invocation_params.dir),
                                 "override_ini": config.option.override_ini}
        accepted = inspect.signature(determine_setup).parameters
        return Path(determine_setup(**{k: v for k, v in given.items() if k in accepted})[0])
    except Exception:  # noqa: BLE001 - a pytest whose internals differ: the plain comparison below
        return None


def moved_rootdir(config: pytest.Config) -> str | None:
    """The warning's text when option values given as separate arguments moved the rootdir, else None."""
    if getattr(config.option, "rootdir", None):
        return None  # chosen explicitly
    taken = _taken_values(config)
    if not taken:
        return None
    root, here = Path(config.rootpath), Path(config.invocation_params.dir)
    expected = _rootdir_without_them(config) or here
    if root == expected:
        return None

    try:
        s = settings_from_config(config, check=False)
        where = {n: getattr(s, n) for n in _ROOT_RELATIVE if s.origins.get(n) != "cli" and s.origins.get(n) != "env"}
    except DFlashEvalError:
        where = {n: root / str(next(o.default for o in OPTIONS if o.name == n)) for n in _ROOT_RELATIVE}
    if not where:
        return None  # every rootdir-relative path was given: nothing goes astray
    flag, value = taken[0]
    goes = ", ".join(f"{_SHOWN[n]} {p}" for n, p in where.items())
    return (f"dflash-eval: pytest chose {root} as its rootdir, not {expected}: it took the value of {flag} ({value}) "
            f"for a test path (pytest picks the rootdir before the plugin's options are known). So {goes}. Give "
            f"option values with '=' ({flag}={value}), pass --rootdir={here}, or run `dflash-eval run`, which joins "
            "them.")


def warn_moved_rootdir(config: pytest.Config) -> None:
    """Issue :func:`moved_rootdir`'s warning (at configure time, where pytest shows config warnings)."""
    text = moved_rootdir(config)
    if text:
        config.issue_config_time_warning(pytest.PytestConfigWarning(text), stacklevel=2)
