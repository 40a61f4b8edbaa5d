"""The run's verdict on the target's kernels, one per dtype: the token that every cache entry computed on this machine
in that dtype carries in its key (:func:`dflash_eval.target.provenance.platform_fields`, through
:meth:`dflash_eval.inputs.run_inputs.Inputs.platform_fields`).

When the run's evidence finds that the live kernels no longer give what the cache's entries were made with, no entry
those kernels made is served: the completions, the teacher-forced argmax, the features, the fingerprint, and what is
computed from them (τ, the drift budget, the online loop, a registered measurement) are all keyed by the token, so
each is made again with the live kernels, as a cold run makes it. One mechanism for every kind of entry: a new kind
is covered by carrying the platform fields, as every entry computed on this machine does.

The evidence: the kernel probe's digest is in the key of each entry it vouches for (per length bucket and regime:
:mod:`dflash_eval.target.kernel_probe`); what its one-layer model on seeded weights and inputs cannot see (a fault
confined to deeper layers, to the larger activations of real weights and data, to real sequences), the witness sees
on the real target (:mod:`dflash_eval.features.witness`). The witness is the ``judge``: once per process and dtype,
before the first key of that dtype is made (the first call of :meth:`KernelVerdict.token`), it re-runs the real
target over every side of that dtype the run reads and decides the token: the one the cache's entries were last made
under (``current``) while the live kernels reproduce them; else an earlier one whose entries they reproduce (kernels
that went back); else a new one (every entry of the dtype made again). While it witnesses a token, keys of that dtype
carry the token tried (:meth:`KernelVerdict.trying`). Without a judge (no feature stage in the process) the current
token stands unchecked; so it does under ``--witness-prompts 0``.

The registry: ``<cache>/v1/witness/<context>.json`` per context (target, dtype, device kind, library versions): the
current token and the tokens seen before it, the most recent last (:data:`REGISTRY_SIZE` of them).

Example::

    verdict = KernelVerdict(cache, "cpu", lambda: identity)
    verdict.judge = witness.verdict          # decides the token of a dtype from the run's evidence
    fields = platform_fields(torch.float32, "cpu", verdict.token(torch.float32))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from dflash_eval.cache.keys import cache_key
from dflash_eval.cache.store import Cache
from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.errors import CacheError
from dflash_eval.target.provenance import platform_fields

__all__ = ["Judge", "KernelVerdict", "REGISTRY_SIZE"]

REGISTRY_SIZE = 16  # tokens remembered per context
#: decides the token of a dtype from the run's evidence (the witness's :meth:`~dflash_eval.features.witness.Witness.
#: verdict`)
Judge = Callable[[torch.dtype], str]


class KernelVerdict:
    """The verdicts of one process (module docstring): ``cache`` holds the registry, ``device`` and ``identity`` (the
    target's content hash, asked for when a context is first needed) name the context."""

    def __init__(self, cache: Cache, device: torch.device | str, identity: Callable[[], str]) -> None:
        self.cache, self.device, self._identity = cache, device, identity
        self.judge: Judge | None = None
        self._tokens: dict[str, str] = {}
        self._trying: dict[str, str] = {}
        self._deciding: set[str] = set()

    def token(self, dtype: torch.dtype) -> str:
        """The token of ``dtype``'s kernels in this process, decided on the first call (by the judge, else the
        registry's current one); the token tried while the judge witnesses one."""
        key = str(dtype)
        if key in self._trying:
            return self._trying[key]
        if key not in self._tokens:
            if key in self._deciding:
                raise RuntimeError(f"a {key} cache key was made while the kernels' verdict of {key} was being decided, "
                                   "outside the token it tried")
            self._deciding.add(key)
            try:
                self._tokens[key] = self.judge(dtype) if self.judge is not None else self.current(dtype)
            finally:
                self._deciding.discard(key)
        return self._tokens[key]

    def decided(self) -> dict[str, str]:
        """dtype -> the token decided in this process."""
        return dict(self._tokens)

    @contextmanager
    def trying(self, dtype: torch.dtype, token: str) -> Iterator[None]:
        """While the judge witnesses ``token``: every key of ``dtype`` carries it."""
        key = str(dtype)
        was = self._trying.get(key)
        self._trying[key] = token
        try:
            yield
        finally:
            if was is None:
                del self._trying[key]
            else:
                self._trying[key] = was

    # ------------------------------------------------------------------------------------ registry
    def context(self, dtype: torch.dtype) -> str:
        """The key of ``dtype``'s context: target, dtype, device kind, library versions (no token)."""
        return cache_key("witness", {"target": self._identity(), **platform_fields(dtype, self.device)})

    def path(self, dtype: torch.dtype) -> Path:
        return self.cache.base / "witness" / f"{self.context(dtype)[:32]}.json"

    def lock(self, dtype: torch.dtype) -> AbstractContextManager[Any]:
        """The context's file lock (xdist workers decide one after the other); none under ``--cache-only``, which
        writes nothing (the cache may be read-only)."""
        if self.cache.cache_only:
            return nullcontext()
        return self.cache.locked("witness-" + self.context(dtype)[:24])

    def read(self, dtype: torch.dtype) -> tuple[str, list[str]]:
        """(the current token, the tokens seen, the most recent last) of ``dtype``'s context."""
        try:
            data = json.loads(self.path(dtype).read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        current = data.get("current")
        seen = data.get("tokens")
        return (current if isinstance(current, str) else "",
                [t for t in seen if isinstance(t, str)] if isinstance(seen, list) else [])

    def current(self, dtype: torch.dtype) -> str:
        """The token the cache's entries of ``dtype`` were last made under (empty: as first cached)."""
        return self.read(dtype)[0]

    def earlier(self, dtype: torch.dtype) -> list[str]:
        """The tokens seen before the current one, the most recent first."""
        current, seen = self.read(dtype)
        return [t for t in reversed(seen) if t != current]

    def record(self, dtype: torch.dtype, token: str) -> None:
        """Make ``token`` the current one of ``dtype``'s context, the one it replaces kept among those seen (nothing
        is written when it is current already)."""
        current, seen = self.read(dtype)
        if token == current and token in seen:
            return
        seen = [t for t in seen if t not in (current, token)] + [current] * (current != token) + [token]
        path = self.path(dtype)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({"current": token, "tokens": seen[-REGISTRY_SIZE:]}, indent=1) + "\n")
        except OSError as exc:
            raise CacheError(f"cannot record the witness token in {path} ({exc}): is the cache directory "
                             f"{self.cache.root} writable?") from exc
