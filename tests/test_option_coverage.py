"""Every suite option (:data:`dflash_eval.options.settings.OPTIONS`) is passed by at least one test: as ``--name``
(or ``--name=VALUE``), as its environment variable ``DFLASH_EVAL_<NAME>`` or as its ini key ``dflash_<name>``, in a
string that a file under ``tests/`` or ``tests_eval/`` hands on (a command line, a call's argument, an environment
mapping, an ini text). Mentions do not count: docstrings, strings compared against (``"--x" in out``) and regular
expressions searched for. The test lists every option no test passes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_eval.options.settings import OPTIONS

ROOT = Path(__file__).resolve().parents[1]
TEST_DIRS = (ROOT / "tests", ROOT / "tests_eval")
#: Options allowed to be passed by no test yet, each with the reason (none at present).
NOT_YET_PASSED: dict[str, str] = {}
_SEARCHES = {"search", "match", "fullmatch", "findall", "finditer"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def handed_on(source: str) -> Iterator[str]:
    """The string constants of ``source`` (f-strings' literal parts too) but docstrings, strings that are compared
    (``==``, ``in``) or asserted, and the patterns of ``re`` searches."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    parent: dict[int, ast.AST] = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
            continue
        up = parent.get(id(node))
        if isinstance(up, ast.JoinedStr):
            up = parent.get(id(up))
        if isinstance(up, (ast.Compare, ast.Assert)):
            continue
        if isinstance(up, ast.Call) and isinstance(up.func, ast.Attribute) and up.func.attr in _SEARCHES:
            continue
        yield node.value


def passes(text: str, forms: tuple[str, ...]) -> bool:
    """Whether a handed-on string holds one of ``forms`` as a word of its own (``--x``, ``--x=1``, ``dflash_x = 1``,
    ``DFLASH_EVAL_X``)."""
    for word in text.replace(",", " ").split():
        word = word.strip("'\"")
        if any(word == f or word.startswith(f + "=") for f in forms):
            return True
    return False


def passed_options(files: list[Path]) -> dict[str, list[str]]:
    """Option name -> the test files that pass it."""
    strings = {f: list(handed_on(f.read_text(encoding="utf-8"))) for f in files}
    out: dict[str, list[str]] = {}
    for o in OPTIONS:
        forms = (o.flag, o.env, o.ini)
        out[o.name] = [str(f.relative_to(ROOT)) for f, ss in strings.items() if any(passes(s, forms) for s in ss)]
    return out


def test_every_option_is_passed_by_a_test() -> None:
    files = sorted(p for d in TEST_DIRS for p in d.rglob("*.py"))
    assert len(files) > 20, f"no test files found under {TEST_DIRS}"
    found = passed_options(files)
    missing = [o.flag for o in OPTIONS if not found[o.name] and o.name not in NOT_YET_PASSED]
    assert not missing, ("suite options no test passes (as --name, DFLASH_EVAL_<NAME> or dflash_<name>; add a test "
                         "whose outcome depends on each):\n  " + "\n  ".join(missing))
    stale = [f"--{n.replace('_', '-')}" for n in NOT_YET_PASSED if found.get(n)]
    assert not stale, f"options in NOT_YET_PASSED that a test now passes (drop them from the list): {stale}"


@pytest.mark.parametrize(("source", "passed"), [
    ('run("--drift-cos-tol", "1.01")', True),
    ('argv = ["--drift-cos-tol=1.01"]', True),
    ('env = {"DFLASH_EVAL_DRIFT_COS_TOL": "1.01"}', True),
    ('pytester.makeini("[pytest]\\ndflash_drift_cos_tol = 1.01\\n")', True),
    ('f"--prompts x --drift-cos-tol {tol}"', True),
    ('"""Uses --drift-cos-tol."""', False),
    ('assert "--drift-cos-tol" in out', False),
    ('assert out == "--drift-cos-tol"', False),
    ('re.search(r"--drift-cos-tol", out)', False),
    ('run("--drift-cos-tolerance", "1")', False),
    ('msg = "see ``--drift-cos-tol``"', False),
])
def test_what_counts_as_passing_an_option(source: str, passed: bool) -> None:
    forms = ("--drift-cos-tol", "DFLASH_EVAL_DRIFT_COS_TOL", "dflash_drift_cos_tol")
    assert any(passes(s, forms) for s in handed_on(source)) is passed
