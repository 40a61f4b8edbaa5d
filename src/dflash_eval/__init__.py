"""dflash-eval: evaluate DFlash speculative-decoding drafters as pytest tests.

Modules: config / checkpoint / drafter / validate (the drafter and its checks), target / backends / features /
generation (the target, its linear-attention kernels and hidden states), drafting / tau / online (τ offline and
online), provenance, atomic, errors.
"""

__version__ = "0.1.0"
