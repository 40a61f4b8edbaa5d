"""The catalog of measurements: the built-in specs, those of the ``dflash_eval.measurements`` entry-point group, and
those registered in code (:func:`dflash_eval.measurements.registry.register`), looked up by name.

The built-in ones: ``tau`` (chain and DDTree τ on the greedy references, per feature side), ``tau_sampled`` (τ on
the sampled references at temperature > 0), ``drift_budget`` (the drafter's drift budget), ``online`` and
``online_sampled`` (the real speculative loop on the greedy or sampled references), ``round_costs`` (the costs
of a speculative round and of a plain decoding step, timed on the run's device: the predicted speed-up),
``layer_drift`` (one side's features against another's, per prompt and target layer: the drift checks).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from dflash_eval.errors import ConfigError
from dflash_eval.measurements.budget_ladder import DRIFT_BUDGET
from dflash_eval.measurements.layer_drift import LAYER_DRIFT
from dflash_eval.measurements.online_greedy import ONLINE
from dflash_eval.measurements.online_sampled import ONLINE_SAMPLED
from dflash_eval.measurements.registry import Measurement, register, registered_here
from dflash_eval.measurements.round_costs import ROUND_COSTS
from dflash_eval.measurements.tau_greedy import TAU
from dflash_eval.measurements.tau_sampled import TAU_SAMPLED

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "registered", "spec", "TAU", "TAU_SAMPLED", "DRIFT_BUDGET", "ONLINE",
           "ONLINE_SAMPLED", "ROUND_COSTS", "LAYER_DRIFT"]

ENTRY_POINT_GROUP = "dflash_eval.measurements"

#: The built-in measurements by name (each reached by reference where the suite asks for it: ``ev.measure(TAU, ...)``).
BUILTIN: dict[str, Measurement[Any, Any]] = {m.name: m for m in (TAU, TAU_SAMPLED, DRIFT_BUDGET, ONLINE,
                                                                 ONLINE_SAMPLED, ROUND_COSTS, LAYER_DRIFT)}
_loaded = False


def _load_entry_points() -> None:
    """Register every entry point of :data:`ENTRY_POINT_GROUP` once per process (an instance or a class)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            register(obj() if isinstance(obj, type) else obj)
        except Exception as exc:  # a broken plugin is named, not a traceback from importlib
            raise ConfigError(f"measurement entry point {ep.name!r} = {ep.value!r} (group {ENTRY_POINT_GROUP}) "
                              f"cannot be loaded: {type(exc).__name__}: {exc}") from exc


def registered() -> dict[str, Measurement[Any, Any]]:
    """Every measurement by name: the built-in ones first, then the entry points' and those registered in code (a
    registered one may not take a built-in name)."""
    _load_entry_points()
    extra = registered_here()
    clash = sorted(set(extra) & set(BUILTIN))
    if clash:
        raise ConfigError(f"registered measurements {clash} take the names of built-in ones; pick other names")
    return {**BUILTIN, **extra}


def spec(name: str) -> Measurement[Any, Any]:
    """The measurement named ``name`` (ConfigError naming the known ones when there is none)."""
    found = registered().get(name)
    if found is None:
        raise ConfigError(f"no measurement named {name!r} (known: {sorted(registered())})")
    return found
