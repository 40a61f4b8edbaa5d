"""How the completions stage reaches a ready SGLang server: a collaborator handed to the session at construction.

``--completions sglang`` needs a server only when completions are not cached. :class:`ServerLink` gives the
references stage its ready client when it first needs one: ``connect`` makes it on demand (``dflash-eval gate``
connects to ``--sglang-url``), or whoever started the service attaches its client and description
(:meth:`ServerLink.attach`, the pytest plugin's ``sglang`` fixture, which owns the service's lifetime: a skip when
no server is ready, the launched server stopped at session end, :meth:`ServerLink.detach`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dflash_eval.errors import EvalError

if TYPE_CHECKING:  # the client module imports requests: only a run that talks to a server needs it
    from dflash_eval.sglang.client import ReferenceClient

__all__ = ["ServerLink"]


class ServerLink:
    """A ready SGLang client on demand (see module docstring); ``connect``: makes one (None: only an attached one)."""

    def __init__(self, connect: Callable[[], ReferenceClient | None] | None = None) -> None:
        self._connect = connect
        self._client: ReferenceClient | None = None
        self._info: dict[str, Any] | None = None

    def attach(self, client: ReferenceClient, info: dict[str, Any] | None = None) -> None:
        """Use ``client`` (ready, its server's identity checked) until :meth:`detach`; ``info``: the service's
        description for eval.json's ``sglang`` block."""
        self._client, self._info = client, info

    def detach(self) -> None:
        self._client = None

    def client(self) -> ReferenceClient:
        """The ready client: the attached one, else one ``connect`` makes (once); EvalError when there is none."""
        if self._client is None and self._connect is not None:
            self._client = self._connect()
        if self._client is None:
            raise EvalError("--completions sglang: reference completions are not cached and no SGLang server was "
                            "started (the suite's sglang fixture starts it; outside pytest pass a ServerLink that "
                            "connects to a ready server)")
        return self._client

    @property
    def info(self) -> dict[str, Any] | None:
        """The attached service's description (None when none was attached)."""
        return self._info
