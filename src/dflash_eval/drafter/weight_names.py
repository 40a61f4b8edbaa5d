"""Which tensor of a checkpoint loads which drafter parameter: SGLang's DFlash loader's rules, key by key.

SGLang serves a drafter with the weights its loader (``python/sglang/srt/models/dflash.py``,
``DFlashDraftModel.load_weights``) puts into its parameters, so this evaluator reads a checkpoint by the same rules,
and τ is measured on the weights SGLang serves:

1. a key is a parameter's name as it is, else with a leading ``model.`` removed (one, key by key: a file may carry
   the prefix on some keys only);
2. SGLang keeps q/k/v and gate/up projections fused (``qkv_proj``, ``gate_up_proj``): it loads a split key
   (``...q_proj.weight``) into its part of the fused parameter and a fused key (``...qkv_proj.weight``, written by a
   converter) split in the order q, k, v and gate, up; here the drafter keeps them split, so a fused tensor is cut
   into its parts (:data:`STACKED`);
3. a key that names no parameter of the drafter is skipped (an embedding, an lm_head, a RoPE cache, a layer past
   ``num_hidden_layers``, anything unknown): :class:`SkippedKey`, with why;
4. a training checkpoint's wrapper prefix (``module.``, ``draft_model.``: :data:`WHOLE_PREFIXES`) is removed when
   EVERY key carries it. SGLang does not do this (it reads no training checkpoint); the checks say so.

What SGLang accepts silently but would serve wrongly is recorded here and refused by the ``state_dict_keys`` check
(:mod:`dflash_eval.drafter.checks`): a parameter no key reaches (SGLang keeps its initial value), two keys that load
the same parameter (SGLang keeps the one it reads last), a fused tensor that does not split into its parts (SGLang's
loader stops on it). The tensors are sliced, never copied.

Example::

    weights, names = map_weights(load_file("model.safetensors"), config)
    names.skipped   # (SkippedKey('embed_tokens.weight', (4096, 256), 'an input embedding: ...'),)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.model import expected_shapes

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["STACKED", "WHOLE_PREFIXES", "SGLANG_LOADER", "SkippedKey", "WeightNames", "map_weights"]

#: (SGLang's fused parameter, the split name stacked into it), in the order SGLang lays the parts out.
STACKED = (("qkv_proj", "q_proj"), ("qkv_proj", "k_proj"), ("qkv_proj", "v_proj"),
           ("gate_up_proj", "gate_proj"), ("gate_up_proj", "up_proj"))
#: Prefixes of training checkpoints (a DDP wrapper's, a trainer's attribute), removed when every key has one.
WHOLE_PREFIXES = ("module.", "draft_model.")
#: Where SGLang's rules are written, for the messages.
SGLANG_LOADER = "SGLang's DFlash loader (python/sglang/srt/models/dflash.py, DFlashDraftModel.load_weights)"
#: The prefix SGLang's loader removes, key by key.
MODEL_PREFIX = "model."
#: At most this many keys are named per kind of renaming in a message (every skipped key is named).
NAMED = 3


@dataclass(frozen=True)
class SkippedKey:
    """A tensor of the checkpoint that loads no parameter (SGLang's loader skips it too), its shape and why."""

    key: str
    shape: tuple[int, ...]
    reason: str

    def describe(self) -> str:
        return f"'{self.key}' {list(self.shape)} ({self.reason})"


@dataclass(frozen=True)
class WeightNames:
    """How a checkpoint's keys were read into the drafter's parameters (:func:`map_weights`).

    Attributes:
        prefix: the wrapper prefix removed from every key (:data:`WHOLE_PREFIXES`), or None.
        renamed: ``{key: parameters}`` of the keys loaded under another name: a ``model.`` prefix removed, or a
            fused tensor cut into its parts (keys loaded as they are, after ``prefix``, are not listed).
        skipped: the keys that load no parameter, in the checkpoint's order.
        origin: ``{parameter: key}`` of the parameters loaded from a key of another name (the kept one).
        conflicts: ``{parameter: keys}`` where several keys load the same parameter (the first one is kept).
        problems: ``{key: why}`` of the fused tensors that do not split into their parts (none of them is loaded).
    """

    prefix: str | None = None
    renamed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    skipped: tuple[SkippedKey, ...] = ()
    origin: dict[str, str] = field(default_factory=dict)
    conflicts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    def key_of(self, param: str) -> str:
        """The checkpoint key ``param`` was loaded from (its own name when it was not renamed)."""
        return self.origin.get(param, param)

    @property
    def unsplit(self) -> frozenset[str]:
        """The parameters a fused tensor of :attr:`problems` was meant to load."""
        return frozenset(p for params in (self.renamed.get(k, ()) for k in self.problems) for p in params)

    def notes(self) -> list[str]:
        """What was read other than as written, one phrase each (empty: every key loaded its parameter as it is)."""
        out = []
        if self.prefix:
            out.append(f"prefix '{self.prefix}' removed from every key (a training wrapper's; SGLang removes only "
                       f"'{MODEL_PREFIX}', so it would serve these weights only saved without '{self.prefix}')")
        stripped = [k for k, ps in self.renamed.items()
                    if len(ps) == 1 and k.removeprefix(self.prefix or "").startswith(MODEL_PREFIX)]
        if stripped:
            out.append(f"'{MODEL_PREFIX}' removed from {_count(stripped, 'key')}, key by key as SGLang does ("
                       + _some(stripped) + ")")
        fused = [k for k, ps in self.renamed.items() if len(ps) > 1 and k not in self.problems]
        if fused:
            out.append(f"{_count(fused, 'fused tensor')} split into their parts as SGLang loads them ("
                       + "; ".join(f"'{k}' into {'/'.join(_module(p) for p in self.renamed[k])}"
                                   for k in fused[:NAMED]) + (f" and {len(fused) - NAMED} more" if len(fused) > NAMED
                                                              else "") + ")")
        if self.skipped:
            them = "it" if len(self.skipped) == 1 else "them"
            out.append(f"{_count(self.skipped, 'key')} skipped as SGLang skips {them} (no drafter weight): "
                       + "; ".join(s.describe() for s in self.skipped))
        return out

    def skipped_warning(self, source: object) -> str | None:
        """The one warning naming every skipped key and why (None: nothing was skipped)."""
        if not self.skipped:
            return None
        return (f"{source}: {len(self.skipped)} tensor(s) of the checkpoint load no drafter weight and are skipped, "
                f"as {SGLANG_LOADER} skips them, so τ is measured on the weights SGLang serves: "
                + "; ".join(s.describe() for s in self.skipped))


def _count(items: Sized, word: str) -> str:
    return f"{len(items)} {word}{'' if len(items) == 1 else 's'}"


def _module(param: str) -> str:
    """``q_proj`` of ``layers.0.self_attn.q_proj.weight``."""
    return param.rsplit(".", 2)[-2]


def _some(keys: list[str]) -> str:
    named = ", ".join(f"'{k}'" for k in keys[:NAMED])
    return named + (f" and {len(keys) - NAMED} more" if len(keys) > NAMED else "")


def _sglang_name(param: str) -> str:
    """The name of the SGLang parameter holding ``param`` (its fused parameter for a stacked projection)."""
    for fused, part in STACKED:
        param = param.replace(f".{part}.", f".{fused}.")
    return param


def _why_skipped(key: str, config: DrafterConfig) -> str:
    base = key.removeprefix(MODEL_PREFIX)
    if base.endswith("embed_tokens.weight"):
        return "an input embedding: the drafter embeds its block with the target's"
    if base.startswith("lm_head.") or ".lm_head." in base:
        return "an output head: the drafter's logits come from the target's lm_head"
    if "rotary_emb." in base:
        return "a RoPE cache: the rotary tables are computed from the config"
    layer = re.match(r"layers\.(\d+)\.", base)
    if layer and int(layer.group(1)) >= config.num_hidden_layers:
        return f"layer {layer.group(1)}: the config has num_hidden_layers {config.num_hidden_layers}"
    if base.endswith(".bias") and "self_attn." in base and not config.attention_bias:
        return "a bias: the config has attention_bias false"
    return "no parameter of the drafter has this name"


def map_weights(state_dict: Mapping[str, Tensor], config: DrafterConfig
                ) -> tuple[dict[str, Tensor], WeightNames]:
    """The drafter's parameters (its own names, q/k/v and gate/up split) read from ``state_dict`` by SGLang's rules
    (the module docstring), and how each key was read. Never raises: what cannot be loaded is recorded in the
    :class:`WeightNames` for the ``state_dict_keys`` check to refuse."""
    want = expected_shapes(config)
    parts: dict[str, list[str]] = {}  # SGLang's parameter -> the drafter's parameters it holds, in SGLang's order
    for _, part in STACKED:
        for p in want:
            if f".{part}." in p:
                parts.setdefault(_sglang_name(p), []).append(p)
    for p in want:
        parts.setdefault(_sglang_name(p), [p])

    def resolve(name: str) -> str | None:
        if name in parts:
            return name
        if name.startswith(MODEL_PREFIX) and name[len(MODEL_PREFIX):] in parts:
            return name[len(MODEL_PREFIX):]
        return None  # SGLang also tries the name with 'model.' added: none of its DFlash parameters has that prefix

    prefix = next((p for p in WHOLE_PREFIXES if state_dict and all(k.startswith(p) for k in state_dict)), None)
    out: dict[str, Tensor] = {}
    sources: dict[str, list[str]] = {}
    renamed: dict[str, tuple[str, ...]] = {}
    skipped: list[SkippedKey] = []
    problems: dict[str, str] = {}
    for raw, tensor in state_dict.items():
        key = raw[len(prefix):] if prefix else raw
        loads: tuple[str, ...] | None = None
        for fused, part in STACKED:  # a split projection: its part of the fused parameter
            if f".{part}." not in key:
                continue
            hit = resolve(key.replace(part, fused))
            if hit is not None:
                loads = (parts[hit][[p for f, p in STACKED if f == fused].index(part)],)
                break
        else:
            hit = resolve(key)
            loads = None if hit is None else tuple(parts[hit])
        if loads is None:
            skipped.append(SkippedKey(raw, tuple(tensor.shape), _why_skipped(key, config)))
            continue
        if loads != (key,):
            renamed[raw] = loads
        if len(loads) > 1:  # a fused tensor: cut along its rows, in SGLang's order
            rows = [want[p][0] for p in loads]
            expect = (sum(rows), *want[loads[0]][1:])
            if tuple(tensor.shape) != expect:
                problems[raw] = (f"{list(tensor.shape)} does not split into {'/'.join(_module(p) for p in loads)} of "
                                 f"{'/'.join(map(str, rows))} rows: expected {list(expect)} (SGLang's loader stops on "
                                 "it too)")
                continue
            pieces = dict(zip(loads, tensor.split(rows, dim=0)))
        else:
            pieces = {loads[0]: tensor}
        for p, t in pieces.items():
            sources.setdefault(p, []).append(raw)
            out.setdefault(p, t)
    conflicts = {p: tuple(keys) for p, keys in sources.items() if len(keys) > 1}
    origin = {p: keys[0] for p, keys in sources.items() if keys[0] != p}
    return out, WeightNames(prefix=prefix, renamed=renamed, skipped=tuple(skipped), origin=origin,
                            conflicts=conflicts, problems=problems)
