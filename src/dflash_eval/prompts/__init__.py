"""Evaluation prompts: where they come from and how their text becomes the token ids the target sees.

- :mod:`.prompt` -- the :class:`Prompt` record; multi-turn conversations split into one prompt per turn;
- :mod:`.files` -- prompt files in the suite's own JSONL schema;
- :mod:`.datafiles` -- rows of local data sets (``datasets`` save_to_disk folders, repository snapshots, Parquet,
  Arrow, JSON/JSONL);
- :mod:`.sets` -- the built-in set definitions (GSM8K, MATH-500, HumanEval, MBPP, MT-Bench), field mappings,
  YAML/TOML set definitions and the ``--prompts`` spec;
- :mod:`.formatting` -- raw text or chat template, thinking on/off, multi-turn messages.

Example::

    python -c "from dflash_eval.prompts import load_prompt_spec; print(len(load_prompt_spec('humaneval:5')))"
"""

from dflash_eval.prompts.datafiles import read_rows
from dflash_eval.prompts.files import load_prompts, parse_prompt_line
from dflash_eval.prompts.formatting import (
                                            CHAT_TEMPLATE_MODES,
                                            RAW_TURN_SEPARATOR,
                                            THINKING_MODES,
                                            conversation_messages,
                                            encode_messages,
                                            encode_prompt,
                                            has_chat_template,
                                            template_has_thinking_switch,
)
from dflash_eval.prompts.prompt import Prompt, expand_turns
from dflash_eval.prompts.sets import (
                                            BUILTIN_DEFINITIONS,
                                            BUILTIN_SETS,
                                            DEFAULT_PROMPT_DATA_DIR,
                                            HUMANEVAL_WRAPPERS,
                                            SetDefinition,
                                            load_humaneval,
                                            load_prompt_spec,
                                            load_set,
                                            resolve_spec_paths,
)

__all__ = ["Prompt", "expand_turns", "load_prompts", "parse_prompt_line", "read_rows", "BUILTIN_DEFINITIONS",
           "BUILTIN_SETS", "DEFAULT_PROMPT_DATA_DIR", "HUMANEVAL_WRAPPERS", "SetDefinition", "load_humaneval",
           "load_prompt_spec", "load_set", "resolve_spec_paths", "CHAT_TEMPLATE_MODES", "THINKING_MODES",
           "RAW_TURN_SEPARATOR", "conversation_messages", "encode_messages", "encode_prompt", "has_chat_template",
           "template_has_thinking_switch"]
