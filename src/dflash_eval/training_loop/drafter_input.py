"""What :meth:`dflash_eval.Evaluator.evaluate` accepts as a drafter, turned into what an evaluation reads.

- a path (a released directory, a ``.safetensors`` file or a training ``.pt``): read by the evaluation as the
  suite reads ``--drafter``;
- a state dict (parameter name -> tensor, keys optionally prefixed ``module.``) with its config (a
  :class:`~dflash_eval.drafter.DrafterConfig`, a config.json's dict or its path): a
  :class:`~dflash_eval.drafter.Checkpoint` in memory, the same one reading those weights saved would give;
- a live :class:`~dflash_eval.drafter.DFlashDrafter` (the model being trained): evaluated as it is, on its device,
  when its device and dtype are the run's (``--device`` / ``--dtype``); otherwise a copy of its weights is built in
  the run's device and dtype, so τ is always the τ of these weights saved and evaluated from disk. Another
  ``nn.Module`` is evaluated through its state dict and ``config``.

A module is evaluated in eval mode under ``torch.no_grad()``, and its mode is restored afterwards
(:func:`evaluation_mode`), whatever the evaluation raised.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

import torch
from torch import nn

from dflash_eval.drafter import Checkpoint, DFlashDrafter, DrafterConfig, checkpoint_from_state_dict, load_config_file
from dflash_eval.drafter.vocabulary import TargetVocabulary
from dflash_eval.errors import CheckpointError, ConfigError

__all__ = ["DrafterInput", "DrafterSource", "DrafterConfigSource", "drafter_input", "evaluation_mode", "same_device"]

#: What :func:`drafter_input` accepts as a drafter: a checkpoint path, a module, or a state dict.
DrafterSource = str | os.PathLike[str] | nn.Module | Mapping[str, torch.Tensor]
#: A drafter's config: a DrafterConfig, a config.json's dict or its path.
DrafterConfigSource = DrafterConfig | Mapping[str, object] | str | os.PathLike[str]


class _TargetFacts(TypedDict):
    """What :func:`_config` needs of the target besides the config itself."""

    num_target_layers: int | None
    vocabulary: TargetVocabulary | None


@dataclass
class DrafterInput:
    """One drafter to evaluate: ``path`` (read from disk by the evaluation) or ``checkpoint`` (in memory), and the
    ``live`` module evaluated as it is (None: a drafter is built from the checkpoint); ``module``: the module whose
    mode :func:`evaluation_mode` restores; ``label``: what reports name it by."""

    label: str
    path: Path | None = None
    checkpoint: Checkpoint | None = None
    live: DFlashDrafter | None = None
    module: nn.Module | None = None


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two torch devices are the same device (``cuda`` is the current CUDA device)."""
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return a.type == "cpu" or a.index == b.index
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def _config(config: DrafterConfigSource, *, source: str, num_target_layers: int | None,
            vocabulary: TargetVocabulary | None) -> DrafterConfig:
    """A DrafterConfig from a DrafterConfig, a config.json's dict or its path (ConfigError naming the source)."""
    if isinstance(config, DrafterConfig):
        return config
    if isinstance(config, Mapping):
        return DrafterConfig.from_dict(dict(config), source=source, num_target_layers=num_target_layers,
                                       vocabulary=vocabulary)
    if isinstance(config, (str, os.PathLike)):
        return load_config_file(Path(config), num_target_layers=num_target_layers, vocabulary=vocabulary)
    raise ConfigError(f"{source}: the drafter's config is needed (config=DrafterConfig, a config.json dict or its "
                      f"path), got {type(config).__name__}")


def _module_input(module: nn.Module, config: DrafterConfigSource | None, label: str, device: torch.device,
                  dtype: torch.dtype, **target: Unpack[_TargetFacts]) -> DrafterInput:
    cfg_given = config if config is not None else getattr(module, "config", None)
    if cfg_given is None:
        raise ConfigError(f"{label}: a {type(module).__name__} has no DrafterConfig; pass config=")
    cfg = _config(cfg_given, source=label, **target)
    ckpt = checkpoint_from_state_dict(module.state_dict(), cfg, source=label)
    params = list(module.parameters())
    live = None
    if isinstance(module, DFlashDrafter) and params and config is None and all(
            p.dtype == dtype and same_device(p.device, device) for p in params):
        live = module  # its own weights, device and dtype are the run's: no copy
    return DrafterInput(label=label, checkpoint=ckpt, live=live, module=module)


def drafter_input(drafter: DrafterSource, *, config: DrafterConfigSource | None = None, name: str | None = None,
                  device: torch.device, dtype: torch.dtype, num_target_layers: int | None = None,
                  vocabulary: TargetVocabulary | None = None) -> DrafterInput:
    """``drafter`` (see module docstring) as a :class:`DrafterInput`; ``device`` / ``dtype``: the run's; ``name``:
    the label in reports (default: the path, or ``in-memory <class>``)."""
    target: _TargetFacts = {"num_target_layers": num_target_layers, "vocabulary": vocabulary}
    if isinstance(drafter, (str, os.PathLike)):
        path = Path(drafter).expanduser().absolute()
        if not path.exists():
            raise CheckpointError(f"drafter checkpoint not found: {path} (a drafter directory or a .pt file)")
        if config is not None:
            raise ConfigError(f"{path}: config= is for a state dict or a module; a checkpoint on disk brings its own "
                              "(config.json beside it, or embedded in the .pt)")
        return DrafterInput(label=name or str(path), path=path)
    if isinstance(drafter, nn.Module):
        return _module_input(drafter, config, name or f"in-memory {type(drafter).__name__}", device, dtype,
                             **target)
    if isinstance(drafter, Mapping):
        label = name or "in-memory state dict"
        if config is None:
            raise ConfigError(f"{label}: a state dict needs its config (config=DrafterConfig, a config.json dict or "
                              "its path)")
        cfg = _config(config, source=label, **target)
        return DrafterInput(label=label, checkpoint=checkpoint_from_state_dict(dict(drafter), cfg, source=label))
    raise CheckpointError(f"cannot evaluate a {type(drafter).__name__}: pass a checkpoint path, a state dict with "
                          "config=, or a DFlashDrafter module")


@contextmanager
def evaluation_mode(module: nn.Module | None) -> Iterator[None]:
    """``module`` in eval mode under ``torch.no_grad()`` for the block; its train/eval mode restored after it."""
    if module is None:
        with torch.no_grad():
            yield
        return
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes.items():
            m.training = training
