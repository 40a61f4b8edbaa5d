"""The suite's options: one declaration (:class:`dflash_eval.options.settings.EvalSettings`' fields) drives the pytest
plugin's and the ``dflash-eval`` CLI's registration, one resolver (CLI > env > ini > default) serves both, and the
option table in docs/reference.md is generated from it.

Run: ``pytest tests/test_options.py -p no:cacheprovider``
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from dflash_eval.cli.main import build_parser, main
from dflash_eval.errors import ConfigError
from dflash_eval.options.settings import OPTIONS, OPTIONS_BY_NAME, EvalSettings, add_options, in_repo, resolve
from dflash_eval.options.table import DOCS_COMMAND, render_option_table, with_option_table
from dflash_eval.pytest_plugin import settings_from_config

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DRAFTER = ROOT / "fixtures" / "drafter"
PLUGIN = "dflash_eval.pytest_plugin"


def make_checkout(root: Path) -> Path:
    """A folder that counts as a checkout of this repository (its pyproject.toml names the project)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text('[project]\nname = "dflash-eval"\n')
    return root


@pytest.fixture(autouse=True)
def no_env_options(monkeypatch):
    """No DFLASH_EVAL_* variable of the calling environment leaks into these tests."""
    for spec in OPTIONS:
        monkeypatch.delenv(spec.env, raising=False)


# --------------------------------------------------------------------------------------------- one declaration


def test_options_are_the_settings_fields():
    names = [f.name for f in dataclasses.fields(EvalSettings) if f.name != "origins"]
    assert [o.name for o in OPTIONS] == names and set(OPTIONS_BY_NAME) == set(names)
    defaults = EvalSettings()
    for o in OPTIONS:
        assert o.help and o.kind in ("str", "path", "spec", "int", "float", "bool", "ints", "choice")
        assert o.flag == "--" + o.name.replace("_", "-") and o.env == "DFLASH_EVAL_" + o.name.upper()
        assert o.ini == "dflash_" + o.name and (o.kind == "choice") == bool(o.choices)
        assert getattr(defaults, o.name) == o.default and o.nullable == (o.default is None)
    assert OPTIONS_BY_NAME["device_map"].nullable and not OPTIONS_BY_NAME["max_new_tokens"].nullable
    assert EvalSettings.from_mapping({"device_map": None, "max_new_tokens": None}).max_new_tokens == 128


def record_registration(**kwargs):
    flags, inis = {}, {}
    add_options(lambda flag, **kw: flags.__setitem__(flag, kw),
                add_ini=(lambda name, **kw: inis.__setitem__(name, kw)) if kwargs.pop("ini", False) else None,
                **kwargs)
    return flags, inis


def test_add_options_registers_every_option_with_its_help():
    flags, inis = record_registration(ini=True)
    assert list(flags) == [o.flag for o in OPTIONS] and list(inis) == [o.ini for o in OPTIONS]
    tm = flags["--target-model"]
    assert tm["dest"] == "target_model" and tm["default"] is None
    assert tm["help"] == ("target model directory (transformers layout) [env DFLASH_EVAL_TARGET_MODEL, ini "
                          "dflash_target_model; default: fixtures/target in this repository, else required]")
    assert flags["--ddtree-budget"]["action"] == "append" and flags["--cache-only"]["action"] == "store_const"
    assert "default: unset]" in flags["--tau-floor"]["help"] and "default: 8]" in flags["--ddtree-budget"]["help"]
    assert flags["--completions"]["metavar"] == "{local,sglang,cache}" and "choices" not in flags["--completions"]
    assert inis["dflash_tau_margin"] == {"help": "margin subtracted from measured τ by --update-tau-floors (same as "
                                                 "--tau-margin)", "type": "string", "default": ""}

    flags, inis = record_registration(skip=("drafter",), strict_choices=True)  # the CLI's style
    assert "--drafter" not in flags and len(flags) == len(OPTIONS) - 1 and not inis
    assert flags["--target-model"]["help"] == "target model directory (transformers layout) [env " \
                                              "DFLASH_EVAL_TARGET_MODEL]"
    assert flags["--completions"]["choices"] == ("local", "sglang", "cache")


def test_pytest_plugin_and_cli_register_the_same_options(pytester):
    config = pytester.parseconfig("-p", PLUGIN)
    for o in OPTIONS:
        assert config.getoption(o.name) is None and config.getini(o.ini) == ""
    ns = build_parser().parse_args(["gate", "--drafter", "d"])
    gate_options = {o.name for o in OPTIONS if o.applies_to("gate")}  # the gate registers only what it honours
    assert gate_options <= set(vars(ns)) and not ({o.name for o in OPTIONS} - gate_options) & set(vars(ns))
    assert ns.drafter == ["d"] and all(getattr(ns, name) is None for name in gate_options if name != "drafter")
    assert main(["gate", "--drafter", "d", "--completions", "nope"]) == 2  # argparse rejects a bad choice


@pytest.mark.slow
def test_pytest_help_lists_every_option(pytester):
    res = pytester.runpytest_subprocess("-p", PLUGIN, "--help")
    assert res.ret == 0
    text = res.stdout.str()
    for o in OPTIONS:
        assert o.flag in text and o.ini in text


def test_gate_and_record_help_list_only_the_options_they_honour(capsys):
    for command in ("gate", "record"):
        assert main([command, "--help"]) == 0
        text = capsys.readouterr().out
        flat = " ".join(text.split())
        for o in OPTIONS:
            if o.name == "drafter" and command == "gate":  # the gate's own --drafter (repeated), no env
                continue
            assert (f"[env {o.env}]" in flat) == o.applies_to(command), (command, o.flag)
            assert bool(re.search(rf"^\s+{re.escape(o.flag)}[ ,\n]", text, re.M)) == o.applies_to(command), o.flag
        assert "dflash_" not in text
    assert "DFLASH_EVAL_DRAFTER]" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------- resolution


def test_resolve_precedence_origins_and_bases(tmp_path):
    cwd, ini_dir, root = tmp_path / "cwd", tmp_path / "ini", make_checkout(tmp_path / "root")
    cli = {"max_new_tokens": "16", "ddtree_budget": ["2", "3,2"], "target_model": "t",
           "prompts": "humaneval:3, sub/p.jsonl,/abs/q.jsonl"}
    env = {"DFLASH_EVAL_MAX_NEW_TOKENS": "32", "DFLASH_EVAL_TAU_MARGIN": "0.5", "DFLASH_EVAL_REPORT_DIR": "rep",
           "DFLASH_EVAL_DEVICE_MAP": ""}
    ini = {"dflash_max_new_tokens": "64", "dflash_tau_margin": "0.1", "dflash_cache_dir": "cc",
           "dflash_cache_only": "true", "dflash_device_map": "auto"}
    s = resolve(cli.get, environ=env, ini=lambda k: ini.get(k, ""), invocation_dir=cwd, ini_dir=ini_dir, root=root)
    assert (s.max_new_tokens, s.ddtree_budget, s.tau_margin, s.cache_only) == (16, (2, 3), 0.5, True)
    assert s.target_model == cwd / "t" and s.report_dir == cwd / "rep" and s.cache_dir == ini_dir / "cc"
    assert s.golden_dir == root / "golden" and s.drafter == root / "fixtures" / "drafter"
    assert s.prompts == f"humaneval:3,{cwd / 'sub' / 'p.jsonl'},/abs/q.jsonl"
    assert s.device_map == "auto"  # an empty env variable is unset
    assert {k: s.origins[k] for k in ("max_new_tokens", "tau_margin", "report_dir", "cache_dir", "device_map",
                                      "golden_dir")} == {"max_new_tokens": "cli", "tau_margin": "env",
                                                         "report_dir": "env", "cache_dir": "ini", "device_map": "ini",
                                                         "golden_dir": "default"}
    assert set(s.origins) == set(OPTIONS_BY_NAME)
    plain = resolve(lambda name: None, environ={}, invocation_dir=cwd, root=root)  # no ini: the CLI's case
    assert plain.prompts == f"humaneval:16,{root / 'fixtures' / 'prompts.jsonl'}" and plain.max_new_tokens == 128
    assert set(plain.origins.values()) == {"default"}


def test_plugin_resolves_cli_env_ini_default_against_their_dirs(pytester, monkeypatch):
    for d in ("run", "proj"):
        (pytester.path / d).mkdir()
    make_checkout(pytester.path / "root")
    (pytester.path / "proj" / "pytest.ini").write_text(
        "[pytest]\ndflash_max_new_tokens = 64\ndflash_cache_dir = cc\ndflash_prompts = p.jsonl\n"
        "dflash_tau_margin = 0.1\n")
    monkeypatch.chdir(pytester.path / "run")
    monkeypatch.setenv("DFLASH_EVAL_REPORT_DIR", "rep")
    monkeypatch.setenv("DFLASH_EVAL_TAU_MARGIN", "0.5")
    config = pytester.parseconfig("-p", PLUGIN, "-c", "../proj/pytest.ini", "--rootdir", "../root",
                                  "--max-new-tokens", "16", "--prompts", "humaneval:3,sub/p.jsonl")
    s = settings_from_config(config)
    run, proj, root = (pytester.path / d for d in ("run", "proj", "root"))
    assert s.max_new_tokens == 16 and s.prompts == f"humaneval:3,{run / 'sub' / 'p.jsonl'}"
    assert s.report_dir == run / "rep" and s.tau_margin == 0.5 and s.cache_dir == proj / "cc"
    assert s.golden_dir == root / "golden"
    assert [s.origins[k] for k in ("max_new_tokens", "report_dir", "cache_dir", "golden_dir")] == \
        ["cli", "env", "ini", "default"]


def test_cli_resolves_paths_and_prompt_files_against_the_cwd_and_reads_no_ini(tmp_path, monkeypatch, capsys):
    make_checkout(tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\ndflash_prompts = elsewhere.jsonl\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DFLASH_EVAL_DRAFTER_CONFIG", "cfg/config.json")
    rc = main(["gate", "--drafter", str(FIXTURE_DRAFTER), "--target-model", "nope", "--device", "cpu", "--quiet",
               "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--target-model {tmp_path / 'nope'}: not found" in err
    assert f"--drafter-config {tmp_path / 'cfg' / 'config.json'}: not found" in err
    assert f"--prompts humaneval:16,{tmp_path / 'fixtures' / 'prompts.jsonl'}:" in err  # default, not the ini
    rc = main(["gate", "--drafter", str(FIXTURE_DRAFTER), "--target-model", "nope", "--device", "cpu", "--quiet",
               "--prompts", "humaneval:2,sub/p.jsonl"])
    assert rc == 2 and f"--prompts humaneval:2,{tmp_path / 'sub' / 'p.jsonl'}:" in capsys.readouterr().err


def test_outside_a_checkout_target_and_drafter_are_required_and_prompts_are_builtin(tmp_path):
    """Outside this repository the bundled-fixture defaults do not apply: one error naming both options."""
    assert not in_repo(tmp_path) and in_repo(make_checkout(tmp_path / "repo")) and in_repo(ROOT)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pyproject.toml").write_text('[project]\nname = "dflash-eval-fork"\n')
    assert not in_repo(tmp_path / "other")
    with pytest.raises(ConfigError, match=re.escape(
            f"--target-model and --drafter required: {tmp_path} is not a checkout of the dflash-eval repository")):
        resolve(lambda name: None, environ={}, invocation_dir=tmp_path, root=tmp_path)
    with pytest.raises(ConfigError,
                       match=r"^--drafter required: .* give --drafter PATH \(or env DFLASH_EVAL_DRAFTER\)$"):
        resolve(lambda name: None, environ={"DFLASH_EVAL_TARGET_MODEL": "t"}, invocation_dir=tmp_path, root=tmp_path)
    s = resolve({"target_model": "t", "drafter": "d"}.get, environ={}, invocation_dir=tmp_path, root=tmp_path,
                check=False)
    assert s.prompts == "humaneval:16" and s.golden_dir == tmp_path / "golden" and s.origins["prompts"] == "default"
    assert OPTIONS_BY_NAME["prompts"].shown_default == ("humaneval:16,fixtures/prompts.jsonl in this repository, "
                                                        "else humaneval:16")


def test_plugin_outside_a_checkout_is_one_usage_error(pytester):
    """`pytest` on the suite's folder elsewhere without --target-model: exit 4 with the message, before collection."""
    (pytester.path / "suite").mkdir()
    (pytester.path / "suite" / "test_tau.py").write_text("def test_x(eval_session):\n    pass\n")
    pytester.makeini("[pytest]\n")
    res = pytester.runpytest_inprocess("-p", PLUGIN, "suite", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: dflash-eval: --target-model and --drafter required: * is not a checkout*"])


@pytest.mark.parametrize("source, needle", [
    ({"cli": {"max_new_tokens": "x"}}, "--max-new-tokens: expected an integer, got 'x'"),
    ({"env": {"DFLASH_EVAL_REQUIRE_SGLANG": "maybe"}}, "--require-sglang: expected a boolean"),
    ({"ini": {"dflash_chat_template": "maybe"}}, "--chat-template: unknown value 'maybe'; choose one of auto, on, off"),
    ({"cli": {"hidden_state_backend": "nope"}}, "--hidden-state-backend: unknown backend 'nope'"),
    ({"env": {"DFLASH_EVAL_DDTREE_BUDGET": "4,0"}}, "--ddtree-budget: expected one or more integers >= 1"),
    ({"ini": {"dflash_sglang_timeout": "0"}}, "--sglang-timeout must be > 0 seconds"),
])
def test_bad_values_name_the_flag(source, needle, tmp_path):
    make_checkout(tmp_path)
    cli, env, ini = source.get("cli", {}), source.get("env", {}), source.get("ini", {})
    with pytest.raises(ConfigError, match=re.escape(needle)):
        resolve(cli.get, environ=env, ini=lambda k: ini.get(k, ""), invocation_dir=tmp_path, root=tmp_path)


def test_plugin_and_cli_report_bad_values_naming_the_flag(pytester, capsys):
    with pytest.raises(ConfigError, match="--tau-margin: expected a number, got 'lots'"):
        settings_from_config(pytester.parseconfig("-p", PLUGIN, "--tau-margin", "lots"))
    assert main(["gate", "--drafter", str(FIXTURE_DRAFTER), "--baseline-drop-tol", "lots"]) == 2
    assert "bad input: --baseline-drop-tol: expected a number, got 'lots'" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------- docs


def test_docs_option_table_is_current():
    doc = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert with_option_table(doc) == doc, f"docs/reference.md: the option table is stale; run: {DOCS_COMMAND}"


def test_option_table_rows_and_regeneration():
    table = render_option_table()
    lines = table.splitlines()
    assert len(lines) == 2 + len(OPTIONS) and lines[0].startswith("| option | env | ini | default |")
    for o, line in zip(OPTIONS, lines[2:]):
        assert line.startswith(f"| `{o.flag}") and f"`{o.env}`" in line and f"`{o.ini}`" in line
    assert "| `--chat-template {auto,on,off}` |" in table and r"max \|τ(eval features)" in table
    stale = "intro\n<!-- options-table:start -->\n| old |\n<!-- options-table:end -->\nrest\n"
    fresh = with_option_table(stale)
    assert fresh == "intro\n<!-- options-table:start -->\n" + table + "<!-- options-table:end -->\nrest\n"
    assert with_option_table(fresh) == fresh
    with pytest.raises(ValueError, match="options-table:start"):
        with_option_table("no markers")


def test_options_command_checks_and_writes_docs(tmp_path, capsys):
    from dflash_eval.options.table import main as options_main

    md = tmp_path / "doc.md"
    md.write_text("<!-- options-table:start -->\n<!-- options-table:end -->\n")
    assert options_main(["--check-docs", str(md)]) == 1 and DOCS_COMMAND in capsys.readouterr().err
    assert options_main(["--write-docs", str(md)]) == 0 and render_option_table() in md.read_text()
    assert options_main(["--check-docs", str(md)]) == 0


def test_argparse_parser_from_add_options_parses_every_kind():
    ap = argparse.ArgumentParser()
    add_options(ap.add_argument, strict_choices=True)
    ns = ap.parse_args(["--ddtree-budget", "4", "--ddtree-budget", "8", "--cache-only", "--completions", "cache"])
    assert ns.ddtree_budget == ["4", "8"] and ns.cache_only is True and ns.completions == "cache"
    s = resolve(lambda name: getattr(ns, name), environ={}, invocation_dir=Path("/w"), root=ROOT)
    assert s.ddtree_budget == (4, 8) and s.cache_only and s.completions == "cache" and s.origins["cache_only"] == "cli"
