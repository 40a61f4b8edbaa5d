"""Completions from an SGLang server's ``POST /generate``, validated completely before anything is returned.

:func:`generate_greedy` sends ``input_ids`` with ``temperature: 0`` (argmax); :func:`generate_sampled` sends one
``sampling_params`` dict per prompt (SGLang's ``/generate`` takes a list, one per prompt): the temperature, top-k,
top-p and min-p of the run and that prompt's ``sampling_seed``. SGLang honours a per-request ``sampling_seed`` only
when the server runs with ``--enable-deterministic-inference`` (its seeded Gumbel-max sampler); otherwise it samples
from its own generator and the seed has no effect. Both validate the whole response before returning anything, so
a caller that caches the result can never cache a partial or malformed answer; every failure raises
:class:`~dflash_eval.sglang.transport.SGLangError` naming the field and the URL. Each request is bounded by a total
deadline (also against a server that trickles bytes), so no call can hang.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import requests

from dflash_eval.sglang.transport import SGLangError, describe_exception, excerpt, normalize_url

__all__ = ["Completion", "generate_greedy", "generate_sampled"]

logger = logging.getLogger("dflash_eval.sglang")


@dataclass(frozen=True)
class Completion:
    """One greedy completion as returned by ``POST /generate``.

    ``output_ids`` are the generated ids only (no prompt). ``finish_reason`` is SGLang's dict, e.g.
    ``{"type": "length", "length": 64}`` or ``{"type": "stop", "matched": 151645}``. The two ``spec_*`` fields
    are present only when the server runs a speculative algorithm (``meta_info.spec_accept_length`` /
    ``spec_verify_ct``), else ``None`` (also when ``spec_verify_ct`` is 0: no speculative round ran, and SGLang's
    tokenizer manager then sends ``spec_accept_length: 0``); so is ``spec_accept_histogram``
    (``meta_info.spec_accept_histogram``, older name ``spec_correct_drafts_histogram``: index n = verify rounds that
    accepted exactly n draft tokens), which servers report only in recent versions.
    """

    output_ids: list[int]
    text: str
    finish_reason: dict
    spec_accept_length: float | None
    spec_verify_ct: int | None
    spec_accept_histogram: list[int] | None = None


def _check_prompts(batch_input_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    if isinstance(batch_input_ids, (str, bytes)) or not isinstance(batch_input_ids, Sequence):
        raise SGLangError(f"batch_input_ids must be a list of lists of ints, got {type(batch_input_ids).__name__}")
    prompts: list[list[int]] = []
    for i, ids in enumerate(batch_input_ids):
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise SGLangError(f"batch_input_ids[{i}] must be a list of ints, got {type(ids).__name__}")
        if len(ids) == 0:
            raise SGLangError(f"batch_input_ids[{i}] is empty: SGLang cannot generate from an empty prompt")
        out: list[int] = []
        for tok in ids:
            if isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
                raise SGLangError(f"batch_input_ids[{i}] contains {tok!r} ({type(tok).__name__}), expected int")
            out.append(int(tok))
        prompts.append(out)
    return prompts


def _post_json(endpoint: str, payload: dict[str, Any], deadline: float) -> tuple[int, bytes]:
    """POST ``payload`` and read the whole answer, returning by ``deadline`` whatever the server does.

    A read timeout alone does not bound the total time (a server trickling one byte per second never trips it), so
    the body is read as it arrives (urllib3's public ``read1``: whatever bytes are there, without waiting for a full
    buffer) and the deadline is checked between reads; the response is closed by the thread that reads it. The
    request runs in a daemon thread and the caller waits at most until ``deadline``, then raises
    :class:`TimeoutError`; a thread left waiting on a silent server ends at its read timeout (the time that was left
    when the request was sent).
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            remaining = max(0.05, deadline - time.monotonic())
            with requests.post(endpoint, json=payload, timeout=(min(remaining, 10.0), remaining), stream=True) as r:
                chunks: list[bytes] = []
                while time.monotonic() < deadline:
                    chunk = r.raw.read1(64 * 1024, decode_content=True)
                    if not chunk:
                        box["result"] = (r.status_code, b"".join(chunks))
                        return
                    chunks.append(chunk)
                box["error"] = TimeoutError("no complete answer by the deadline")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"sglang-post {endpoint}", daemon=True)
    worker.start()
    worker.join(timeout=max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        raise TimeoutError("no complete answer by the deadline")
    if "error" in box:
        raise box["error"]
    return box["result"]


def _parse_item(item: Any, *, index: int, where: str, max_new_tokens: int) -> Completion:
    def bad(field: str, problem: str) -> SGLangError:
        return SGLangError(f"{where}: malformed response item [{index}]: field {field!r} {problem}")

    if not isinstance(item, dict):
        raise bad("<item>", f"is {type(item).__name__}, expected an object: {excerpt(json.dumps(item))}")
    if "error" in item and "output_ids" not in item:
        raise SGLangError(f"{where}: item [{index}] is an error: {excerpt(json.dumps(item['error']))}")
    if "output_ids" not in item:
        raise bad("output_ids", f"is missing (keys: {sorted(item)})")
    output_ids = item["output_ids"]
    if not isinstance(output_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in output_ids):
        raise bad("output_ids", f"is not a list of ints: {excerpt(json.dumps(output_ids), 200)}")
    meta = item.get("meta_info")
    if not isinstance(meta, dict):
        raise bad("meta_info", "is missing" if meta is None else f"is {type(meta).__name__}, expected an object")
    finish = meta.get("finish_reason")
    if not isinstance(finish, dict) or not isinstance(finish.get("type"), str):
        raise bad("meta_info.finish_reason", f"is not an object with a string 'type': {finish!r}")
    if finish["type"] == "abort":
        raise SGLangError(f"{where}: item [{index}] was aborted by the server: finish_reason={finish!r}")
    if not output_ids:
        raise SGLangError(
            f"{where}: item [{index}] has an empty output_ids (finish_reason={finish!r}); "
            f"a reference completion must contain at least one token"
        )
    if len(output_ids) > max_new_tokens:
        raise bad("output_ids", f"has {len(output_ids)} tokens, more than max_new_tokens={max_new_tokens}")
    text = item.get("text", "")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise bad("text", f"is {type(text).__name__}, expected a string")
    accept = meta.get("spec_accept_length")
    if accept is not None:
        if isinstance(accept, bool) or not isinstance(accept, (int, float)) or not math.isfinite(accept):
            raise bad("meta_info.spec_accept_length", f"is {accept!r}, expected a finite number")
        accept = float(accept)
    verify = meta.get("spec_verify_ct")
    if verify is not None:
        if isinstance(verify, bool) or not isinstance(verify, int):
            if isinstance(verify, float) and verify.is_integer():
                verify = int(verify)
            else:
                raise bad("meta_info.spec_verify_ct", f"is {verify!r}, expected an int")
    hist = meta.get("spec_accept_histogram", meta.get("spec_correct_drafts_histogram"))
    if hist is not None and (not isinstance(hist, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in hist)):
        raise bad("meta_info.spec_accept_histogram", f"is {excerpt(json.dumps(hist), 200)}, expected a list of "
                  "non-negative ints")
    if verify == 0:  # no speculative round (older SGLang sends spec_accept_length 0 then): no accept length at all
        accept, verify, hist = None, None, None
    return Completion(
        output_ids=list(output_ids),
        text=text,
        finish_reason=dict(finish),
        spec_accept_length=accept,
        spec_verify_ct=verify,
        spec_accept_histogram=list(hist) if hist else None,
    )


def _check_arguments(base: str, *, max_new_tokens: object, batch_size: object, timeout_s: float,
                     caller: str = "generate_greedy") -> None:
    """SGLangError naming the argument: ``max_new_tokens`` and ``batch_size`` ints >= 1, ``timeout_s`` > 0."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise SGLangError(f"{caller}({base!r}): max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SGLangError(f"{caller}({base!r}): batch_size must be an int >= 1, got {batch_size!r}")
    if timeout_s <= 0:
        raise SGLangError(f"{caller}({base!r}): timeout_s must be > 0, got {timeout_s}")


def _sampling_params(max_new_tokens: int, stop_token_ids: list[int] | None) -> dict[str, Any]:
    """Greedy (``temperature: 0``) sampling parameters of every request."""
    params: dict[str, Any] = {
        "temperature": 0.0,
        "max_new_tokens": max_new_tokens,
        "ignore_eos": False,
        "skip_special_tokens": True,
    }
    if stop_token_ids:
        params["stop_token_ids"] = [int(t) for t in stop_token_ids]
    return params


def _request(endpoint: str, payload: dict[str, Any], *, where: str, timeout_s: float, expected: int) -> list[Any]:
    """POST one batch and return its answer: a JSON list of ``expected`` items (a bare object for a one-prompt
    batch is taken as a list of it); anything else raises SGLangError naming ``where``."""
    sent = time.monotonic()
    try:
        status, body = _post_json(endpoint, payload, sent + timeout_s)
    except (requests.exceptions.RequestException, TimeoutError) as exc:
        raise SGLangError(
            f"{where}: no complete answer after {time.monotonic() - sent:.1f}s (timeout {timeout_s:g}s per "
            f"request): {describe_exception(exc)}"
        ) from exc
    if status != 200:
        raise SGLangError(f"{where}: HTTP {status} after {time.monotonic() - sent:.1f}s; body: {excerpt(body)!r}")
    try:
        decoded = json.loads(body)
    except ValueError as exc:
        raise SGLangError(
            f"{where}: HTTP 200 but the body is not valid JSON ({exc}); body: {excerpt(body)!r}"
        ) from exc
    if isinstance(decoded, dict) and expected == 1 and "output_ids" in decoded:
        decoded = [decoded]  # tolerate a single-prompt batch answered with a bare object
    if not isinstance(decoded, list):
        raise SGLangError(
            f"{where}: malformed response: expected a JSON list of {expected} items, got "
            f"{type(decoded).__name__}: {excerpt(json.dumps(decoded))!r}"
        )
    if len(decoded) != expected:
        raise SGLangError(
            f"{where}: malformed response: list has {len(decoded)} items for a batch of {expected} prompts"
        )
    return decoded


def _generate(endpoint: str, prompts: list[list[int]], params: list[dict[str, Any]], *, max_new_tokens: int,
              timeout_s: float, batch_size: int) -> list[Completion]:
    """POST ``prompts`` (with ``params[i]`` for prompt i) in requests of at most ``batch_size``, one after another;
    every item of every answer validated before anything is returned."""
    results: list[Completion] = []
    for first in range(0, len(prompts), batch_size):
        chunk = prompts[first : first + batch_size]
        where = f"POST {endpoint} (prompts {first}..{first + len(chunk) - 1} of {len(prompts)})"
        chunk_params = params[first : first + batch_size]
        # one dict for a batch whose prompts share their parameters (the greedy case), else one per prompt
        sent: dict[str, Any] | list[dict[str, Any]] = (
            chunk_params[0] if all(p == chunk_params[0] for p in chunk_params) else chunk_params)
        decoded = _request(endpoint, {"input_ids": chunk, "sampling_params": sent}, where=where,
                           timeout_s=timeout_s, expected=len(chunk))
        for i, item in enumerate(decoded):
            results.append(_parse_item(item, index=first + i, where=where, max_new_tokens=max_new_tokens))
    return results


def generate_greedy(
    url: str,
    batch_input_ids: list[list[int]],
    *,
    max_new_tokens: int,
    timeout_s: float = 600.0,
    batch_size: int = 32,
    stop_token_ids: list[int] | None = None,
) -> list[Completion]:
    """Greedy completions of ``batch_input_ids`` from ``POST /generate``, one :class:`Completion` per prompt.

    Prompts go in requests of at most ``batch_size`` (SGLang answers a batch with a list in the same order),
    with ``temperature: 0`` (argmax), ``max_new_tokens`` and, when given, ``stop_token_ids``. ``timeout_s``
    bounds each request (one batch, from sending it to the last byte of the answer, even if the server trickles
    bytes), so a call takes at most ``ceil(len(batch_input_ids) / batch_size) * timeout_s``; requests go one
    after another.

    The result is returned only after every item of every request was validated: an HTTP error (the body
    excerpt is quoted), undecodable JSON, a list of the wrong length, a missing or ill-typed ``output_ids`` or
    ``meta_info.finish_reason``, an aborted or empty completion, more than ``max_new_tokens`` tokens, each
    raise :class:`SGLangError` naming the field and the URL, and nothing is returned (so nothing can be cached).
    """
    base = normalize_url(url)
    endpoint = base + "/generate"
    _check_arguments(base, max_new_tokens=max_new_tokens, batch_size=batch_size, timeout_s=timeout_s)
    prompts = _check_prompts(batch_input_ids)
    if not prompts:
        return []
    start = time.monotonic()
    params = [_sampling_params(max_new_tokens, stop_token_ids)] * len(prompts)
    results = _generate(endpoint, prompts, params, max_new_tokens=max_new_tokens, timeout_s=timeout_s,
                        batch_size=batch_size)
    logger.debug("SGLang %s: %d greedy completions in %.1fs", base, len(results), time.monotonic() - start)
    return results


def _check_sampling(base: str, sampling: object, seeds: object, n: int) -> None:
    """SGLangError naming the argument: ``sampling`` a dict with a temperature > 0, one int seed per prompt."""
    if not isinstance(sampling, dict) or not isinstance(sampling.get("temperature"), (int, float)) \
            or isinstance(sampling.get("temperature"), bool) or not sampling["temperature"] > 0:
        raise SGLangError(f"generate_sampled({base!r}): sampling must be a dict of sampling_params with a "
                          f"temperature > 0 (use generate_greedy for temperature 0), got {sampling!r}")
    bad_keys = sorted(set(sampling) & {"max_new_tokens", "sampling_seed", "stop_token_ids"})
    if bad_keys:
        raise SGLangError(f"generate_sampled({base!r}): sampling must not set {bad_keys}: they are arguments of "
                          "their own")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) != n or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) and 0 <= int(x) < 2**63 for x in seeds):
        raise SGLangError(f"generate_sampled({base!r}): seeds must be one int in 0 .. 2**63 - 1 per prompt "
                          f"({n} prompts), got {excerpt(repr(seeds), 200)}")


def generate_sampled(
    url: str,
    batch_input_ids: list[list[int]],
    *,
    sampling: dict[str, Any],
    seeds: Sequence[int],
    max_new_tokens: int,
    timeout_s: float = 600.0,
    batch_size: int = 32,
    stop_token_ids: list[int] | None = None,
) -> list[Completion]:
    """Sampled completions of ``batch_input_ids`` from ``POST /generate``, one :class:`Completion` per prompt.

    ``sampling``: the ``sampling_params`` fields of the draw (``temperature`` > 0, and ``top_k``, ``top_p``,
    ``min_p`` as SGLang names them, e.g. :meth:`dflash_eval.target.sampling.SamplingParams.sglang`); prompt ``i``
    is sent with ``sampling_seed: seeds[i]`` (honoured by a server started with
    ``--enable-deterministic-inference``, see the module docstring). Requests, deadlines and validation as
    :func:`generate_greedy`.
    """
    base = normalize_url(url)
    endpoint = base + "/generate"
    _check_arguments(base, max_new_tokens=max_new_tokens, batch_size=batch_size, timeout_s=timeout_s,
                     caller="generate_sampled")
    prompts = _check_prompts(batch_input_ids)
    _check_sampling(base, sampling, seeds, len(prompts))
    if not prompts:
        return []
    start = time.monotonic()
    common = {**_sampling_params(max_new_tokens, stop_token_ids), **sampling}
    params = [{**common, "sampling_seed": int(seed)} for seed in seeds]
    results = _generate(endpoint, prompts, params, max_new_tokens=max_new_tokens, timeout_s=timeout_s,
                        batch_size=batch_size)
    logger.debug("SGLang %s: %d sampled completions in %.1fs", base, len(results), time.monotonic() - start)
    return results
