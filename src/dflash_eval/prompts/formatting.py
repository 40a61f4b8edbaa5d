"""How prompt text becomes the token ids the target sees: raw text or the target's chat template, thinking on/off,
and multi-turn conversations.

``--chat-template``: ``auto`` applies the tokenizer's chat template when it has one (instruct targets) and uses raw
text otherwise (base models, the bundled target); ``on`` requires a template; ``off`` never applies it.
``--thinking off`` (default) passes ``enable_thinking=False`` to the template, as the reference DFlash benchmark
does; ``on`` passes ``True`` (Qwen3 / Qwen3.5 / Qwen3.6 templates then leave the thinking block to the model).

A later turn of a conversation is, with a template, the template applied to every earlier user turn and the
target's reply to it (the decoded reference completion, special tokens skipped) plus the new user turn, with the
generation prompt. Raw text has no roles: the later turn continues the earlier turn's exact token ids (prompt +
completion) with :data:`RAW_TURN_SEPARATOR` and the new user text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dflash_eval.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["CHAT_TEMPLATE_MODES", "THINKING_MODES", "RAW_TURN_SEPARATOR", "has_chat_template", "encode_prompt",
           "encode_messages", "conversation_messages", "template_has_thinking_switch"]

CHAT_TEMPLATE_MODES = ("auto", "on", "off")
THINKING_MODES = ("off", "on")
RAW_TURN_SEPARATOR = "\n\n"


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def template_has_thinking_switch(template: str | None) -> bool:
    """Whether a chat template reads ``enable_thinking`` (Qwen3-style templates do)."""
    return bool(template and "enable_thinking" in template)


def conversation_messages(turns: Sequence[str], replies: Sequence[str]) -> list[dict[str, str]]:
    """Chat messages of user ``turns`` with the assistant ``replies`` to all but the last."""
    if len(replies) != len(turns) - 1:
        raise ValueError(f"{len(turns)} user turns need {len(turns) - 1} replies, got {len(replies)}")
    msgs: list[dict[str, str]] = []
    for k, t in enumerate(turns):
        msgs.append({"role": "user", "content": t})
        if k < len(replies):
            msgs.append({"role": "assistant", "content": replies[k]})
    return msgs


def encode_messages(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], *,
                    thinking: bool = False) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, with the generation prompt."""
    out: Any  # ids, or a BatchEncoding (by transformers version): transformers' own union, narrowed below
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            enable_thinking=thinking)
    except TypeError:  # older tokenizers without template kwargs passthrough
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, *, chat_template: str = "auto",
                  thinking: bool = False) -> list[int]:
    """Token ids of ``text`` (one user message) under the chosen formatting mode."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ConfigError(f"--chat-template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")
    use = chat_template == "on" or (chat_template == "auto" and has_chat_template(tokenizer))
    if chat_template == "on" and not has_chat_template(tokenizer):
        raise ConfigError("--chat-template on, but the target tokenizer has no chat_template "
                          "(tokenizer_config.json 'chat_template' or chat_template.jinja)")
    if not use:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return encode_messages(tokenizer, [{"role": "user", "content": text}], thinking=thinking)
