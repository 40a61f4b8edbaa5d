"""The package's layers, read from the source with ``ast``: every unit of ``src/dflash_eval`` (a subpackage, or one of
the root modules) has its place in :data:`LAYERS`, no import points from a lower layer to a higher one, no two
modules import each other through any chain (imports under ``if TYPE_CHECKING:`` and inside functions count), every
import inside a function says why it is there, and no two modules share a file name. One exception, narrow and
tested: the hook specifications may name their parameters' types for type checkers (:data:`TYPED_SPECS`). Sizes are
no rule here: run ``python tests/test_layout.py`` for the size of every module, class and function, as information.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "dflash_eval"

#: The units of the package from the lowest layer to the highest: a unit imports only units before it (and
#: itself). One line each: what the layer holds.
LAYERS: tuple[str, ...] = (
    "errors",         # the error types every message goes through
    "hookspec",       # the plugin hook specifications (pytest and pluggy only)
    "common",         # atomic writes, paths, dtypes, sizes, the host and git state; progress, timings, threads
    "cache",          # the content-addressed cache and its one production protocol
    "prompts",        # prompt files, built-in sets, chat formatting
    "sglang",         # the SGLang client, launcher and service
    "target",         # the target model: loading, head, backends, kernels, features, generation
    "drafter",        # the DFlash drafter: config, model, checks, checkpoints
    "metrics",        # τ, DDTree, the online loop, drift, the drift budget, statistics, floors, the verdict
    "options",        # every option declared once, resolved, checked; how a run was invoked
    "inputs",         # what a run needs besides the drafter
    "references",     # greedy and sampled reference completions, the teacher-forced argmax; a server's, checked
    "features",       # the target's hidden-state features
    "measurements",   # the registry, its runner, the built-in specs; one drafter evaluated: checks, drift
    "session",        # one run composed: stages, floors and baseline checked, the reference drafter, the typed result
    "golden",         # the golden records: which a run needs, the one writer
    "report",         # eval.json, eval.md, plots, gate.json: one rendering layer
    "training_loop",  # evaluating checkpoints while they train: Evaluator, history, trends, trackers
    "pytest_plugin",  # the suite as pytest tests: hooks (delegating), fixtures, state
    "cli",            # the dflash-eval command
    "dflash_eval",    # the public face (lazy exports)
    "__main__",       # python -m dflash_eval
    "testing",        # random tiny models and training recipes for tests (not in the wheel)
)


@dataclass(frozen=True)
class Import:
    source: str        # importing module (dotted)
    target: str        # imported module (dotted, within the package)
    line: int
    in_function: bool
    reason: bool       # a comment on the import's line or the line above
    type_only: bool = False  # under ``if TYPE_CHECKING:``


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def unit(module: str) -> str:
    """The layer unit of a dotted module name: its subpackage, or the root module's own name."""
    parts = module.split(".")
    return "dflash_eval" if len(parts) == 1 else parts[1]


def _resolve(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known and name.split(".")[0] == "dflash_eval":
            yield name


def imports_of(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every import of a package module by ``module`` (module level, TYPE_CHECKING blocks and functions alike)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    out: list[Import] = []

    def reason(lineno: int) -> bool:
        here = lines[lineno - 1]
        above = lines[lineno - 2].strip() if lineno >= 2 else ""
        return "#" in here or above.startswith("#")

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _resolve(module, path.name == "__init__.py", child, known):
                    if target != module:
                        out.append(Import(module, target, child.lineno, in_function, reason(child.lineno),
                                          type_only))
            visit(child, nested, type_only or _type_checking(child))

    visit(ast.parse(source, filename=str(path)), False, False)
    return out


def _type_checking(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block."""
    return isinstance(node, ast.If) and (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING" or
                                         isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")


#: The one module whose type-only imports may name any layer: the hook specifications type their parameters as
#: pytest's own hookspec does (the classes of the run, imported for type checkers only); at run time it imports
#: nothing of the package (:func:`test_the_hookspec_imports_nothing_of_the_package_at_run_time`).
TYPED_SPECS = "dflash_eval.hookspec"


def all_imports() -> list[Import]:
    mods = _modules()
    known = set(mods)
    return [imp for m, p in mods.items() for imp in imports_of(m, p, known)
            if not (imp.source == TYPED_SPECS and imp.type_only)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def _graph(imports: list[Import], key: object) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        a, b = key(imp.source), key(imp.target)  # type: ignore[operator]
        if a != b:
            edges[a].add(b)
    return edges


# ------------------------------------------------------------------------------------------------------------ tests
def test_the_package_has_modules() -> None:
    assert len(_modules()) > 50, f"no package found under {PACKAGE}"


def test_every_unit_has_a_layer() -> None:
    units = {unit(m) for m in _modules()}
    missing = sorted(units - set(LAYERS))
    gone = sorted(set(LAYERS) - units)
    assert not missing, f"units without a place in LAYERS (tests/test_layout.py): {missing}"
    assert not gone, f"LAYERS names units that no longer exist: {gone}"


def test_imports_point_down_the_layers() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    against = sorted(f"{i.source}:{i.line} imports {i.target} ({unit(i.source)} may not import {unit(i.target)}, a "
                     "higher layer)" for i in all_imports()
                     if unit(i.source) in rank and unit(i.target) in rank
                     and rank[unit(i.target)] > rank[unit(i.source)])
    assert not against, "imports against the layer order:\n  " + "\n  ".join(against)


def test_no_import_cycle_between_modules() -> None:
    found = cycles(_graph(all_imports(), lambda m: m))
    assert not found, "import cycles between modules:\n  " + "\n  ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_between_packages() -> None:
    found = cycles(_graph(all_imports(), unit))
    assert not found, "import cycles between packages:\n  " + "\n  ".join(" <-> ".join(c) for c in found)


def test_the_hookspec_imports_nothing_of_the_package_at_run_time() -> None:
    mods = _modules()
    found = imports_of(TYPED_SPECS, mods[TYPED_SPECS], set(mods))
    assert found and all(i.type_only for i in found), [i for i in found if not i.type_only]


def test_imports_inside_functions_say_why() -> None:
    """An import inside a function is there to keep ``dflash-eval --help`` and ``pytest --help`` free of torch (or
    for a like reason); it says so in a comment on its line or the line above."""
    bare = sorted(f"{i.source}:{i.line} imports {i.target}" for i in all_imports() if i.in_function and not i.reason)
    assert not bare, "imports inside functions without a one-line reason:\n  " + "\n  ".join(bare)


def test_the_package_docstring_names_every_package_and_no_other() -> None:
    """``dflash_eval.__doc__`` lists the packages by concern: exactly those there are."""
    import re

    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))) or ""
    listed = doc.split("Packages, by concern", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"``(\w+)``", listed))
    real = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert named == real, f"named but not there: {sorted(named - real)}; there but not named: {sorted(real - named)}"


def test_no_two_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for m, p in _modules().items():
        if p.name != "__init__.py":
            by_name[p.name].append(m)
    same = [f"{name}: {', '.join(paths)}" for name, paths in sorted(by_name.items()) if len(paths) > 1]
    assert not same, "modules sharing a file name (name each after what it holds):\n  " + "\n  ".join(same)


# ------------------------------------------------------------------------------------- the checks can fail
@pytest.mark.parametrize(("edges", "expected"), [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"c"}}, []),
])
def test_cycles_finds_every_loop(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_imports_of_sees_type_checking_and_function_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dflash_eval.errors import X\n"
                   "def f():\n    from dflash_eval.cache import keys\n"
                   "def g():\n    # torch: only when asked\n    import dflash_eval.common\n")
    known = {"dflash_eval.errors", "dflash_eval.cache", "dflash_eval.cache.keys", "dflash_eval.common"}
    got = imports_of("dflash_eval.metrics.m", src, known)
    assert [(i.target, i.in_function, i.reason, i.type_only) for i in got] == [
        ("dflash_eval.errors", False, False, True), ("dflash_eval.cache.keys", True, False, False),
        ("dflash_eval.common", True, True, False)]


# ------------------------------------------------------------------------------------- sizes, as information
def _sizes() -> Iterator[tuple[str, str, int]]:
    for m, p in _modules().items():
        text = p.read_text(encoding="utf-8")
        yield m, "module", len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                yield f"{m}.{node.name}", kind, (node.end_lineno or node.lineno) - node.lineno + 1


if __name__ == "__main__":  # python tests/test_layout.py: the size of everything, largest first, as information
    rows = sorted(_sizes(), key=lambda r: -r[2])
    for kind, plural in (("module", "modules"), ("class", "classes"), ("function", "functions")):
        these = [r for r in rows if r[1] == kind]
        print(f"{len(these)} {plural}; largest:")
        for name, _, n in these[:10]:
            print(f"  {n:5d}  {name}")
