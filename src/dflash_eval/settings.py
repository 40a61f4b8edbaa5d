"""Eval-suite options and their resolved values.

Every option is ``--name`` on the command line, ``DFLASH_EVAL_<NAME>`` in the environment and ``dflash_<name>`` in the
ini file; precedence CLI > env > ini > default (the pytest plugin and the gate CLI resolve the sources, this module
parses and validates the values). :class:`EvalSettings` also resolves ``auto`` device, dtype and backends.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash_eval.backends import BACKENDS, resolve_backend
from dflash_eval.dtypes import parse_dtype
from dflash_eval.errors import ConfigError
from dflash_eval.prompts import CHAT_TEMPLATE_MODES
from dflash_eval.prompts import BUILTIN_SETS

__all__ = ["COMPLETION_SOURCES", "DEFAULT_PROMPTS", "OPTIONS", "OPTIONS_BY_NAME", "OptionSpec", "EvalSettings",
           "resolve_prompt_spec", "worker_info"]

COMPLETION_SOURCES = ("local", "sglang", "cache")
DEFAULT_PROMPTS = "humaneval:16,fixtures/prompts.jsonl"


def worker_info() -> tuple[str, int, int]:
    """(worker id, worker index, worker count) from pytest-xdist's environment ("master", 0, 1 without xdist)."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "master")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    idx = int(wid[2:]) if wid.startswith("gw") and wid[2:].isdigit() else 0
    return wid, idx, count


# ------------------------------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class OptionSpec:
    """One suite option: ``--name`` on the command line, ``DFLASH_EVAL_<NAME>`` in the environment and
    ``dflash_<name>`` in the ini file ([tool.pytest.ini_options]); precedence CLI > env > ini > default."""

    name: str  # python name, e.g. "target_model"
    default: Any
    help: str
    kind: str = "str"  # str | path | spec (--prompts: files resolved like paths) | int | float | bool | ints | choice
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "DFLASH_EVAL_" + self.name.upper()

    @property
    def ini(self) -> str:
        return "dflash_" + self.name


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("target_model", "fixtures/target", "target model directory (transformers layout)", "path"),
    OptionSpec("drafter", "fixtures/drafter", "drafter: a released directory (config.json + model.safetensors) "
               "or a training .pt file", "path"),
    OptionSpec("drafter_config", None, "config.json for a bare .pt drafter without an embedded config", "path"),
    OptionSpec("reference_drafter", None, "a reference drafter directory: test_checkpoint lists every architecture "
               "difference against it", "path"),
    OptionSpec("prompts", DEFAULT_PROMPTS, "prompt sets and/or JSONL files, comma-separated: built-in sets by "
               "name (humaneval, humaneval:N for the first N) and JSONL files (one {id, category, text} object a "
               "line)", "spec"),
    OptionSpec("chat_template", "auto", "format prompts with the target tokenizer's chat template: auto (when it has "
               "one; thinking disabled), on (required), off (raw text)", "choice", CHAT_TEMPLATE_MODES),
    OptionSpec("num_prompts", None, "use only the first N prompts", "int"),
    OptionSpec("max_new_tokens", 128, "length of the reference completions (tokens)", "int"),
    OptionSpec("max_blocks", None, "stop each τ simulation after this many speculative rounds", "int"),
    OptionSpec("ddtree_budget", (8,), "DDTree node budget(s); repeat the option or give a comma list (e.g. 4,8)",
               "ints"),
    OptionSpec("device", "auto", "device for the target and drafter: auto (cuda if available, else cpu), cpu, "
               "cuda, cuda:N", "str"),
    OptionSpec("device_map", None, "load the target across GPUs with accelerate (e.g. auto) when it does not fit on "
               "one; inputs go to the first device (use with -n 0)", "str"),
    OptionSpec("dtype", "auto", "dtype of the target and drafter: auto (bf16 on CUDA, fp32 on CPU), bf16, fp16, "
               "fp32", "str"),
    OptionSpec("hidden_state_backend", "auto", "linear-attention kernels for the evaluation's target forwards",
               "choice", tuple(BACKENDS)),
    OptionSpec("reference_backend", "torch", "backend the drafter was trained on: the drift tests compare the "
               "evaluation backend's features against it", "choice", tuple(BACKENDS)),
    OptionSpec("completions", "local", "where reference completions come from on a cache miss: local (target's "
               "greedy generation), sglang (--sglang-url), cache (never compute; fail on a miss)", "choice",
               COMPLETION_SOURCES),
    OptionSpec("sglang_url", None, "URL of a running SGLang server serving the target (for --completions sglang; "
               "default http://127.0.0.1:30000 with --sglang-launch)", "str"),
    OptionSpec("sglang_launch", None, "command that starts the SGLang server (own process group, log in the report "
               "dir, stopped at session end); only run when completions are not cached", "str"),
    OptionSpec("sglang_timeout", 600.0, "seconds to wait in all for the SGLang server to be ready (/health_generate "
               "200)", "float"),
    OptionSpec("sglang_request_timeout", 600.0, "seconds each POST /generate request may take", "float"),
    OptionSpec("sglang_model_name", None, "name /model_info must match (default: the target directory's name)",
               "str"),
    OptionSpec("require_sglang", False, "CI gate: no SGLang server with a cold completion cache is a failure (else "
               "the completion-dependent tests are skipped)", "bool"),
    OptionSpec("cache_dir", ".dflash_cache", "content-addressed cache of completions and features", "path"),
    OptionSpec("cache_only", False, "never compute: fail on any cache miss or corrupted entry", "bool"),
    OptionSpec("tau_floor", None, "use this τ floor for every prompt and the mean (overrides golden/tau_floors.json)",
               "float"),
    OptionSpec("update_tau_floors", False, "rewrite golden/tau_floors.json from this run's τ minus --tau-margin",
               "bool"),
    OptionSpec("tau_margin", 0.25, "margin subtracted from measured τ by --update-tau-floors", "float"),
    OptionSpec("floors_file", "golden/tau_floors.json", "τ floors file", "path"),
    OptionSpec("golden_dir", "golden", "folder of golden files (floors, feature fingerprint, completion snapshots)",
               "path"),
    OptionSpec("update_fingerprints", False, "rewrite golden/feature_fingerprint.json from this run", "bool"),
    OptionSpec("drift_rel_tol", None, "max relative L2 error of features between backends/dtypes (default: 5e-3 "
               "for fp32 comparisons, 5e-2 when bf16/fp16 is involved)", "float"),
    OptionSpec("drift_cos_tol", None, "min cosine similarity of features (default: 0.9999 fp32, 0.998 bf16)",
               "float"),
    OptionSpec("drift_accept_tol", 0.5, "max |τ(eval features) - τ(reference features)| per prompt", "float"),
    OptionSpec("report_dir", "reports", "where eval.json, eval.md and eval.png are written", "path"),
    OptionSpec("torch_threads", None, "torch intra-op threads on CPU (default: cpu_count // (2 * workers), at least "
               "1; oversubscribed tiny models are far slower with more)", "int"),
)
OPTIONS_BY_NAME = {o.name: o for o in OPTIONS}


def resolve_prompt_spec(raw: Any, base: Path | None) -> str:
    """``--prompts`` with every relative file item made absolute against ``base`` (built-in set names such as
    ``humaneval:16`` stay as they are; so does a bare unknown name, which then fails as an unknown set)."""
    items = [s.strip() for s in str(raw).split(",") if s.strip()]
    out = []
    for item in items:
        if item.partition(":")[0] in BUILTIN_SETS:
            out.append(item)
            continue
        p = Path(item).expanduser()
        if not p.is_absolute() and base is not None and (
                (base / p).exists() or item.endswith((".jsonl", ".json")) or "/" in item):
            p = base / p
        out.append(str(p))
    return ",".join(out)


def _parse_value(spec: OptionSpec, raw: Any, base: Path | None) -> Any:
    if raw is None:
        return None
    if spec.kind == "bool":
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{spec.flag}: expected a boolean (1/0, true/false), got {raw!r}")
    if spec.kind == "ints":
        items: list[Any] = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        out: list[int] = []
        for it in items:
            for part in str(it).replace(",", " ").split():
                try:
                    out.append(int(part))
                except ValueError as exc:
                    raise ConfigError(f"{spec.flag}: expected integers, got {part!r}") from exc
        if not out or any(v < 1 for v in out):
            raise ConfigError(f"{spec.flag}: expected one or more integers >= 1, got {raw!r}")
        return tuple(dict.fromkeys(out))
    if spec.kind == "int":
        try:
            return int(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{spec.flag}: expected an integer, got {raw!r}") from exc
    if spec.kind == "float":
        try:
            return float(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{spec.flag}: expected a number, got {raw!r}") from exc
    if spec.kind == "path":
        p = Path(str(raw)).expanduser()
        return p if p.is_absolute() or base is None else base / p
    if spec.kind == "spec":
        return resolve_prompt_spec(raw, base)
    if spec.kind == "choice" and str(raw) not in spec.choices:
        if spec.name.endswith("backend"):
            raise ConfigError(f"{spec.flag}: unknown backend {raw!r}; choose one of {', '.join(spec.choices)}")
        raise ConfigError(f"{spec.flag}: unknown value {raw!r}; choose one of {', '.join(spec.choices)}")
    return str(raw)


@dataclass(frozen=True)
class EvalSettings:
    """Resolved suite settings (see :data:`OPTIONS` for each field's meaning)."""

    target_model: Path
    drafter: Path
    prompts: str
    drafter_config: Path | None = None
    reference_drafter: Path | None = None
    num_prompts: int | None = None
    chat_template: str = "auto"
    max_new_tokens: int = 128
    max_blocks: int | None = None
    ddtree_budget: tuple[int, ...] = (8,)
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    hidden_state_backend: str = "auto"
    reference_backend: str = "torch"
    completions: str = "local"
    sglang_url: str | None = None
    sglang_launch: str | None = None
    sglang_timeout: float = 600.0
    sglang_request_timeout: float = 600.0
    sglang_model_name: str | None = None
    require_sglang: bool = False
    cache_dir: Path = Path(".dflash_cache")
    cache_only: bool = False
    tau_floor: float | None = None
    update_tau_floors: bool = False
    tau_margin: float = 0.25
    floors_file: Path = Path("golden/tau_floors.json")
    golden_dir: Path = Path("golden")
    update_fingerprints: bool = False
    drift_rel_tol: float | None = None
    drift_cos_tol: float | None = None
    drift_accept_tol: float = 0.5
    report_dir: Path = Path("reports")
    torch_threads: int | None = None
    origins: dict[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_mapping(
        cls,
        values: dict[str, Any],
        *,
        base: Path | None = None,
        origins: dict[str, str] | None = None,
    ) -> EvalSettings:
        """Build from raw option values (strings or typed); missing names take their defaults.

        Relative paths are resolved against ``base`` when given (the plugin resolves each source itself).
        """
        unknown = set(values) - set(OPTIONS_BY_NAME)
        if unknown:
            raise ConfigError(f"unknown eval option(s): {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for spec in OPTIONS:
            raw = values.get(spec.name, spec.default)
            kwargs[spec.name] = _parse_value(spec, raw, base)
        s = cls(**{k: v for k, v in kwargs.items() if v is not None or k in _NULLABLE}, origins=dict(origins or {}))
        s.validate()
        return s

    def validate(self) -> None:
        """Cheap consistency checks that need no model (bad values raise ConfigError before anything runs)."""
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_blocks is not None and self.max_blocks < 1:
            raise ConfigError(f"--max-blocks must be >= 1, got {self.max_blocks}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ConfigError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.completions == "sglang" and not self.sglang_url and not self.sglang_launch:
            raise ConfigError("--completions sglang needs --sglang-url URL (a running server) or --sglang-launch CMD")
        if self.sglang_launch and self.completions != "sglang":
            raise ConfigError(f"--sglang-launch needs --completions sglang (got --completions {self.completions})")
        for name in ("sglang_timeout", "sglang_request_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(self, name)}")
        if self.tau_margin < 0:
            raise ConfigError(f"--tau-margin must be >= 0, got {self.tau_margin}")
        for name in ("hidden_state_backend", "reference_backend"):
            if getattr(self, name) not in BACKENDS:
                raise ConfigError(f"--{name.replace('_', '-')}: unknown backend {getattr(self, name)!r}; "
                                  f"choose one of {', '.join(BACKENDS)}")
        parse_dtype(self.dtype) if self.dtype != "auto" else None
        self.torch_device  # noqa: B018 - validates the device string
        self.eval_backend  # noqa: B018 - e.g. fla on a CPU-only machine: BackendError naming the fix

    # ------------------------------------------------------------------------------------------- resolved
    @property
    def torch_device(self) -> torch.device:
        """``auto``: CPU without CUDA; with N GPUs under pytest-xdist, worker gwK takes ``cuda:K % N`` (one GPU per
        worker, all sharing the cache); otherwise the current CUDA device."""
        if self.device == "auto":
            if not torch.cuda.is_available():
                return torch.device("cpu")
            _, index, count = worker_info()
            n = torch.cuda.device_count()
            return torch.device(f"cuda:{index % n}") if count > 1 and n > 1 else torch.device("cuda")
        try:
            dev = torch.device(self.device)
        except RuntimeError as exc:
            raise ConfigError(f"--device: invalid device {self.device!r} ({exc})") from exc
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device {self.device}: CUDA is not available on this machine")
        return dev

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return parse_dtype(self.dtype)

    @property
    def eval_backend(self) -> str:
        """The concrete backend of the evaluation's target forwards (``auto`` resolved; fla checked)."""
        return resolve_backend(self.hidden_state_backend, self.torch_device)

    @property
    def ref_backend(self) -> str:
        name = resolve_backend(self.reference_backend, self.torch_device) if self.reference_backend != "fla" \
            else "fla"
        return name

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("origins")
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


_NULLABLE = {"device_map", "drafter_config", "reference_drafter", "num_prompts", "max_blocks", "sglang_url", "tau_floor",
             "sglang_launch", "sglang_model_name",
             "drift_rel_tol", "drift_cos_tol", "torch_threads"}
