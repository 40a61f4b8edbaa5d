"""The settings that change τ, recorded with floors files and reports, and checked before they are compared.

τ floors or a baseline recorded with 128 new tokens say nothing about a 512-token run; nor do ones from another
target, block size, chat-template or thinking mode, HumanEval prompt wrapper, dtype or backend; nor do floors
recorded at one temperature (or top-k, top-p, min-p, samples per prompt, sampling seed) for a run at another. Each
floors file and each eval.json carries this context; :func:`mismatches` lists every field where a recorded context
differs from the current run (fields the recording does not have are not checked, so older files stay usable).

Every field but the drafter's block size is set by one option (:data:`FIELD_OPTIONS`), named by its flag in the
mismatch message. Such an option must be declared ``affects_tau`` (:mod:`dflash_eval.options.declaration`): the
options, a layer above this module, refuse to load otherwise. The context is a subset of those options: the prompt
selection, for one, is not in it (floors are kept per prompt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dflash_eval.target.sampling_params import SamplingParams

__all__ = ["TAU_FIELDS", "FIELD_OPTIONS", "GREEDY_DEFAULTS", "mismatches", "describe", "sampling_context"]


class SamplingSettings(Protocol):
    """What :func:`sampling_context` reads of the run's :class:`~dflash_eval.options.settings.EvalSettings` (a layer
    above this module)."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def samples_per_prompt(self) -> int: ...
    @property
    def sampling_seed(self) -> int: ...
    @property
    def sampling(self) -> SamplingParams: ...


#: field -> the option that sets it (None: no option, the drafter's own), in the order messages list them
FIELD_OPTIONS: dict[str, str | None] = {
    "target": "target_model",
    "max_new_tokens": "max_new_tokens",
    "max_blocks": "max_blocks",
    "block_size": None,
    "chat_template": "chat_template",
    "thinking": "thinking",
    "humaneval_wrapper": "humaneval_wrapper",
    "dtype": "dtype",
    "backend": "hidden_state_backend",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "samples_per_prompt": "samples_per_prompt",
    "sampling_seed": "sampling_seed",
}

# field -> how a user changes it (named in the mismatch message): the option's flag (``--name-with-dashes``)
TAU_FIELDS: dict[str, str] = {f: f"the drafter's {f}" if o is None else "--" + o.replace("_", "-")
                              for f, o in FIELD_OPTIONS.items()}

#: The value a context without the field had: recordings made before sampling existed, and greedy runs (which
#: record no sampling fields), were greedy, so a greedy floors file is refused for a sampled run and vice versa.
GREEDY_DEFAULTS: dict[str, Any] = {"temperature": 0.0}


def _show(field: str, value: Any) -> str:
    return f"{value[:12]}..." if field == "target" and isinstance(value, str) and len(value) > 16 else repr(value)


def mismatches(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per τ-relevant field whose recorded value differs from the current run's."""
    out = []
    recorded = {**GREEDY_DEFAULTS, **recorded} if "target" in recorded else recorded
    current = {**GREEDY_DEFAULTS, **current} if "target" in current else current
    for f, how in TAU_FIELDS.items():
        if f in recorded and f in current and recorded[f] != current[f]:
            out.append(f"{f} ({how}): recorded {_show(f, recorded[f])}, this run {_show(f, current[f])}")
    return out


def describe(context: dict[str, Any]) -> str:
    return ", ".join(f"{f}={_show(f, context[f])}" for f in TAU_FIELDS if f in context)


def sampling_context(settings: SamplingSettings) -> dict[str, Any]:
    """The sampling fields of a run's context: none for a greedy run (its context stays as before), else the
    temperature, top-k, top-p, min-p, samples per prompt and seed."""
    if not settings.temperature > 0 or settings.sampling.greedy:
        return {}
    return {"temperature": float(settings.temperature), "top_k": int(settings.top_k), "top_p": float(settings.top_p),
            "min_p": float(settings.min_p), "samples_per_prompt": int(settings.samples_per_prompt),
            "sampling_seed": int(settings.sampling_seed)}
