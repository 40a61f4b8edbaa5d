"""The eval suite's stages, in the order data flows through them.

``inputs`` (drafter-independent: settings, prompts, target directory, tokenizer, prompt ids, head, floors) ->
``references`` (reference completions and their teacher-forced check) -> ``feature_store`` (target features per
prompt, layer and backend) -> ``evaluation`` (one drafter: checkpoint, τ, drift) -> ``results`` (one typed result
object, JSON-ready). :class:`dflash_eval.suite.session.EvalSession` composes them; no stage calls a later one.
"""
