"""Packaging of the plugin and the suite: what the wheel ships (packages, the ``pytest11`` entry point, the suite's
modules as ``dflash_eval.tests_eval``), that loading the plugin and building both entry points' help imports no
torch, nor does importing any report module, that the repository's conftest and the entry point register the plugin
once, and that ``--pyargs`` runs of the suite are recognised (the usage error before collection). The wheel itself is
built and installed by ``tests/test_wheel_install.py``.

Run: ``pytest tests/test_packaging.py -p no:cacheprovider``
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PLUGIN = "dflash_eval.pytest_plugin"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}


def test_package_list_covers_the_source_tree_and_the_suite():
    st = PYPROJECT["tool"]["setuptools"]
    src = ROOT / "src"
    found = sorted(".".join(p.parent.relative_to(src).parts) for p in src.rglob("__init__.py"))
    assert "dflash_eval.testing" in found
    shipped = [p for p in found if p != "dflash_eval.testing"]
    assert sorted(st["packages"]) == sorted(shipped + ["dflash_eval.tests_eval"]), \
        "pyproject [tool.setuptools] packages must list every package under src/ but dflash_eval.testing, plus " \
        "dflash_eval.tests_eval"
    assert st["package-dir"] == {"": "src", "dflash_eval.tests_eval": "tests_eval"}
    assert (ROOT / "tests_eval" / "__init__.py").is_file() and (ROOT / "tests_eval" / "test_tau.py").is_file()
    assert "eval.schema.json" in {p.name for p in (src / "dflash_eval" / "report").glob("*.json")}
    assert st["package-data"]["dflash_eval.report"] == ["*.json"]


def test_no_shipped_module_imports_the_testing_package():
    """dflash_eval.testing is not in the wheel: a shipped module importing it would fail in an installed package."""
    pkg = ROOT / "src" / "dflash_eval"
    offenders = [str(p.relative_to(pkg)) for p in sorted(pkg.rglob("*.py"))
                 if p.parent.name != "testing" and "dflash_eval.testing" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_entry_point_name_is_the_module_conftest_loads():
    """pytest skips `pytest_plugins = [NAME]` when a plugin of that name is registered: the entry point's name must be
    the module name, or an installed package would register the plugin twice in a checkout (a ValueError)."""
    eps = PYPROJECT["project"]["entry-points"]["pytest11"]
    assert eps == {PLUGIN: PLUGIN}
    conftest = (ROOT / "conftest.py").read_text(encoding="utf-8")
    assert f'pytest_plugins = ["{PLUGIN}"]' in conftest
    assert PYPROJECT["project"]["scripts"] == {"dflash-eval": "dflash_eval.cli.main:main"}


def test_torch_is_not_a_dependency():
    deps = PYPROJECT["project"]["dependencies"]
    assert not [d for d in deps if d.split("[")[0].split(">")[0].split("=")[0].strip() == "torch"]
    assert PYPROJECT["project"]["optional-dependencies"]["torch"] == ["torch>=2.4"]


def test_plugin_given_twice_registers_once(pytester):
    """`-p NAME` (what the entry point does) plus the conftest's pytest_plugins: one plugin, no error."""
    pytester.makeconftest(f'pytest_plugins = ["{PLUGIN}"]')
    pytester.makepyfile("def test_ok(pytestconfig):\n"
                        f"    assert len([p for p in pytestconfig.pluginmanager.get_plugins() "
                        f"if getattr(p, '__name__', '') == '{PLUGIN}']) == 1\n")
    res = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider")
    assert res.ret == 0, res.stdout.str()


IMPORT_CHECK = """
import sys
{body}
bad = sorted(m for m in ("torch", "transformers", "dflash_eval.session.eval_session", "matplotlib") if m in sys.modules)
print("HEAVY", bad)
"""


@pytest.mark.parametrize("body", [
    "import dflash_eval.options.settings, dflash_eval.pytest_plugin",
    "from dflash_eval.cli.main import build_parser; build_parser().format_help()",
    "import pytest; rc = pytest.main(['--help', '-p', 'dflash_eval.pytest_plugin']); assert rc == 0",
    "from dflash_eval.cli.main import main; assert main(['gate', '--help']) == 0",
], ids=["import-plugin", "cli-parser", "pytest-help", "gate-help"])
def test_option_registration_and_help_import_no_torch(body, tmp_path):
    """Fast help: registering the options (pytest's and the CLI's) imports neither torch nor transformers."""
    p = subprocess.run([sys.executable, "-c", IMPORT_CHECK.format(body=body)], capture_output=True, text=True,
                       cwd=tmp_path, env=_clean_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []", p.stdout[-2000:]


REPORT = ROOT / "src" / "dflash_eval" / "report"
TORCH_FREE = """
import importlib, sys
importlib.import_module({module!r})
print("TORCH", sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


@pytest.mark.parametrize("module", ["dflash_eval.report"] + [f"dflash_eval.report.{p.stem}" for p in
                                                             sorted(REPORT.glob("*.py")) if p.stem != "__init__"])
def test_every_report_writer_imports_no_torch(module, tmp_path):
    """The reports are plain data made text: importing any report module (eval.md's, eval.html's, the gate's, the
    plots') loads neither torch nor transformers; the small data they read (a τ result, the verdict) lives in
    torch-free modules."""
    p = subprocess.run([sys.executable, "-c", TORCH_FREE.format(module=module)], capture_output=True, text=True,
                       cwd=tmp_path, env=_clean_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "TORCH []", p.stdout[-2000:]


def test_pyargs_run_of_the_suite_is_recognised(pytester):
    """`pytest --pyargs PKG` where PKG holds the suite's modules: outside a checkout without --target-model, one
    usage error (exit 4) before collection, like `pytest tests_eval`."""
    pkg = pytester.mkpydir("mysuite")
    (pkg / "test_tau.py").write_text("def test_x(eval_session):\n    pass\n")
    pytester.makeini("[pytest]\n")
    pytester.syspathinsert()
    for args in (["--pyargs", "mysuite"], ["--pyargs", "mysuite.test_tau"], ["mysuite"]):
        res = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider", *args)
        assert res.ret == pytest.ExitCode.USAGE_ERROR, (args, res.stdout.str())
        res.stderr.fnmatch_lines(["ERROR: dflash-eval: --target-model and --drafter required*"])


def test_user_test_file_using_suite_fixtures_gets_the_same_usage_error(pytester):
    """A user's own test file (no suite folder in the arguments) that uses the suite's fixtures: exit 4 too."""
    pytester.makepyfile(test_mine="def test_mine(tau_results):\n    pass\n")
    pytester.makeini("[pytest]\n")
    res = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: dflash-eval: --target-model and --drafter required*"])
    # plain tests of such a project, even with fixtures of their own named like the suite's, are left alone
    pytester.makepyfile(test_mine="import pytest\n\n@pytest.fixture\ndef target():\n    return 3\n\n"
                                  "def test_plain(target):\n    assert target == 3\n")
    res = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider")
    assert res.ret == 0, res.stdout.str()


def test_markers_are_registered_by_the_plugin(pytester):
    """Installed elsewhere (no pyproject of ours), the suite's markers still pass --strict-markers."""
    pytester.makepyfile("import pytest\n\n@pytest.mark.fla\n@pytest.mark.gpu\n@pytest.mark.slow\n"
                        "@pytest.mark.sglang\ndef test_x():\n    pass\n")
    pytester.makeini("[pytest]\n")
    res = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider", "--strict-markers", "-m", "fla")
    assert res.ret == 0 and "1 passed" in res.stdout.str()


def test_missing_torch_is_one_clear_error(monkeypatch, capsys):
    import importlib.util

    from dflash_eval.cli.main import main
    from dflash_eval.common.torch_check import require_torch
    from dflash_eval.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ConfigError, match="torch is not installed: install the torch build for this machine first"):
        require_torch()
    assert main(["gate", "--drafter", str(ROOT / "fixtures" / "drafter")]) == 2
    assert "download.pytorch.org/whl/cpu" in capsys.readouterr().err
