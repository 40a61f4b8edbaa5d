"""Patch a function where it is used, not only where it is defined: ``patch_uses(monkeypatch, module, name, value)``
sets ``module.name`` and every loaded ``dflash_eval`` module's binding of the same object (``from module import
name`` binds it under the same name) to ``value``, so a spy or a guard sees every call whichever way the code
imported it."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest


def patch_uses(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, value: Any) -> int:
    """Patch ``module.name`` and its bindings in the loaded package modules; how many places were patched."""
    real = getattr(module, name)
    places = [module] + [m for n, m in list(sys.modules.items())
                         if n.startswith("dflash_eval") and m is not module and getattr(m, name, None) is real]
    for place in places:
        monkeypatch.setattr(place, name, value)
    return len(places)
