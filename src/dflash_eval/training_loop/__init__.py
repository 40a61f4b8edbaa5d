"""Evaluate while you train: the in-process API, τ over training steps, and checkpoints of a training run.

- :mod:`~dflash_eval.training_loop.evaluator`: :class:`Evaluator`, built once from the target, prompts and settings;
  ``evaluate(drafter, step=...)`` takes a checkpoint path, a state dict and its config, or the live drafter module
  and returns the suite's typed :class:`~dflash_eval.session.eval_result.EvalResult`. The drafter-independent stages
  (prompts, completions, features) are produced once and reused from memory by every later call.
- :mod:`~dflash_eval.training_loop.drafter_input`: what ``evaluate`` accepts, turned into a checkpoint or a live
  drafter (and the module's train/eval mode restored after the call).
- :mod:`~dflash_eval.training_loop.history`: one JSONL record per evaluated checkpoint in the report folder,
  appended atomically under a file lock; :mod:`~dflash_eval.training_loop.trend`: the verdicts across steps
  (below the run's recent level beyond the noise between checkpoints; a plateau notice);
  :mod:`~dflash_eval.training_loop.trend_table` and :mod:`~dflash_eval.training_loop.trend_plot`: the markdown
  trend table and the plot (τ over steps, the regression verdict's Δ and its limit, evaluations without a step
  apart), written by ``Evaluator.close()`` beside the history.
- :mod:`~dflash_eval.training_loop.checkpoint_dir`: the checkpoints of a training output folder in step order;
  :mod:`~dflash_eval.training_loop.watch`: waiting for new ones (``dflash-eval gate DIR --watch``).
- :mod:`~dflash_eval.training_loop.trackers`: TensorBoard and Weights & Biases logging through their own
  libraries, when installed, as implementations of the history-record hook (τ, its CI, the floor and the verdict
  as scalars: ``TRACKER_SCALARS``); :mod:`~dflash_eval.training_loop.plugins`:
  the hook manager outside pytest.

The reference drafter's τ (``--reference-drafter``) is the session's (:mod:`dflash_eval.session.reference_drafter`).

What a trainer imports is exported from :mod:`dflash_eval` (``Evaluator``, ``History``, ``CheckpointRecord``,
``trend_table``, ``write_trend_table``, ``write_trend_plot``, ``TensorBoardTracker``, ``WandbTracker``,
``tracker_scalars``, ``TRACKER_SCALARS``); these modules are private by convention.

Docs: ``docs/training-loop.md``; examples with the installed package: ``docs/examples/train_loop.py`` (a plain
loop), ``docs/examples/specforge_callback.py`` (a SpecForge-style callback); in a checkout:
``docs/examples/train_with_eval.py``.
"""
