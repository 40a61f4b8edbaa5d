"""Near ties of the target: where two greedy decodings of the same target may legitimately part, and the one rule that
judges a parting.

A greedy completion is the target's argmax token after token. Where the target's two best tokens lie within rounding
of each other, which one wins depends on summation order: the decode path (one token at a time) against the prefill
path (a whole sequence), a left-padded batch against one prompt, and, on a GPU, the kernel configuration Triton's
autotuner picked in this process by timing its candidates. So a completion may leave another one of the same target
(its golden record, its own teacher-forced argmax, an SGLang server's answer) at a near tie and follow a different,
equally greedy path from there. Two completions part for a reason only where the target is confident.

The rule (:func:`judge`): at the first position where two token sequences differ, take the target's own logits there
(teacher-forced on the shared prefix, in the run's settings) and measure how far the less favoured of the two tokens
lies below the target's best logit (:attr:`Divergence.margin`; where the two are the target's top two, this is its
top-2 margin). Within the near-tie band of the dtype the target runs in (:data:`NEAR_TIE_BAND`) the parting is a
**near tie**: named, counted, and not a failure, and the tokens after it are not compared (each completion follows its
own prefix from there). Outside the band it is a **divergence**: the target prefers one of the two tokens by more than
rounding can explain.

The band by dtype: in float32 the two paths agree to ~1e-5, so 1e-3 is far above rounding. In bfloat16 a logit holds 8
significant bits: one step is 0.0625 for logits in [8, 16) and 0.125 in [16, 32); measured on an H200 with fla on the
bundled target, decode and prefill parted at margins 0.031 and 0.0625 (one step) in 3 of 37 completions, and a fresh
Triton cache moved one golden completion at margin 0.031: two steps of a logit below 32 is the band. float16 holds 11
bits: 0.03125 is two steps of a logit below 32.

The target's logits at a position are kept as its :data:`TOP_K` best tokens (:class:`TopTokens`), enough to judge any
parting whose tokens are among them. A token outside them lies at least :attr:`TopTokens.floor_gap` below the best,
by an amount not known: such a parting is never called a near tie (it fails, saying so).

Torch-free: the reports and the golden checks read :class:`Divergence` rows without loading torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dflash_eval.errors import ResultKeyError
from dflash_eval.metrics.verdict.rules import is_near_tie

__all__ = ["NEAR_TIE_BAND", "DEFAULT_BAND", "TOP_K", "AGAINST", "NAMED", "near_tie_band", "TopTokens", "Divergence",
           "first_divergence", "judge", "near_tie_notices", "near_tie_count"]

#: Largest margin (logits) at which two greedy decodings of the target may part by rounding alone, by the dtype the
#: target runs in (module docstring).
NEAR_TIE_BAND: dict[str, float] = {"float32": 1e-3, "float64": 1e-3, "bfloat16": 0.25, "float16": 0.03125}
#: The band of a dtype not in :data:`NEAR_TIE_BAND`.
DEFAULT_BAND = 1e-3
#: How many of the target's best tokens (and their logits) a teacher-forced entry keeps per position.
TOP_K = 8
#: How many near ties of each kind a verdict names one by one (eval.md and eval.json hold them all).
NAMED = 4
#: What a completion was compared with: its golden record (the snapshot under ``golden/``), the target's own
#: teacher-forced argmax over it, or (for a server's completion) the local target's.
AGAINST = ("golden", "teacher-forced", "server")


def near_tie_band(dtype: object) -> float:
    """The near-tie band of ``dtype`` (a torch dtype or its name, with or without ``torch.``)."""
    return NEAR_TIE_BAND.get(str(dtype).removeprefix("torch."), DEFAULT_BAND)


@dataclass(frozen=True)
class TopTokens:
    """The target's best tokens at one position, best first, with their logits."""

    ids: tuple[int, ...]
    logits: tuple[float, ...]

    def gap(self, token: int) -> float | None:
        """How far ``token``'s logit lies below the best one (None: ``token`` is not among these)."""
        for t, v in zip(self.ids, self.logits):
            if t == token:
                return self.logits[0] - v
        return None

    @property
    def floor_gap(self) -> float:
        """A token not among these lies at least this far below the best logit."""
        return self.logits[0] - self.logits[-1]


@dataclass(frozen=True)
class Divergence:
    """Where a completion first leaves the token sequence it was compared with, judged by the target's own logits
    there (module docstring). ``position``: completion token index (``absolute``: index in prompt + completion);
    ``expected``: the token of what it was compared with (the golden record's, the teacher-forced argmax, the local
    target's), ``got``: this run's (or the server's); ``margin``: how far the less favoured of the two lies below
    the target's best logit, None when one of them is not among the target's :data:`TOP_K` best (then it lies at least
    ``margin_bound`` below); ``band``: the near-tie band of ``dtype``."""

    prompt_id: str
    against: str
    position: int
    absolute: int
    expected: int
    got: int
    margin: float | None
    margin_bound: float
    band: float
    dtype: str
    expected_text: str = ""
    got_text: str = ""

    @property
    def near_tie(self) -> bool:
        """Within the near-tie band: a named near tie, not a failure."""
        return is_near_tie(self.margin, self.band)

    @property
    def margin_text(self) -> str:
        """The margin as messages and tables print it (3 significant digits; ``> x`` when only bounded)."""
        if self.margin is None:
            return f"> {self.margin_bound:.3g} (a token outside the target's {TOP_K} best)"
        return f"{self.margin:.3g}"

    def describe(self) -> str:
        """One line: which prompt, where, both tokens, the margin against the band, and what it means."""
        what = {"golden": "the golden completion", "teacher-forced": "the target's teacher-forced argmax",
                "server": "the local target's teacher-forced argmax"}.get(self.against, self.against)
        mine = "the server" if self.against == "server" else "this run"
        head = (f"prompt {self.prompt_id!r}: the completion leaves {what} at completion token {self.position} "
                f"(position {self.absolute}): {self.against} {self.expected} {self.expected_text or '?'}, {mine} "
                f"{self.got} {self.got_text or '?'}; the target's margin there {self.margin_text}")
        if self.near_tie:
            return (f"{head} is within the {self.dtype} near-tie band {self.band:g}: a near tie, not a failure "
                    f"(completion tokens after {self.position} not compared)")
        return (f"{head} is outside the {self.dtype} near-tie band {self.band:g}: the target prefers one of the two "
                "tokens by more than rounding explains")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["near_tie"] = self.near_tie
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Divergence:
        """A row of :meth:`to_dict` (eval.json's ``near_ties``; ``near_tie`` follows from the margin);
        ResultKeyError naming a key it does not know or lacks."""
        ResultKeyError.check(data, (*cls.__dataclass_fields__, "near_tie"))
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ, ``min(len)`` when one is a proper prefix of the other, None when
    they are equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def judge(prompt_id: str, against: str, position: int, absolute: int, expected: int, got: int, top: TopTokens,
          dtype: object, decode: Callable[[int], str] | None = None) -> Divergence:
    """The :class:`Divergence` of ``got`` against ``expected`` at ``position`` (module docstring), from the target's
    best tokens ``top`` there; ``decode`` names a token for the messages."""
    band = near_tie_band(dtype)
    gaps = [top.gap(expected), top.gap(got)]
    margin = None if any(g is None for g in gaps) else max(g for g in gaps if g is not None)
    if margin is not None and not math.isfinite(margin):
        margin = None
    return Divergence(prompt_id, against, position, absolute, expected, got, margin, top.floor_gap, band,
                      str(dtype).removeprefix("torch."), _text(decode, expected), _text(decode, got))


def _text(decode: Callable[[int], str] | None, token: int) -> str:
    if decode is None:
        return ""
    try:
        return repr(decode(token))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode a lone id: the id says enough
        return ""


def near_tie_notices(ties: Sequence[Divergence], limit: int | None = NAMED) -> list[str]:
    """What a verdict says of a run's near ``ties`` (eval.json's ``near_ties``; not failures, the tokens after each
    not compared), golden completions first: ``near tie: <prompt> ...`` for each completion that left its golden
    record (at most ``limit``, then how many more); the completions that left their own teacher-forced argmax (the
    decode and the prefill path parting at a tie, common in bf16) one by one when few, else on one line naming the
    prompts."""
    golden = [d for d in ties if d.against != "teacher-forced"]
    forced = [d for d in ties if d.against == "teacher-forced"]
    shown = golden if limit is None else golden[:limit]
    lines = [f"near tie: {d.describe()}" for d in shown]
    if len(golden) > len(shown):
        lines.append(f"near tie: {len(golden) - len(shown)} more golden completions (eval.md lists them)")
    if forced and (limit is None or len(forced) <= 2):
        lines += [f"near tie: {d.describe()}" for d in forced]
    elif forced:
        where = ", ".join(f"{d.prompt_id} token {d.position} (margin {d.margin_text})" for d in forced[:limit])
        more = f" and {len(forced) - limit} more (eval.md lists them)" if limit is not None and len(forced) > limit \
            else ""
        lines.append(f"near tie: {len(forced)} completions leave their teacher-forced argmax (the decode and the "
                     f"prefill path parting where the target's two best tokens tie in {forced[0].dtype}), not "
                     f"failures: {where}{more}")
    return lines


def near_tie_count(rows: Sequence[Divergence | Mapping[str, Any]]) -> str:
    """``1 golden completion at a near tie, 19 teacher-forced near ties`` ("" when there is none; ``rows``: the
    divergences, or eval.json's ``near_ties`` rows)."""
    golden = sum(1 for d in rows if (d.against if isinstance(d, Divergence) else d.get("against")) != "teacher-forced")
    forced = len(rows) - golden
    return ", ".join(([f"{golden} golden completion{'s' if golden != 1 else ''} at a near tie"] if golden else [])
                     + ([f"{forced} teacher-forced near tie{'s' if forced != 1 else ''}"] if forced else []))
