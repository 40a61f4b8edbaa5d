"""The package as a user gets it: build the wheel, install it into a fresh virtual environment outside the checkout,
and run the installed suite from a temporary directory against the bundled fixtures.

The fresh environment gets the wheel only (``pip install --no-deps --no-index``); its dependencies (torch among them)
are the running environment's, made visible through a ``.pth`` file instead of being downloaded again, and a check
that every requirement the wheel declares is satisfied there replaces pip's resolver. Steps (each asserted):

1. ``pip wheel`` of a copy of the sources (pyproject, README, src/, tests_eval/): the wheel holds the plugin, the
   suite's modules as ``dflash_eval.tests_eval``, the eval.json schema and the ``pytest11`` entry point;
2. ``python -m venv --without-pip``, ``pip --python VENV install --no-deps --no-index WHEEL``;
3. from an empty temporary folder: ``dflash_eval`` is imported from the venv, ``pytest --help`` lists the
   "dflash-eval" options and imports no torch, ``dflash-eval --help`` works;
4. ``pytest --pyargs dflash_eval.tests_eval`` without ``--target-model``: exit 4 and one message;
5. ``dflash-eval run`` on 2 bundled prompts plus the documented user test file: exit 0, reports in the temporary
   folder (not in the checkout), every suite test and the user's tests recorded, eval.json valid against the schema;
   then a first run on a new model (the bundled one copied into a repository of its own, nothing recorded): one
   usage error naming ``dflash-eval record``, ``dflash-eval gate`` exits 2 naming the floors file, and after
   ``dflash-eval record`` the same ``dflash-eval run`` is green without a PytestWarning;
6. in the checkout, ``pytest`` with the installed entry point and the repository's conftest: the plugin once;
7. the trainer examples (``docs/examples/train_loop.py``, ``docs/examples/specforge_callback.py``) copied into a
   folder of their own and run with the installed package for two steps on the bundled target (its path passed
   in), the drafter built and trained by the example itself: each writes history.jsonl, history.md and
   history.png, the loop TensorBoard scalars with the verdict, the callback its checkpoints and the numbers it
   hands to the trainer's tracker; ``dflash_eval.testing`` (not in the wheel) is not importable there.

The wheel and its environment are built once for the module (the ``installed`` fixture).

Run: ``pytest tests/test_wheel_install.py -p no:cacheprovider`` (4-6 minutes on a 2-core CPU).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
SOURCES = ("pyproject.toml", "README.md", "src", "tests_eval")
CHECK_REQUIREMENTS = """
import importlib.metadata as md
from packaging.requirements import Requirement
bad = []
for raw in md.requires("dflash-eval") or []:
    req = Requirement(raw)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        bad.append(f"{req}: not installed")
        continue
    if not req.specifier.contains(version, prereleases=True):
        bad.append(f"{req}: found {version}")
print("UNSATISFIED", bad)
"""


def run(cmd: list[str], cwd: Path, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_") and k != "PYTHONPATH"}
    env.update(kw.pop("env", {}))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def build_wheel(tmp: Path) -> Path:
    src = tmp / "sources"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    try:  # no build isolation when this environment can build (fast, offline); else pip's isolated build
        import setuptools

        isolation = [] if int(setuptools.__version__.split(".")[0]) >= 77 else None
    except ImportError:
        isolation = None
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), f"{src}{os.sep}"]
    p = run(cmd + (["--no-build-isolation"] if isolation is not None else []), cwd=tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = (tmp / "dist").glob("dflash_eval-*.whl")
    return wheel


@dataclass(frozen=True)
class Installed:
    """The wheel installed into a fresh virtual environment: its folder, python, site-packages; the wheel; how long
    building and installing took."""

    venv: Path
    py: Path
    site: Path
    wheel: Path
    seconds: float


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel once and install it (and nothing else) into a fresh venv; the running environment's
    packages are made visible through a .pth file (module docstring)."""
    t0 = time.perf_counter()
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp).returncode == 0
    py = venv / "bin" / "python"
    p = run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
             str(wheel)], cwd=tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    site = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site.stdout.strip(), "_dflash_eval_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return Installed(venv, py, Path(site.stdout.strip()), wheel, time.perf_counter() - t0)


def test_installed_wheel_runs_the_suite_from_anywhere(tmp_path, installed):
    t0 = time.perf_counter()
    wheel, venv, py = installed.wheel, installed.venv, installed.py
    site = Path(installed.site)
    names = zipfile.ZipFile(wheel).namelist()
    for f in ("dflash_eval/pytest_plugin/__init__.py", "dflash_eval/tests_eval/test_tau.py",
              "dflash_eval/tests_eval/__init__.py", "dflash_eval/report/eval.schema.json"):
        assert f in names, f"{f} missing from {wheel.name}"
    eps = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[pytest11]\ndflash_eval.pytest_plugin = dflash_eval.pytest_plugin" in eps
    t_install = installed.seconds

    work = tmp_path / "work"
    work.mkdir()
    p = run([str(py), "-c", "import dflash_eval; print(dflash_eval.__file__)"], cwd=work)
    assert p.stdout.strip().startswith(str(venv)), f"dflash_eval imported from {p.stdout.strip()}, not the venv"
    p = run([str(py), "-c", CHECK_REQUIREMENTS], cwd=work)
    assert p.stdout.strip().splitlines()[-1] == "UNSATISFIED []", p.stdout + p.stderr
    p = run([str(py), "-c", "import sys, pytest; rc = pytest.main(['--help']); "
                            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)"], cwd=work)
    assert p.returncode == 0 and "dflash-eval" in p.stdout and "--target-model" in p.stdout, p.stderr
    assert p.stdout.strip().endswith("TORCH False")
    p = run([str(venv / "bin" / "dflash-eval"), "--help"], cwd=work)
    assert p.returncode == 0 and "run" in p.stdout and "gate" in p.stdout, p.stderr

    p = run([str(py), "-m", "pytest", "--pyargs", "dflash_eval.tests_eval", "-p", "no:cacheprovider"], cwd=work)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "--target-model and --drafter required" in p.stderr and "collected" not in p.stdout

    shutil.copy(ROOT / "docs" / "examples" / "test_own_checks.py", work / "test_own_checks.py")
    p = run([str(venv / "bin" / "dflash-eval"), "run", "test_own_checks.py", "-p", "no:cacheprovider",
             "--target-model", str(ROOT / "fixtures" / "target"), "--drafter", str(ROOT / "fixtures" / "drafter"),
             "--golden-dir", str(ROOT / "golden"), "--floors-file", str(ROOT / "golden" / "tau_floors.json"),
             "--prompts", str(ROOT / "fixtures" / "prompts.jsonl"), "--num-prompts", "2",
             "--junitxml", "junit.xml"], cwd=work)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert f"rootdir: {work}" in p.stdout
    data = json.loads((work / "reports" / "eval.json").read_text())
    outcomes = data["tests"]["outcomes"]
    assert sum(1 for k in outcomes if "test_own_checks.py::" in k) == 3
    assert data["tests"]["counts"].get("failed", 0) == 0
    assert any("test_tau.py::test_tau[" in k for k in outcomes) and data["mean_passed"] is True
    assert (work / ".dflash_cache").is_dir() and (work / "reports" / "eval.png").is_file()
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates eval.json")
    schema = json.loads((site / "dflash_eval" / "report" / "eval.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)

    # A first run on a new model from a repository of its own: one usage error naming `dflash-eval record`, the gate
    # without floors exits 2 naming the floors file it looked for; recorded, the same run is green.
    mine = work / "myrepo"
    shutil.copytree(ROOT / "fixtures" / "target", mine / "models" / "mytarget")
    shutil.copytree(ROOT / "fixtures" / "drafter", mine / "ckpt" / "released")
    lines = (ROOT / "fixtures" / "prompts.jsonl").read_text().splitlines(keepends=True)
    (mine / "prompts.jsonl").write_text("".join(lines[:2]))
    new = ["--target-model", "models/mytarget", "--drafter", "ckpt/released", "--prompts", "prompts.jsonl",
           "--max-new-tokens", "24", "-p", "no:cacheprovider"]
    cli = str(venv / "bin" / "dflash-eval")
    p = run([cli, "run", *new], cwd=mine)
    assert p.returncode == 4 and p.stderr.count("ERROR:") == 1 and "FAILED" not in p.stdout, p.stdout + p.stderr
    assert f"{mine}/golden/tau_floors.json does not exist" in p.stderr
    assert "\n  dflash-eval record " + " ".join(new) + "\n" in p.stderr, p.stderr
    p = run([cli, "gate", "--drafter", "ckpt/released", *new[:2], *new[4:8], "--quiet"], cwd=mine)
    assert p.returncode == 2 and f"no τ floors to gate against: {mine}/golden/tau_floors.json" in p.stderr, p.stderr
    p = run([cli, "record", *new], cwd=mine)
    assert p.returncode == 0 and "dflash-eval record: wrote" in p.stdout, p.stdout[-6000:] + p.stderr[-3000:]
    p = run([cli, "run", *new], cwd=mine)
    assert p.returncode == 0 and "PytestWarning" not in p.stdout + p.stderr, p.stdout[-6000:] + p.stderr[-3000:]
    t_suite = time.perf_counter() - t0

    # The checkout with the package installed: the entry point and conftest.py's pytest_plugins name one plugin.
    p = run([str(py), "-m", "pytest", "tests_eval/test_checkpoint.py", "-p", "no:cacheprovider", "-q",
             f"--cache-dir={tmp_path / 'cache'}", f"--report-dir={tmp_path / 'repo-reports'}"], cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    print(f"wheel build + install {t_install:.1f} s, installed suite run {t_suite:.1f} s")


def test_trainer_examples_run_from_the_installed_wheel(tmp_path, installed):
    """The documented trainer examples, in a folder of their own, with the installed package only: a plain loop and
    a SpecForge-style callback, two steps each on the bundled target; each writes the history and its trend files."""
    t0 = time.perf_counter()
    repo = tmp_path / "trainer"
    repo.mkdir()
    for name in ("train_loop.py", "specforge_callback.py"):
        shutil.copy(ROOT / "docs" / "examples" / name, repo / name)
    p = run([str(installed.py), "-c", "import dflash_eval.testing"], cwd=repo)
    assert p.returncode != 0 and "No module named 'dflash_eval.testing'" in p.stderr, p.stderr  # not in the wheel
    lines = (ROOT / "fixtures" / "prompts.jsonl").read_text().splitlines(keepends=True)
    (repo / "prompts.jsonl").write_text("".join(lines[:2]))
    (repo / "seeds.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ("def ", "The ")))
    common = ["--target-model", str(ROOT / "fixtures" / "target"), "--prompts", "prompts.jsonl",
              "--max-new-tokens", "16", "--train-prompts", "seeds.jsonl", "--new-tokens", "8", "--steps", "2",
              "--cache-dir", "cache", "--device", "cpu"]

    p = run([str(installed.py), "train_loop.py", *common, "--every", "1", "--report-dir", "runs/loop/eval",
             "--tensorboard", "runs/loop/tb"], cwd=repo, timeout=1200)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    records = [json.loads(line) for line in (repo / "runs/loop/eval/history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2] and records[0]["mean_tau"] == pytest.approx(1.0, abs=0.05)
    md = (repo / "runs/loop/eval/history.md").read_text()
    assert md.startswith("# τ over training steps") and md.count("`in-memory DFlashDrafter`") == 3
    assert (repo / "runs/loop/eval/history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "history: " in p.stdout and "| step | drafter |" in p.stdout
    if importlib.util.find_spec("tensorboard") is not None:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(repo / "runs/loop/tb"))
        acc.Reload()
        assert [e.step for e in acc.Scalars("tau/mean")] == [0, 1, 2]
        assert [e.value for e in acc.Scalars("verdict/regression")] == [0.0, 0.0, 0.0]

    p = run([str(installed.py), "specforge_callback.py", *common, "--save-interval", "1", "--output-dir",
             "runs/sf", "--report-dir", "runs/sf/eval"], cwd=repo, timeout=1200)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert sorted(d.name for d in (repo / "runs/sf").glob("epoch_*")) == ["epoch_0_step_1", "epoch_0_step_2"]
    logged = [json.loads(line) for line in (repo / "runs/sf/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2]
    assert all("train/loss" in r and r["dflash_eval/tau/mean"] >= 1.0 and "dflash_eval/verdict/regression" in r
               for r in logged)
    history = [json.loads(line) for line in (repo / "runs/sf/eval/history.jsonl").read_text().splitlines()]
    assert [(r["step"], Path(r["drafter"]).name) for r in history] == [(1, "epoch_0_step_1"), (2, "epoch_0_step_2")]
    assert [r["mean_tau"] for r in history] == [r["dflash_eval/tau/mean"] for r in logged]
    assert (repo / "runs/sf/eval/history.md").is_file() and (repo / "runs/sf/eval/history.png").is_file()
    print(f"trainer examples from the installed wheel: {time.perf_counter() - t0:.1f} s")
