"""Reading DFlash drafter checkpoints: the released HF layout and training ``.pt`` files.

1. A directory with ``config.json`` and ``model.safetensors`` (or sharded, with ``model.safetensors.index.json``)
   holding keys ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``, ``layers.N....``.
2. A training checkpoint ``.pt``: the state dict at the top level or under ``"model"`` / ``"state_dict"``, keys
   optionally prefixed ``module.``; read with ``torch.load(weights_only=True)`` (never unpickling code). Its
   config comes from ``config_path``, else an embedded ``"config"`` dict.

Either way, and for a state dict held in memory, the keys are read by SGLang's DFlash loader's rules
(:mod:`dflash_eval.drafter.weight_names`): ``model.`` removed key by key, fused q/k/v and gate/up tensors split,
keys that load no parameter (an embedding, an lm_head, a RoPE cache, ...) skipped with one warning naming them.

Reading never fails on shape mismatches or keys that cannot be loaded: :mod:`dflash_eval.drafter.checks` reports
those one check at a time, and :func:`build_drafter` refuses to build from a checkpoint that fails them.

Example::

    ckpt = read_checkpoint("fixtures/drafter")
    drafter = build_drafter(ckpt, spec=TargetSpec(num_layers=8, hidden_size=256, vocab_size=4096))
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from dflash_eval.common.atomic import atomic_write_with
from dflash_eval.common.dtypes import parse_dtype
from dflash_eval.drafter.checks import Check, NonFinite, TargetSpec, run_checks
from dflash_eval.drafter.config import DrafterConfig, load_config_file
from dflash_eval.drafter.model import DFlashDrafter
from dflash_eval.drafter.vocabulary import TargetVocabulary
from dflash_eval.drafter.weight_names import WeightNames, map_weights
from dflash_eval.errors import CheckpointError, ConfigError, DrafterRefused

__all__ = ["Checkpoint", "nonfinite_tensors", "read_checkpoint", "checkpoint_from_state_dict", "fit_refusal",
           "build_drafter", "save_drafter"]


@dataclass
class Checkpoint:
    """A drafter checkpoint as read, before any validation.

    Attributes:
        state_dict: the drafter's parameters under their own names, as SGLang's loader would fill them
            (:func:`~dflash_eval.drafter.weight_names.map_weights`); the tensors that load no parameter are not in
            it (``names.skipped``).
        fingerprint: sha256 of exactly those parameters (names, shapes, dtypes, bytes): of the weights the drafter
            computes with, not of the file. A layout variant of the same weights (an extra embedding or lm_head, a
            ``model.`` prefix, fused projections) has the fingerprint of the plain layout and shares its cached
            results: what it skips changes no value computed here, nor what SGLang serves.
        names: how the keys were read (what was renamed, split, skipped, or cannot be loaded).
    """

    source: Path
    config: DrafterConfig
    state_dict: dict[str, Tensor]
    fingerprint: str
    names: WeightNames = field(default_factory=WeightNames)
    _nonfinite: dict[str, NonFinite] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.state_dict.items()}

    @property
    def nonfinite(self) -> dict[str, NonFinite]:
        """The floating-point tensors holding NaN or infinite values, with their counts (empty: every value is
        finite); counted once per checkpoint."""
        if self._nonfinite is None:
            self._nonfinite = nonfinite_tensors(self.state_dict)
        return self._nonfinite


def _read_safetensors_dir(path: Path) -> dict[str, Tensor]:
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    try:
        if single.is_file():
            return load_file(str(single))
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            sd: dict[str, Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                sd.update(load_file(str(path / shard)))
            return sd
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path}: cannot read drafter weights ({type(exc).__name__}: {exc}); truncated file?") from exc
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json in the drafter directory")


def _pickled_object(exc: BaseException) -> str | None:
    """What a weights-only load refused to unpickle, from torch's message (None: another failure)."""
    if not isinstance(exc, pickle.UnpicklingError):
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return f"of class {found.group(1)}"
    found = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    return f"the weights-only reader stopped at: {found.group(1).strip().rstrip('.')}" if found else \
        "one that weights_only=True does not read"


def _read_pt(path: Path) -> tuple[dict[str, Tensor], dict[str, Any] | None]:
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        what = _pickled_object(exc)
        if what is not None:
            raise CheckpointError(
                f"{path}: refused: it holds a pickled Python object ({what}), and unpickling it may run code the "
                "file names; dflash-eval reads only tensors, dicts, lists and plain values "
                "(torch.load(weights_only=True)). If you trust the file, convert it once: ckpt = torch.load(PATH, "
                "weights_only=False), then save only its tensors, torch.save(state_dict, 'drafter.pt') (a state "
                "dict, optionally with a plain 'config' dict), or safetensors.torch.save_file(state_dict, "
                "'model.safetensors') beside the drafter's config.json, and pass that"
            ) from None
        raise CheckpointError(
            f"{path}: cannot read as a weights-only torch checkpoint ({type(exc).__name__}: {exc}); a truncated or "
            "not a torch file?"
        ) from exc
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict at the top level, got {type(obj).__name__}")
    embedded = obj.get("config") if isinstance(obj.get("config"), dict) else None
    for key in ("model", "state_dict", "module"):
        if isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    sd = {k: v for k, v in obj.items() if isinstance(v, Tensor)}
    if not sd:
        raise CheckpointError(f"{path}: no tensors found at the top level or under 'model'/'state_dict'")
    return sd, embedded


def nonfinite_tensors(sd: dict[str, Tensor]) -> dict[str, NonFinite]:
    """``{key: NonFinite}`` of every floating-point tensor of ``sd`` with a NaN or infinite value."""
    out = {}
    for k, t in sd.items():
        if not (t.is_floating_point() or t.is_complex()) or bool(torch.isfinite(t).all()):
            continue
        nan = int(torch.isnan(t).sum())
        out[k] = NonFinite(nan=nan, inf=int(torch.isinf(t).sum()), size=t.numel())
    return out


def _fingerprint(sd: dict[str, Tensor]) -> str:
    """sha256 over the parameters in name order: each name, shape, dtype and raw bytes."""
    h = hashlib.sha256()
    for k in sorted(sd):
        t = sd[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def read_checkpoint(
    path: str | Path,
    *,
    config_path: str | Path | None = None,
    num_target_layers: int | None = None,
    vocabulary: TargetVocabulary | None = None,
) -> Checkpoint:
    """Read a drafter from a released directory or a ``.pt`` training checkpoint (``num_target_layers`` and
    ``vocabulary``: the target's, for a config without target_layer_ids or mask_token_id).

    Raises:
        CheckpointError: the path is missing or unreadable.
        ConfigError: no usable config (give ``config_path`` for a bare ``.pt``).
    """
    path = Path(path)
    embedded: dict[str, Any] | None = None
    if path.is_dir():
        sd = _read_safetensors_dir(path)
        cfg_file = Path(config_path) if config_path else path / "config.json"
    elif path.is_file():
        if path.suffix == ".safetensors":
            try:
                sd = load_file(str(path))
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{path}: cannot read safetensors ({exc})") from exc
        else:
            sd, embedded = _read_pt(path)
        cfg_file = Path(config_path) if config_path else path.parent / "config.json"
    else:
        raise CheckpointError(f"drafter checkpoint not found: {path} (pass --drafter DIR or FILE.pt)")
    kwargs: dict[str, Any] = {"num_target_layers": num_target_layers, "vocabulary": vocabulary}
    if config_path is not None or (embedded is None and cfg_file.is_file()):
        cfg = load_config_file(cfg_file, **kwargs)
    elif embedded is not None:
        cfg = DrafterConfig.from_dict(embedded, source=f"{path}['config']", **kwargs)
    else:
        raise ConfigError(
            f"{path}: no drafter config: none embedded under 'config' and no {cfg_file}; pass --drafter-config FILE"
        )
    return _checkpoint(path, cfg, sd)


def checkpoint_from_state_dict(state_dict: dict[str, Tensor], config: DrafterConfig, *,
                               source: str | Path) -> Checkpoint:
    """A checkpoint held in memory (a training loop's state dict, keys optionally prefixed ``module.``): the same
    :class:`Checkpoint` :func:`read_checkpoint` gives for these weights saved, fingerprint and warnings included. The
    tensors are not copied. ``source``: what reports name it by."""
    bad = sorted(k for k, v in state_dict.items() if not isinstance(v, Tensor))
    if bad or not state_dict:
        raise CheckpointError(f"{source}: a drafter state dict maps parameter names to tensors; "
                              + (f"not tensors: {bad[:5]}" if bad else "it is empty"))
    return _checkpoint(Path(source), config, {k: v.detach() for k, v in state_dict.items()})


def _checkpoint(source: Path, config: DrafterConfig, tensors: Mapping[str, Tensor]) -> Checkpoint:
    """The checkpoint of ``tensors`` read by SGLang's rules, with the one warning naming what they skip."""
    sd, names = map_weights(tensors, config)
    message = names.skipped_warning(source)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=3)
    return Checkpoint(source=source, config=config, state_dict=sd, fingerprint=_fingerprint(sd), names=names)


def fit_refusal(ckpt: Checkpoint, spec: TargetSpec | None,
                checks: list[Check] | None = None) -> DrafterRefused | None:
    """Why the drafter cannot be built for the target: a DrafterRefused naming every failed check (None: it fits);
    ``checks``: the results of :func:`run_checks` when already run."""
    failures = [c for c in (run_checks(ckpt, spec) if checks is None else checks) if c.status == "fail"]
    if not failures:
        return None
    lines = "\n".join(f"  - [{c.name}] {c.message}" for c in failures)
    return DrafterRefused(f"drafter {ckpt.source} does not fit the target:\n{lines}",
                          [(c.name, c.message) for c in failures])


def build_drafter(
    ckpt: Checkpoint,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "bf16",
    spec: TargetSpec | None = None,
    checks: list[Check] | None = None,
) -> DFlashDrafter:
    """Instantiate the drafter and load its weights; refuse on any failing validation check (DrafterRefused, an
    ArchitectureMismatch naming every failed check).

    Args:
        ckpt: from :func:`read_checkpoint`.
        spec: the target to validate against (when None, the checks compare with the drafter's own config).
        checks: the checks already run on ``ckpt`` against ``spec`` (run here when None).
    """
    refusal = fit_refusal(ckpt, spec, checks)
    if refusal is not None:
        raise refusal
    model = DFlashDrafter(ckpt.config)
    model.load_state_dict(ckpt.state_dict, strict=True)
    return model.to(device=torch.device(device), dtype=parse_dtype(dtype)).eval()


def save_drafter(model: DFlashDrafter, out_dir: str | Path, *, dtype: str | torch.dtype | None = None) -> None:
    """Write the released layout (config.json + model.safetensors), each file atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dt = parse_dtype(dtype) if dtype is not None else None
    sd = {k: (v.to(dt) if dt is not None else v).detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write_with(out / "model.safetensors", lambda p: save_file(sd, str(p), metadata={"format": "pt"}))
    model.config.save(out / "config.json")
