"""How a suite option is declared: :func:`opt` makes a dataclass field carry the option's help, kind, choices,
default outside this repository, the commands that honour it and whether it affects the τ measured;
:class:`OptionSpec` is that declaration read back (its ``--flag``, ``DFLASH_EVAL_<NAME>`` environment variable and
``dflash_<name>`` ini key), and :func:`declared_options` reads every one off a settings dataclass.

``affects_tau`` has no default: every option says whether a change of its value can change a τ measured (the
target, prompts, generation, sampling, dtype, backend, ...) or not (where files go, memory and threads, servers and
timeouts, floors, margins and tolerances that only judge). What reads it: the settings digest that decides which
training-history records are compared, and the check of the τ context a floors file or baseline was recorded with.

The options themselves are the fields of :class:`dflash_eval.options.settings.EvalSettings`; this module knows no
option by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COMMANDS", "REQUIRED", "SAME", "OptionSpec", "declared_options", "opt"]


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


SAME = _Marker("SAME")  # an option whose default is the same inside and outside this repository
REQUIRED = _Marker("REQUIRED")  # no default outside this repository: the option must be given
#: The commands that read options: ``run`` (the pytest suite: ``dflash-eval run``, ``pytest``), ``gate``
#: (``dflash-eval gate``: τ of several checkpoints against the floors) and ``record`` (``dflash-eval record``: the
#: suite's recording tests, writing floors, snapshots and the fingerprint). The suite honours every option.
COMMANDS = ("run", "gate", "record")


def opt(default: Any, help: str, kind: str = "str", choices: Iterable[str] = (),  # noqa: A002 - addoption's name for it
        outside: Any = SAME, commands: Iterable[str] = COMMANDS, *, affects_tau: bool) -> Any:
    """One option's field. ``kind``: str | path | spec (--prompts: file items resolved like paths) | int | float |
    bool | ints | choice. A ``None`` default makes the option nullable (unset). ``outside``: the default outside a
    checkout of this repository (:data:`REQUIRED`: none, the option must be given). ``commands``: the commands of
    :data:`COMMANDS` that honour it (the others refuse it). ``affects_tau`` (required): whether another value can
    change a τ measured (module docstring)."""
    if not isinstance(affects_tau, bool):
        raise TypeError(f"affects_tau must be True or False, got {affects_tau!r}")
    return field(default=default, metadata={"help": help, "kind": kind, "choices": tuple(choices),
                                            "outside": outside, "commands": tuple(commands),
                                            "affects_tau": affects_tau})


@dataclass(frozen=True)
class OptionSpec:
    """One suite option (derived from a settings field declared with :func:`opt`): ``--name`` on the command line,
    ``DFLASH_EVAL_<NAME>`` in the environment and ``dflash_<name>`` in the ini file ([tool.pytest.ini_options]);
    precedence CLI > env > ini > default."""

    name: str  # python name, e.g. "target_model"
    default: Any
    help: str
    kind: str = "str"  # str | path | spec (--prompts: files resolved like paths) | int | float | bool | ints | choice
    choices: tuple[str, ...] = ()
    outside: Any = SAME  # the default outside a checkout of this repository (REQUIRED: must be given)
    commands: tuple[str, ...] = COMMANDS  # the commands that honour it (:data:`COMMANDS`)
    affects_tau: bool = field(kw_only=True)  # whether another value can change a τ measured (no default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "DFLASH_EVAL_" + self.name.upper()

    @property
    def ini(self) -> str:
        return "dflash_" + self.name

    @property
    def nullable(self) -> bool:
        """Unset is a valid value (the default is ``None``)."""
        return self.default is None

    @property
    def shown_default(self) -> str:
        """The default as ``pytest --help`` and the docs show it."""
        if self.default is None:
            return "unset"
        if isinstance(self.default, tuple):
            return ",".join(map(str, self.default))
        if self.outside is REQUIRED:
            return f"{self.default} in this repository, else required"
        if self.outside is not SAME:
            return f"{self.default} in this repository, else {self.outside}"
        return str(self.default)

    def default_for(self, repo: bool) -> Any:
        """The default inside (``repo``) or outside a checkout of this repository (:data:`REQUIRED`: none)."""
        return self.default if repo or self.outside is SAME else self.outside

    def applies_to(self, command: str) -> bool:
        """Whether ``command`` (one of :data:`COMMANDS`) honours this option."""
        return command in self.commands


def declared_options(settings_class: type) -> tuple[OptionSpec, ...]:
    """The options of a settings dataclass: one :class:`OptionSpec` per field declared with :func:`opt`, in field
    order; TypeError naming a field whose declaration does not say whether it affects τ."""
    out = []
    for f in dataclasses.fields(settings_class):
        if "help" not in f.metadata:
            continue
        if not isinstance(f.metadata.get("affects_tau"), bool):
            raise TypeError(f"option {f.name!r} of {settings_class.__name__} does not declare affects_tau "
                            "(True or False): declare it with opt(..., affects_tau=...)")
        out.append(OptionSpec(f.name, f.default, **f.metadata))
    return tuple(out)
