"""Orchestration behind the eval suite's session fixtures: settings, cached completions and features, results.

The pytest plugin (:mod:`dflash_eval.pytest_plugin`) turns command-line / env / ini options into an
:class:`EvalSettings` and creates one :class:`EvalSession` per process (per xdist worker). Everything expensive is
lazy and memoised on the session, and every target computation goes through the content-addressed
:class:`~dflash_eval.cache.Cache`:

- reference completions: cache, else SGLang (``--completions sglang``) or the target's own greedy generation
  (``local``); ``cache`` never computes completions;
- target features: one cache entry per (sequence, target layer, backend, dtype, ...); missing layers of a
  sequence are extracted in ONE target forward;
- τ for every prompt from one batched :func:`dflash_eval.tau.draft_table` call;
- drift (feature error and τ difference between backends / dtypes) and the teacher-forced argmax check.

Under pytest-xdist each worker walks the prompts starting at a different offset and first only *tries* each
entry's lock, so workers produce different entries in parallel; then it waits for the entries others hold.
An entry is produced once per run (the re-check under the lock), whichever worker gets there first.

Example (outside pytest)::

    settings = EvalSettings.from_mapping({"target_model": "fixtures/target", "drafter": "fixtures/drafter",
                                          "prompts": "fixtures/prompts.jsonl"})
    session = EvalSession(settings)
    for pid, r in session.tau_results.items():
        print(pid, r.chain.tau, {b: t.tau for b, t in r.ddtree.items()})
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from dflash_eval.backends import (
    check_backend_device,
    use_backend,
)
from dflash_eval.cache import Cache, CacheEntry, cache_key, ids_digest
from dflash_eval.drift import fingerprint as layer_fingerprint
from dflash_eval.drift_plan import (  # noqa: F401
    Comparison,
    DriftStat,
    Side,
    drift_comparisons,
    drift_stat,
)
from dflash_eval.errors import ConfigError, DFlashEvalError
from dflash_eval.floors import Floors, load_floors
from dflash_eval.formatting import encode_prompt
from dflash_eval.prompt_sets import load_prompt_spec
from dflash_eval.prompts import Prompt
from dflash_eval.provenance import device_kind, library_versions, provenance
from dflash_eval.settings import (  # noqa: F401 - re-exported: the plugin and tests import them from here
    COMPLETION_SOURCES,
    DEFAULT_PROMPTS,
    OPTIONS,
    OPTIONS_BY_NAME,
    EvalSettings,
    OptionSpec,
    resolve_prompt_spec,
    worker_info,
)
from dflash_eval.tau import TauResult, chain_tau, ddtree_tau, draft_table, macro_tau

__all__ = [
    "OPTIONS",
    "OptionSpec",
    "EvalSettings",
    "EvalSession",
    "CompletionRecord",
    "PromptTau",
    "Comparison",
    "DriftStat",
    "EvalError",
    "FINGERPRINT_TEXT",
]

FINGERPRINT_TEXT = "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"


class EvalError(DFlashEvalError):
    """An evaluation input is unusable (empty completion, unreachable server, ...)."""


# ------------------------------------------------------------------------------------------------------ records


@dataclass
class CompletionRecord:
    """A reference completion: generated ids only (no prompt), decoded text, where it came from."""

    prompt_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    source: str
    finish_reason: Any = None
    spec_accept_length: float | None = None  # meta_info.spec_accept_length of a speculative SGLang server

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@dataclass
class PromptTau:
    """τ of one prompt: the chain loop and DDTree for each budget."""

    prompt_id: str
    category: str
    chain: TauResult
    ddtree: dict[int, TauResult]
    prompt_tokens: int
    completion_tokens: int


# ------------------------------------------------------------------------------------------------------ session


class Progress:
    """Progress of a long production (prompts done / total, tokens/s): a log line per step, at most every
    ``every_s`` seconds (and always for the last step). ``sink`` None: silent."""

    def __init__(self, what: str, total: int, sink: Callable[[str], None] | None, every_s: float = 2.0) -> None:
        self.what, self.total, self.sink, self.every_s = what, total, sink, every_s
        self.done = self.tokens = 0
        self.t0 = self._last = time.perf_counter()

    def step(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        now = time.perf_counter()
        if self.sink is None or (now - self._last < self.every_s and self.done < self.total):
            return
        self._last = now
        dt = max(now - self.t0, 1e-9)
        self.sink(f"[dflash-eval] {self.what}: {self.done}/{self.total} prompts, {self.tokens} tokens, "
                  f"{self.tokens / dt:.1f} tokens/s, {dt:.1f} s")

    def wrap(self, produce: Callable[[], Any], tokens: Callable[[], int]) -> Callable[[], None]:
        def run() -> None:
            produce()
            self.step(tokens())
        return run


def _default_progress_sink(worker_count: int) -> Callable[[str], None] | None:
    """Progress lines go to the real stderr (pytest's capture does not hide them) when it is a terminal and this
    is not an xdist worker; DFLASH_EVAL_PROGRESS=1 / 0 forces them on / off."""
    import sys

    flag = os.environ.get("DFLASH_EVAL_PROGRESS", "").strip().lower()
    stream = sys.__stderr__
    if flag in ("0", "false", "no", "off") or stream is None:
        return None
    if flag not in ("1", "true", "yes", "on") and (worker_count > 1 or not stream.isatty()):
        return None
    return lambda m: print(m, file=stream, flush=True)


def _code_digest() -> str:
    """sha256 of the source of the modules that decide τ (a code change invalidates memoised τ)."""
    import hashlib

    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("tau.py", *sorted(f"drafter/{f.name}" for f in (here / "drafter").glob("*.py")), "head.py"):
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()


class EvalSession:
    """Per-process evaluation state; every property is computed once (see module docstring)."""

    def __init__(self, settings: EvalSettings, *, worker: tuple[str, int, int] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.worker_id, self.worker_index, self.worker_count = worker or worker_info()
        self.cache = Cache(settings.cache_dir, cache_only=settings.cache_only, worker=self.worker_id)
        self.timings: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.log = log or (lambda _m: None)
        # progress lines of long productions (None: silent); see _default_progress_sink
        self.progress: Callable[[str], None] | None = _default_progress_sink(self.worker_count)
        self._models: dict[torch.dtype, Any] = {}
        self._completions: dict[str, CompletionRecord] = {}
        self._features: dict[tuple[str, str, str], dict[int, torch.Tensor]] = {}
        self._argmax: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.errors: list[str] = []
        self.sglang_info: dict[str, Any] | None = None  # set by the plugin's ``sglang`` fixture (eval.json "sglang")
        self._set_threads()

    def preflight(self) -> None:
        """Check every input path at once; ConfigError lists all that are missing or unreadable."""
        s = self.settings
        problems = []
        if not (s.target_model / "config.json").is_file():
            problems.append(f"--target-model {s.target_model}: " + (
                "no config.json (not a transformers model directory)" if s.target_model.is_dir() else "not found"))
        if not s.drafter.exists():
            problems.append(f"--drafter {s.drafter}: not found (a drafter directory or a .pt file)")
        for name in ("drafter_config", "reference_drafter"):
            v = getattr(s, name)
            if v is not None and not v.exists():
                problems.append(f"--{name.replace('_', '-')} {v}: not found")
        try:
            self.prompts  # noqa: B018 - loads every set/file of the spec (JSONL errors name the line)
        except ConfigError as exc:
            problems.append(f"--prompts {s.prompts}: {exc}")
        for label, path in (("--target-model", s.target_model / "config.json"),):
            if path.is_file() and not os.access(path, os.R_OK):
                problems.append(f"{label} {path}: not readable")
        if problems:
            raise ConfigError("unusable inputs:\n  " + "\n  ".join(problems))

    def _set_threads(self) -> None:
        if self.settings.torch_device.type != "cpu":
            return
        n = self.settings.torch_threads or max(1, (os.cpu_count() or 1) // (2 * max(1, self.worker_count)))
        torch.set_num_threads(n)
        self.counts["torch_threads"] = n

    # What depends on the target, the prompts and the suite options but not on the drafter.
    SHARED = ("prompts", "prompt_by_id", "floors", "target", "target_identity", "target_config", "spec", "head",
              "tokenizer", "tokenizer_digest", "prompt_ids", "comparisons")

    def share_from(self, other: EvalSession) -> EvalSession:
        """Reuse ``other``'s drafter-independent pieces (target, head, tokenizer, prompts, completions, features,
        cache handle): evaluating checkpoint after checkpoint then costs only drafter work. Both sessions must
        differ only in the drafter options (ConfigError otherwise). Returns self."""
        drafter_opts = {"drafter", "drafter_config", "reference_drafter"}
        mine = {k: v for k, v in self.settings.to_dict().items() if k not in drafter_opts}
        theirs = {k: v for k, v in other.settings.to_dict().items() if k not in drafter_opts}
        if mine != theirs:
            diff = sorted(k for k in mine if mine[k] != theirs.get(k))
            raise ConfigError(f"cannot share target resources between sessions whose options differ in {diff}")
        for name in self.SHARED:
            if name in other.__dict__:
                self.__dict__[name] = other.__dict__[name]
        self.cache = other.cache
        self._models, self._completions = other._models, other._completions
        self._features, self._argmax = other._features, other._argmax
        return self

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] += time.perf_counter() - t0

    # --------------------------------------------------------------------------------------------- inputs
    @cached_property
    def prompts(self) -> list[Prompt]:
        return load_prompt_spec(self.settings.prompts, limit=self.settings.num_prompts)

    @cached_property
    def prompt_by_id(self) -> dict[str, Prompt]:
        return {p.id: p for p in self.prompts}

    @cached_property
    def floors(self) -> Floors:
        return load_floors(self.settings.floors_file, override=self.settings.tau_floor)

    @cached_property
    def checkpoint(self) -> Any:
        from dflash_eval.drafter import read_checkpoint

        with self.timed("drafter_load"):
            return read_checkpoint(self.settings.drafter, config_path=self.settings.drafter_config,
                                   num_target_layers=self.target_num_layers)

    @cached_property
    def reference_checkpoint(self) -> Any:
        from dflash_eval.drafter import read_checkpoint

        if self.settings.reference_drafter is None:
            return None
        return read_checkpoint(self.settings.reference_drafter,
                               num_target_layers=self.target_num_layers)

    @cached_property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self.checkpoint.config.target_layer_ids)

    @cached_property
    def target(self) -> Any:
        from dflash_eval.target import load_target

        with self.timed("target_load"):
            t = load_target(self.settings.target_model, device=self.settings.torch_device,
                            dtype=self.settings.torch_dtype, device_map=self.settings.device_map)
        self._models[t.dtype] = t.model
        return t

    @cached_property
    def target_identity(self) -> str:
        """Content hash of the target's config + weights (no model load needed: see Target.identity)."""
        from dflash_eval.target import TargetDir

        if "target" in self.__dict__:
            return self.target.identity()
        with self.timed("target_hash"):
            try:
                return self._stat_memo("target_identity", self.settings.target_model,
                                       lambda: TargetDir(self.settings.target_model).fingerprint())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot read the target model at {self.settings.target_model}: {exc} "
                                  "(pass --target-model DIR)") from exc

    def _stat_memo(self, name: str, path: Path, compute: Callable[[], str]) -> str:
        """``compute()`` memoised in ``<cache>/v1/<name>.json`` under the (name, size, mtime_ns) of config.json and
        the weight files of ``path``: a warm run does not hash gigabytes of weights again (any rewrite of a file
        changes its mtime). Not counted in the cache stats; nothing is written under --cache-only."""
        from dflash_eval.atomic import atomic_write_text

        files = [path / "config.json", *sorted(path.glob("*.safetensors")), *sorted(path.glob("*.bin"))]
        stamp = cache_key(name, {"path": str(path.resolve()), "files": [
            [f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.is_file()]})
        memo_file = self.cache.root / "v1" / f"{name}.json"
        try:
            memo = json.loads(memo_file.read_text())
        except (OSError, ValueError):
            memo = {}
        if isinstance(memo, dict) and isinstance(memo.get(stamp), str):
            return memo[stamp]
        value = compute()
        if not self.cache.cache_only:
            try:
                memo_file.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(memo_file, json.dumps({**(memo if isinstance(memo, dict) else {}),
                                                         stamp: value}, indent=1, sort_keys=True) + "\n")
            except OSError:
                pass
        return value

    @cached_property
    def target_config(self) -> dict[str, Any]:
        from dflash_eval.target import TargetDir

        return TargetDir(self.settings.target_model).text

    @cached_property
    def target_num_layers(self) -> int | None:
        """The target's layer count from config.json (None when unreadable: the input checks report that)."""
        try:
            n = self.target_config.get("num_hidden_layers")
        except (ConfigError, OSError, json.JSONDecodeError):
            return None
        return int(n) if n is not None else None

    @cached_property
    def spec(self) -> Any:
        """What the drafter checks need about the target (read from config.json and the weights' head shape)."""
        from dflash_eval.drafter import TargetSpec

        if "target" in self.__dict__:
            return TargetSpec.from_target(self.target)
        cfg = self.target_config
        return TargetSpec(num_layers=int(cfg["num_hidden_layers"]), hidden_size=int(cfg["hidden_size"]),
                          vocab_size=self.head.vocab_size)

    @cached_property
    def drafter(self) -> Any:
        """The drafter, validated against the target (ArchitectureMismatch names every failing check)."""
        from dflash_eval.drafter import build_drafter

        spec = self.spec
        with self.timed("drafter_load"):
            return build_drafter(self.checkpoint, device=self.settings.torch_device, dtype=self.settings.torch_dtype,
                                 spec=spec)

    @cached_property
    def head(self) -> Any:
        """The target's input embedding and lm_head. Without a loaded target (a warm cache), they are read
        straight from the safetensors weights, so a warm run never imports transformers or builds the model."""
        from dflash_eval.head import TargetHead

        if "target" in self.__dict__:
            return TargetHead.from_model(self.target.model)
        try:
            with self.timed("head_load"):
                return TargetHead.from_pretrained(self.settings.target_model, device=self.settings.torch_device,
                                                  dtype=self.settings.torch_dtype)
        except DFlashEvalError as exc:  # weights not in a known safetensors layout: take them from the model
            self.log(f"reading the target's embedding/lm_head from safetensors failed ({exc}); loading the model")
            return TargetHead.from_model(self.target.model)

    @cached_property
    def tokenizer(self) -> Any:
        if "target" in self.__dict__:
            return self.target.tokenizer
        from transformers import AutoTokenizer

        with self.timed("target_load"):
            try:
                return AutoTokenizer.from_pretrained(self.settings.target_model, local_files_only=True)
            except Exception as exc:  # noqa: BLE001
                raise ConfigError(f"cannot load the tokenizer from {self.settings.target_model}: "
                                  f"{type(exc).__name__}: {exc}") from exc

    @cached_property
    def tokenizer_digest(self) -> str:
        from dflash_eval.target import TargetDir

        return TargetDir(self.settings.target_model).tokenizer_digest()

    def model_for(self, dtype: torch.dtype) -> Any:
        """The target model in ``dtype`` (a cast copy, made once, for the bf16-vs-fp32 comparison)."""
        if dtype not in self._models:
            base = self.target.model
            with self.timed("target_load"):
                self._models[dtype] = copy.deepcopy(base).to(dtype=dtype).eval()
        return self._models[dtype]

    @cached_property
    def chat_template_text(self) -> str | None:
        """The target tokenizer's chat template, read from its files (tokenizer_config.json ``chat_template``,
        chat_template.jinja, chat_template.json) without importing transformers; None when it has none."""
        from dflash_eval.target import TargetDir

        return TargetDir(self.settings.target_model).chat_template_text()

    @cached_property
    def prompt_format(self) -> dict[str, Any]:
        """How prompt text becomes token ids: ``{"chat_template": "on"|"off", "template_sha256": ...}`` (``auto``
        resolved); part of the prompt_ids cache key (completions and features key the resulting ids)."""
        import hashlib

        mode, tmpl = self.settings.chat_template, self.chat_template_text
        if mode == "on" and tmpl is None:
            raise ConfigError(f"--chat-template on, but the target tokenizer at {self.settings.target_model} has no "
                              "chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)")
        use = mode == "on" or (mode == "auto" and tmpl is not None)
        return {"chat_template": "on" if use else "off",
                "template_sha256": hashlib.sha256(tmpl.encode()).hexdigest() if use and tmpl else None,
                "enable_thinking": False if use else None}

    @cached_property
    def prompt_ids(self) -> dict[str, list[int]]:
        """Token ids of each prompt (raw text or the chat template, see :attr:`prompt_format`; no other special
        tokens); cached by tokenizer files + formatting + text."""
        out: dict[str, list[int]] = {}
        missing = []
        with self.timed("tokenize"):
            for p in self.prompts:
                fields = {"tokenizer": self.tokenizer_digest, "text": p.text, "add_special_tokens": False,
                          **self.prompt_format}
                e = self.cache.read("prompt_ids", cache_key("prompt_ids", fields))
                if e is not None:
                    out[p.id] = e.tensors["ids"].tolist()
                else:
                    missing.append((p, fields))
            for p, fields in missing:
                key = cache_key("prompt_ids", fields)
                if self.cache.cache_only:  # tokenizing is not "computing": do it, but write nothing
                    out[p.id] = self._tokenize(p)
                    continue
                with self.cache.locked(f"prompt_ids-{key}"):
                    e = self.cache.read("prompt_ids", key, count=False)
                    if e is not None:
                        out[p.id] = e.tensors["ids"].tolist()
                        continue
                    out[p.id] = self._tokenize(p)
                    self.cache.write("prompt_ids", key, {"ids": torch.tensor(out[p.id])}, fields=fields,
                                     meta={"prompt_id": p.id})
        return {p.id: out[p.id] for p in self.prompts}

    def _tokenize(self, p: Prompt) -> list[int]:
        ids = encode_prompt(self.tokenizer, p.text, chat_template=self.prompt_format["chat_template"])
        if not ids:
            raise EvalError(f"prompt {p.id!r} (line {p.line} of its set in --prompts {self.settings.prompts}) "
                            "tokenizes to no tokens")
        return ids

    def _ordered(self, items: list[Any]) -> list[Any]:
        """Rotate so that worker k starts k/n of the way in (parallel producers rarely collide)."""
        if not items or self.worker_count <= 1:
            return list(items)
        k = (self.worker_index * len(items)) // self.worker_count
        return items[k:] + items[:k]

    def _produce_all(self, jobs: list[tuple[str, Callable[[], bool], Callable[[], None]]]) -> None:
        """Run (lock name, present?, produce) jobs: try-lock pass in rotated order, then wait for the rest."""
        deferred = []
        for name, present, produce in self._ordered(jobs):
            if present():
                continue
            with self.cache.locked(name, blocking=False) as got:
                if not got:
                    deferred.append((name, present, produce))
                    continue
                if not present():
                    produce()
        for name, present, produce in deferred:
            if present():
                continue
            with self.cache.locked(name):
                if not present():
                    produce()

    # --------------------------------------------------------------------------------------------- completions
    def _completion_fields(self, pid: str, source: str) -> dict[str, Any]:
        f: dict[str, Any] = {"target": self.target_identity, "prompt_ids": self.prompt_ids[pid],
                             "max_new_tokens": self.settings.max_new_tokens, "source": source}
        if source == "local":
            f.update(backend=self.settings.eval_backend, dtype=str(self.settings.torch_dtype),
                     device_kind=device_kind(self.settings.torch_device), versions=library_versions(),
                     stop_at_eos=True)
        return f

    def _record(self, pid: str, entry: CacheEntry) -> CompletionRecord:
        ids = entry.tensors["output_ids"].tolist()
        return CompletionRecord(pid, self.prompt_ids[pid], ids, entry.meta.get("text", ""),
                                entry.meta.get("source", entry.manifest.get("fields", {}).get("source", "?")),
                                entry.meta.get("finish_reason"), entry.meta.get("spec_accept_length"))

    def _read_completion(self, pid: str) -> CompletionRecord | None:
        sources = {"local": ["local"], "sglang": ["sglang"], "cache": ["local", "sglang"]}[self.settings.completions]
        for src in sources:
            entry = self.cache.read("completion", cache_key("completion", self._completion_fields(pid, src)))
            if entry is not None:
                return self._record(pid, entry)
        return None

    def _write_completion(self, pid: str, source: str, ids: list[int], text: str, finish: Any, seconds: float,
                          extra_meta: dict[str, Any] | None = None) -> None:
        if not ids:
            raise EvalError(f"empty completion for prompt {pid!r} from {source}: nothing to evaluate "
                            "(the target emitted EOS at once?); no cache entry written")
        fields = self._completion_fields(pid, source)
        self.cache.write("completion", cache_key("completion", fields), {"output_ids": torch.tensor(ids)},
                         fields=fields, meta={"text": text, "source": source, "finish_reason": finish,
                                              "prompt_id": pid, **(extra_meta or {})}, seconds=seconds)

    def _generate_local(self, pid: str) -> None:
        from dflash_eval.generation import greedy_generate

        self.drafter  # noqa: B018 - a drafter that does not fit the target stops the run before any cache write
        t0 = time.perf_counter()
        with self.timed("generation"):
            ids = greedy_generate(self.target, self.prompt_ids[pid], self.settings.max_new_tokens,
                                  backend=self.settings.eval_backend)
        self.counts["generated_tokens"] += len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)  # as SGLang returns it
        self._write_completion(pid, "local", ids, text, None, time.perf_counter() - t0)

    def _generate_sglang(self, pids: list[str]) -> None:
        """Fetch greedy completions from the server (ready + identity re-checked first: cheap when the plugin's
        ``sglang`` fixture already waited) and cache them; nothing is cached unless every answer is valid."""
        from dflash_eval.sglang import check_identity, generate_greedy, wait_until_ready
        from dflash_eval.sglang_suite import DEFAULT_LAUNCH_URL

        self.drafter  # noqa: B018
        s = self.settings
        url = str(s.sglang_url or DEFAULT_LAUNCH_URL)
        t0 = time.perf_counter()
        with self.timed("sglang"):
            wait_until_ready(url, timeout_s=s.sglang_timeout)
            check_identity(url, expected_name=s.sglang_model_name or s.target_model.name)
            comps = generate_greedy(url, [self.prompt_ids[p] for p in pids], max_new_tokens=s.max_new_tokens,
                                    timeout_s=s.sglang_request_timeout)
        dt = (time.perf_counter() - t0) / max(1, len(pids))
        for pid, c in zip(pids, comps):
            extra = {} if c.spec_accept_length is None else {"spec_accept_length": c.spec_accept_length,
                                                             "spec_verify_ct": c.spec_verify_ct}
            self._write_completion(pid, "sglang", list(c.output_ids), c.text, c.finish_reason, dt, extra)

    def completions_cached(self) -> bool:
        """Whether every prompt's completion is memoised or cached for the configured ``--completions`` source."""
        sources = {"local": ["local"], "sglang": ["sglang"], "cache": ["local", "sglang"]}[self.settings.completions]
        return all(pid in self._completions or any(
            self.cache.exists("completion", cache_key("completion", self._completion_fields(pid, src)))
            for src in sources) for pid in (p.id for p in self.prompts))

    def completions(self) -> dict[str, CompletionRecord]:
        """Every prompt's reference completion (cache, else produced per ``--completions``)."""
        pids = [p.id for p in self.prompts]
        missing = [p for p in pids if p not in self._completions]
        if missing:
            with self.timed("completions"):
                self._ensure_completions(missing)
        return {p: self._completions[p] for p in pids}

    def _ensure_completions(self, pids: list[str]) -> None:
        for pid in pids:
            rec = self._read_completion(pid)
            if rec is not None:
                self._completions[pid] = rec
        todo = [p for p in pids if p not in self._completions]
        if not todo:
            return
        mode = self.settings.completions
        for pid in todo:
            self.cache.miss("completion", cache_key("completion", self._completion_fields(pid, "local")),
                            f"the reference completion of prompt {pid!r}" + (
                                " (--completions cache never generates)" if mode == "cache" else ""))
        if mode == "cache":  # cache.miss raised already when cache_only; --completions cache alone also fails
            raise EvalError(f"--completions cache: no cached completion for prompts {todo} "
                            f"under {self.settings.cache_dir}; run once with --completions local or sglang")
        if mode == "sglang":
            name = "completion-sglang-" + cache_key("batch", {"keys": [self._completion_fields(p, "sglang")
                                                                       for p in todo]})
            with self.cache.locked(name):
                still = [p for p in todo if self._read_completion(p) is None]
                if still:
                    self._generate_sglang(still)
        else:
            jobs = []
            prog = Progress("reference completions (local generation)", len(todo), self.progress)
            for pid in todo:
                key = cache_key("completion", self._completion_fields(pid, "local"))
                before = [0]

                def gen(p: str = pid, b: list[int] = before) -> None:
                    b[0] = self.counts["generated_tokens"]
                    self._generate_local(p)

                jobs.append((f"completion-{key}", lambda k=key: self.cache.exists("completion", k),
                             prog.wrap(gen, lambda b=before: self.counts["generated_tokens"] - b[0])))
            self._produce_all(jobs)
        for pid in todo:
            rec = self._read_completion(pid)
            if rec is None:
                raise EvalError(f"completion of prompt {pid!r} missing after production (cache dir unwritable?)")
            self._completions[pid] = rec

    # --------------------------------------------------------------------------------------------- features
    def _feature_fields(self, seq: list[int], layer: int, side: Side) -> dict[str, Any]:
        return {"target": self.target_identity, "tokens": ids_digest(seq), "n_tokens": len(seq), "layer": int(layer),
                "backend": side.backend, "dtype": str(side.dtype), "device_kind": device_kind(self.settings.torch_device),
                "versions": library_versions()}

    def _read_layers(self, seq: list[int], layers: tuple[int, ...], side: Side) -> dict[int, torch.Tensor]:
        out = {}
        for i in layers:
            e = self.cache.read("features", cache_key("features", self._feature_fields(seq, i, side)))
            if e is not None:
                out[i] = e.tensors["features"]
        return out

    def _extract(self, pid: str, seq: list[int], layers: tuple[int, ...], side: Side) -> None:
        from dflash_eval.features import layer_features

        self.drafter  # noqa: B018 - refuse before any cache write when the drafter does not fit
        have = self._read_layers(seq, layers, side)
        missing = tuple(i for i in layers if i not in have)
        if not missing:
            return
        model = self.model_for(side.dtype)
        t0 = time.perf_counter()
        with self.timed("target_forward"), use_backend(side.backend, self.settings.torch_device) as info:
            feats = layer_features(model, torch.tensor(seq, dtype=torch.long), list(missing))
        self.counts["target_forwards"] += 1
        dt = time.perf_counter() - t0
        for i in missing:
            fields = self._feature_fields(seq, i, side)
            meta = {"prompt_id": pid, "provenance": provenance(backend=info.name, dtype=side.dtype,
                                                               device=self.settings.torch_device,
                                                               kernel=info.chunk_impl, layer_ids=[i])}
            self.cache.write("features", cache_key("features", fields), {"features": feats[i]}, fields=fields,
                             meta=meta, seconds=dt / len(missing))

    def features(self, side: Side, layers: tuple[int, ...] | None = None) -> dict[str, dict[int, torch.Tensor]]:
        """Per prompt, per target layer features [T, H] of prompt + completion under ``side``."""
        layers = tuple(layers if layers is not None else self.layer_ids)
        comps = self.completions()
        out: dict[str, dict[int, torch.Tensor]] = {}
        todo = []
        with self.timed("features"):
            for p in self.prompts:
                memo = self._features.setdefault((p.id, side.backend, str(side.dtype)), {})
                need = tuple(i for i in layers if i not in memo)
                if need:
                    memo.update(self._read_layers(comps[p.id].sequence, need, side))
                if any(i not in memo for i in layers):
                    todo.append(p.id)
            if todo:
                if side.backend == "fla":
                    check_backend_device("fla", self.settings.torch_device)
                jobs = []
                prog = Progress(f"target features ({side.label}, layers {list(layers)})", len(todo), self.progress)
                for pid in todo:
                    seq = comps[pid].sequence
                    group = {k: v for k, v in self._feature_fields(seq, -1, side).items() if k != "layer"}
                    name = "features-" + cache_key("featgroup", group)

                    def present(pid: str = pid, seq: list[int] = seq) -> bool:
                        return all(self.cache.exists("features", cache_key("features", self._feature_fields(seq, i, side)))
                                   for i in layers)

                    jobs.append((name, present, prog.wrap(lambda pid=pid, seq=seq: self._extract(pid, seq, layers, side),
                                                          lambda seq=seq: len(seq))))
                for pid in todo:
                    for i in layers:
                        f = self._feature_fields(comps[pid].sequence, i, side)
                        if not self.cache.exists("features", cache_key("features", f)):
                            self.cache.miss("features", cache_key("features", f),
                                            f"features of prompt {pid!r}, layer {i}, {side.label}")
                self._produce_all(jobs)
                for pid in todo:
                    memo = self._features[(pid, side.backend, str(side.dtype))]
                    memo.update(self._read_layers(comps[pid].sequence, tuple(i for i in layers if i not in memo), side))
                    lost = [i for i in layers if i not in memo]
                    if lost:
                        raise EvalError(f"features of prompt {pid!r} layers {lost} missing after extraction")
            for p in self.prompts:
                memo = self._features[(p.id, side.backend, str(side.dtype))]
                out[p.id] = {i: memo[i] for i in layers}
        return out

    @property
    def eval_side(self) -> Side:
        return Side(self.settings.eval_backend, self.settings.torch_dtype)

    # --------------------------------------------------------------------------------------------- τ
    def _tau_for(self, feats: dict[str, dict[int, torch.Tensor]], budgets: tuple[int, ...]) -> dict[str, PromptTau]:
        comps = self.completions()
        drafter = self.drafter
        dt = next(drafter.parameters()).dtype
        items = []
        for p in self.prompts:
            f = torch.cat([feats[p.id][i] for i in self.layer_ids], dim=-1).to(dt)
            items.append((f, torch.tensor(comps[p.id].sequence, dtype=torch.long), len(comps[p.id].prompt_ids)))
        with self.timed("drafting"):
            tables = draft_table(drafter, self.head, items, top_k=max(budgets) if budgets else 1)
        out = {}
        mb = self.settings.max_blocks
        for p, table in zip(self.prompts, tables):
            out[p.id] = PromptTau(
                p.id, p.category, chain_tau(table, max_blocks=mb),
                {b: ddtree_tau(table, b, max_blocks=mb) for b in budgets},
                len(comps[p.id].prompt_ids), len(comps[p.id].output_ids))
        return out

    def _tau_fields(self, side: Side, budgets: tuple[int, ...]) -> dict[str, Any]:
        """Everything τ depends on: drafter weights + config, the code that drafts and simulates, the exact
        feature entries (hence target, tokens, backend, dtype, versions), budgets and max_blocks."""
        comps = self.completions()
        return {
            "drafter": self.checkpoint.fingerprint, "drafter_config": self.checkpoint.config.to_dict(),
            "code": _code_digest(), "budgets": list(budgets), "max_blocks": self.settings.max_blocks,
            "dtype": str(self.settings.torch_dtype), "device_kind": device_kind(self.settings.torch_device),
            "versions": library_versions(),
            "items": [{"prompt_len": len(comps[p.id].prompt_ids),
                       "features": [cache_key("features", self._feature_fields(comps[p.id].sequence, i, side))
                                    for i in self.layer_ids]} for p in self.prompts],
        }

    @cached_property
    def tau_results(self) -> dict[str, PromptTau]:
        """τ of every prompt on the evaluation backend's features (chain and every DDTree budget).

        The per-round acceptance lengths are memoised in the cache under a key covering every input (see
        :meth:`_tau_fields`), so a warm run does not even run the drafter; the drafter is still loaded and
        validated against the target.
        """
        self.drafter  # noqa: B018 - fail fast (before producing anything) when the drafter does not fit
        return self._memo_tau(self.eval_side, tuple(self.settings.ddtree_budget))

    def _memo_tau(self, side: Side, budgets: tuple[int, ...]) -> dict[str, PromptTau]:
        fields = self._tau_fields(side, budgets)
        key = cache_key("tau", fields)
        entry = self.cache.read("tau", key)
        if entry is None and not self.cache.cache_only:
            with self.cache.locked(f"tau-{key}"):
                entry = self.cache.read("tau", key, count=False)
                if entry is None:
                    t0 = time.perf_counter()
                    res = self._tau_for(self.features(side), budgets)
                    tensors = {}
                    for n, p in enumerate(self.prompts):
                        tensors[f"chain/{n}"] = torch.tensor(res[p.id].chain.accept_lengths, dtype=torch.int32)
                        for b in budgets:
                            tensors[f"ddtree{b}/{n}"] = torch.tensor(res[p.id].ddtree[b].accept_lengths,
                                                                     dtype=torch.int32)
                    self.cache.write("tau", key, tensors, fields=fields, seconds=time.perf_counter() - t0,
                                     meta={"prompt_ids": [p.id for p in self.prompts], "side": side.label})
                    return res
        if entry is None:  # --cache-only: computing τ from cached features is allowed, writing is not
            return self._tau_for(self.features(side), budgets)
        comps = self.completions()
        bs = self.checkpoint.config.block_size
        out = {}
        for n, p in enumerate(self.prompts):
            out[p.id] = PromptTau(
                p.id, p.category, TauResult(entry.tensors[f"chain/{n}"].tolist(), bs, "chain"),
                {b: TauResult(entry.tensors[f"ddtree{b}/{n}"].tolist(), bs, f"ddtree-{b}") for b in budgets},
                len(comps[p.id].prompt_ids), len(comps[p.id].output_ids))
        return out

    @cached_property
    def mean_tau(self) -> dict[str, Any]:
        res = list(self.tau_results.values())
        return {"chain": macro_tau([r.chain for r in res]),
                "ddtree": {b: macro_tau([r.ddtree[b] for r in res]) for b in self.settings.ddtree_budget}}

    @cached_property
    def category_tau(self) -> dict[str, Any]:
        """Per category and ``"all"``: n, chain / DDTree τ mean, median and bootstrap 95 % CI, floors, verdict
        (:func:`dflash_eval.report.category_stats`)."""
        from dflash_eval.report import category_stats

        return category_stats(self.prompt_verdicts(), self.floors)

    # --------------------------------------------------------------------------------------------- drift
    @cached_property
    def comparisons(self) -> list[Comparison]:
        return drift_comparisons(self.settings)

    def comparison(self, name: str) -> Comparison:
        for c in self.comparisons:
            if c.name == name:
                return c
        raise KeyError(name)

    def drift(self, name: str) -> dict[str, Any]:
        """Per-prompt per-layer feature drift and per-prompt τ difference for comparison ``name``."""
        memo = self.__dict__.setdefault("_drift", {})
        if name in memo:
            return memo[name]
        c = self.comparison(name)
        self.drafter  # noqa: B018
        fa, fb = self.features(c.a), self.features(c.b)
        stats: dict[str, dict[int, DriftStat]] = {}
        for p in self.prompts:
            stats[p.id] = {}
            for i in self.layer_ids:
                rel, cos, mx = drift_stat(fa[p.id][i], fb[p.id][i])
                stats[p.id][i] = DriftStat(name, p.id, i, rel, cos, mx, c.rel_tol, c.cos_tol)
        ta = self.tau_results if c.a == self.eval_side else self._memo_tau(c.a, ())
        tb = self.tau_results if c.b == self.eval_side else self._memo_tau(c.b, ())
        accept = {p.id: (ta[p.id].chain.tau, tb[p.id].chain.tau) for p in self.prompts}
        memo[name] = {"stats": stats, "accept": accept, "comparison": c}
        return memo[name]

    # --------------------------------------------------------------------------------------------- consistency
    def teacher_forced(self, pid: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(argmax, top1 - top2 logit margin) of the target at every position of prompt + completion."""
        if pid in self._argmax:
            return self._argmax[pid]
        rec = self.completions()[pid]
        seq = rec.sequence
        side = self.eval_side
        fields = {"target": self.target_identity, "tokens": ids_digest(seq), "n_tokens": len(seq),
                  "backend": side.backend, "dtype": str(side.dtype),
                  "device_kind": device_kind(self.settings.torch_device), "versions": library_versions()}

        def produce() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
            with self.timed("target_forward"), use_backend(side.backend, self.settings.torch_device), \
                    torch.no_grad():
                logits = self.target.model(input_ids=torch.tensor([seq], device=self.target.device)).logits[0].float()
            self.counts["target_forwards"] += 1
            top = logits.topk(2, dim=-1)
            return {"argmax": top.indices[:, 0].cpu(), "margin": (top.values[:, 0] - top.values[:, 1]).cpu()}, \
                {"prompt_id": pid}

        e = self.cache.get_or_produce("argmax", fields, produce, what=f"teacher-forced argmax of {pid!r}")
        self._argmax[pid] = (e.tensors["argmax"], e.tensors["margin"])
        return self._argmax[pid]

    # --------------------------------------------------------------------------------------------- fingerprint
    @cached_property
    def fingerprint(self) -> dict[str, Any]:
        """Summary statistics of every target layer's features of :data:`FINGERPRINT_TEXT` (torch backend, the
        evaluation dtype and device: no second copy of the target is made)."""
        from dflash_eval.features import layer_features

        ids = list(self.tokenizer(FINGERPRINT_TEXT, add_special_tokens=False)["input_ids"])
        model = self.target.model
        layers = list(range(self.target.num_layers))
        with self.timed("target_forward"), use_backend("torch", self.settings.torch_device):
            feats = layer_features(model, torch.tensor(ids), layers)
        stats = {str(i): layer_fingerprint(feats[i]) for i in layers}
        return {"target": self.target_identity, "text": FINGERPRINT_TEXT, "tokens": ids_digest(ids),
                "n_tokens": len(ids), "backend": "torch", "dtype": str(self.target.dtype).removeprefix("torch."),
                "device_kind": device_kind(self.settings.torch_device), "layers": stats,
                "versions": library_versions()}

    # --------------------------------------------------------------------------------------------- report
    def prompt_verdicts(self) -> dict[str, dict[str, Any]]:
        out = {}
        fl = self.floors
        for pid, r in self.tau_results.items():
            floor = fl.for_prompt(pid)
            dd_floor = {b: fl.for_prompt(pid, b) for b in r.ddtree}
            ok = (floor is not None and r.chain.tau >= floor) and all(
                f is not None and r.ddtree[b].tau >= f for b, f in dd_floor.items())
            out[pid] = {
                "category": r.category, "tau": r.chain.tau, "rounds": r.chain.rounds,
                "accept_lengths": r.chain.accept_lengths, "histogram": r.chain.histogram,
                "ddtree": {str(b): t.tau for b, t in r.ddtree.items()},
                "ddtree_accept_lengths": {str(b): t.accept_lengths for b, t in r.ddtree.items()},
                "floor": floor, "ddtree_floor": {str(b): f for b, f in dd_floor.items()},
                "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                "passed": bool(ok),
            }
            rec = self._completions.get(pid)
            server_accept = rec.spec_accept_length if rec is not None else None
            if server_accept is not None:  # the SGLang server ran the drafter itself (--speculative-algorithm)
                out[pid]["server_accept_length"] = server_accept
        return out

    def fragment(self) -> dict[str, Any]:
        """Everything this process measured, JSON-ready (merged across xdist workers by the report)."""
        out: dict[str, Any] = {"worker": self.worker_id, "settings": self.settings.to_dict(),
                               "timings": {k: round(v, 4) for k, v in self.timings.items()},
                               "counts": dict(self.counts), "cache": self.cache.stats.to_dict(),
                               "errors": list(self.errors)}
        if self.sglang_info:
            out["sglang"] = self.sglang_info
        if "target" in self.__dict__:
            t = self.target
            out["target"] = {"path": str(t.path), "identity": self.target_identity, "num_layers": t.num_layers,
                             "hidden_size": t.hidden_size, "vocab_size": t.vocab_size, "layer_types": t.layer_types,
                             "dtype": str(t.dtype), "device": str(t.device), "loaded": True}
        elif "target_identity" in self.__dict__:
            cfg = self.__dict__.get("target_config", {})
            out["target"] = {"path": str(self.settings.target_model), "identity": self.target_identity,
                             "num_layers": cfg.get("num_hidden_layers"), "hidden_size": cfg.get("hidden_size"),
                             "vocab_size": cfg.get("vocab_size"), "layer_types": cfg.get("layer_types"),
                             "dtype": str(self.settings.torch_dtype), "device": str(self.settings.torch_device),
                             "loaded": False}
        if "target" in out:
            out["provenance"] = provenance(backend=self.settings.eval_backend, dtype=self.settings.torch_dtype,
                                           device=self.settings.torch_device)
        if "checkpoint" in self.__dict__:
            ck = self.checkpoint
            out["drafter"] = {"path": str(ck.source), "fingerprint": ck.fingerprint, "config": ck.config.to_dict()}
        if "tau_results" in self.__dict__:
            out["prompts"] = self.prompt_verdicts()
            m = self.mean_tau
            out["mean_tau"] = m["chain"]
            out["mean_ddtree"] = {str(b): v for b, v in m["ddtree"].items()}
            out["mean_floor"] = self.floors.for_mean()
            out["mean_ddtree_floor"] = {str(b): self.floors.for_mean(b) for b in self.settings.ddtree_budget}
            out["categories"] = self.category_tau
        drift = self.__dict__.get("_drift", {})
        if drift:
            rows, acc = [], []
            for name, d in drift.items():
                c = d["comparison"]
                for pid, per in d["stats"].items():
                    rows.extend(s.to_dict() for s in per.values())
                for pid, (a, b) in d["accept"].items():
                    acc.append({"comparison": name, "prompt_id": pid, "tau_a": a, "tau_b": b, "diff": abs(a - b),
                                "tol": c.accept_tol, "passed": abs(a - b) <= c.accept_tol,
                                "a": c.a.label, "b": c.b.label})
            out["drift"] = rows
            out["drift_accept"] = acc
        return out
