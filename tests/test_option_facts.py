"""Options carry their own facts: every suite option declares whether it affects τ (``opt(..., affects_tau=...)``,
no default), and what depends on that fact reads the declaration, not a list kept apart from it:

- the settings digest of :mod:`dflash_eval.training_loop.evaluator` (which training-history records are compared)
  keeps exactly the options declared ``affects_tau`` (the drafter's own aside): another value of any of them moves
  the digest, another value of any other option (``--chunk-memory``, ``--tau-margin-sigmas``, ``--torch-threads``,
  ...) leaves it as it was;
- the τ context of floors files and baselines (:mod:`dflash_eval.metrics.tau_context`) records only options
  declared ``affects_tau`` (the options refuse to load otherwise) and names them by their flags;
- an option declared without the field is refused when the options are read.

The options package's imports point one way (no cycle, not even through ``if TYPE_CHECKING``), and importing the
options and the τ context loads no torch. No model: the digest is taken of a stand-in session.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dflash_eval.inputs.run_inputs import DRAFTER_OPTIONS
from dflash_eval.metrics import tau_context
from dflash_eval.options.declaration import OptionSpec, declared_options, opt
from dflash_eval.options.settings import OPTIONS, OPTIONS_BY_NAME, TAU_OPTIONS, EvalSettings, check_tau_context
from dflash_eval.options.table import render_option_table
from dflash_eval.training_loop.evaluator import settings_digest

ROOT = Path(__file__).resolve().parents[1]
OPTIONS_DIR = ROOT / "src" / "dflash_eval" / "options"

#: Options that must stay out of the digest: memory, threads and a margin that only judges.
NOT_TAU = ("chunk_memory", "tau_margin_sigmas", "torch_threads")
#: Options that must stay in it (a sample of what changes τ).
TAU = ("target_model", "prompts", "max_new_tokens", "max_blocks", "dtype", "hidden_state_backend", "temperature",
       "top_k", "top_p", "min_p", "samples_per_prompt", "sampling_seed", "chat_template", "thinking",
       "ddtree_budget", "kernel_fault")
#: Other values where the generic one of :func:`_other` would not change what the digest sees (it records the
#: resolved dtype and device type) or would not parse.
OTHER = {"dtype": "bf16", "device": "meta", "kernel_fault": "noise:0.01", "chunk_memory": "8GiB",
         "prompts": "humaneval:4"}


def _other(spec: OptionSpec) -> Any:
    """A value of ``spec`` other than its default."""
    if spec.name in OTHER:
        return OTHER[spec.name]
    d = spec.default
    if spec.kind == "bool":
        return not d
    if spec.kind == "choice":
        return next(c for c in spec.choices if c != d)
    if spec.kind == "ints":
        return (*d, max(d) + 1)
    if spec.kind == "int":
        return 3 if d is None else d + 1
    if spec.kind == "float":
        return 0.5 if d is None else d + 0.5
    if spec.kind == "path":
        return Path("/elsewhere") / spec.name
    return f"other-{spec.name}"


@pytest.fixture(scope="module")
def base() -> EvalSettings:
    return EvalSettings.from_mapping({"target_model": "/t", "drafter": "/d", "device": "cpu"})


def _digest(settings: EvalSettings) -> str:
    inputs = SimpleNamespace(target_identity="0123456789abcdef0123", prompts=[SimpleNamespace(id="p0")])
    return settings_digest(SimpleNamespace(settings=settings, inputs=inputs))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ the field


def test_every_declared_option_says_whether_it_affects_tau() -> None:
    fields = [f for f in dataclasses.fields(EvalSettings) if f.name != "origins"]
    assert [f.name for f in fields] == [o.name for o in OPTIONS], "every settings field is a declared option"
    for f in fields:
        assert type(f.metadata.get("affects_tau")) is bool, f"{f.name}: no affects_tau in its declaration"
    assert all(type(o.affects_tau) is bool for o in OPTIONS)
    assert TAU_OPTIONS == {o.name for o in OPTIONS if o.affects_tau}
    assert set(TAU) <= TAU_OPTIONS and not set(NOT_TAU) & TAU_OPTIONS


def test_an_option_declared_without_the_field_is_refused() -> None:
    with pytest.raises(TypeError, match="affects_tau"):
        opt(1, "a count", "int")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="affects_tau must be True or False"):
        opt(1, "a count", "int", affects_tau="yes")  # type: ignore[arg-type]

    @dataclass(frozen=True)
    class Declared:
        counted: int = opt(1, "a count", "int", affects_tau=True)
        by_hand: int = field(default=2, metadata={"help": "declared without opt", "kind": "int"})

    with pytest.raises(TypeError, match="option 'by_hand' of Declared does not declare affects_tau"):
        declared_options(Declared)


def test_the_option_table_shows_the_field() -> None:
    rows = render_option_table().splitlines()[2:]
    for o, row in zip(OPTIONS, rows):
        cells = [c.strip() for c in row.split(" | ")]
        assert cells[5] == ("yes" if o.affects_tau else "no"), row


# ------------------------------------------------------------------------------------------------ the digest


def test_the_digest_is_stable(base: EvalSettings) -> None:
    assert _digest(base) == _digest(dataclasses.replace(base))


@pytest.mark.parametrize("name", sorted(TAU_OPTIONS - DRAFTER_OPTIONS))
def test_a_tau_option_moves_the_digest(base: EvalSettings, name: str) -> None:
    changed = dataclasses.replace(base, **{name: _other(OPTIONS_BY_NAME[name])})
    assert _digest(changed) != _digest(base), f"--{name} affects τ but the digest ignores it"


@pytest.mark.parametrize("name", sorted(set(OPTIONS_BY_NAME) - TAU_OPTIONS))
def test_an_option_that_does_not_affect_tau_leaves_the_digest(base: EvalSettings, name: str) -> None:
    changed = dataclasses.replace(base, **{name: _other(OPTIONS_BY_NAME[name])})
    assert getattr(changed, name) != getattr(base, name)
    assert _digest(changed) == _digest(base), f"--{name} does not affect τ but moves the digest"


def test_memory_margin_and_threads_leave_the_digest(base: EvalSettings) -> None:
    changed = dataclasses.replace(base, chunk_memory="64MiB", tau_margin_sigmas=1.5, torch_threads=2)
    assert _digest(changed) == _digest(base)
    assert _digest(dataclasses.replace(changed, max_new_tokens=64)) != _digest(base)


def test_the_drafter_options_never_enter_the_digest(base: EvalSettings) -> None:
    changed = dataclasses.replace(base, drafter=Path("/other"), drafter_config=Path("/c.json"),
                                  reference_drafter=Path("/ref"))
    assert _digest(changed) == _digest(base)


# ------------------------------------------------------------------------------------------------ the τ context


def test_the_tau_context_names_options_that_affect_tau() -> None:
    for f, name in tau_context.FIELD_OPTIONS.items():
        if name is not None:
            assert OPTIONS_BY_NAME[name].affects_tau, f"context field {f} comes from --{name}"
            assert tau_context.TAU_FIELDS[f] == OPTIONS_BY_NAME[name].flag
    assert list(tau_context.TAU_FIELDS) == list(tau_context.FIELD_OPTIONS)
    assert set(tau_context.sampling_context(SimpleNamespace(
        temperature=0.7, top_k=5, top_p=0.9, min_p=0.0, samples_per_prompt=2, sampling_seed=0,
        sampling=SimpleNamespace(greedy=False)))) <= set(tau_context.FIELD_OPTIONS)


def test_a_context_field_from_an_option_that_does_not_affect_tau_is_refused() -> None:
    check_tau_context()  # the context as it is: run on import too
    with pytest.raises(TypeError, match=r"not declared affects_tau=True: max_blocks \(chunk_memory\)"):
        check_tau_context({**tau_context.FIELD_OPTIONS, "max_blocks": "chunk_memory"})
    with pytest.raises(TypeError, match=r"seed \(no_such_option\)"):
        check_tau_context({"seed": "no_such_option"})


def test_a_mismatch_names_the_declared_flag() -> None:
    lines = tau_context.mismatches({"target": "t", "max_new_tokens": 128, "backend": "torch"},
                                   {"target": "t", "max_new_tokens": 64, "backend": "fla"})
    assert lines == ["max_new_tokens (--max-new-tokens): recorded 128, this run 64",
                     "backend (--hidden-state-backend): recorded 'torch', this run 'fla'"]


# ------------------------------------------------------------------------------------------------ imports


def _imports(path: Path) -> set[str]:
    """Every dflash_eval module ``path`` imports: at the top, in functions and under ``if TYPE_CHECKING``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("dflash_eval.")}


def test_the_options_package_imports_point_one_way() -> None:
    modules = {f"dflash_eval.options.{p.stem}": p for p in OPTIONS_DIR.glob("*.py") if p.stem != "__init__"}
    graph = {m: _imports(p) & set(modules) - {m} for m, p in modules.items()}
    assert "dflash_eval.options.settings" not in graph["dflash_eval.options.value_checks"]
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, "import cycle: " + " -> ".join((*path[path.index(m):], m))
        if m not in done:
            for dep in sorted(graph[m]):
                visit(dep, (*path, m))
            done.add(m)

    for m in sorted(graph):
        visit(m, ())


def test_options_and_the_tau_context_import_no_torch() -> None:
    code = ("import sys, dflash_eval.options.settings, dflash_eval.options.table, dflash_eval.metrics.tau_context; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
