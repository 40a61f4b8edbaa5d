"""The package's size guard rails, read from the source with ``ast``: no module of ``src/dflash_eval`` over
:data:`MAX_MODULE_LINES` lines, no class over :data:`MAX_CLASS_LINES`, no function or method over
:data:`MAX_FUNCTION_LINES` (from its ``def`` line to its last line, docstring included), and no two modules of one file name
(``__init__.py`` aside). Each test lists every offender with its path, line and size.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dflash_eval"
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _span(node: ast.AST) -> int:
    """Lines from the ``def`` / ``class`` line to the last line of the body (docstring included, decorators not)."""
    return node.end_lineno - node.lineno + 1


def _definitions(kinds: tuple[type, ...], limit: int) -> list[str]:
    out = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, kinds) and _span(node) > limit:
                out.append(f"{_name(path)}:{node.lineno} {node.name}: {_span(node)} lines")
    return out


def test_the_package_has_modules() -> None:
    assert len(_modules()) > 50, f"no package found under {PACKAGE}"


def test_no_module_over_the_limit() -> None:
    long = [f"{_name(p)}: {n} lines" for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern):\n  " + "\n  ".join(long)


def test_no_class_over_the_limit() -> None:
    long = _definitions((ast.ClassDef,), MAX_CLASS_LINES)
    assert not long, f"classes over {MAX_CLASS_LINES} lines:\n  " + "\n  ".join(long)


def test_no_function_over_the_limit() -> None:
    long = _definitions((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n  " + "\n  ".join(long)


def test_no_two_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in _modules():
        if p.name != "__init__.py":
            by_name[p.name].append(_name(p))
    same = [f"{name}: {', '.join(paths)}" for name, paths in sorted(by_name.items()) if len(paths) > 1]
    assert not same, "modules sharing a file name (name each after what it holds):\n  " + "\n  ".join(same)


@pytest.mark.parametrize(("source", "kind", "limit", "found"), [
    ("def f():\n" + "    x = 1\n" * 60, (ast.FunctionDef,), MAX_FUNCTION_LINES, ["f: 61"]),
    ("@dec\ndef f():\n" + "    x = 1\n" * 59, (ast.FunctionDef,), MAX_FUNCTION_LINES, []),
    ("def f():\n" + "    x = 1\n" * 59, (ast.FunctionDef,), MAX_FUNCTION_LINES, []),
    ("class C:\n" + "    x = 1\n" * 250, (ast.ClassDef,), MAX_CLASS_LINES, ["C: 251"]),
])
def test_spans_count_the_definition_and_its_body(source: str, kind: tuple[type, ...], limit: int, found: list[str]) -> None:
    """The measure itself: a definition's lines from its ``def`` / ``class`` line to its last body line."""
    tree = ast.parse(source)
    assert [f"{n.name}: {_span(n)}" for n in ast.walk(tree) if isinstance(n, kind) and _span(n) > limit] == found
