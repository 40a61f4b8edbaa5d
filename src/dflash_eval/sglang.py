"""SGLang as the reference-completion server: the public facade of dflash-eval's SGLang support.

Import from here; the implementation lives in :mod:`dflash_eval.sglang_client` (readiness, identity, greedy
generation, server info) and :mod:`dflash_eval.sglang_launch` (launching and tearing down a server).

Typical use::

    from dflash_eval.sglang import LaunchedServer, check_identity, generate_greedy, wait_until_ready

    wait_until_ready("http://127.0.0.1:30000", timeout_s=600)        # an already running (or restarting) server
    check_identity("http://127.0.0.1:30000", expected_name="Qwen3-8B")
    completions = generate_greedy("http://127.0.0.1:30000", prompts, max_new_tokens=128)

Protocol facts (see ``shared/reference/sglang.md``): the port refuses connections while weights load, then
``/health`` and ``/health_generate`` answer 503 during warm-up while ``/model_info`` already answers 200; the
server is ready only when ``GET /health_generate`` answers 200. Every failure raises :class:`SGLangError`
(a ``RuntimeError``) naming the URL, the time waited, the last status seen and the server log tail.
"""

from __future__ import annotations

from dflash_eval.sglang_client import (
    Completion,
    SGLangError,
    check_identity,
    generate_greedy,
    log_tail,
    normalize_url,
    server_info,
    wait_until_ready,
)
from dflash_eval.sglang_launch import LaunchedServer, process_alive

__all__ = [
    "SGLangError",
    "Completion",
    "wait_until_ready",
    "check_identity",
    "generate_greedy",
    "LaunchedServer",
    "server_info",
    "normalize_url",
    "log_tail",
    "process_alive",
]
