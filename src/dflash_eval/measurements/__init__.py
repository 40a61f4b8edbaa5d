"""Measurements of one drafter as declared specs served by one runner: τ (chain and DDTree) on greedy and on sampled
references, the drift budget, and the online loop (greedy and sampled); and the drafter under measurement
(:class:`~dflash_eval.measurements.drafter_evaluation.DrafterEvaluation`: its checkpoint read and validated against the
target, its measurements, hidden-state drift). A new measurement is one spec module registered with
:func:`dflash_eval.measurements.registry.register`."""
