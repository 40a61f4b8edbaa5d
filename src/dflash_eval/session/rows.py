"""The typed rows of a result: each eval.json object an :class:`~dflash_eval.session.eval_result.EvalResult` carries
as a dataclass whose fields are the object's keys, in eval.json's order.

:meth:`Row.to_dict` writes the object as eval.json holds it (fields in declaration order; a field declared with
:data:`OPTIONAL` is left out while it is None, one declared with :func:`_absent` while it is :data:`ABSENT`, every
other field is written even when None; floats, NaN included, as they are). :meth:`Row.from_dict` reads such an
object back, so a fragment of eval.json round-trips: ``Row.from_dict(row.to_dict()).to_dict() == row.to_dict()``. It
refuses a key the row does not know and a field the row needs that the object lacks (an optional member, or one
that may be absent, may be absent; :class:`Absent` says which field is which), with one :class:`ResultKeyError`
naming the key's path (``prompts.humaneval-0.online.tau``); :meth:`ResultKeyError.in_file` names the file it was
read from.

The rows of τ: :class:`PromptRow` (eval.json's ``prompts``; the online loop's :class:`OnlineRow`, the SGLang
server's and a sampled run's fields are optional members; :class:`CompletionRow`: each reference the prompt's τ was
measured on, its ids, text and rounds), :class:`CategoryRow`, :class:`ConversationRow`,
:class:`TurnRow` and their parts :class:`Acceptance` (pooled rounds) and :class:`Stat` (mean, median, 95 % CI and its
method).
The drift rows are in :mod:`dflash_eval.session.blocks`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final, TypeVar

from dflash_eval.errors import ResultKeyError  # re-exported: the rows' error

__all__ = ["OPTIONAL", "MAY_BE_ABSENT", "Absent", "ABSENT", "ResultKeyError", "Row", "Acceptance", "Stat",
           "OnlineRow", "CompletionRow", "PromptRow", "CategoryRow", "ConversationRow", "TurnRow", "rows_to_dict",
           "rows_from_dict", "rows_from_list"]

#: Field metadata of a key eval.json leaves out while the field is None.
OPTIONAL = {"optional": True}

#: Field metadata of a key eval.json may leave out and, where it holds it, may hold as null.
MAY_BE_ABSENT = {"may_be_absent": True}

R = TypeVar("R", bound="Row")
T = TypeVar("T")


class Absent(enum.Enum):
    """The value of a member its object leaves out, where the object may also hold it as null: a field typed
    ``X | None | Absent`` (declared with :func:`_absent`) is :data:`ABSENT` when the key is missing and None when it
    is present and null. The three kinds of field a row states: needed (``x: X``; ``x: X | None``: present, may be
    null), optional (``_opt()``: may be absent, never null) and may be absent or null (``_absent()``)."""

    ABSENT = "absent"

    def __repr__(self) -> str:
        return "ABSENT"


#: A member its object leaves out (:class:`Absent`).
ABSENT: Final = Absent.ABSENT


def _opt(**kw: Any) -> Any:
    """An optional member (default None, left out of the dict while None)."""
    return field(default=None, metadata=OPTIONAL, **kw)


def _absent(**kw: Any) -> Any:
    """A member that may be absent and, where present, null (default :data:`ABSENT`, left out of the dict while
    ABSENT; a null is held as None and written back)."""
    return field(default=ABSENT, metadata=MAY_BE_ABSENT, **kw)


#: The types of a JSON scalar: a list of them is copied whole, not item by item (token ids, rounds).
_SCALARS = frozenset({int, float, str, bool, type(None)})


def plain(value: object) -> Any:
    """``value`` as eval.json's plain data: rows as dicts, containers copied."""
    if isinstance(value, (list, tuple)):
        if all(type(v) in _SCALARS for v in value):
            return list(value)
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Row) or (dataclasses.is_dataclass(value) and hasattr(value, "to_dict")):
        return value.to_dict()  # a row, or a record of the metrics that writes itself (a drift direction)
    return value


@cache
def _scalar_hint(hint: object) -> bool:
    """Whether ``hint`` types a JSON scalar (or an optional one), read as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return all(_scalar_hint(a) for a in typing.get_args(hint))
    return hint in _SCALARS or hint is Any


def _typed(hint: object, value: Any) -> Any:
    """Plain ``value`` read as ``hint``: rows (and rows inside dicts, lists and optionals) from their dicts."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None) and a is not Absent]
        return _typed(inner[0], value) if len(inner) == 1 else value
    if isinstance(hint, type) and issubclass(hint, Row):
        return hint.from_dict(value)
    if isinstance(hint, type) and hasattr(hint, "from_dict"):  # a record that reads itself, as strictly
        return hint.from_dict(value)
    if origin is dict and len(args) == 2:
        out = {}
        for k, v in value.items():
            try:
                out[k] = _typed(args[1], v)
            except ResultKeyError as exc:
                raise exc.under(str(k)) from None
        return out
    if origin is list and args and _scalar_hint(args[0]) and all(type(v) in _SCALARS for v in value):
        return list(value)  # token ids, accept lengths, τ per sample: copied whole
    if origin is dict and len(args) == 2 and _scalar_hint(args[1]):
        return dict(value)
    if origin is list and args:
        items = []
        for i, v in enumerate(value):
            try:
                items.append(_typed(args[0], v))
            except ResultKeyError as exc:
                raise exc.under(i) from None
        return items
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class Row:
    """A dataclass that is one eval.json object (module docstring)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # every Row subclass is a dataclass
            value = getattr(self, f.name)
            if (value is None and f.metadata.get("optional")) or value is ABSENT:
                continue
            out[f.name] = plain(value)
        return out

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """The row of ``data`` (module docstring); ResultKeyError naming the first key it does not know or the first
        field it needs that ``data`` lacks. Every field is needed but an optional member (:data:`OPTIONAL`), which
        :meth:`to_dict` leaves out while it is None: held as null it is a key this row does not write, unknown; and
        a member that may be absent (:func:`_absent`), :data:`ABSENT` while the key is missing."""
        owner: type = cls  # a class is hashable; mypy checks type[R] against Hashable by R's instances' __hash__
        hints = _hints(owner)
        keys, optional, never_null = _layout(owner)
        ResultKeyError.check(data, keys, optional)
        null = next((k for k in never_null if k in data and data[k] is None), None)
        if null is not None:
            raise ResultKeyError("unknown", null)
        kw = {}
        for name in keys:
            if name in data:
                try:
                    kw[name] = _typed(hints[name], data[name])
                except ResultKeyError as exc:
                    raise exc.under(name) from None
        return cls(**kw)


@cache
def _layout(cls: type) -> tuple[tuple[str, ...], frozenset[str], frozenset[str]]:
    """A row's keys in declaration order, those it may leave out (its optional members and those that may be absent)
    and those of its optional members (never null)."""
    fields = dataclasses.fields(cls)
    optional = frozenset(f.name for f in fields if f.metadata.get("optional"))
    absent = frozenset(f.name for f in fields if f.metadata.get("may_be_absent"))
    return tuple(f.name for f in fields), optional | absent, optional


def rows_to_dict(rows: Mapping[str, Row]) -> dict[str, dict[str, Any]]:
    """``{key: row.to_dict()}`` in the rows' order."""
    return {k: r.to_dict() for k, r in rows.items()}


def rows_from_dict(cls: type[R], data: Mapping[str, Mapping[str, Any]]) -> dict[str, R]:
    """``{key: cls.from_dict(row)}`` in the data's order (ResultKeyError names the row's key)."""
    out = {}
    for k, v in data.items():
        try:
            out[k] = cls.from_dict(v)
        except ResultKeyError as exc:
            raise exc.under(str(k)) from None
    return out


def rows_from_list(read: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
    """``[read(item)]`` of a list of records (a row's or a record's ``from_dict``) in order (ResultKeyError names the
    item's index: ``[2].cos``)."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(read(item))
        except ResultKeyError as exc:
            raise exc.under(i) from None
    return out


@dataclass
class Acceptance(Row):
    """Pooled speculative rounds: their count, mean acceptance length, histogram and per-position rates
    (:func:`dflash_eval.metrics.acceptance_rates.acceptance_block`)."""

    rounds: int
    tau: float
    histogram: list[int]
    position_rates: list[float]


@dataclass
class Stat(Row):
    """Mean, median and 95 % CI of τ over ``n`` prompts, and the CI's method (``Hall t over prompts``;
    :class:`dflash_eval.metrics.stats.Summary`; absent from an eval.json written before it was recorded)."""

    n: int
    mean: float
    median: float
    ci95: list[float]
    ci_method: str | None = _opt()


@dataclass
class OnlineRow(Row):
    """The online speculative loop's rounds of one prompt (``--online-tau``); at temperature > 0 ``tau`` is the mean
    over the samples, with ``samples`` and ``sample_tau``."""

    rounds: int
    tau: float
    histogram: list[int]
    position_rates: list[float]
    accept_lengths: list[int]
    tokens: int
    matches_reference: bool
    first_divergence: int | None
    samples: int | None = _opt()
    sample_tau: list[float] | None = _opt()


@dataclass
class CompletionRow(Row):
    """One reference completion a prompt's τ was measured on (eval.json's ``prompts.<id>.completions``; one line of
    ``reports/samples.jsonl``): ``sample`` 0 at temperature 0, the sampled reference's index above it (``seed``: its
    stream seed); where it came from (``local``, ``sglang``); its token ids, decoded text and each token's piece of
    that text (``pieces``, joining to ``text``); the chain loop's accept length of every verification round on it,
    its τ, and each DDTree budget's τ and accept lengths. Round ``r`` starts at completion position ``c_r`` (``c_1 =
    0``, the prefill's token; ``c_{r+1} = c_r + a_r``): it accepts the drafts of positions ``c_r + 1 .. c_r + a_r - 1``
    and its bonus token at ``c_r + a_r`` is where the first draft was rejected, unless ``a_r`` is the block size."""

    sample: int
    source: str
    ids: list[int]
    text: str
    pieces: list[str]
    accept_lengths: list[int]
    tau: float
    ddtree: dict[str, float]
    ddtree_accept_lengths: dict[str, list[int]]
    seed: int | None = _opt()


@dataclass
class PromptRow(Row):
    """One prompt's judged τ (eval.json's ``prompts`` row): chain τ and its rounds, each DDTree budget's τ, the
    floors and the verdict (``passed`` None: not gated); a sampled run's samples, the SGLang server's own accept
    length, the turn of a multi-turn conversation, the online loop's τ and the baseline's τ when measured; the
    prompt's token ids (what the target saw, its chat template applied), its text and the references the τ was
    measured on (``completions``)."""

    category: str
    tau: float
    rounds: int
    accept_lengths: list[int]
    histogram: list[int]
    position_rates: list[float]
    ddtree: dict[str, float]
    ddtree_accept_lengths: dict[str, list[int]]
    floor: float | None
    ddtree_floor: dict[str, float | None]
    prompt_tokens: int
    completion_tokens: int
    passed: bool | None
    samples: int | None = _opt()
    sample_tau: list[float] | None = _opt()
    sample_ci95: list[float] | None = _opt()
    sample_ci_method: str | None = _opt()
    ddtree_sample_tau: dict[str, list[float]] | None = _opt()
    server_accept_length: float | None = _opt()
    server_histogram: list[int] | None = _opt()
    server_position_rates: list[float] | None = _opt()
    conversation: str | None = _opt()
    turn: int | None = _opt()
    online: OnlineRow | None = _opt()
    baseline_tau: float | None = _opt()
    prompt_ids: list[int] | None = _opt()
    prompt_text: str | None = _opt()
    completions: list[CompletionRow] | None = _opt()


@dataclass
class CategoryRow(Row):
    """A category's (or ``"all"``'s) τ over its prompts, chain and per DDTree budget, its pooled acceptance per
    source (chain, online, server), its floors and verdict."""

    n: int
    chain: Stat
    ddtree: dict[str, Stat]
    acceptance: dict[str, Acceptance]
    floor: float | None
    ddtree_floor: dict[str, float | None]
    passed: bool | None


@dataclass
class ConversationRow(Row):
    """A multi-turn conversation: its turns' prompt ids and chain τ in turn order, and its rounds pooled."""

    category: str
    turns: list[str]
    turn_tau: list[float]
    rounds: int
    tau: float
    histogram: list[int]
    position_rates: list[float]


@dataclass
class TurnRow(Row):
    """The k-th turns of the conversations: chain τ over them and their pooled acceptance."""

    chain: Stat
    acceptance: Acceptance
