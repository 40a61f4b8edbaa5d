"""The version of the code whose results the cache memoises (τ, DDTree τ, the drift budget, the online loop).

Every memoised result's key holds :data:`CODE_VERSION`. Raise it in the same change as any edit to how those
results are computed (the chain and DDTree simulation, the online loop, the drafter's forward, the drift ladder):
the next run then recomputes instead of reading a result of the old code. Reference completions and features are
keyed by what produced them (target, backend, kernel probe digest), not by this constant.
"""

CODE_VERSION = "2026.12.1"
