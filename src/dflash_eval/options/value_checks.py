"""The checks of the suite's option values that need neither torch nor the machine's devices: counts, the SGLang
options, tolerances, the drift ladder, the kernel fault, backend and dtype names, the device string. Each raises
one ConfigError naming the option; :meth:`dflash_eval.options.settings.EvalSettings.validate_values` runs them all.

Imports point one way: the settings module imports this one, never the reverse (not even for type checking); the
checks read the settings through :class:`CheckedSettings`, the attributes they need.
"""

from __future__ import annotations

import re
from typing import Protocol

from dflash_eval.common.dtypes import check_dtype_name
from dflash_eval.common.sizes import parse_memory
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.drift_ladder import parse_ladder
from dflash_eval.target.backends import BACKENDS, parse_fault

__all__ = ["CheckedSettings", "check_values"]

_DEVICE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(:\d+)?$")  # a torch device string's form (torch checks the type)


class CheckedSettings(Protocol):
    """What the checks read by name (read-only, as on the frozen settings); the counts, timeouts and tolerances
    they loop over are read with ``getattr``."""

    @property
    def chunk_memory(self) -> str: ...
    @property
    def completions(self) -> str: ...
    @property
    def sglang_url(self) -> str | None: ...
    @property
    def sglang_launch(self) -> str | None: ...
    @property
    def tau_margin(self) -> float: ...
    @property
    def drift_budget_ladder(self) -> str: ...
    @property
    def kernel_fault(self) -> str | None: ...
    @property
    def update_fingerprints(self) -> bool: ...
    @property
    def update_tau_floors(self) -> bool: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def witness_prompts(self) -> int: ...


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_counts(s: CheckedSettings) -> None:
    """Counts that must be at least 1 where set; ``--witness-prompts`` at least 0."""
    for name in ("max_new_tokens", "generation_batch", "max_blocks", "drift_budget_min_prompts", "num_prompts"):
        value = getattr(s, name)
        if value is not None and value < 1:
            raise ConfigError(f"{_flag(name)} must be >= 1, got {value}")
    if s.witness_prompts < 0:
        raise ConfigError(f"--witness-prompts must be >= 0 (0: no witness), got {s.witness_prompts}")


def check_memory(s: CheckedSettings) -> None:
    """``--chunk-memory``: a memory size (:func:`dflash_eval.common.sizes.parse_memory`)."""
    parse_memory(s.chunk_memory, flag="--chunk-memory")


def check_sglang(s: CheckedSettings) -> None:
    """``--completions sglang`` with a server to ask, ``--sglang-launch`` only with it, positive timeouts."""
    if s.completions == "sglang" and not s.sglang_url and not s.sglang_launch:
        raise ConfigError("--completions sglang needs --sglang-url URL (a running server) or --sglang-launch CMD")
    if s.sglang_launch and s.completions != "sglang":
        raise ConfigError(f"--sglang-launch needs --completions sglang (got --completions {s.completions})")
    for name in ("sglang_timeout", "sglang_request_timeout"):
        if not getattr(s, name) > 0:
            raise ConfigError(f"{_flag(name)} must be > 0 seconds, got {getattr(s, name)}")


def check_tolerances(s: CheckedSettings) -> None:
    """Margins and tolerances that must not be negative; ``--speedup-floor`` a finite speed-up above 0."""
    if s.tau_margin < 0:
        raise ConfigError(f"--tau-margin must be >= 0, got {s.tau_margin}")
    for name in ("baseline_drop_tol", "baseline_rise_tol", "drift_budget_tol", "drift_budget_safety"):
        if not getattr(s, name) >= 0:
            raise ConfigError(f"{_flag(name)} must be >= 0, got {getattr(s, name)}")
    floor = getattr(s, "speedup_floor", None)
    if floor is not None and not 0 < floor < float("inf"):
        raise ConfigError(f"--speedup-floor must be a finite speed-up > 0 (e.g. 1.5: 1.5 times plain decoding), "
                          f"got {floor}")


def check_fault(s: CheckedSettings) -> None:
    """``--kernel-fault``: a diagnostic that never writes golden records, in one of the fault forms."""
    if s.kernel_fault and (s.update_fingerprints or s.update_tau_floors):
        raise ConfigError(f"--kernel-fault {s.kernel_fault} is a diagnostic: golden records are never written "
                          "from faulty kernels; drop --update-fingerprints / --update-tau-floors, or the fault")
    if s.kernel_fault is not None:
        parse_fault(s.kernel_fault)  # BackendError naming the forms


def check_names(s: CheckedSettings) -> None:
    """Backend names, the dtype name and the device string's form."""
    for name in ("hidden_state_backend", "reference_backend"):
        if getattr(s, name) not in BACKENDS:
            raise ConfigError(f"{_flag(name)}: unknown backend {getattr(s, name)!r}; "
                              f"choose one of {', '.join(BACKENDS)}")
    check_dtype_name(s.dtype, flag="--dtype")
    if not _DEVICE.match(s.device):
        raise ConfigError(f"--device: invalid device {s.device!r}; choose one of auto (cuda if available, else "
                          "cpu), cpu, cuda, cuda:N (or another torch device type, e.g. mps)")


def check_values(s: CheckedSettings) -> None:
    """Every check of this module on the settings ``s``, in the order a user would fix them."""
    check_counts(s)
    check_memory(s)
    check_sglang(s)
    check_tolerances(s)
    parse_ladder(s.drift_budget_ladder)
    check_fault(s)
    check_names(s)
