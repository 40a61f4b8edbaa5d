"""The documentation's references resolve: every relative markdown link (and its ``#anchor``) in README.md, docs/
and fixtures/ points at an existing file and heading; every ``src/dflash_eval/...`` path and every dotted
``dflash_eval.<module>[.<name>]`` the docs name exists in the source tree; every ``docs/<page>.md`` named by the
docs, sources, tests, benchmarks or scripts exists, and a section it names in quotes (``docs/benchmarks.md,
"Cold runs"``) is a heading of that page.

Run: ``pytest tests/test_docs_links.py -p no:cacheprovider``
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MARKDOWN = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("fixtures/**/*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...
SRC_PATH = re.compile(r"\bsrc/dflash_eval/[\w/.-]*\w")
DOTTED = re.compile(r"(?<![\w.-])dflash_eval(?:\.[A-Za-z_]\w*)+")
# A page named with a section in quotes: docs/benchmarks.md, "Cold runs" / docs/eval.md ("Prompt sets").
PAGE_SECTION = re.compile(r"\b((?:docs/)?[\w-]+\.md|README)\b(?:\)|\])?(?:,\s*|\s+\(|:\s*)\"([^\"]{3,})\"")
DOCS_PAGE = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.md\b")
# Texts that may name a docs page: the docs themselves, the sources (shipped), tests, benchmarks, scripts.
NAMING_TEXT = sorted({*MARKDOWN, *ROOT.glob("src/**/*.py"), *ROOT.glob("tests_eval/*.py"), *ROOT.glob("tests/*.py"),
                      *ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*"), *ROOT.glob("fixtures/*.py"),
                      ROOT / "pyproject.toml", ROOT / "tox.ini"} - {Path(__file__).resolve()})


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _without_code_blocks(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def relative_links(md: Path) -> list[str]:
    """The relative link targets of ``md`` outside code blocks, anchors within the page included."""
    return [t for t in LINK.findall(_without_code_blocks(md.read_text(encoding="utf-8"))) if not EXTERNAL.match(t)]


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def headings(md: Path) -> tuple[str, ...]:
    text = _without_code_blocks(md.read_text(encoding="utf-8"))
    return tuple(m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.MULTILINE))


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(md):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def dead_links(md: Path) -> list[str]:
    dead = []
    for target in relative_links(md):
        file, _, anchor = target.partition("#")
        path = md if not file else md.parent / file
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            dead.append(target)
    return dead


@cache
def _module_names(path: Path) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """Names a module defines or imports at its top level (``if`` / ``try`` blocks included) and each class's."""
    names: set[str] = set()
    classes: dict[str, frozenset[str]] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(node.name)
                members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                        ast.ClassDef))}
                members |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                            if isinstance(t, ast.Name)}
                members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                            and isinstance(n.target, ast.Name)}
                classes[node.name] = frozenset(members)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return frozenset(names), classes


def _package_dir(first: str) -> Path:
    # dflash_eval.tests_eval is this repository's tests_eval/ (pyproject's package-dir)
    return ROOT / "tests_eval" if first == "tests_eval" else SRC / "dflash_eval" / first


def resolves(dotted: str) -> bool:
    """Whether ``dflash_eval.a.b...`` names a package, a module, or a name (a class's member) defined in one."""
    parts = dotted.split(".")[1:]
    path, module = SRC / "dflash_eval", SRC / "dflash_eval" / "__init__.py"
    for i, part in enumerate(parts):
        candidate = _package_dir(part) if i == 0 else path / part
        if (candidate / "__init__.py").is_file() or (i == 0 and part == "tests_eval" and candidate.is_dir()):
            path, module = candidate, candidate / "__init__.py"
        elif candidate.with_suffix(".py").is_file():
            path, module = candidate, candidate.with_suffix(".py")
        else:
            names, classes = _module_names(module) if module.is_file() else (frozenset(), {})
            if part not in names:
                return False
            rest = parts[i + 1:]
            return not rest or part not in classes or rest[0] in classes[part]
    return True


@cache
def junit_properties() -> tuple[frozenset[str], tuple[str, ...]]:
    """The junit property names the plugin writes, read from its source so that the docs may name them although
    they are no modules: the literal ones (``dflash_eval.mean_tau``) and the prefixes of formatted ones
    (``dflash_eval.mean_ddtree`` of ``dflash_eval.mean_ddtree<N>``, ``dflash_eval.prompt.`` of
    ``dflash_eval.prompt.<id>.tau``)."""
    tree = ast.parse((SRC / "dflash_eval" / "pytest_plugin" / "junit.py").read_text(encoding="utf-8"))
    literal = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and re.fullmatch(r"dflash_eval(\.\w+)+", n.value)}
    prefixes = {n.values[0].value for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) and n.values
                and isinstance(n.values[0], ast.Constant) and str(n.values[0].value).startswith("dflash_eval.")}
    return frozenset(literal), tuple(sorted(prefixes))


def is_junit_property(dotted: str) -> bool:
    literal, prefixes = junit_properties()
    return dotted in literal or any(dotted.startswith(p) or dotted + "." == p for p in prefixes)


def unresolved_names(md: Path) -> list[str]:
    names = set(DOTTED.findall(md.read_text(encoding="utf-8")))
    return sorted(d for d in names if not resolves(d) and not is_junit_property(d))


def _page(name: str, where: Path) -> Path:
    if name == "README":
        return ROOT / "README.md"
    return ROOT / name if "/" in name else (where.parent / name if (where.parent / name).is_file()
                                            else ROOT / "docs" / name)


def missing_sections(path: Path) -> list[str]:
    text = re.sub(r"\s+", " ", path.read_text(encoding="utf-8", errors="replace").replace("#", " "))
    out = []
    for name, section in PAGE_SECTION.findall(text):
        page = _page(name, path)
        if page.suffix == ".md" and page.is_file() and not any(section in h for h in headings(page)):
            out.append(f"{name}, \"{section}\"")
    return out


# --------------------------------------------------------------------------------------------------------- tests


def test_markdown_files_are_found():
    names = {_rel(p) for p in MARKDOWN}
    assert {"README.md", "docs/manual.md", "docs/reference.md", "docs/design.md", "docs/benchmarks.md"} <= names


@pytest.mark.parametrize("md", MARKDOWN, ids=_rel)
def test_relative_links_and_anchors_resolve(md):
    dead = dead_links(md)
    assert not dead, f"{_rel(md)}: dead relative links {dead}"


@pytest.mark.parametrize("md", MARKDOWN, ids=_rel)
def test_source_paths_named_in_docs_exist(md):
    missing = sorted({p for p in SRC_PATH.findall(md.read_text(encoding="utf-8")) if not (ROOT / p).exists()})
    assert not missing, f"{_rel(md)}: source paths that do not exist {missing}"


@pytest.mark.parametrize("md", MARKDOWN, ids=_rel)
def test_module_names_in_docs_exist(md):
    bad = unresolved_names(md)
    assert not bad, f"{_rel(md)}: dflash_eval names that are no package, module or name in it {bad}"


def test_docs_pages_named_anywhere_exist():
    missing = []
    for path in NAMING_TEXT:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            missing += [f"{_rel(path)}: {p}" for p in sorted(set(DOCS_PAGE.findall(text))) if not (ROOT / p).is_file()]
    assert not missing, "docs pages named but not there:\n" + "\n".join(missing)


def test_sections_named_in_quotes_are_headings():
    missing = [f"{_rel(p)}: {s}" for p in NAMING_TEXT if p.is_file() for s in missing_sections(p)]
    assert not missing, "sections named but no heading of that page:\n" + "\n".join(missing)


def design_table(md: Path) -> dict[str, list[str]]:
    """The package table of the design page: ``{package: [modules named in its row]}`` (a module is a backticked
    bare name in the last cell, e.g. ``store`` or ``eval.schema.json``)."""
    rows = {}
    for m in re.finditer(r"^\| `(\w+)/` \|[^\n]*\| ([^\n]*) \|$", md.read_text(encoding="utf-8"), flags=re.MULTILINE):
        cell = re.sub(r"\([^()]*(?:\([^()]*\)[^()]*)*\)", "", m.group(2))  # what a module holds, in parentheses
        rows[m.group(1)] = re.findall(r"`([\w.]+)`", cell)
    return rows


def test_design_page_names_every_package_and_only_modules_that_exist():
    table = design_table(ROOT / "docs" / "design.md")
    base = SRC / "dflash_eval"
    packages = {p.name for p in base.iterdir() if (p / "__init__.py").is_file()}
    assert packages <= set(table), f"docs/design.md: packages missing from the table: {sorted(packages - set(table))}"
    missing = [f"{pkg}/{mod}" for pkg, mods in table.items() for mod in mods
               if not ((base / pkg / f"{mod}.py").is_file() or (base / pkg / mod).exists())]
    assert not missing, f"docs/design.md names modules that do not exist: {missing}"


# ------------------------------------------------------------------------------------------- the checkers fail


def test_link_checker_finds_dead_links_and_anchors(tmp_path):
    md = tmp_path / "x.md"
    (tmp_path / "there.md").write_text("# A title: with `code`, and (parens)\n## Twice\n## Twice\n")
    md.write_text("# Here\n[a](there.md) [b](missing.md#part) [c](https://example.com/x) [d](#here)\n"
                  "![e](img/none.png)\n"
                  "[f](there.md#a-title-with-code-and-parens) [g](there.md#twice-1) [h](there.md#nowhere) [i](#gone)\n"
                  "```\n[not a link](nowhere.md)\n```\n")
    assert dead_links(md) == ["missing.md#part", "img/none.png", "there.md#nowhere", "#gone"]


def test_name_checker_tells_modules_from_missing_ones():
    assert resolves("dflash_eval.metrics.verdict") and resolves("dflash_eval.session.eval_session.EvalSession")
    assert resolves("dflash_eval.EvalSession") and resolves("dflash_eval.tests_eval")
    assert resolves("dflash_eval.cache.store.Cache.read")
    assert not resolves("dflash_eval.verdict") and not resolves("dflash_eval.cache.store.Cache.no_such_method")
    assert not resolves("dflash_eval.tau.simulate_tau") and not resolves("dflash_eval.metrics.tau.no_such_name")
    assert is_junit_property("dflash_eval.mean_tau") and is_junit_property("dflash_eval.prompt")
    assert is_junit_property("dflash_eval.mean_ddtree") and not is_junit_property("dflash_eval.mean_taus")


def test_design_table_reader(tmp_path):
    md = tmp_path / "design.md"
    md.write_text("| package | concern | modules |\n|---|---|---|\n"
                  "| `cache/` | the cache | `store` (`Cache`: read, `ensure`), `keys` (keys (sha256)); "
                  "`eval.schema.json` |\n")
    assert design_table(md) == {"cache": ["store", "keys", "eval.schema.json"]}


def test_section_checker_finds_missing_headings(tmp_path):
    (tmp_path / "page.md").write_text("# Page\n## Cold runs: batched\nBaseline tolerances, a paragraph\n")
    md = tmp_path / "x.md"
    md.write_text('see page.md, "Cold runs" and page.md ("Baseline tolerances") and (page.md, "Nope")\n')
    assert missing_sections(md) == ['page.md, "Baseline tolerances"', 'page.md, "Nope"']
