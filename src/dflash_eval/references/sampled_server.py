"""Sampled reference completions from an SGLang server (``--completions sglang`` at ``--temperature`` > 0).

Each missing (prompt, sample) of a batch is one prompt of a ``POST /generate`` whose ``sampling_params`` carry the
run's temperature, top-k, top-p and min-p and, as ``sampling_seed``, the sample's stream seed
(:func:`dflash_eval.target.sampling.stream_seed`), so the request that a recorded floor's reference came from can be
asked again. The server's draws are its own random numbers (SGLang's sampler, not this package's), so its samples
differ from local ones of the same seed; what makes them valid references is that they are draws of the same
processed target distribution, neither too flat nor too sharp, which the local target checks for every completion
and pooled over the whole fetch before anything of the fetch is cached
(:mod:`dflash_eval.references.server_sample_check`).

SGLang honours ``sampling_seed`` only when started with ``--enable-deterministic-inference`` (its ``/server_info``
then says ``enable_deterministic_inference: true``). Without it every fetch draws afresh: a cached sample is reused,
but a fresh cache gets other references than a recording made on the same server, so the paired comparison with
T > 0 floors degrades to an unpaired one (the floors' margins still hold for an equal drafter on other draws). The
fetch warns once per process in that case and each entry records ``seeded``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from dflash_eval.cache.requests import Produced, Request
from dflash_eval.errors import EvalError
from dflash_eval.inputs.run_inputs import Inputs
from dflash_eval.references.completion_sources import out_of_vocab
from dflash_eval.references.greedy import References
from dflash_eval.references.server_sample_check import check_sampled_completions
from dflash_eval.references.token_pieces import decode_pieces

if TYPE_CHECKING:  # the client module imports requests: only a run that talks to a server needs it
    from dflash_eval.sglang.client import ReferenceClient

__all__ = ["UnseededServerWarning", "fetch_sampled", "server_seeds_requests"]

_warned: set[str] = set()


class UnseededServerWarning(UserWarning):
    """The SGLang server ignores ``sampling_seed``: its sampled references are not reproducible."""


def server_seeds_requests(info: dict[str, Any] | None) -> bool:
    """Whether a server's ``/server_info`` says it honours a request's ``sampling_seed``."""
    return bool((info or {}).get("enable_deterministic_inference", False))


def _seeded(client: ReferenceClient) -> bool:
    """Ask the server whether it honours seeds (one ``GET /server_info`` per fetch); warn once per URL and process
    when it does not."""
    url = str(getattr(client, "url", "the SGLang server"))
    try:
        info = client.info()  # type: ignore[attr-defined]  # SGLangClient's; a plugin's client may lack it
    except Exception as exc:  # noqa: BLE001 - a server without /server_info cannot say: unseeded, and why
        info = {"error": f"{type(exc).__name__}: {exc}"}
    seeded = server_seeds_requests(info)
    if not seeded and url not in _warned:
        _warned.add(url)
        warnings.warn(UnseededServerWarning(
            f"{url} does not run with --enable-deterministic-inference (its /server_info: "
            f"enable_deterministic_inference={info.get('enable_deterministic_inference')!r}), so SGLang ignores the "
            "sampling_seed of each request: the sampled references are valid draws of the target but a fresh cache "
            "draws other ones, and a gate against T > 0 floors recorded on this server is no longer paired. Start "
            "the server with --enable-deterministic-inference for reproducible references"), stacklevel=2)
    return seeded


def fetch_sampled(inp: Inputs, references: References, pairs: list[tuple[str, int]], todo: list[Request],
                  request_of: Callable[[str, int], Request]) -> list[Produced]:
    """The sampled completions of ``todo`` (requests of ``pairs``' batch) from the ready server, each checked."""
    s = inp.settings
    keys = {r.key for r in todo}
    reqs = {p: request_of(*p) for p in pairs}
    want = [p for p in pairs if reqs[p].key in keys]
    seeds = [int(reqs[p].fields["stream_seed"]) for p in want]
    client = references.server.client()
    url = str(getattr(client, "url", "the SGLang server"))
    seeded = _seeded(client)
    prompts = [references.prompt_ids(pid) for pid, _ in want]
    with inp.meter.timed("sglang"):
        comps = client.generate_sampled(prompts, sampling=s.sampling.sglang(), seeds=seeds,
                                        max_new_tokens=s.max_new_tokens)
    vocab = inp.vocab_size
    for (pid, k), c in zip(want, comps):
        bad = out_of_vocab(list(c.output_ids), vocab)
        if bad is not None:
            raise EvalError(f"sampled completion {k} of prompt {pid!r} from {url}: token id {bad[1]} at completion "
                            f"position {bad[0]} is outside the target vocabulary (0..{vocab - 1}); the server does "
                            "not serve this target's tokenizer? No cache entry written")
    check_sampled_completions(inp, [(f"{pid}#{k}", ids, list(c.output_ids))
                                    for (pid, k), ids, c in zip(want, prompts, comps)], s.sampling, url)
    made = {}
    for (pid, k), seed, c in zip(want, seeds, comps):
        meta = {"prompt_id": pid, "sample": k, "source": "sglang", "sampling_seed": seed, "seeded": seeded,
                "finish_reason": c.finish_reason, "server_text": c.text}
        meta["text"], meta["pieces"] = decode_pieces(inp.tokenizer, list(c.output_ids))  # as local completions
        made[reqs[(pid, k)].key] = Produced({"output_ids": torch.tensor(list(c.output_ids), dtype=torch.int64)},
                                            meta, tokens=len(c.output_ids))
    return [made[r.key] for r in todo]
