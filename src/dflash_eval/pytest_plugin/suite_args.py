"""Whether a pytest run includes the eval suite: one of its arguments is, or contains, the folder of the suite's
modules (a folder holding ``test_tau.py``), given as a path (``pytest tests_eval``) or, with ``--pyargs``, as a
package or module name (``pytest --pyargs dflash_eval.tests_eval``, ``dflash-eval run``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

__all__ = ["SUITE_PACKAGE", "runs_suite", "suite_dir", "is_suite_dir"]

SUITE_PACKAGE = "dflash_eval.tests_eval"  # the installed package of the suite's modules (tests_eval/ in the repo)


def is_suite_dir(d: Path) -> bool:
    """A folder of the suite's modules, or a folder holding one."""
    return (d / "test_tau.py").is_file() or any(d.glob("*/test_tau.py"))


def suite_dir() -> Path | None:
    """Where the installed suite's modules are (None when the package is not installed)."""
    return _module_path(SUITE_PACKAGE)


def _module_path(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent that is not a package, or an invalid name
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin) if spec.origin and spec.origin not in ("built-in", "frozen") else None


def runs_suite(config: pytest.Config) -> bool:
    """Whether an argument of this run is (or contains) the suite's folder, as a path or (``--pyargs``) a name."""
    for arg in config.args:
        part = str(arg).split("::")[0]
        p = Path(config.invocation_params.dir, part)
        if not p.exists() and config.option.pyargs and part.replace(".", "").replace("_", "").isalnum():
            found = _module_path(part)
            if found is None:
                continue
            p = found
        d = p.parent if p.is_file() else p
        if p.exists() and is_suite_dir(d):
            return True
    return False
