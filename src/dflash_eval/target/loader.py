"""The target model directory and the loaded target causal LM (transformers, local files only).

:class:`TargetDir` is the one reader of a target directory without loading the model: config.json (parsed once,
multimodal configs read through their ``text_config``), the weight files and their fingerprint, the tokenizer
files' digest and the chat template. :func:`load_target` loads the model and tokenizer: to CUDA when available
(else CPU), in bf16 by default. Nothing is ever fetched from a hub: ``local_files_only=True`` everywhere, and a
missing directory is a clear error naming the path.

Example::

    from dflash_eval.target.loader import TargetDir, load_target
    print(TargetDir("fixtures/target").num_layers)
    target = load_target("fixtures/target", dtype="fp32")
    print(target.num_layers, target.hidden_size, target.identity()[:12])
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import torch
from torch import nn

from dflash_eval.common.dtypes import parse_dtype
from dflash_eval.common.heap import importing
from dflash_eval.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

__all__ = ["TargetDir", "Target", "load_target", "default_device", "text_config"]

_FULL_HASH_LIMIT = 512 * 1024 * 1024  # files above this are fingerprinted by header + sampled tensor bytes
_SAMPLE_BYTES = 4096  # bytes read at the start, middle and end of every tensor of a large safetensors file


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The text part of a (possibly multimodal) transformers config."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _safetensors_header(fh: BinaryIO, size: int) -> tuple[bytes, dict[str, Any]] | None:
    """(raw header bytes, parsed header) of a safetensors file, None when it is not one."""
    fh.seek(0)
    head = fh.read(8)
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "little")
    if not 2 <= n <= min(size - 8, 100 * 1024 * 1024):
        return None
    raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return (raw, header) if isinstance(header, dict) else None


def _file_digest(path: Path) -> str:
    """sha256 of a weight file: every byte up to :data:`_FULL_HASH_LIMIT`; beyond, the whole
    safetensors header (names, dtypes, shapes, offsets) plus :data:`_SAMPLE_BYTES` at the start, middle and end of
    EVERY tensor (a non-safetensors file: its first MiB and 16 chunks spread over it)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as fh:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
            return h.hexdigest()
        parsed = _safetensors_header(fh, size)
        if parsed is None:
            fh.seek(0)
            h.update(fh.read(1 << 20))
            for i in range(16):
                fh.seek(size * i // 16)
                h.update(fh.read(1 << 16))
            return h.hexdigest()
        raw, header = parsed
        h.update(b"safetensors-sampled\n")
        h.update(raw)
        base = 8 + len(raw)
        spans = sorted(tuple(v["data_offsets"]) for k, v in header.items()
                       if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v)
        for begin, end in spans:
            length = int(end) - int(begin)
            for at in sorted({0, max(0, length // 2 - _SAMPLE_BYTES // 2), max(0, length - _SAMPLE_BYTES)}):
                fh.seek(base + int(begin) + at)
                h.update(fh.read(min(_SAMPLE_BYTES, length - at)))
    return h.hexdigest()




_TOKENIZER_FILE_PREFIXES = ("tokenizer", "vocab", "merges", "special_tokens_map", "added_tokens", "chat_template")


@dataclass(frozen=True)
class TargetDir:
    """A target model directory, read without loading the model; config.json is parsed once, on first use.

    Config properties read the text part of the config: ``text_config`` when the file nests one (multimodal
    checkpoints), else the top level. Reading raises :class:`~dflash_eval.errors.ConfigError` naming the file
    when the directory or config.json is missing, or config.json is not a JSON object.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @cached_property
    def raw(self) -> dict[str, Any]:
        """The parsed config.json as written (:meth:`check_config`, once)."""
        return self.check_config()

    def check_config(self) -> dict[str, Any]:
        """config.json parsed: ConfigError naming the directory or the file when it is missing, unreadable, not JSON
        or not a JSON object."""
        if not self.path.is_dir():
            raise ConfigError(f"target model directory not found: {self.path} (pass --target-model DIR)")
        if not self.config_file.is_file():
            raise ConfigError(f"{self.path} has no config.json: not a transformers model directory")
        try:
            data = json.loads(self.config_file.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{self.config_file}: cannot read ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{self.config_file}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{self.config_file}: expected a JSON object, got {type(data).__name__}")
        return data

    @property
    def text(self) -> dict[str, Any]:
        """The text model's config: ``text_config`` when present (multimodal checkpoints), else the top level."""
        nested = self.raw.get("text_config")
        return nested if isinstance(nested, dict) and nested else self.raw

    def _field(self, key: str) -> Any:
        if key not in self.text:
            raise ConfigError(f"{self.config_file}: no {key!r}" + (" in 'text_config'" if self.text is not self.raw
                                                                   else ""))
        return self.text[key]

    @property
    def num_layers(self) -> int:
        return int(self._field("num_hidden_layers"))

    @property
    def hidden_size(self) -> int:
        return int(self._field("hidden_size"))

    @property
    def vocab_size(self) -> int:
        return int(self._field("vocab_size"))

    @property
    def layer_types(self) -> list[str]:
        """Per-layer attention kind; all ``full_attention`` when the config does not say."""
        types = self.text.get("layer_types")
        return list(types) if types else ["full_attention"] * self.num_layers

    @property
    def eos_token_id(self) -> int | None:
        """The config's EOS id (text part first, then the top level); the first one when it lists several."""
        eos = self.text.get("eos_token_id", self.raw.get("eos_token_id"))
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(self.text.get("tie_word_embeddings", self.raw.get("tie_word_embeddings", False)))

    def weight_files(self) -> list[Path]:
        """``*.safetensors`` then ``*.bin`` files, each group sorted by name."""
        return sorted(self.path.glob("*.safetensors")) + sorted(self.path.glob("*.bin"))

    def fingerprint(self) -> str:
        """sha256 over config.json and the weight files: each file hashed whole up to 512 MiB; beyond, its
        safetensors header plus 4 KiB at the start, middle and end of every tensor."""
        h = hashlib.sha256()
        h.update(json.dumps(self.raw, sort_keys=True).encode())
        for w in self.weight_files():
            h.update(w.name.encode())
            h.update(_file_digest(w).encode())
        return h.hexdigest()

    def tokenizer_files(self) -> list[Path]:
        """The tokenizer files (tokenizer*, vocab*, merges*, special tokens, added tokens, chat template), sorted."""
        return sorted(f for f in self.path.iterdir() if f.is_file() and f.name.startswith(_TOKENIZER_FILE_PREFIXES))

    def tokenizer_digest(self) -> str:
        """sha256 over the tokenizer files (:meth:`tokenizer_files`)."""
        h = hashlib.sha256()
        for f in self.tokenizer_files():
            h.update(f.name.encode())
            h.update(hashlib.sha256(f.read_bytes()).hexdigest().encode())
        return h.hexdigest()

    def check_json_files(self) -> None:
        """Parse config.json and every JSON tokenizer file; ConfigError naming the file and the JSON error (the
        first bad file) instead of a tokenizer library's traceback later."""
        self.check_config()
        for f in self.tokenizer_files():
            if f.suffix == ".json":
                _read_json(f)

    def chat_template_text(self) -> str | None:
        """The tokenizer's chat template, read from its files (chat_template.jinja, chat_template.json,
        tokenizer_config.json ``chat_template``) without importing transformers; None when it has none."""
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        for name, key in (("chat_template.json", "chat_template"), ("tokenizer_config.json", "chat_template")):
            f = self.path / name
            if not f.is_file():
                continue
            data = _read_json(f)  # invalid JSON is an error, never "no chat template"
            t = data.get(key) if isinstance(data, dict) else None
            if isinstance(t, list):  # named templates: [{"name": "default", "template": ...}, ...]
                t = json.dumps(t, sort_keys=True)
            if t:
                return str(t)
        return None


def _read_json(path: Path) -> Any:
    """The parsed JSON file; ConfigError naming the file and the JSON error."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from exc


@dataclass
class Target:
    """A loaded target model with its tokenizer and where it came from.

    Layer count and hidden size come from the directory's config.json (:attr:`dir`); the vocabulary size from
    the loaded lm_head; the layer types from the loaded config (transformers may derive them), else config.json.
    """

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    path: Path
    device: torch.device
    dtype: torch.dtype
    _identity: str | None = field(default=None, repr=False)
    dir: TargetDir = field(default=None, repr=False, compare=False)  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.dir is None:
            self.dir = TargetDir(self.path)

    @property
    def config(self) -> PretrainedConfig:
        """The loaded model's (text) config object."""
        return text_config(cast("PretrainedConfig", self.model.config))  # a transformers model's attribute

    @property
    def num_layers(self) -> int:
        return self.dir.num_layers

    @property
    def hidden_size(self) -> int:
        return self.dir.hidden_size

    @property
    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings()  # type: ignore[operator]  # transformers' method, seen through nn.Module.__getattr__
        return int(head.weight.shape[0])

    @property
    def layer_types(self) -> list[str]:
        types = getattr(self.config, "layer_types", None)
        return list(types) if types else self.dir.layer_types

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's EOS id, else the config's (:attr:`TargetDir.eos_token_id`)."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return self.dir.eos_token_id if eos is None else eos

    def identity(self) -> str:
        """Content hash of config + weights (:meth:`TargetDir.fingerprint`, cached on the object)."""
        if self._identity is None:
            self._identity = self.dir.fingerprint()
        return self._identity


def load_target(
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "bf16",
    device_map: str | dict[str, Any] | None = None,
) -> Target:
    """Load a causal LM and its tokenizer from a local directory.

    ``device_map`` (e.g. ``"auto"``, needs accelerate) spreads a target too large for one GPU over all GPUs;
    inputs then go to the device of its first parameters.

    Raises:
        ConfigError: the directory or its config.json is missing, or transformers cannot load it.
    """
    with importing():  # the modeling code, with the garbage collector paused (dflash_eval.common.heap)
        from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tdir = TargetDir(path)
    tdir.check_json_files()  # a missing directory or an invalid config/tokenizer JSON: a ConfigError naming it
    dev = torch.device(device) if device is not None else default_device()
    dt = parse_dtype(dtype)
    try:
        if device_map is not None:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dt, device_map=device_map)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dt)
    except Exception as exc:
        raise ConfigError(f"cannot load target model from {path}: {type(exc).__name__}: {exc}") from exc
    if device_map is None:
        model.to(dev)  # type: ignore[arg-type]  # transformers types PreTrainedModel.to through a decorator that loses self
    else:
        dev = next(model.parameters()).device
    model.eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ConfigError(f"cannot load tokenizer from {path}: {type(exc).__name__}: {exc}") from exc
    return Target(model=model, tokenizer=tokenizer, path=path, device=dev, dtype=dt, dir=tdir)
