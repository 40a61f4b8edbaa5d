"""The run's inputs seen through another prompt list: the drift budget's prompts, when the selection is too small.

A drift budget measured on a handful of prompts is mostly noise (one prompt's |Δτ| sets its CI), so the budget is
measured on at least ``--drift-budget-min-prompts`` prompts of the same ``--prompts`` source
(:meth:`dflash_eval.measurements.drafter_evaluation.DrafterEvaluation.drift_budget`). :class:`PromptView` gives the
references and feature stages that list instead of the selection, and everything else of the run's :class:`Inputs`
unchanged and shared: the loaded target, the cache, the meter, the tokenizer. Its entries are the same cache entries the
selection's prompts would have (keyed by tokens, not by selection), so the selected prompts are not produced twice.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from dflash_eval.inputs.prompt_tokens import tokenize_prompts
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.prompts import Prompt

__all__ = ["PromptView"]


class PromptView:
    """``inputs`` with ``prompts`` in place of its selection (see module docstring)."""

    def __init__(self, inputs: Inputs, prompts: list[Prompt]) -> None:
        self._inputs = inputs
        self.prompts = list(prompts)

    def __getattr__(self, name: str) -> Any:  # everything but the prompt-derived attributes is the run's own
        return getattr(self._inputs, name)

    @cached_property
    def prompt_by_id(self) -> dict[str, Prompt]:
        return {p.id: p for p in self.prompts}

    @cached_property
    def prompt_ids(self) -> dict[str, list[int]]:
        """Token ids of these prompts, by the run's own rule (:attr:`Inputs.prompt_ids`) and from the same cache."""
        return tokenize_prompts(self)
