"""SGLang as the reference-completion server: the public names of dflash-eval's SGLang support.

Import from here; the modules are :mod:`~dflash_eval.sglang.transport` (the error type, URL normalisation, log
tail), :mod:`~dflash_eval.sglang.client` (readiness, identity, server info, :class:`SGLangClient`),
:mod:`~dflash_eval.sglang.generate` (validated greedy and seeded sampled ``POST /generate``),
:mod:`~dflash_eval.sglang.ports` (is a port taken, and by which process), :mod:`~dflash_eval.sglang.launch` (launching
and tearing down a server's
process group) and :mod:`~dflash_eval.sglang.service` (the suite's server:
launched or external, checked once, handing over a ready client).

Typical use::

    from dflash_eval.sglang import SGLangClient

    client = SGLangClient.connect("http://127.0.0.1:30000", expected_name="Qwen3-8B", ready_timeout_s=600)
    completions = client.generate_greedy(prompts, max_new_tokens=128)

Protocol facts: the port refuses connections while weights load, then ``/health`` and ``/health_generate``
answer 503 during warm-up while ``/model_info`` already answers 200; the server is ready only when
``GET /health_generate`` answers 200. Every failure raises :class:`SGLangError` (a ``RuntimeError``) naming the
URL, the time waited, the last status seen and the server log tail.
"""

from __future__ import annotations

from dflash_eval.sglang.client import SGLangClient, check_identity, server_info, wait_until_ready
from dflash_eval.sglang.generate import Completion, generate_greedy, generate_sampled
from dflash_eval.sglang.launch import LaunchedServer, process_alive
from dflash_eval.sglang.service import DEFAULT_LAUNCH_URL, SERVER_LOG_NAME, SGLangService, SGLangUnavailable
from dflash_eval.sglang.transport import SGLangError, log_tail, normalize_url

__all__ = [
    "SGLangError",
    "SGLangUnavailable",
    "Completion",
    "SGLangClient",
    "wait_until_ready",
    "check_identity",
    "generate_greedy",
    "generate_sampled",
    "server_info",
    "LaunchedServer",
    "SGLangService",
    "DEFAULT_LAUNCH_URL",
    "SERVER_LOG_NAME",
    "normalize_url",
    "log_tail",
    "process_alive",
]
