"""τ and what is judged from it: the offline chain and DDTree loop, the online loop, statistics, per-position
acceptance, hidden-state drift and the drift budget, floors, baselines and the verdict."""
