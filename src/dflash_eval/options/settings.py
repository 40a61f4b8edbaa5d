"""The eval suite's options: each declared once, as a field of :class:`EvalSettings`, and everything derived from it.

A field is declared with :func:`dflash_eval.options.declaration.opt` (its help, kind, choices, the commands that
honour it and whether it affects τ: :data:`TAU_OPTIONS`, what the training history's settings digest keeps); from
it come ``--name`` on the command line, ``DFLASH_EVAL_<NAME>`` in the environment and ``dflash_<name>`` in the ini
file ([tool.pytest.ini_options]). :func:`add_options` registers them (pytest's ``group.addoption`` and argparse's
``add_argument`` alike), :func:`resolve` is the one resolver (precedence CLI > env > ini > default; relative paths
and ``--prompts`` file items made absolute there; the machinery is :mod:`dflash_eval.options.sources`), the value
checks are :mod:`dflash_eval.options.value_checks` and :mod:`dflash_eval.options.table` writes the table in
``docs/reference.md`` (``python -m dflash_eval.options.table --write-docs docs/reference.md``).
:class:`EvalSettings` also resolves ``auto`` device, dtype and backends.

The defaults that point at this repository's bundled fixtures (``--target-model``, ``--drafter``, the prompt file in
``--prompts``) apply only when the root directory is a checkout of this project (:func:`in_repo`); elsewhere
``--target-model`` and ``--drafter`` must be given and ``--prompts`` defaults to ``humaneval:16``.

Importing this module (and registering the options) imports no torch: ``pytest --help`` stays fast. torch is
imported when a device or dtype is resolved.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.common.dtypes import parse_dtype
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.drift_ladder import DEFAULT_LADDER
from dflash_eval.metrics.tau_context import FIELD_OPTIONS
from dflash_eval.options.declaration import COMMANDS, REQUIRED, OptionSpec, declared_options, opt
from dflash_eval.options.sources import gather, in_repo, register_options
from dflash_eval.options.value_checks import check_values
from dflash_eval.options.values import parse_value, resolve_prompt_spec
from dflash_eval.prompts import CHAT_TEMPLATE_MODES, DEFAULT_PROMPT_DATA_DIR, HUMANEVAL_WRAPPERS, THINKING_MODES
from dflash_eval.target.backends import BACKENDS, parse_fault, resolve_backend, with_fault
from dflash_eval.target.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = ["COMMANDS", "COMPLETION_SOURCES", "DEFAULT_PROMPTS", "OUTSIDE_PROMPTS", "REQUIRED", "OPTIONS",
           "OPTIONS_BY_NAME", "OptionSpec", "EvalSettings", "TAU_OPTIONS", "add_options", "check_tau_context",
           "in_repo", "resolve", "resolve_prompt_spec", "worker_info"]

COMPLETION_SOURCES = ("local", "sglang", "cache")
DEFAULT_PROMPTS = "humaneval:16,fixtures/prompts.jsonl"
OUTSIDE_PROMPTS = "humaneval:16"  # --prompts default outside a checkout of this repository (no fixtures/ there)

_RUN_GATE, _RUN_RECORD, _RUN = ("run", "gate"), ("run", "record"), ("run",)  # the commands of some options


def worker_info() -> tuple[str, int, int]:
    """(worker id, worker index, worker count) from pytest-xdist's environment ("master", 0, 1 without xdist)."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "master")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    idx = int(wid[2:]) if wid.startswith("gw") and wid[2:].isdigit() else 0
    return wid, idx, count


# ------------------------------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class EvalSettings:
    """Resolved suite settings; each field but ``origins`` is one option (its help: ``pytest --help``)."""

    target_model: Path = opt(Path("fixtures/target"), "target model directory (transformers layout)", "path",
                             outside=REQUIRED, affects_tau=True)
    drafter: Path = opt(Path("fixtures/drafter"), "drafter: a released directory (config.json + model.safetensors) "
                        "or a training .pt file", "path", outside=REQUIRED, affects_tau=True)
    drafter_config: Path | None = opt(None, "config.json for a bare .pt drafter without an embedded config", "path",
                                      affects_tau=True)
    reference_drafter: Path | None = opt(None, "a reference drafter directory: its τ on the same prompts is "
                                         "reported beside the drafter's with the paired difference, and "
                                         "test_checkpoint lists every architecture difference against it", "path",
                                         commands=_RUN_GATE, affects_tau=False)
    prompts: str = opt(DEFAULT_PROMPTS, "prompt sets and files, comma-separated: built-in sets by name (gsm8k, "
                       "math500, humaneval, mbpp, mt-bench; NAME:N for the first N), local data NAME=PATH[:FIELD][:N] "
                       "(datasets save_to_disk folder, parquet, arrow, json, jsonl), .yaml/.toml set definitions and "
                       "JSONL files (one {id, category, text|turns} object a line)", "spec",
                       outside=OUTSIDE_PROMPTS, affects_tau=True)
    prompt_data_dir: Path = opt(DEFAULT_PROMPT_DATA_DIR, "where built-in sets named without a path are read: "
                                "<dir>/<name> (save_to_disk folder or dataset repository snapshot) or "
                                "<dir>/<name>.parquet|.jsonl|.json; nothing is downloaded", "path", affects_tau=True)
    humaneval_wrapper: str = opt("none", "HumanEval prompt text: none (the raw problem) or reference (wrapped as the "
                                 "reference DFlash benchmark does, for comparable τ)", "choice", HUMANEVAL_WRAPPERS,
                                 affects_tau=True)
    chat_template: str = opt("auto", "format prompts with the target tokenizer's chat template: auto (when it has "
                             "one), on (required), off (raw text)", "choice", CHAT_TEMPLATE_MODES, affects_tau=True)
    thinking: str = opt("off", "enable_thinking passed to the chat template (Qwen3/3.5/3.6): off (as the reference "
                        "benchmark) or on (needs a template with the switch)", "choice", THINKING_MODES,
                        affects_tau=True)
    num_prompts: int | None = opt(None, "use only the first N prompts", "int", affects_tau=True)
    max_new_tokens: int = opt(128, "length of the reference completions (tokens)", "int", affects_tau=True)
    generation_batch: int = opt(32, "prompts per batch of local greedy generation (left-padded, similar lengths "
                                "together; under xdist at least one batch per worker; 1: one prompt at a time, "
                                "unpadded)", "int", affects_tau=False)
    max_blocks: int | None = opt(None, "stop each τ simulation after this many speculative rounds", "int",
                                 affects_tau=True)
    chunk_memory: str = opt("2GiB", "memory of one chunk of prompts in the τ simulations and the drift budget (their "
                            "features, contexts and the drafter's context keys and values, host and device; e.g. "
                            "512MiB, 8GiB): prompts are simulated chunk by chunk, with the same τ, so the run's "
                            "memory does not grow with the number of prompts", affects_tau=False)
    temperature: float = opt(0.0, "the target's sampling temperature for τ (0: greedy references; > 0: "
                             "--samples-per-prompt sampled references per prompt, τ their mean; "
                             "docs/temperature.md)", "float", affects_tau=True)
    top_k: int = opt(-1, "top-k of the target's sampling at --temperature > 0 (-1: all tokens)", "int",
                     affects_tau=True)
    top_p: float = opt(1.0, "top-p of the target's sampling at --temperature > 0 (1: all tokens)", "float",
                       affects_tau=True)
    min_p: float = opt(0.0, "min-p of the target's sampling at --temperature > 0 (0: off; SGLang's DFlash "
                       "verification does not apply it)", "float", affects_tau=True)
    samples_per_prompt: int = opt(8, "sampled reference completions per prompt at --temperature > 0", "int",
                                  affects_tau=True)
    sampling_seed: int = opt(0, "seed of the sampled references (with the prompt id and sample index: one stream "
                             "seed each, an SGLang sampling_seed)", "int", affects_tau=True)
    online_tau: bool = opt(False, "also run the real speculative loop (the target verifies each drafted block) on "
                           "every prompt and report its τ and per-position acceptance beside the offline ones", "bool",
                           commands=_RUN_GATE, affects_tau=False)
    ddtree_budget: tuple[int, ...] = opt((8,), "DDTree node budget(s); repeat the option or give a comma list "
                                         "(e.g. 4,8)", "ints", affects_tau=True)
    device: str = opt("auto", "device for the target and drafter: auto (cuda if available, else cpu), cpu, cuda, "
                      "cuda:N", affects_tau=True)
    device_map: str | None = opt(None, "load the target across GPUs with accelerate (e.g. auto) when it does not fit "
                                 "on one; inputs go to the first device (use with -n 0)", affects_tau=False)
    dtype: str = opt("auto", "dtype of the target and drafter: auto (bf16 on CUDA, fp32 on CPU), bf16, fp16, fp32",
                     affects_tau=True)
    hidden_state_backend: str = opt("auto", "linear-attention kernels for the evaluation's target forwards",
                                    "choice", BACKENDS, affects_tau=True)
    reference_backend: str = opt("torch", "backend the drafter was trained on: the drift tests compare the "
                                 "evaluation backend's features against it", "choice", BACKENDS, commands=_RUN,
                                 affects_tau=False)
    completions: str = opt("local", "where reference completions come from on a cache miss: local (target's greedy "
                           "generation), sglang (--sglang-url), cache (never compute; fail on a miss)", "choice",
                           COMPLETION_SOURCES, affects_tau=False)
    sglang_url: str | None = opt(None, "URL of a running SGLang server serving the target (for --completions "
                                 "sglang; default http://127.0.0.1:30000 with --sglang-launch)", affects_tau=False)
    sglang_launch: str | None = opt(None, "command that starts the SGLang server (own process group, log in the "
                                    "report dir, stopped at session end); only run when completions are not cached",
                                    commands=_RUN_RECORD, affects_tau=False)
    sglang_timeout: float = opt(600.0, "seconds to wait in all for the SGLang server to be ready (/health_generate "
                                "200)", "float", affects_tau=False)
    sglang_request_timeout: float = opt(600.0, "seconds each POST /generate request may take", "float",
                                        affects_tau=False)
    sglang_model_name: str | None = opt(None, "name /model_info must match (default: the target directory's name)",
                                        affects_tau=False)
    require_sglang: bool = opt(False, "CI gate: no SGLang server with a cold completion cache is a failure (else the "
                               "completion-dependent tests are skipped)", "bool", commands=_RUN_RECORD,
                               affects_tau=False)
    cache_dir: Path = opt(Path(".dflash_cache"), "content-addressed cache of completions and features", "path",
                          affects_tau=False)
    cache_only: bool = opt(False, "never compute: fail on any cache miss or corrupted entry", "bool", affects_tau=False)
    rehash: bool = opt(False, "re-hash the target's config and weight files instead of trusting the identity "
                       "memoised under their inodes, sizes and times (e.g. after rewriting weights in place)", "bool",
                       affects_tau=False)
    witness_prompts: int = opt(1, "prompts re-extracted through the live target on every run, warm ones too, and "
                               "compared with their cached features and teacher-forced logits (bit for bit on a CPU, "
                               "within the measured reproducibility bound on a GPU), besides the fingerprint text and "
                               "the shortest and the longest sequence of each length bucket, which are always "
                               "witnessed: a mismatch names the layer, prompt and position, and nothing the kernels "
                               "of that dtype made is used as cached: completions, argmax, features and what is "
                               "computed from them are made again (an error under --cache-only); 0: no witness at all "
                               "(a warm run then loads no target)", "int", affects_tau=False)
    tau_floor: float | None = opt(None, "floor of the MEAN τ over the selected prompts, chain and every DDTree "
                                  "budget (replaces the mean floor derived from the floors file; prompts without a "
                                  "per-prompt floor are then not gated one by one)", "float", commands=_RUN_GATE,
                                  affects_tau=False)
    tau_floor_prompt: float | None = opt(None, "floor of EVERY prompt's chain and DDTree τ (replaces the floors "
                                         "file's per-prompt floors)", "float", commands=_RUN_GATE, affects_tau=False)
    speedup_floor: float | None = opt(None, "floor of the PREDICTED chain speed-up over plain decoding (mean τ x "
                                      "the cost of a plain step / the cost of a round, both timed on this run's "
                                      "device and dtype; docs/speedup.md): test_predicted_speedup and the gate fail "
                                      "below it; valid only for the device it was measured on", "float",
                                      commands=_RUN_GATE, affects_tau=False)
    allow_settings_mismatch: bool = opt(False, "use a floors file or --baseline recorded with other τ-relevant "
                                        "settings (target, max_new_tokens, block size, chat template, thinking, "
                                        "dtype, backend) with a warning instead of refusing it", "bool",
                                        commands=_RUN_GATE, affects_tau=False)
    baseline: Path | None = opt(None, "an earlier reports/eval.json: compare this run's chain τ prompt by prompt "
                                "(paired, skew-corrected t CI over prompts); test_baseline_tau_drop / "
                                "test_baseline_tau_ceiling",
                                "path", commands=_RUN_GATE, affects_tau=False)
    baseline_drop_tol: float = opt(0.02, "largest relative drop of the paired mean chain τ against --baseline that "
                                   "still passes", "float", commands=_RUN_GATE, affects_tau=False)
    baseline_rise_tol: float = opt(0.25, "largest relative rise of the paired mean chain τ against --baseline that "
                                   "still passes (a bigger jump suggests a future-token leak)", "float",
                                   commands=_RUN_GATE, affects_tau=False)
    update_tau_floors: bool = opt(False, "rewrite golden/tau_floors.json from this run's τ minus --tau-margin", "bool",
                                  commands=_RUN, affects_tau=False)
    tau_margin: float = opt(0.25, "margin subtracted from measured τ by --update-tau-floors", "float",
                            commands=_RUN_RECORD, affects_tau=False)
    tau_margin_sigmas: float = opt(3.0, "at --temperature > 0 the floor margin is this many standard deviations "
                                   "of the difference of two S-sample means (sqrt(2) x spread over samples / "
                                   "sqrt(S)) instead of --tau-margin", "float", commands=_RUN_RECORD, affects_tau=False)
    floors_file: Path = opt(Path("golden/tau_floors.json"), "τ floors file (default: the floors of the run's dtype "
                            "and backend, golden/tau_floors.json for float32/torch, golden/tau_floors.<dtype>-"
                            "<backend>.json otherwise, e.g. bfloat16-fla on a CUDA machine with fla)", "path",
                            affects_tau=False)
    golden_dir: Path = opt(Path("golden"), "folder of golden files (floors, feature fingerprint, completion "
                           "snapshots)", "path", commands=_RUN_RECORD, affects_tau=False)
    update_fingerprints: bool = opt(False, "rewrite the golden fingerprint of this run's device kind, backend and "
                                    "dtype (golden/fingerprints/<kind>-<backend>-<dtype>.json)", "bool",
                                    commands=_RUN, affects_tau=False)
    drift_rel_tol: float | None = opt(None, "regression check: max relative L2 error of features between backends/"
                                      "dtypes (default: 5e-3 fp32, 5e-2 when bf16/fp16 is involved)", "float",
                                      commands=_RUN, affects_tau=False)
    drift_cos_tol: float | None = opt(None, "regression check: min cosine similarity of features (default: 0.9999 "
                                      "fp32, 0.998 bf16)", "float", commands=_RUN, affects_tau=False)
    drift_accept_tol: float = opt(0.5, "max |τ(eval features) - τ(reference features)| per prompt", "float",
                                  commands=_RUN, affects_tau=False)
    drift_budget_ladder: str = opt(DEFAULT_LADDER, "perturbations measuring the drafter's drift budget: xA amplifies "
                                   "the run's measured drift direction A times (the main axis, the budget's fit); "
                                   "relative Gaussian noise sizes and rounding dtypes (bf16, fp16, fp8) form the "
                                   "isotropic axis reported beside it", commands=_RUN, affects_tau=False)
    drift_budget_tol: float = opt(0.1, "the mean τ drop over the prompts that defines the drift budget: the "
                                  "injected feature error at which the fitted drop reaches this", "float",
                                  commands=_RUN, affects_tau=False)
    drift_budget_safety: float = opt(5.0, "drift gate: worst measured drift per layer x this is compared with the "
                                     "drift budget's CI (pass below its lower end, fail above its upper end)",
                                     "float", commands=_RUN, affects_tau=False)
    drift_budget_seed: int = opt(0, "seed of the drift budget's noise levels (not of its amplified drift levels)",
                                 "int", commands=_RUN, affects_tau=False)
    drift_budget_min_prompts: int = opt(32, "measure the drift budget on at least this many prompts: a smaller "
                                        "selection is extended with the next prompts of --prompts (more prompts "
                                        "narrow the budget's CI)", "int", commands=_RUN, affects_tau=False)
    drift_budget_conclusive: bool = opt(False, "drift gate: decide a drift x safety inside the budget's CI on the "
                                        "budget's estimate (pass / fail) instead of skipping it as inconclusive",
                                        "bool", commands=_RUN, affects_tau=False)
    kernel_fault: str | None = opt(None, "diagnostic: perturb the delta-rule kernels of the evaluation's feature "
                                   "extraction: noise:REL or round:bf16|fp16|fp8 (completions unaffected)",
                                   commands=_RUN_GATE, affects_tau=True)
    report_dir: Path = opt(Path("reports"), "where eval.json, eval.md and eval.png are written", "path",
                           affects_tau=False)
    torch_threads: int | None = opt(None, "torch intra-op threads for CPU work, on GPU runs too (default: torch's "
                                    "own, one per physical core, divided among the xdist workers, at least 1)", "int",
                                    affects_tau=False)
    origins: dict[str, str] = field(default_factory=dict, compare=False)  # option name -> cli | env | ini | default

    @classmethod
    def from_mapping(cls, values: dict[str, Any], *, base: Path | None = None,
                     origins: dict[str, str] | None = None) -> EvalSettings:
        """Build from raw option values (strings or typed); missing names take their defaults.

        Relative paths are resolved against ``base`` when given (:func:`resolve` gives each source its own base).
        """
        unknown = set(values) - set(OPTIONS_BY_NAME)
        if unknown:
            raise ConfigError(f"unknown eval option(s): {sorted(unknown)}")
        given = {name: "given" for name in values} if origins is None else origins
        return cls._build({o.name: parse_value(o, values.get(o.name, o.default), base) for o in OPTIONS}, given)

    @classmethod
    def _build(cls, parsed: dict[str, Any], origins: dict[str, str] | None, *, check: bool = True) -> EvalSettings:
        """From parsed values; ``None`` for a non-nullable option means its default."""
        kwargs = {o.name: parsed[o.name] for o in OPTIONS if parsed[o.name] is not None or o.nullable}
        s = cls(**kwargs, origins=dict(origins or {}))
        if check:
            s.validate()
            s = s.with_profile_floors()
        return s

    def validate(self) -> None:
        """Cheap consistency checks that need no model (bad values raise ConfigError before anything runs):
        :meth:`validate_values`, then the device and backends against this machine (imports torch)."""
        self.validate_values()
        self.check_device_and_backends()

    def check_device_and_backends(self) -> None:
        """The device string parses and the backends run on it (ConfigError / BackendError naming the fix, e.g. fla
        on a CPU-only machine): what :attr:`feature_backend` resolves, through :attr:`eval_backend` and
        :attr:`torch_device`."""
        fault = None if self.kernel_fault is None else parse_fault(self.kernel_fault)
        with_fault(resolve_backend(self.hidden_state_backend, self.torch_device), fault)

    def validate_values(self) -> None:
        """The checks of :meth:`validate` that need neither torch nor the machine's devices (ConfigError):
        :func:`dflash_eval.options.value_checks.check_values`."""
        check_values(self)
        self.sampling_params()

    @property
    def sampling(self) -> SamplingParams:
        """The target's sampling for τ: :meth:`sampling_params`."""
        return self.sampling_params()

    def sampling_params(self) -> SamplingParams:
        """The target's sampling for τ (:class:`dflash_eval.target.sampling_params.SamplingParams`); ConfigError
        naming the option for a bad value."""
        if self.samples_per_prompt < 1:
            raise ConfigError(f"--samples-per-prompt must be >= 1, got {self.samples_per_prompt}")
        if self.temperature > 0 and self.online_tau and self.completions != "local":
            raise ConfigError(f"--online-tau at --temperature {self.temperature} replays each sampled reference's "
                              "random draws in the local speculative loop, which only references sampled locally "
                              f"have (--completions {self.completions} takes the server's, drawn by its own "
                              "sampler): use --completions local, or leave out --online-tau (docs/temperature.md)")
        try:
            return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)
        except ValueError as exc:
            name = str(exc).split()[0]
            raise ConfigError(f"--{name.replace('_', '-')}: {exc}") from exc

    # ------------------------------------------------------------------------------------------- resolved
    @cached_property
    def torch_device(self) -> torch.device:
        """``auto``: CPU without CUDA; with N GPUs under pytest-xdist, worker gwK takes ``cuda:K % N`` (one GPU per
        worker, all sharing the cache); otherwise the current CUDA device. Resolved once per settings object: every
        cache key asks for it, and on a CUDA machine each ``torch.cuda.is_available()`` asks the driver."""
        import torch  # not at the top: `pytest --help` and `dflash-eval --help` import this module, not torch

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
        import torch  # not at the top: `pytest --help` and `dflash-eval --help` import this module, not torch

        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return parse_dtype(self.dtype)

    @property
    def eval_backend(self) -> str:
        """The concrete backend of the evaluation's target forwards (``auto`` resolved; fla checked)."""
        return resolve_backend(self.hidden_state_backend, self.torch_device)

    @property
    def feature_backend(self) -> str:
        """The backend of the evaluation's feature extraction: :attr:`eval_backend`, with ``--kernel-fault``."""
        return with_fault(self.eval_backend, None if self.kernel_fault is None else parse_fault(self.kernel_fault))

    @property
    def records_profile(self) -> str:
        """The τ-relevant settings golden records are kept apart by, as a name: ``""`` for float32 with the torch
        backend (the records at the top of the golden folder: ``tau_floors.json``, ``snapshots/<target>/``), else
        ``<dtype>-<backend>``, e.g. ``bfloat16-fla`` (``tau_floors.bfloat16-fla.json``,
        ``snapshots/<target>.bfloat16-fla/``): what a CUDA machine's ``auto`` settings run with."""
        dtype = str(self.torch_dtype).removeprefix("torch.")
        return "" if (dtype, self.eval_backend) == ("float32", "torch") else f"{dtype}-{self.eval_backend}"

    @property
    def snapshot_folder(self) -> str:
        """The folder under ``<golden>/snapshots/`` that holds this run's reference-completion snapshots: the
        target folder's name, with ``.<records profile>`` where :attr:`records_profile` is not the CPU default
        (greedy completions in bf16 are not those of fp32)."""
        name, profile = self.target_model.name or "target", self.records_profile
        return f"{name}.{profile}" if profile else name

    def with_profile_floors(self) -> EvalSettings:
        """These settings with ``--floors-file`` left at its default pointing at the floors of
        :attr:`records_profile` (``golden/tau_floors.bfloat16-fla.json`` beside ``golden/tau_floors.json``); a
        floors file given on the command line, the environment, the ini file or to :meth:`from_mapping` is kept."""
        profile = self.records_profile
        if self.origins.get("floors_file", "default") != "default" or not profile:
            return self
        path = Path(self.floors_file)
        return replace(self, floors_file=path.with_name(f"{path.stem}.{profile}{path.suffix}"))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("origins")
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


# ------------------------------------------------------------------------------------------------------ options


OPTIONS: tuple[OptionSpec, ...] = declared_options(EvalSettings)
OPTIONS_BY_NAME = {o.name: o for o in OPTIONS}
#: The options declared ``affects_tau``: another value can change a τ measured (the others change where things go,
#: memory, threads, servers, or how a run is judged).
TAU_OPTIONS = frozenset(o.name for o in OPTIONS if o.affects_tau)


def check_tau_context(field_options: Mapping[str, str | None] = FIELD_OPTIONS) -> None:
    """TypeError unless every option the τ context of floors files and baselines records
    (:data:`dflash_eval.metrics.tau_context.FIELD_OPTIONS`) is a declared option that affects τ; run on import."""
    wrong = sorted(f"{f} ({o})" for f, o in field_options.items() if o is not None and o not in TAU_OPTIONS)
    if wrong:
        raise TypeError(f"the τ context records fields of options not declared affects_tau=True: {', '.join(wrong)}")


check_tau_context()


def add_options(add_argument: Callable[..., Any], *, add_ini: Callable[..., Any] | None = None,
                skip: Iterable[str] = (), strict_choices: bool = False, command: str = "run") -> None:
    """Register every option ``command`` honours (but those in ``skip``) through ``add_argument`` (argparse's
    ``add_argument`` or pytest's ``group.addoption``) and, given ``add_ini`` (pytest's ``parser.addini``), its ini
    key.

    Every option's CLI value defaults to ``None`` (unset: :func:`resolve` falls back to env, ini, default). With
    ``add_ini`` the help names env and ini keys and the default; without, the env key only. ``strict_choices``:
    argparse rejects a value outside a choice option's choices (else :func:`resolve` raises ConfigError).
    """
    register_options(OPTIONS, add_argument, add_ini=add_ini, skip=skip, strict_choices=strict_choices,
                     command=command)


def resolve(cli: Callable[[str], Any], *, environ: Mapping[str, str], invocation_dir: Path, root: Path,
            ini: Callable[[str], Any] | None = None, ini_dir: Path | None = None, check: bool = True) -> EvalSettings:
    """Every option's value, CLI > env > ini > default, parsed and validated into :class:`EvalSettings` (with
    ``origins``); raises ConfigError naming the option's flag.

    ``cli(name)`` is the command line's value of an option (``None``: not given), ``ini(ini_key)`` the ini file's
    (``None``/empty: not set). Relative paths and ``--prompts`` file items are made absolute against the source's
    directory: ``invocation_dir`` for CLI and env, ``ini_dir`` (default ``root``) for the ini file, ``root`` for
    the defaults. Outside a checkout of this repository (:func:`in_repo` of ``root``) the bundled-fixture defaults do
    not apply: a missing ``--target-model`` / ``--drafter`` is one ConfigError. ``check=False`` skips
    :meth:`EvalSettings.validate` (no torch import: values only parsed).
    """
    parsed, origins = gather(OPTIONS, cli, environ=environ, invocation_dir=invocation_dir, root=root, ini=ini,
                             ini_dir=ini_dir)
    return EvalSettings._build(parsed, origins, check=check)
