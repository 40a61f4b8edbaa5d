"""The project's documentation: every relative link in the markdown files points at a file or folder of the
repository, and the docs, sources and scripts speak of the project alone (no paths of the machines they were
written on, no notes kept outside the repository).

Run: ``pytest tests/test_docs.py -p no:cacheprovider``
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("fixtures/**/*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...
# Texts that belong to the project (the suite's sources ship to users; the docs and scripts are read in the repo).
PROJECT_TEXT = sorted({*MARKDOWN, *ROOT.glob("src/**/*.py"), *ROOT.glob("tests_eval/*.py"), *ROOT.glob("tests/*.py"),
                       *ROOT.glob("scripts/*"), *ROOT.glob("benchmarks/*.py"), ROOT / "pyproject.toml",
                       ROOT / "tox.ini", ROOT / ".ci" / "run"} - {Path(__file__).resolve()})
FORBIDDEN = [
    (re.compile(r"shared/(reference|design)"), "a note kept outside the repository"),
    (re.compile(r"/work/(main|wt-)"), "a path of the machine it was written on"),
    (re.compile(r"\b(the )?lent (H200|GPU|machine)", re.IGNORECASE), "an internal machine name"),
    (re.compile(r"\(issue \d+\)|\bissue #?\d+\b", re.IGNORECASE), "an internal issue number"),
]


def relative_links(md: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.DOTALL)  # code blocks are not links
    return [t for t in LINK.findall(text) if not EXTERNAL.match(t) and not t.startswith("#")]


def test_markdown_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in MARKDOWN}
    assert {"README.md", "docs/eval_suite.md", "docs/benchmarks.md"} <= names


@pytest.mark.parametrize("md", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(md):
    dead = [t for t in relative_links(md) if not (md.parent / t.split("#")[0]).exists()]
    assert not dead, f"{md.relative_to(ROOT)}: dead relative links {dead}"


def test_link_checker_finds_dead_links(tmp_path):
    md = tmp_path / "x.md"
    (tmp_path / "there.md").write_text("")
    md.write_text("[a](there.md) [b](missing.md#part) [c](https://example.com/x) [d](#anchor) ![e](img/none.png)\n"
                  "```\n[not a link](nowhere.md)\n```\n")
    assert relative_links(md) == ["there.md", "missing.md#part", "img/none.png"]
    assert [t for t in relative_links(md) if not (tmp_path / t.split("#")[0]).exists()] == \
        ["missing.md#part", "img/none.png"]


def test_project_text_speaks_of_the_project_alone():
    problems = []
    for path in PROJECT_TEXT:
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for pattern, what in FORBIDDEN:
                if pattern.search(line):
                    problems.append(f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:100]}")
    assert not problems, "\n".join(problems)
