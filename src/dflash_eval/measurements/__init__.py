"""Measurements of one drafter as declared specs served by one runner: τ (chain and DDTree) on greedy and on sampled
references, the drift budget, and the online loop (greedy and sampled). A new measurement is one spec module registered
with :func:`dflash_eval.measurements.registry.register`."""
