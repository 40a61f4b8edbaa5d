"""Prompt text to token ids, cached: the formatting rule (raw text or the target's chat template, thinking on or
off), each prompt's ids and the ids of a raw text (the fingerprint's).

Ids are ``prompt_ids`` cache entries keyed by the tokenizer files' digest, the formatting and the text, so a warm run
needs no tokenizer (hence no transformers import) for them. They are derived entries: tokenizing is not computing,
so under ``--cache-only`` a miss is tokenized, not written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dflash_eval.cache.entry_checks import Expected
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.errors import ConfigError, EvalError
from dflash_eval.options.settings import EvalSettings
from dflash_eval.prompts import Prompt, encode_prompt, template_has_thinking_switch
from dflash_eval.target.loader import TargetDir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dflash_eval.cache.store import Cache
    from dflash_eval.common.progress import Meter

__all__ = ["prompt_format", "text_ids", "tokenize_prompts", "TokenizingInputs"]


class TokenizingInputs(Protocol):
    """What tokenizing needs of the run's inputs: :class:`~dflash_eval.inputs.run_inputs.Inputs` or a
    :class:`~dflash_eval.inputs.prompt_view.PromptView` of them (a Protocol: run_inputs imports this module)."""

    @property
    def settings(self) -> EvalSettings: ...
    @property
    def target_dir(self) -> TargetDir: ...
    @property
    def prompts(self) -> list[Prompt]: ...
    @property
    def prompt_format(self) -> dict[str, Any]: ...
    @property
    def cache(self) -> Cache: ...
    @property
    def meter(self) -> Meter: ...
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

_IDS = Expected(tensors={"ids": (torch.int64, (None,))})


def prompt_format(s: EvalSettings, target_dir: TargetDir) -> dict[str, Any]:
    """How prompt text becomes token ids: ``{"chat_template": "on"|"off", "template_sha256": ...,
    "enable_thinking": bool | None}`` (``auto`` resolved; thinking None without a template); part of the prompt
    ids' cache key (completions and features key the resulting ids)."""
    mode, tmpl = s.chat_template, target_dir.chat_template_text()
    if mode == "on" and tmpl is None:
        raise ConfigError(f"--chat-template on, but the target tokenizer at {s.target_model} has no "
                          "chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)")
    use = mode == "on" or (mode == "auto" and tmpl is not None)
    if s.thinking == "on" and not use:
        raise ConfigError(f"--thinking on needs the target's chat template, but prompts are raw text "
                          f"(--chat-template {mode}" + ("" if tmpl else f"; {s.target_model} has no template")
                          + ")")
    if s.thinking == "on" and not template_has_thinking_switch(tmpl):
        raise ConfigError(f"--thinking on, but the chat template of {s.target_model} has no enable_thinking "
                          "switch (a Qwen3-style template reads it); leave --thinking off")
    return {"chat_template": "on" if use else "off",
            "template_sha256": hashlib.sha256(tmpl.encode()).hexdigest() if use and tmpl else None,
            "enable_thinking": (s.thinking == "on") if use else None}


def tokenize_prompts(inputs: TokenizingInputs) -> dict[str, list[int]]:
    """Token ids of each of ``inputs.prompts`` but later conversation turns (raw text or the chat template, see
    :func:`prompt_format`; no other special tokens)."""
    digest = inputs.target_dir.tokenizer_digest()
    firsts = [p for p in inputs.prompts if not p.follows]  # a later turn's ids need the earlier replies
    reqs = {p.id: Request("prompt_ids", {"tokenizer": digest, "text": p.text, "add_special_tokens": False,
                                         **inputs.prompt_format},
                          expect=_IDS, what=f"the token ids of prompt {p.id!r}", item=p.id, derived=True)
            for p in firsts}

    def tokenizer_of(p: Prompt) -> Callable[[list[Request]], list[Produced]]:
        return lambda todo: [Produced({"ids": torch.tensor(_tokenize(inputs, p))}, {"prompt_id": p.id})]

    with inputs.meter.timed("tokenize"):
        entries = inputs.cache.ensure([Batch([reqs[p.id]], tokenizer_of(p)) for p in firsts])
    return {p.id: entries[reqs[p.id].key].tensors["ids"].tolist() for p in firsts}


def text_ids(inputs: TokenizingInputs, text: str, what: str) -> list[int]:
    """Token ids of raw ``text`` (no chat template, no special tokens), cached like the prompt ids (keyed by the
    tokenizer files and the text)."""
    req = Request("prompt_ids", {"tokenizer": inputs.target_dir.tokenizer_digest(), "text": text,
                                 "add_special_tokens": False, "chat_template": "off"},
                  expect=_IDS, what=f"the token ids of {what}", derived=True)

    def produce(todo: list[Request]) -> list[Produced]:
        ids = [int(i) for i in inputs.tokenizer(text, add_special_tokens=False)["input_ids"]]
        return [Produced({"ids": torch.tensor(ids, dtype=torch.int64)}, {"text_of": what})]

    return inputs.cache.ensure([Batch([req], produce)])[req.key].tensors["ids"].tolist()


def _tokenize(inputs: TokenizingInputs, p: Prompt) -> list[int]:
    fmt = inputs.prompt_format
    ids = encode_prompt(inputs.tokenizer, p.text, chat_template=fmt["chat_template"],
                        thinking=bool(fmt["enable_thinking"]))
    if not ids:
        raise EvalError(f"prompt {p.id!r} (line {p.line} of its set in --prompts {inputs.settings.prompts}) "
                        "tokenizes to no tokens")
    return ids
