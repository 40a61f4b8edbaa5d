"""The first stage: everything an evaluation needs that does not depend on the drafter.

Settings, the cache handle, the prompts, the τ floors, the target directory (config, identity, tokenizer, chat
template), each prompt's token ids, the target's borrowed embedding / lm_head and, only when something has to be
computed, the loaded target model. A second drafter in the same process (``dflash-eval gate``) reuses this object
as it is: :meth:`Inputs.check_shareable` refuses settings that differ in anything but the drafter.

Nothing here loads the model on a warm cache: the head is read straight from the safetensors weights and the
target's content hash is memoised under each file's inode, size, mtime and ctime (``--rehash`` recomputes it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dflash_eval.cache.store import Cache
from dflash_eval.common.heap import importing
from dflash_eval.common.paths import folder_problem
from dflash_eval.common.progress import Meter, Sink, default_progress_sink
from dflash_eval.drafter import TargetSpec
from dflash_eval.drafter.vocabulary import TargetVocabulary, read_tokenizer_facts
from dflash_eval.errors import ConfigError, DFlashEvalError
from dflash_eval.inputs.kernel_verdict import KernelVerdict
from dflash_eval.inputs.prompt_tokens import prompt_format, text_ids, tokenize_prompts
from dflash_eval.metrics.drift import Comparison, Side, drift_comparisons
from dflash_eval.metrics.floors import Floors, load_floors
from dflash_eval.options.preflight import input_problems, target_config_problem
from dflash_eval.options.settings import EvalSettings, worker_info
from dflash_eval.prompts import Prompt, load_prompt_spec
from dflash_eval.target.backends import check_backend_device
from dflash_eval.target.head import TargetHead
from dflash_eval.target.kernel_cache import add_sink, use_kernel_cache
from dflash_eval.target.kernel_probe import ProbeResult, ProbeShape
from dflash_eval.target.kernel_registry import KernelProbes
from dflash_eval.target.loader import Target, TargetDir, load_target
from dflash_eval.target.provenance import platform_fields

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

__all__ = ["Inputs", "DEFAULT_PROGRESS", "DRAFTER_OPTIONS"]

DRAFTER_OPTIONS = frozenset({"drafter", "drafter_config", "reference_drafter"})
#: ``Inputs(progress=...)``'s default: :func:`~dflash_eval.common.progress.default_progress_sink`.
DEFAULT_PROGRESS = "default"


def _file_stamp(path: Path) -> list[Any]:
    """What the identity memo keys a file on: name, device, inode, size, mtime_ns, ctime_ns."""
    st = path.stat()
    return [path.name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class Inputs:
    """Drafter-independent inputs of one process (see module docstring). ``progress``: where long productions
    report (None: silent; by default :func:`~dflash_eval.common.progress.default_progress_sink`)."""

    def __init__(self, settings: EvalSettings, *, worker: tuple[str, int, int] | None = None,
                 log: Callable[[str], None] | None = None, progress: Sink | None | str = DEFAULT_PROGRESS) -> None:
        self.settings = settings
        self.worker_id, self.worker_index, self.worker_count = worker or worker_info()
        self.cache = Cache(settings.cache_dir, cache_only=settings.cache_only, worker=self.worker_id)
        # compiled GPU kernels and their tuning results live with the cache they vouch for (unless TRITON_CACHE_DIR
        # is set); a read-only cache under --cache-only leaves Triton's default
        self.kernel_cache = use_kernel_cache(self.cache.root, folder_problem if settings.cache_only else None)
        self.meter = Meter()
        add_sink(self.meter.note_compile)
        self.meter.counts["torch_threads"] = torch.get_num_threads()  # set by the entry point (suite.threads)
        self.log = log or (lambda _m: None)
        self.progress: Sink | None = default_progress_sink(self.worker_count) if progress == DEFAULT_PROGRESS \
            else progress  # type: ignore[assignment]  # the one str accepted is DEFAULT_PROGRESS
        self.target_dir = TargetDir(settings.target_model)
        self._target: Target | None = None
        self._identity: str | None = None
        self._models: dict[torch.dtype, nn.Module] = {}

    @cached_property
    def kernel_probes(self) -> KernelProbes:
        """The kernel probes of this process (:mod:`dflash_eval.target.kernel_registry`), shared by every stage whose
        cache keys carry a probe digest (completions, the teacher-forced argmax, features, the fingerprint)."""
        return KernelProbes(self.target_dir, self.settings.torch_device, registry_dir=self.cache.base / "kernel_probes",
                            record=not self.cache.cache_only)

    @cached_property
    def kernel_verdict(self) -> KernelVerdict:
        """The run's verdict on the target's kernels per dtype (:mod:`dflash_eval.inputs.kernel_verdict`): the token
        in :meth:`platform_fields`; its judge, the witness, is registered by the feature stage."""
        return KernelVerdict(self.cache, self.settings.torch_device, lambda: self.target_identity)

    def platform_fields(self, dtype: torch.dtype) -> dict[str, Any]:
        """The key fields every cache entry this run computes in ``dtype`` carries
        (:func:`dflash_eval.target.provenance.platform_fields`), with the run's verdict on the kernels of ``dtype``
        (decided on the first call per dtype: :meth:`KernelVerdict.token`)."""
        return platform_fields(dtype, self.settings.torch_device, self.kernel_verdict.token(dtype))

    def kernel_probe(self, backend: str, dtype: torch.dtype, shape: ProbeShape) -> ProbeResult:
        """The probe of ``backend`` in ``dtype`` at ``shape`` (:mod:`dflash_eval.target.kernel_probe`), run on the first
        call of this process (timed as ``kernel_probe``, counted as ``kernel_probes``)."""
        probes = self.kernel_probes
        if not probes.probed(backend, dtype, shape):
            with self.meter.timed("kernel_probe"):
                probes.get(backend, dtype, shape)
            self.meter.counts["kernel_probes"] += 1
        return probes.get(backend, dtype, shape)

    def check_shareable(self, settings: EvalSettings) -> None:
        """Raise ConfigError unless ``settings`` differ from ours only in the drafter options."""
        mine = {k: v for k, v in self.settings.to_dict().items() if k not in DRAFTER_OPTIONS}
        theirs = {k: v for k, v in settings.to_dict().items() if k not in DRAFTER_OPTIONS}
        if mine != theirs:
            diff = sorted(k for k in mine if mine[k] != theirs.get(k))
            raise ConfigError(f"cannot share target resources between sessions whose options differ in {diff}")

    def preflight(self, *, baseline_check: Callable[[Path], str | None] | None = None) -> None:
        """Check every input path at once (:func:`dflash_eval.options.preflight.input_problems`, the tokenizer's JSON
        files too; ``baseline_check``: its check of ``--baseline``); ConfigError lists all that are missing or
        unreadable."""
        problems = input_problems(self.settings, target_check=self._target_problem, load_prompts=lambda: self.prompts,
                                  baseline_check=baseline_check)
        if problems:
            raise ConfigError("unusable inputs:\n  " + "\n  ".join(problems))

    def check_prompts(self) -> list[Prompt]:
        """The selected prompts, loaded now: ConfigError naming the file and line of a bad ``--prompts`` entry."""
        return self.prompts

    def check_target_config(self) -> None:
        """config.json readable, valid JSON, with a layer count of at least one (ConfigError naming the file)."""
        layers = self.target_dir.num_layers
        if layers < 1:
            raise ConfigError(f"{self.target_dir.config_file}: num_hidden_layers is {layers}; a target needs at "
                              "least one layer")

    def _target_problem(self, settings: EvalSettings) -> str | None:
        """config.json (:func:`~dflash_eval.options.preflight.target_config_problem`), then the tokenizer's JSON
        files."""
        problem = target_config_problem(settings)
        if problem is None:
            try:
                self.target_dir.check_json_files()
            except ConfigError as exc:
                return f"--target-model {exc}"
        return problem

    # ------------------------------------------------------------------------------------------------ prompts
    @cached_property
    def prompts(self) -> list[Prompt]:
        return self.first_prompts(self.settings.num_prompts)

    def first_prompts(self, limit: int | None) -> list[Prompt]:
        """The first ``limit`` prompts of ``--prompts`` (all of them for None): the selection is ``--num-prompts``'s."""
        s = self.settings
        return load_prompt_spec(s.prompts, limit=limit, data_dir=s.prompt_data_dir,
                                humaneval_wrapper=s.humaneval_wrapper)

    @cached_property
    def prompt_by_id(self) -> dict[str, Prompt]:
        return {p.id: p for p in self.prompts}

    @cached_property
    def floors(self) -> Floors:
        """The floors file and the explicit thresholds, for the selected prompts (not yet checked against the run's
        context: :meth:`dflash_eval.session.eval_session.EvalSession.floors` does that)."""
        s = self.settings
        return load_floors(s.floors_file, mean_override=s.tau_floor, prompt_override=s.tau_floor_prompt).select(
            {p.id: p.category for p in self.prompts})

    @cached_property
    def comparisons(self) -> list[Comparison]:
        s = self.settings
        return drift_comparisons(eval_backend=s.feature_backend, reference_backend=s.reference_backend,
                                 requested_backend=s.hidden_state_backend, device=s.torch_device,
                                 dtype=s.torch_dtype, rel_tol=s.drift_rel_tol, cos_tol=s.drift_cos_tol,
                                 accept_tol=s.drift_accept_tol)

    def comparison(self, name: str) -> Comparison:
        for c in self.comparisons:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def eval_side(self) -> Side:
        """The evaluation's features: the evaluation backend (with ``--kernel-fault``) in the evaluation dtype."""
        return Side(self.settings.feature_backend, self.settings.torch_dtype)

    @cached_property
    def sides(self) -> list[Side]:
        """Every side whose features the run may read, the evaluation's first: the reference side (the drift
        budget's) and both sides of each comparison that is not skipped. The witness re-checks all of a dtype's
        before any entry of that dtype is used."""
        found = [self.eval_side, self.reference_side] + [x for c in self.comparisons if c.skip_reason is None
                                                          for x in (c.a, c.b)]
        return list(dict.fromkeys(found))

    @property
    def reference_side(self) -> Side:
        """The features the drafter was trained on, in the evaluation dtype; the drift budget perturbs these.
        ``--reference-backend`` (``auto``, or one that cannot run here such as fla on a CPU: the evaluation backend
        without a kernel fault, as the drift comparisons do)."""
        s = self.settings
        ref = s.reference_backend if s.reference_backend != "auto" else s.eval_backend
        try:
            check_backend_device(ref, s.torch_device, imports=False)
        except DFlashEvalError:
            ref = s.eval_backend
        return Side(ref, s.torch_dtype)

    # ------------------------------------------------------------------------------------------------ target
    @property
    def target_loaded(self) -> bool:
        return self._target is not None

    @property
    def target(self) -> Target:
        """The loaded target model and tokenizer (loaded on first use only)."""
        if self._target is None:
            s = self.settings
            with self.meter.timed("target_load"):
                self._target = load_target(s.target_model, device=s.torch_device, dtype=s.torch_dtype,
                                           device_map=s.device_map)
            self._models[self._target.dtype] = self._target.model
        return self._target

    def model_for(self, dtype: torch.dtype) -> nn.Module:
        """The target model in ``dtype``: the loaded target in its own dtype, else a cast copy, made once (the
        bf16-vs-fp32 comparison)."""
        base = self.target.model  # loaded first: the target's own dtype is then the target itself, never a copy
        if dtype not in self._models:
            import copy

            with self.meter.timed("target_load"):
                self._models[dtype] = copy.deepcopy(base).to(dtype=dtype).eval()
        return self._models[dtype]

    @property
    def target_identity(self) -> str:
        """Content hash of the target's config + weights (:func:`memoised_identity` unless the model is loaded)."""
        if self._identity is None:
            self._identity = self.target.identity() if self.target_loaded else memoised_identity(self)
        return self._identity

    @property
    def identity_known(self) -> bool:
        """Whether the target's identity was needed (and computed) in this run."""
        return self._identity is not None

    @cached_property
    def num_layers(self) -> int | None:
        """The target's layer count from config.json (None when unreadable: the input checks report that)."""
        try:
            return self.target_dir.num_layers
        except (DFlashEvalError, OSError, ValueError, KeyError, TypeError):
            return None

    @cached_property
    def vocab_size(self) -> int:
        """The target's vocabulary size (config.json ``vocab_size``): token ids are 0 .. vocab_size - 1."""
        return self.target_dir.vocab_size

    @cached_property
    def spec(self) -> TargetSpec:
        """What the drafter checks need about the target (config.json and the weights' head shape)."""

        vocabulary, embedding = self.vocabulary, self.head.embed_tokens.weight  # the mask-token check
        if self.target_loaded:
            return dataclasses.replace(TargetSpec.from_target(self.target), vocabulary=vocabulary, embedding=embedding)
        d = self.target_dir
        return TargetSpec(num_layers=d.num_layers, hidden_size=d.hidden_size, vocab_size=self.head.vocab_size,
                          vocabulary=vocabulary, embedding=embedding)

    @cached_property
    def vocabulary(self) -> TargetVocabulary:
        """The target tokenizer's mask token, special tokens and length (read on first use, memoised under the
        tokenizer files' stamps: a warm run parses no tokenizer file), for the drafter's mask token."""

        d = self.target_dir

        def facts() -> dict[str, Any]:
            stamp = {"path": str(d.path.resolve()), "files": [_file_stamp(f) for f in d.tokenizer_files()]}
            memo = self.cache.memo("tokenizer_facts", stamp, lambda: json.dumps(read_tokenizer_facts(d.path)))
            return json.loads(memo)

        return TargetVocabulary(d.path, self.vocab_size, facts=facts)

    @cached_property
    def head(self) -> TargetHead:
        """The target's input embedding and lm_head; without a loaded target (a warm cache) read straight from the
        safetensors weights, so a warm run never builds the model (it imports transformers only for the modeling
        module whose kernels :mod:`dflash_eval.target.kernel_probe` runs)."""

        if self.target_loaded:
            return TargetHead.from_model(self.target.model)
        try:
            with self.meter.timed("head_load"):
                return TargetHead.from_pretrained(self.settings.target_model, device=self.settings.torch_device,
                                                  dtype=self.settings.torch_dtype)
        except DFlashEvalError as exc:  # weights not in a known safetensors layout: take them from the model
            self.log(f"reading the target's embedding/lm_head from safetensors failed ({exc}); loading the model")
            return TargetHead.from_model(self.target.model)

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self.target_loaded:
            return self.target.tokenizer
        with importing():  # transformers, with the garbage collector paused (dflash_eval.common.heap)
            from transformers import AutoTokenizer

        self.target_dir.check_json_files()  # a broken tokenizer file: one message naming it, not a traceback
        with self.meter.timed("target_load"):
            try:
                return AutoTokenizer.from_pretrained(self.settings.target_model, local_files_only=True)
            except Exception as exc:
                raise ConfigError(f"cannot load the tokenizer from {self.settings.target_model}: "
                                  f"{type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------------------------------------ prompt ids
    @cached_property
    def prompt_format(self) -> dict[str, Any]:
        """How prompt text becomes token ids (:func:`~dflash_eval.inputs.prompt_tokens.prompt_format`)."""
        return prompt_format(self.settings, self.target_dir)

    @cached_property
    def prompt_ids(self) -> dict[str, list[int]]:
        """Token ids of each prompt but later conversation turns, from the cache
        (:func:`~dflash_eval.inputs.prompt_tokens.tokenize_prompts`)."""
        return tokenize_prompts(self)

    def text_ids(self, text: str, what: str) -> list[int]:
        """Token ids of raw ``text`` (:func:`~dflash_eval.inputs.prompt_tokens.text_ids`)."""
        return text_ids(self, text, what)

    def describe_target(self) -> dict[str, Any] | None:
        """The ``target`` block of eval.json (None when nothing about the target was needed)."""
        return describe_target(self)


def describe_target(inp: Inputs) -> dict[str, Any] | None:
    """The ``target`` block of eval.json (None when nothing about the target was needed)."""
    if inp.target_loaded:
        t = inp.target
        return {"path": str(t.path), "identity": inp.target_identity, "num_layers": t.num_layers,
                "hidden_size": t.hidden_size, "vocab_size": t.vocab_size, "layer_types": t.layer_types,
                "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device), "loaded": True}
    if not inp.identity_known:
        return None
    try:
        cfg = inp.target_dir.text
    except (DFlashEvalError, OSError, ValueError):
        cfg = {}
    return {"path": str(inp.settings.target_model), "identity": inp.target_identity,
            "num_layers": cfg.get("num_hidden_layers"), "hidden_size": cfg.get("hidden_size"),
            "vocab_size": cfg.get("vocab_size"), "layer_types": cfg.get("layer_types"),
            "dtype": str(inp.settings.torch_dtype).removeprefix("torch."),
            "device": str(inp.settings.torch_device), "loaded": False}


def memoised_identity(inp: Inputs) -> str:
    """:meth:`TargetDir.fingerprint`, memoised under each file's device, inode, size, mtime_ns and ctime_ns
    (replacing or rewriting a file changes its inode or ctime even when size and mtime are restored);
    ``--rehash`` re-hashes the files and overwrites the memo."""
    d = inp.target_dir
    with inp.meter.timed("target_hash"):
        try:
            files = [d.path / "config.json", *d.weight_files()]
            stamp = {"path": str(d.path.resolve()), "files": [_file_stamp(f) for f in files if f.is_file()]}
            return inp.cache.memo("target_identity", stamp, d.fingerprint, refresh=inp.settings.rehash)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the target model at {d.path}: {exc} (pass --target-model DIR)") from exc
