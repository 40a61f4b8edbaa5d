"""Turning prompt text into the token ids the target sees: raw text or the tokenizer's chat template.

``--chat-template auto`` applies the template when the tokenizer has one (instruct targets) and uses raw text
otherwise (base models, the bundled target); ``on`` requires a template; ``off`` never applies it. Thinking is
disabled where the template supports the switch (``enable_thinking=False``), as upstream DFlash benchmarks do.
The returned ids are what the cache keys on.
"""

from __future__ import annotations

from typing import Any

from dflash_eval.errors import ConfigError

__all__ = ["CHAT_TEMPLATE_MODES", "encode_prompt", "has_chat_template"]

CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer: Any, text: str, *, chat_template: str = "auto") -> list[int]:
    """Token ids of ``text`` under the chosen formatting mode."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ConfigError(f"--chat-template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")
    use = chat_template == "on" or (chat_template == "auto" and has_chat_template(tokenizer))
    if chat_template == "on" and not has_chat_template(tokenizer):
        raise ConfigError("--chat-template on, but the target tokenizer has no chat_template "
                          "(tokenizer_config.json 'chat_template' or chat_template.jinja)")
    if not use:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    messages = [{"role": "user", "content": text}]
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            enable_thinking=False)
    except TypeError:  # older tokenizers without template kwargs passthrough
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]
