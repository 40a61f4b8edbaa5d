"""The target tokenizer's side of the drafter's mask token: reading its facts, resolving a missing mask_token_id
as SGLang does, and telling a trained embedding row from an untrained one.

A DFlash drafter fills the B-1 draft slots of every block with the TARGET's input embedding of ``mask_token_id``.
That row is an input the drafter learned to read: a different id (another tokenizer's mask, an off-by-one) is a
drafter fed inputs it never saw, and costs τ without any error. So the mask token is compared with the target's:

- :class:`TargetVocabulary`: the tokenizer's mask token, its special (added) tokens and its length, read from the
  tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``) without importing
  transformers (a warm run never does);
- :func:`resolve_mask_token_id`: a config without ``mask_token_id`` gets the id SGLang's DFlash worker gives it
  (``python/sglang/srt/speculative/dflash_worker.py``, ``_resolve_mask_token_id``): the token named by
  ``dflash_config.mask_token`` (default ``<|MASK|>``) is the tokenizer's own mask token, else a token of its
  vocabulary, else SGLang appends it to the tokenizer (the next id, which must still be a row of the target's
  embedding);
- :func:`row_stat`: how the embedding row's norm compares with the rows of ordinary tokens (see its docstring for
  why a mask row normally looks untrained).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["SGLANG_DEFAULT_MASK_TOKEN", "TargetVocabulary", "read_tokenizer_facts", "resolve_mask_token_id",
           "RowStat", "row_stat", "OUTLIER_Z"]

#: The mask token SGLang's DFlash worker looks up when a drafter config names none (``dflash_config.mask_token``).
SGLANG_DEFAULT_MASK_TOKEN = "<|MASK|>"
#: |modified z-score| above which an embedding row's norm is an outlier (Iglewicz and Hoaglin's cut-off).
OUTLIER_Z = 3.5


def _content(value: Any) -> str | None:
    """A special token as tokenizer files write it: a string or an AddedToken dict ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the target tokenizer file ({type(exc).__name__}: {exc})") from exc


def _token_ids(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """({token: id} of the base vocabulary, {token: id} of the added tokens) from the tokenizer files."""
    vocab: dict[str, int] = {}
    added: dict[str, int] = {}
    tok = _json(path / "tokenizer.json")
    if isinstance(tok, dict):
        model_vocab = (tok.get("model") or {}).get("vocab")
        if isinstance(model_vocab, dict):  # BPE, WordPiece, WordLevel
            vocab = {str(k): int(v) for k, v in model_vocab.items()}
        elif isinstance(model_vocab, list):  # Unigram: [[token, score], ...]
            vocab = {str(e[0]): i for i, e in enumerate(model_vocab) if isinstance(e, list) and e}
        added = {str(a["content"]): int(a["id"]) for a in tok.get("added_tokens") or []
                 if isinstance(a, dict) and "content" in a and "id" in a}
    elif isinstance(_json(path / "vocab.json"), dict):  # a slow BPE tokenizer's files
        vocab = {str(k): int(v) for k, v in _json(path / "vocab.json").items()}
    cfg = _json(path / "tokenizer_config.json")
    for i, a in ((cfg or {}).get("added_tokens_decoder") or {}).items():
        if isinstance(a, dict) and _content(a) is not None:
            added.setdefault(_content(a), int(i))  # type: ignore[arg-type]  # not None: checked above
    return vocab, added


def read_tokenizer_facts(path: str | Path, lookups: Iterable[str] = (SGLANG_DEFAULT_MASK_TOKEN,)) -> dict[str, Any]:
    """What the mask-token checks need from the tokenizer at ``path`` (JSON-serialisable, so it can be memoised):
    ``size`` (its length, as ``len(tokenizer)``), ``mask_token`` / ``mask_token_id`` (its own mask token, None
    when it has none), ``special_ids`` (the added tokens) and ``lookups`` ({token: id or None} for ``lookups``).
    ``size`` is None when no vocabulary could be read (a tokenizer format other than tokenizer.json/vocab.json)."""
    path = Path(path)
    vocab, added = _token_ids(path)
    ids = {**vocab, **added}
    mask = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        mask = mask or _content((_json(path / name) or {}).get("mask_token"))
    return {"size": (max(ids.values()) + 1) if ids else None, "mask_token": mask,
            "mask_token_id": ids.get(mask) if mask else None, "special_ids": sorted(set(added.values())),
            "lookups": {t: ids.get(t) for t in lookups}}


class TargetVocabulary:
    """The target tokenizer's facts (:func:`read_tokenizer_facts`), read on first use.

    Args:
        path: the target directory (its tokenizer files).
        embedding_rows: rows of the target's input embedding (its config.json ``vocab_size``).
        facts: memoised facts (a callable returning them), instead of reading the files.
    """

    def __init__(self, path: str | Path, embedding_rows: int, *,
                 facts: Callable[[], dict[str, Any]] | None = None) -> None:
        self.path = Path(path)
        self.embedding_rows = int(embedding_rows)
        self._load = facts or (lambda: read_tokenizer_facts(self.path))
        self._stats: dict[int, tuple[float, float, int]] = {}

    @cached_property
    def facts(self) -> dict[str, Any]:
        return self._load()

    @property
    def size(self) -> int | None:
        return self.facts["size"]

    @property
    def mask_token(self) -> str | None:
        return self.facts["mask_token"]

    @property
    def mask_token_id(self) -> int | None:
        return self.facts["mask_token_id"]

    @cached_property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self.facts["special_ids"])

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` in the tokenizer (None when it has no such token)."""
        if token in self.facts["lookups"]:
            return self.facts["lookups"][token]
        vocab, added = self._ids
        return added.get(token, vocab.get(token))

    def token_text(self, token_id: int) -> str | None:
        """The token of ``token_id`` (None for an id no token has: a padding row of the embedding)."""
        return self._texts.get(token_id)

    @cached_property
    def _ids(self) -> tuple[dict[str, int], dict[str, int]]:
        return _token_ids(self.path)

    @cached_property
    def _texts(self) -> dict[int, str]:
        vocab, added = self._ids
        return {i: t for t, i in {**vocab, **added}.items()}

    def describe(self, token_id: int) -> str:
        """``'!'`` for a token of the tokenizer, ``no token of the tokenizer`` for a padding row of the embedding."""
        text = self.token_text(token_id) if self.size is not None else None
        return repr(text) if text is not None else "no token of the tokenizer"

    def norm_stats(self, embedding: torch.Tensor) -> tuple[float, float, int]:
        """(median, MAD, n) of the L2 norms of the ordinary tokens' rows of ``embedding`` (computed once)."""
        key = id(embedding)
        if key not in self._stats:
            self._stats[key] = _norm_stats(embedding, self.size, self.special_ids)
        return self._stats[key]


def resolve_mask_token_id(vocab: TargetVocabulary, mask_token: str | None, *, source: str) -> tuple[int, str]:
    """The mask token id SGLang's DFlash worker uses for a drafter config without ``mask_token_id``, and how it was
    found (for the warning that says so).

    Raises:
        ConfigError: SGLang could not resolve it either (the token is not in the tokenizer, and appending it would
            need a row the target's embedding does not have); the message says what to set.
    """
    token = mask_token or SGLANG_DEFAULT_MASK_TOKEN
    named = "dflash_config.mask_token" if mask_token else "SGLang's default mask token"
    own = (f"; the tokenizer's own mask token is {vocab.mask_token!r} (id {vocab.mask_token_id}), which SGLang "
           "uses only when dflash_config.mask_token names it" if vocab.mask_token and vocab.mask_token != token else "")
    if vocab.mask_token == token and vocab.mask_token_id is not None:
        return vocab.mask_token_id, f"the target tokenizer's mask token {token!r} ({named})"
    found = vocab.token_id(token)
    if found is not None:
        return found, f"the target tokenizer's token {token!r} ({named})"
    if vocab.size is None:
        raise ConfigError(f"{source}: no 'dflash_config.mask_token_id', and the target tokenizer at {vocab.path} has "
                          f"no readable vocabulary (tokenizer.json or vocab.json) to look {token!r} ({named}) up in: "
                          "set dflash_config.mask_token_id")
    if vocab.size < vocab.embedding_rows:
        return vocab.size, (f"{token!r} ({named}) appended to the target tokenizer as its next id, as SGLang does "
                            f"when the tokenizer has no such token (a row of the embedding no token uses{own})")
    raise ConfigError(f"{source}: no 'dflash_config.mask_token_id', and the target tokenizer at {vocab.path} has no "
                      f"token {token!r} ({named}){own}; SGLang would append it as id {vocab.size}, but the target's "
                      f"embedding has only {vocab.embedding_rows} rows (SGLang refuses to start): set "
                      "dflash_config.mask_token_id (or dflash_config.mask_token) to the token the drafter was "
                      "trained with")


@dataclass(frozen=True)
class RowStat:
    """The norm of one embedding row against the ordinary tokens' rows (median, MAD, their count ``n``)."""

    row: int
    norm: float
    median: float
    mad: float
    n: int

    @property
    def z(self) -> float:
        """Modified z-score 0.6745 (norm - median) / MAD (inf when the MAD is 0 and the norm differs)."""
        if self.mad > 0:
            return 0.6745 * (self.norm - self.median) / self.mad
        return 0.0 if self.norm == self.median else math.copysign(math.inf, self.norm - self.median)

    @property
    def looks_trained(self) -> bool:
        return abs(self.z) <= OUTLIER_Z

    def describe(self) -> str:
        return (f"norm {self.norm:.3g}, modified z {self.z:+.1f} against the median {self.median:.3g} (MAD "
                f"{self.mad:.2g}) of {self.n} ordinary tokens' rows")


def _norm_stats(embedding: torch.Tensor, size: int | None, special: frozenset[int]) -> tuple[float, float, int]:
    import torch

    w = embedding.detach()
    rows = min(int(w.shape[0]), size if size is not None else int(w.shape[0]))
    norms = torch.cat([torch.linalg.vector_norm(w[i:i + 8192].float(), dim=1)
                       for i in range(0, rows, 8192)]) if rows else torch.zeros(0)
    # the medians from a host copy of the norms: the same numbers (a median is one of them, the subtraction is
    # elementwise), without loading a GPU's selection kernels for two scalars (sampled at 0.13 s of an H100's warm run)
    norms = norms.cpu()
    keep = torch.ones(rows, dtype=torch.bool)
    drop = [i for i in special if i < rows]
    if drop:
        keep[torch.tensor(drop)] = False
    ref = norms[keep]
    if ref.numel() == 0:
        return math.nan, math.nan, 0
    median = float(ref.median())
    return median, float((ref - median).abs().median()), int(ref.numel())


def row_stat(vocab: TargetVocabulary, embedding: torch.Tensor, row: int) -> RowStat:
    """The norm of ``embedding[row]`` against the norms of the ordinary tokens' rows.

    Why the norm, and why against a median: a token the target reads in its training text gets its embedding row
    updated with every occurrence, while a row no training text reaches (a special token such as a mask, a
    padding row past the tokenizer, a byte that never occurs) keeps the scale of its initialisation. The trained
    rows cluster in norm, so a row that is far from that cluster was not trained. The reference is the rows of the
    tokenizer's ordinary tokens (its added/special tokens and padding rows left out); the median and the median
    absolute deviation (MAD) are used because up to half of those rows may be untrained outliers themselves (rare
    bytes) without moving them, where a mean and a standard deviation would be dragged by them. A row is an outlier
    when its modified z-score 0.6745 (norm - median) / MAD exceeds 3.5 in magnitude (Iglewicz and Hoaglin). On the
    bundled target: median 0.836, MAD 0.087 over the ordinary tokens; ``<|mask|>`` (id 1) z +10.1, ``!`` (id 2)
    z +0.0.

    A DFlash mask token is a token the target never reads in text, so its row normally looks UNTRAINED; a mask id
    whose row looks like a trained token's is the suspicious case (the drafter would see an ordinary token's
    embedding in every draft slot).
    """
    median, mad, n = vocab.norm_stats(embedding)
    norm = float(embedding.detach()[row].float().norm())
    return RowStat(row, norm, median, mad, n)
