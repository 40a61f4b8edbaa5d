"""The measurement registry: one declared spec per measurement of a drafter, and the one runner that serves them.

A measurement (:class:`Measurement`) declares its cache kind (``kind``) and key fields, how the entries of one
computation are produced (:meth:`Measurement.plan`: the :class:`~dflash_eval.cache.requests.Batch` es and how they
are spread, and what the plan keeps for decoding, its typed ``state``), how the entries are decoded into its value
(:meth:`Measurement.decode`), and, for one registered from outside, what it adds to eval.json
(``measurements.<name>``, :meth:`Measurement.report`). ``Measurement[S, V]``: ``S`` the plan's state, ``V`` the
value. The :class:`Runner` of one drafter evaluation serves every spec the same way: plan,
:meth:`~dflash_eval.cache.store.Cache.ensure`, decode, and the value kept per parameters for the evaluation's
lifetime. In the spirit of lm-evaluation-harness's metric registry, the built-in measurements
(:mod:`dflash_eval.measurements.builtin`) are specs like any other, reached by reference (``ev.measure(ROUND_COSTS)``
returns the costs' type), and a new one is one spec module::

    from dflash_eval.measurements.registry import Measurement, Plan, register

    class MeanPromptLength(Measurement[None, float]):
        name, kind = "mean_prompt_length", "mean_prompt_length"
        def applies(self, settings): return True            # every evaluation takes it
        def plan(self, subject, params): ...                # one Request, its Batch producing the value
        def decode(self, subject, entries, plan, params): ...
        def report(self, value): return MeasurementReport({"mean": value}, [("mean prompt tokens", f"{value:.1f}")])

    register(MeanPromptLength())

Registered measurements whose :meth:`Measurement.applies` holds for a run's settings are run by every evaluation
(``EvalSession.measure_registered``; in the suite the test ``test_registered_measurement[<name>]``, failing with
:meth:`Measurement.check`'s message), and their :meth:`Measurement.report` lands in eval.json's ``measurements``.
Packages may also register through the ``dflash_eval.measurements`` entry-point group (each entry point names a
:class:`Measurement` instance or class).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, overload

from dflash_eval.errors import ConfigError

if TYPE_CHECKING:  # typing only: the stages a measurement reads (all below this package)
    from dflash_eval.cache.requests import Batch, Request, StepReporter
    from dflash_eval.cache.store import CacheEntry
    from dflash_eval.drafter.checkpoint import Checkpoint
    from dflash_eval.drafter.model import DFlashDrafter
    from dflash_eval.features.feature_store import Features, FeatureStore
    from dflash_eval.inputs.run_inputs import Inputs
    from dflash_eval.metrics.drift import LayerDrift, Side
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.prompts import Prompt
    from dflash_eval.references.greedy import CompletionRecord, References
    from dflash_eval.references.sampled import SampledReferences

__all__ = ["Measurement", "MeasurementReport", "Plan", "Runner", "Subject", "SpecRef", "register", "registered_here",
           "unregister"]

S = TypeVar("S")  # what a measurement's plan keeps for its decoding
V = TypeVar("V")  # a measurement's value


class Subject(Protocol):
    """What a measurement reads of the drafter under evaluation (:class:`~dflash_eval.measurements.
    drafter_evaluation.DrafterEvaluation` is one)."""

    settings: EvalSettings
    inputs: Inputs
    references: References
    sampled_references: SampledReferences
    store: FeatureStore

    @property
    def checkpoint(self) -> Checkpoint: ...

    @property
    def drafter(self) -> DFlashDrafter: ...  # built from the checkpoint, or the live module given

    @property
    def layer_ids(self) -> tuple[int, ...]: ...

    @property
    def sampled(self) -> bool: ...

    @property
    def tau_results(self) -> dict[str, Any]: ...  # PromptTau by prompt id (its module imports this one)

    def check_drafter(self) -> None: ...

    def completions(self) -> dict[str, CompletionRecord]: ...

    def features(self, side: Side, layers: tuple[int, ...] | None = None) -> Features: ...

    def layer_drifts(self, a: Side, b: Side) -> dict[str, dict[int, LayerDrift]]: ...

    @overload
    def measure(self, spec: Measurement[Any, V], **params: Any) -> V: ...

    @overload
    def measure(self, spec: str, **params: Any) -> Any: ...

    def on_prompts(self, prompts: Sequence[Prompt]) -> Subject: ...


@dataclass(frozen=True)
class MeasurementReport:
    """What a registered measurement adds to eval.json (``measurements.<name>.summary``, JSON values) and to the
    tables of the terminal and eval.md (``rows``: label, formatted value)."""

    summary: dict[str, Any]
    rows: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "rows": [list(r) for r in self.rows]}


@dataclass
class Plan(Generic[S]):
    """How one measurement's entries are served: the batches (each one computation under its lock), the requests
    by name (what :meth:`Measurement.decode` reads), ``prepare`` (given the misses before anything is produced),
    ``spread`` (batches shared out over the xdist workers), ``progress`` (a reporter factory given the number of
    missing items) and ``state`` (what the plan computed that decoding needs again: the measurement's own type, None
    for a plan that keeps nothing)."""

    batches: list[Batch]
    requests: dict[str, Request]
    prepare: Callable[[list[Request]], None] | None = None
    spread: bool = False
    progress: Callable[[int], StepReporter] | None = None
    state: S = None  # type: ignore[assignment]  # None: a Plan[None], one that keeps nothing for decoding


class Measurement(ABC, Generic[S, V]):
    """One measurement of a drafter (see module docstring): ``S`` what its plan keeps for decoding, ``V`` its value.
    Parameters (``params``) distinguish values of one measurement in one evaluation, e.g. τ on one feature side with
    some DDTree budgets."""

    name: ClassVar[str]
    kind: ClassVar[str]  # the cache kind of its entries

    def applies(self, settings: EvalSettings) -> bool:
        """Whether every evaluation of a run with ``settings`` takes this measurement (built-in ones: False, they
        are asked for by the stages and tests that need them)."""
        return False

    @abstractmethod
    def plan(self, subject: Subject, params: Mapping[str, Any]) -> Plan[S]:
        """The requests (key fields), batches and producers of the value for ``params``."""

    @abstractmethod
    def decode(self, subject: Subject, entries: Mapping[str, CacheEntry], plan: Plan[S],
               params: Mapping[str, Any]) -> V:
        """The value from the served entries (``entries``: by the plan's request names)."""

    def report(self, value: V) -> MeasurementReport | None:
        """What the value adds to eval.json and the report tables (built-in measurements fill typed fields of
        the result instead: None)."""
        return None

    def check(self, value: V) -> str | None:
        """Why the value fails its test (``test_registered_measurement``), or None when it passes."""
        return None


_REGISTRY: dict[str, Measurement[Any, Any]] = {}
#: A measurement, or the name of one registered (:func:`dflash_eval.measurements.builtin.spec` finds it).
SpecRef = Measurement[Any, Any] | str


def register(measurement: Measurement[S, V], *, replace: bool = False) -> Measurement[S, V]:
    """Add ``measurement`` to the registry (ConfigError when its name is taken, unless ``replace``)."""
    if not isinstance(measurement, Measurement):
        raise ConfigError(f"register(): {measurement!r} is not a dflash_eval Measurement instance")
    taken = _REGISTRY.get(measurement.name)
    if taken is not None and taken is not measurement and not replace:
        raise ConfigError(f"a measurement named {measurement.name!r} is registered already "
                          f"({type(taken).__module__}.{type(taken).__qualname__}); pick another name")
    _REGISTRY[measurement.name] = measurement
    return measurement


def unregister(name: str) -> None:
    """Remove a measurement registered under ``name`` (tests; nothing when there is none)."""
    _REGISTRY.pop(name, None)


def registered_here() -> dict[str, Measurement[Any, Any]]:
    """The measurements registered in code (:func:`register`), by name; the full catalog, with the built-in ones
    and the entry points', is :func:`dflash_eval.measurements.builtin.registered`."""
    return dict(_REGISTRY)


def _params_key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


class Runner:
    """Serves the measurements of one subject (one drafter evaluation): each value computed once per parameters,
    through one path (plan, cache, decode). A measurement is given by reference (a built-in one, typed) or by the
    name it was registered under."""

    def __init__(self, subject: Subject, lookup: Callable[[str], Measurement[Any, Any]]) -> None:
        self.subject = subject
        self.lookup = lookup
        self._values: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}

    def _spec(self, spec: SpecRef) -> Measurement[Any, Any]:
        return self.lookup(spec) if isinstance(spec, str) else spec

    @staticmethod
    def _name(spec: SpecRef) -> str:
        return spec if isinstance(spec, str) else spec.name

    @overload
    def measure(self, spec: Measurement[Any, V], **params: Any) -> V: ...

    @overload
    def measure(self, spec: str, **params: Any) -> Any: ...

    def measure(self, spec: SpecRef, **params: Any) -> Any:
        key = (self._name(spec), _params_key(params))
        if key not in self._values:
            m = self._spec(spec)
            plan = m.plan(self.subject, params)
            inp = self.subject.inputs
            index, count = (inp.worker_index, inp.worker_count) if plan.spread else (0, 1)  # (0, 1): not spread
            served = inp.cache.ensure(plan.batches, prepare=plan.prepare, progress=plan.progress, worker_index=index,
                                      worker_count=count)
            entries = {label: served[r.key] for label, r in plan.requests.items()}
            self._values[key] = m.decode(self.subject, entries, plan, params)
        return self._values[key]

    def computed(self, spec: SpecRef, **params: Any) -> bool:
        """Whether :meth:`measure` computed ``spec`` with exactly ``params``."""
        return (self._name(spec), _params_key(params)) in self._values

    def computed_any(self, spec: SpecRef) -> bool:
        """Whether :meth:`measure` computed ``spec`` with any parameters."""
        return any(n == self._name(spec) for n, _ in self._values)

    def values(self, spec: Measurement[Any, V] | str) -> Iterator[V]:
        """The values of ``spec`` computed so far (one per parameters)."""
        return (v for (n, _), v in self._values.items() if n == self._name(spec))

    def reports(self) -> dict[str, dict[str, Any]]:
        """eval.json's ``measurements``: the reports of the registered measurements computed so far (parameterless
        values only)."""
        out: dict[str, dict[str, Any]] = {}
        for (name, params), value in self._values.items():
            rep = self.lookup(name).report(value) if not params else None
            if rep is not None:
                out[name] = rep.to_dict()
        return out
