"""The DFlash drafter: its config, the model and drafting primitive, checkpoints and architecture checks.

Modules, each importing only those before it (no cycle): :mod:`~dflash_eval.drafter.vocabulary` (the target
tokenizer's mask token), :mod:`~dflash_eval.drafter.config` (DrafterConfig, config.json),
:mod:`~dflash_eval.drafter.model` (DFlashDrafter, expected_shapes, block_ids, draft_logits),
:mod:`~dflash_eval.drafter.weight_names` (which checkpoint key loads which parameter, by SGLang's loader's rules),
:mod:`~dflash_eval.drafter.checks` (checks against the target), :mod:`~dflash_eval.drafter.checkpoint`
(reading, building and saving checkpoints).

Example::

    from dflash_eval.drafter import TargetSpec, build_drafter, read_checkpoint
    drafter = build_drafter(read_checkpoint("fixtures/drafter"), spec=TargetSpec(8, 256, 4096))
"""

from __future__ import annotations

from dflash_eval.drafter.checkpoint import (
    Checkpoint,
    build_drafter,
    checkpoint_from_state_dict,
    fit_refusal,
    read_checkpoint,
    save_drafter,
)
from dflash_eval.drafter.checks import CHECKS, Check, TargetSpec, compare_architectures, run_checks
from dflash_eval.drafter.config import DrafterConfig, default_target_layer_ids, load_config_file
from dflash_eval.drafter.model import ContextKV, DFlashDrafter, block_ids, draft_logits, expected_shapes
from dflash_eval.drafter.vocabulary import TargetVocabulary, resolve_mask_token_id

__all__ = [
    "DFlashDrafter",
    "ContextKV",
    "DrafterConfig",
    "load_config_file",
    "default_target_layer_ids",
    "Checkpoint",
    "read_checkpoint",
    "checkpoint_from_state_dict",
    "build_drafter",
    "fit_refusal",
    "save_drafter",
    "expected_shapes",
    "TargetSpec",
    "Check",
    "CHECKS",
    "run_checks",
    "compare_architectures",
    "block_ids",
    "draft_logits",
    "TargetVocabulary",
    "resolve_mask_token_id",
]
