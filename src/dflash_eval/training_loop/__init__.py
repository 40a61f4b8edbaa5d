"""Evaluate while you train: the in-process API, τ over training steps, and checkpoints of a training run.

- :mod:`~dflash_eval.training_loop.evaluator`: :class:`Evaluator`, built once from the target, prompts and settings;
  ``evaluate(drafter, step=...)`` takes a checkpoint path, a state dict and its config, or the live drafter module
  and returns the suite's typed :class:`~dflash_eval.results.eval_result.EvalResult`. The drafter-independent stages
  (prompts, completions, features) are produced once and reused from memory by every later call.
- :mod:`~dflash_eval.training_loop.drafter_input`: what ``evaluate`` accepts, turned into a checkpoint or a live
  drafter (and the module's train/eval mode restored after the call).
- :mod:`~dflash_eval.training_loop.history`: one JSONL record per evaluated checkpoint in the report folder,
  appended atomically under a file lock; :mod:`~dflash_eval.training_loop.trend`: the verdicts across steps
  (below the run's recent level beyond the noise between checkpoints; a plateau notice);
  :mod:`~dflash_eval.training_loop.trend_table` and :mod:`~dflash_eval.training_loop.trend_plot`: the markdown
  trend table and the τ-vs-step plot.
- :mod:`~dflash_eval.training_loop.checkpoint_dir`: the checkpoints of a training output folder in step order;
  :mod:`~dflash_eval.training_loop.watch`: waiting for new ones (``dflash-eval gate DIR --watch``).
- :mod:`~dflash_eval.training_loop.trackers`: TensorBoard and Weights & Biases logging through their own
  libraries, when installed, as implementations of the history-record hook; :mod:`~dflash_eval.training_loop.plugins`:
  the hook manager outside pytest.

The reference drafter's τ (``--reference-drafter``) is the session's (:mod:`dflash_eval.session.reference_drafter`).

Docs: ``docs/training-loop.md``; example: ``docs/examples/train_with_eval.py``.
"""
