"""The project's texts speak of the project alone: the docs, sources and scripts name no paths of the machines they
were written on and no notes kept outside the repository (that the docs' links and names resolve:
``tests/test_docs_links.py``).

Run: ``pytest tests/test_docs.py -p no:cacheprovider``
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("fixtures/**/*.md")])
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
