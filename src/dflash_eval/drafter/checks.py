"""Architecture checks of a drafter checkpoint against its target, one named check each.

Each check returns a :class:`Check` with status ``pass`` / ``warn`` / ``fail`` and a message that names the key,
the expected and the actual value. The eval suite turns each into its own test (tests_eval/test_checkpoint.py);
:func:`dflash_eval.drafter.checkpoint.build_drafter` refuses a checkpoint with any failing check. The checks
read a checkpoint only through :class:`CheckedCheckpoint` (source, config, key shapes), so this module needs
the model (for the expected key shapes) but never the checkpoint reader.

The classic mistakes caught here: ``fc`` sized for a different number of target layers or transposed, a
drafter hidden size that differs from the target's, a target layer id past the last layer (or pointing at the
last layer, whose HF hidden_states entry is post-norm), a mask token outside the target vocabulary, a drafter
vocabulary (config or any vocabulary-sized tensor) other than the target's, weights that hold NaN or infinite
values (a training run that diverged, a broken conversion: ``finite_weights``, named per tensor, before any τ is
measured; such a drafter would only show τ 1.00 with no cause), and checkpoint keys that SGLang's loader would load
silently into a drafter other than the trained one (``state_dict_keys``: a weight no key loads, two keys loading one
parameter; the keys are read by its rules, :mod:`dflash_eval.drafter.weight_names`).

Two warnings name causes that cost τ (or a deployment) without any error: a mask token that is not the target's
(``mask_token_match``: the tokenizer's mask token, SGLang's lookup of ``dflash_config.mask_token``, the embedding
row's norm; :mod:`dflash_eval.drafter.vocabulary`), and an activation other than silu, which SGLang's DFlash drafter
refuses (``hidden_act``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.model import expected_shapes
from dflash_eval.drafter.vocabulary import SGLANG_DEFAULT_MASK_TOKEN, TargetVocabulary, row_stat

if TYPE_CHECKING:
    import torch

    from dflash_eval.drafter.weight_names import WeightNames
    from dflash_eval.target.loader import Target

__all__ = ["Check", "CheckedCheckpoint", "NonFinite", "TargetSpec", "CHECKS", "VOCAB_KEY_SUFFIXES", "run_checks",
           "compare_architectures"]

Status = Literal["pass", "warn", "fail", "skip"]


class CheckedCheckpoint(Protocol):
    """What the checks read of a checkpoint (:class:`dflash_eval.drafter.checkpoint.Checkpoint` has it): ``shapes``
    of the drafter's parameters as loaded, ``names`` how the checkpoint's keys were read into them."""

    source: Path
    config: DrafterConfig
    names: WeightNames

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    @property
    def nonfinite(self) -> dict[str, NonFinite]: ...


@dataclass(frozen=True)
class NonFinite:
    """How many values of one tensor are NaN and how many infinite, of ``size``."""

    nan: int
    inf: int
    size: int

    def describe(self) -> str:
        if self.nan and self.inf:
            return f"{self.nan} NaN and {self.inf} infinite of its {self.size} values"
        return f"{self.nan or self.inf} of {self.size} values are {'NaN' if self.nan else 'infinite'}"


@dataclass(frozen=True)
class TargetSpec:
    """What the checks need to know about the target; ``vocabulary`` (its tokenizer) and ``embedding`` (its input
    embedding weight, [vocab, H]) only for the mask-token check, which skips without them."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    vocabulary: TargetVocabulary | None = field(default=None, compare=False, repr=False)
    embedding: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_target(cls, target: Target) -> TargetSpec:
        return cls(num_layers=target.num_layers, hidden_size=target.hidden_size, vocab_size=target.vocab_size)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str


def _fc_shape(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    cfg = ckpt.config
    h = spec.hidden_size if spec else cfg.hidden_size
    want = (h, cfg.num_features * h)
    got = ckpt.shapes.get("fc.weight")
    if got is None:
        return Check("fc_shape", "fail", "key 'fc.weight' is missing from the checkpoint")
    key = ckpt.names.key_of("fc.weight")
    if got == want:
        return Check("fc_shape", "pass", f"{key} {list(got)} == [H, {cfg.num_features} * H]")
    hint = ""
    if got == want[::-1]:
        hint = " (transposed: stored as [in, out]; nn.Linear weights are [out, in])"
    elif len(got) == 2 and got[0] == h and got[1] % h == 0:
        hint = (f" (fc sized for {got[1] // h} target layers but target_layer_ids has {cfg.num_features}: "
                f"{list(cfg.target_layer_ids)})")
    return Check("fc_shape", "fail", f"key '{key}': expected {list(want)}, got {list(got)}{hint}; SGLang refuses to "
                 "load it too (python/sglang/srt/models/dflash.py: fc.weight shape mismatch)")


def _hidden_size(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    if spec is None:
        return Check("hidden_size", "skip", "no target given")
    got = ckpt.config.hidden_size
    if got == spec.hidden_size:
        return Check("hidden_size", "pass", f"drafter hidden_size {got} == target hidden_size")
    return Check("hidden_size", "fail",
                 f"config 'hidden_size': drafter {got} != target {spec.hidden_size} "
                 "(drafter trained for another target?)")


def _layer_ids_range(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    ids = list(ckpt.config.target_layer_ids)
    n = spec.num_layers if spec else ckpt.config.num_target_layers
    if n is None:
        return Check("target_layer_ids_range", "skip", "number of target layers unknown")
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        return Check("target_layer_ids_range", "fail",
                     f"'dflash_config.target_layer_ids' {ids}: ids {bad} are outside 0..{n - 1} "
                     f"(target has {n} layers)")
    if ckpt.config.num_target_layers is not None and spec is not None and ckpt.config.num_target_layers != n:
        return Check("target_layer_ids_range", "warn",
                     f"config 'num_target_layers' is {ckpt.config.num_target_layers} but the target has {n} layers")
    return Check("target_layer_ids_range", "pass", f"target_layer_ids {ids} within 0..{n - 1}")


def _layer_ids_last(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    n = spec.num_layers if spec else ckpt.config.num_target_layers
    if n is None:
        return Check("target_layer_ids_last_layer", "skip", "number of target layers unknown")
    if (n - 1) in ckpt.config.target_layer_ids:
        return Check("target_layer_ids_last_layer", "warn",
                     f"target layer id {n - 1} is the last layer: its HF hidden_states entry is AFTER the final norm, "
                     "not the raw layer output (check the +1 convention used in training)")
    return Check("target_layer_ids_last_layer", "pass", "no target layer id points at the last (post-norm) layer")


def _mask_token(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    mask = ckpt.config.mask_token_id
    vocab = spec.vocab_size if spec else ckpt.config.vocab_size
    if 0 <= mask < vocab:
        return Check("mask_token_id", "pass", f"mask_token_id {mask} < vocab size {vocab}")
    return Check("mask_token_id", "fail",
                 f"'dflash_config.mask_token_id' {mask} is outside the target vocabulary (size {vocab})")


def _mask_token_match(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    """Warn when the mask token does not look like the target's: another id than the tokenizer's mask token (or than
    the token SGLang looks up for ``dflash_config.mask_token``), or an embedding row that looks like a trained
    token's (:func:`~dflash_eval.drafter.vocabulary.row_stat`: a mask token's row normally looks untrained)."""
    name, mask = "mask_token_match", ckpt.config.mask_token_id
    vocab = spec.vocabulary if spec else None
    if vocab is None:
        return Check(name, "skip", "no target tokenizer to compare the mask token with")
    if not 0 <= mask < vocab.embedding_rows:
        return Check(name, "skip", f"mask_token_id {mask} is outside the target vocabulary (check mask_token_id)")
    token = ckpt.config.mask_token or SGLANG_DEFAULT_MASK_TOKEN
    named, own = vocab.token_id(token), vocab.mask_token_id
    problems = []
    if named is not None and named != mask:
        which = "dflash_config.mask_token" if ckpt.config.mask_token else "SGLang's default mask token"
        problems.append(f"the target tokenizer's token {token!r} ({which}) is id {named}: SGLang's DFlash worker "
                        "refuses to start with a mask_token_id that conflicts with it "
                        "(python/sglang/srt/speculative/dflash_worker.py)")
    elif named is None and own is not None and own != mask:
        problems.append(f"the target tokenizer's mask token {vocab.mask_token!r} is id {own}")
    readable = spec is not None and spec.embedding is not None and vocab.size is not None  # ordinary tokens known
    row = (row_stat(vocab, spec.embedding, mask)
           if readable and spec is not None and spec.embedding is not None else None)
    looks = "" if row is None else (f"; its embedding row looks like a trained token's ({row.describe()}), where a "
                                    "mask token's row normally looks untrained (the target never reads it in text)"
                                    if row.looks_trained else f"; its embedding row looks untrained ({row.describe()})")
    cost = ("; a drafter fed another mask embedding than it was trained with loses τ without any error: was it "
            "trained with another mask token (another target or tokenizer)?")
    agrees = named == mask or own == mask
    if problems or (row is not None and row.looks_trained and not agrees):
        what = f"'dflash_config.mask_token_id' {mask} ({vocab.describe(mask)})"  # reads the vocabulary: warnings only
        why = "; ".join(problems) if problems else "the target tokenizer has no mask token to compare it with"
        return Check(name, "warn", f"{what}: {why}{looks}{cost}")
    source = (f" is the target tokenizer's token {token!r}" if named == mask else
              f" is the target tokenizer's mask token {vocab.mask_token!r}" if own == mask else
              ": the target tokenizer has no mask token to compare it with")
    return Check(name, "pass", f"'dflash_config.mask_token_id' {mask}{source}{looks}")


#: Keys whose first dimension is the vocabulary (an embedding or head a drafter variant may carry).
VOCAB_KEY_SUFFIXES = ("embed_tokens.weight", "lm_head.weight")


def _vocab(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    cfg_vocab = ckpt.config.vocab_size
    want = spec.vocab_size if spec else cfg_vocab
    problems = []
    if cfg_vocab != want:
        problems.append(f"config 'vocab_size' {cfg_vocab} != target vocabulary size {want}")
    shapes = {**ckpt.shapes, **{s.key: s.shape for s in ckpt.names.skipped}}  # a skipped embedding still tells
    for k, shape in sorted(shapes.items()):
        if k.endswith(VOCAB_KEY_SUFFIXES) and shape and shape[0] != want:
            problems.append(f"key {k!r} {list(shape)}: {shape[0]} vocabulary rows, target has {want}")
        elif not k.endswith(VOCAB_KEY_SUFFIXES) and cfg_vocab != want and cfg_vocab in shape:
            problems.append(f"key {k!r} {list(shape)} is sized for the config's vocabulary {cfg_vocab}")
    if problems:
        return Check("vocab_size", "fail", "; ".join(problems) + " (drafter trained for another tokenizer/target?)")
    return Check("vocab_size", "pass", f"drafter vocabulary {cfg_vocab} == target vocabulary {want}")


def _block_size(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    b = ckpt.config.block_size
    if b >= 2:
        return Check("block_size", "pass", f"block_size {b} >= 2")
    return Check("block_size", "fail", f"'block_size' {b}: must be >= 2 (one bonus slot plus at least one draft slot)")


def _hidden_act(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    act = ckpt.config.hidden_act
    if act == "silu":
        return Check("hidden_act", "pass", "hidden_act silu (the activation SGLang's DFlash drafter implements)")
    return Check("hidden_act", "warn",
                 f"'hidden_act' is {act!r}: evaluated here with {act} (transformers' ACT2FN, as the reference model "
                 "reads it), but SGLang's DFlash drafter refuses every activation other than silu "
                 "(python/sglang/srt/models/dflash.py, DFlashMLP): SGLang cannot serve this drafter as it is")


def _keys(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    """Every parameter loaded once with its shape, the keys read by SGLang's loader's rules
    (:mod:`dflash_eval.drafter.weight_names`); the message says what was renamed, split or skipped. Refused: what
    SGLang refuses (a shape its loader does not take) and what it would load silently but serve wrongly (a parameter
    no key loads, two keys loading one parameter)."""
    names = ckpt.names
    want = expected_shapes(ckpt.config)
    got = ckpt.shapes
    missing = sorted(set(want) - set(got) - names.unsplit)
    unexpected = sorted(set(got) - set(want))
    wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k] and k != "fc.weight")
    notes = names.notes()
    read = f" (keys read as SGLang's loader reads them: {'; '.join(notes)})" if notes else ""
    if not (missing or unexpected or wrong or names.conflicts or names.problems):
        return Check("state_dict_keys", "pass", f"all {len(want)} keys present with the expected shapes{read}")
    parts = []
    if missing:
        parts.append(f"missing keys {missing}: SGLang would load this checkpoint without them (a parameter no key "
                     "loads keeps the value it was created with: its loader does not check) and serve a drafter "
                     "that is not the trained one")
    for param, keys in sorted(names.conflicts.items()):
        parts.append(f"keys {' and '.join(repr(k) for k in keys)} both load {param}: SGLang would load each in turn "
                     "and keep the one it reads last; keep only the one the drafter was trained with")
    for key, why in sorted(names.problems.items()):
        parts.append(f"key {key!r}: {why}")
    if unexpected:
        parts.append(f"unexpected keys {unexpected}")
    if wrong:
        parts.append("shape mismatches "
                     + ", ".join(f"{names.key_of(k)}: expected {list(want[k])}, got {list(got[k])}" for k in wrong)
                     + " (SGLang's weight loaders refuse them too)")
    return Check("state_dict_keys", "fail", f"{ckpt.source}: " + "; ".join(parts) + read)


#: At most this many tensors are named one by one in the ``finite_weights`` message.
NONFINITE_NAMED = 5


def _finite(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> Check:
    bad = ckpt.nonfinite
    if not bad:
        return Check("finite_weights", "pass", f"every value of the {len(ckpt.shapes)} tensors is finite")
    named = [f"{k}: {v.describe()}" for k, v in sorted(bad.items())[:NONFINITE_NAMED]]
    more = f"; and {len(bad) - NONFINITE_NAMED} more tensors" if len(bad) > NONFINITE_NAMED else ""
    return Check("finite_weights", "fail",
                 f"{ckpt.source}: {len(bad)} of {len(ckpt.shapes)} tensors hold non-finite values: "
                 + "; ".join(named) + more + " (a training step that diverged, or a broken conversion: evaluate a "
                 "checkpoint from before the loss became NaN); its drafts would be noise and its τ no measure")


CHECKS: dict[str, Callable[[Any, TargetSpec | None], Check]] = {
    "fc_shape": _fc_shape,
    "hidden_size": _hidden_size,
    "target_layer_ids_range": _layer_ids_range,
    "target_layer_ids_last_layer": _layer_ids_last,
    "mask_token_id": _mask_token,
    "mask_token_match": _mask_token_match,
    "vocab_size": _vocab,
    "block_size": _block_size,
    "hidden_act": _hidden_act,
    "state_dict_keys": _keys,
    "finite_weights": _finite,
}


def run_checks(ckpt: CheckedCheckpoint, spec: TargetSpec | None) -> list[Check]:
    """Every check, in a fixed order."""
    return [fn(ckpt, spec) for fn in CHECKS.values()]


_ARCH_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "block_size", "rope_theta", "rope_type", "rope_params",
                "rms_norm_eps", "hidden_act", "attention_bias", "num_features")


def compare_architectures(ours: CheckedCheckpoint, reference: CheckedCheckpoint) -> list[str]:
    """Every difference in architecture fields and key shapes between two drafters (empty when they agree)."""
    diffs = []
    for f in _ARCH_FIELDS:
        a, b = getattr(ours.config, f), getattr(reference.config, f)
        if a != b:
            diffs.append(f"config {f}: ours {a!r}, reference {b!r}")
    sa, sb = ours.shapes, reference.shapes
    for k in sorted(set(sa) | set(sb)):
        if k not in sa:
            diffs.append(f"key {k}: missing in ours (reference {list(sb[k])})")
        elif k not in sb:
            diffs.append(f"key {k}: not in reference (ours {list(sa[k])})")
        elif sa[k] != sb[k]:
            diffs.append(f"key {k}: ours {list(sa[k])}, reference {list(sb[k])}")
    return diffs
