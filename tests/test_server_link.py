"""The references stage reaches an SGLang server through the ServerLink handed to the session: a client connected
on first need (once), or one attached by whoever started the service; none is one error naming what to do.

Run: ``pytest tests/test_server_link.py -p no:cacheprovider``
"""

from __future__ import annotations

import pytest

from dflash_eval.errors import EvalError
from dflash_eval.references.server_link import ServerLink


def test_connect_runs_on_first_need_only_and_once() -> None:
    made: list[str] = []
    link = ServerLink(lambda: made.append("client") or "client")
    assert made == [] and link.info is None  # nothing connects until a fetch needs it
    assert link.client() == "client" and link.client() == "client" and made == ["client"]


def test_an_attached_client_is_used_until_detached() -> None:
    link = ServerLink()
    link.attach("ready", {"url": "http://127.0.0.1:30000"})
    assert link.client() == "ready" and link.info == {"url": "http://127.0.0.1:30000"}
    link.detach()
    with pytest.raises(EvalError, match="no SGLang server was started"):
        link.client()
