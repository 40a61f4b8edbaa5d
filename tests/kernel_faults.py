"""Kernel faults patched from OUTSIDE dflash-eval into the functions and classes the bundled target's forward calls
(transformers' Qwen3.5 modeling module, torch), with the same library versions: what a kernel rebuilt, patched or
miscompiled in place looks like to the suite. Each fault adds seeded relative noise (1e-2 of the output's RMS, the
same noise on every call of one shape) where it applies, or changes the computation, and nothing elsewhere:

- ``chunk_noise``: the chunked delta rule's output, every call;
- ``gate``: the decay gate of the chunked delta rule times 1.1;
- ``bf16_chunk``: the chunked delta rule run with its inputs and output in bf16 (bf16 accumulation);
- ``long_inputs``: the chunked delta rule's output, only on calls over more than :data:`LONG` tokens;
- ``conv1d``: ``causal_conv1d_fn``'s output (the prefill convolution);
- ``conv1d_update``: ``causal_conv1d_update``'s output (the decode-step convolution);
- ``gated_norm``: the gated RMSNorm's output (``Qwen3_5RMSNormGated.forward``);
- ``decode_only``: the recurrent delta rule's output on single-token calls (decode steps) only, noise of
  :data:`DECODE_REL` (1e-2 flips no greedy token of the bundled prompts: the completions would not move);
- ``recurrent_prefill``: the recurrent delta rule's output on multi-token calls only (the ``torch-recurrent``
  backend's prefill);
- ``attention_long``: torch's ``scaled_dot_product_attention`` output, only for more than :data:`LONG_QUERIES`
  queries.

Faults confined to a length regime within one probe bucket, or to a batch size, as real kernels dispatch (the
bundled prompts of ``tests/test_warm_equals_cold.py`` are 98 and 147 tokens, 162 and 211 with their completions, the
fingerprint text 33; one left-padded batch of both decodes with cache lengths 148 to 211):

- ``short_inputs``: the chunked delta rule's output, only on calls under :data:`SHORT` tokens (shorter sequences of
  the bucket);
- ``single_chunk``: the same, only on calls of at most one 64-token chunk (the fingerprint text);
- ``short_kv`` / ``long_kv``: attention's output on decode steps (fewer queries than cached keys: transformers
  folds a decode step's query heads of one key head into its query length) over fewer than :data:`SHORT` / more than
  :data:`LONG_KV` cached keys, noise of :data:`KV_REL`;
- ``batched``: the recurrent delta rule's output on decode steps of a batch of more than one sequence, noise of
  :data:`DECODE_REL` (one-at-a-time extraction never calls it so).

Faults the kernel probe cannot see (:data:`BLIND`): confined to what its model, one decoder layer of each type
(layer ids 0 and 1) with seeded weights and inputs, never runs, and the real target does; only the witness, the real
target re-run on real data, can see them:

- ``deep_chunk``: the chunked delta rule's output in the Gated DeltaNet layers from :data:`DEEP` on (the deeper
  layers);
- ``deep_recurrent``: the recurrent delta rule's output in the layers from :data:`DEEP` on, every call (the decode
  steps of generation, the ``torch-recurrent`` backend's prefill; the other kernel path), noise of
  :data:`DECODE_REL`;
- ``large_activations``: the RMSNorm's output on rows whose input reaches :data:`ACT` (the real target's residual
  stream in its deeper layers; the probe's stays below 2);
- ``bf16_deep``: the chunked delta rule's output in bf16 only, from layer :data:`DEEP` on (one dtype);
- ``rotary_late``: the rotary tables at positions from :data:`LATE` on (positions past some length), as the full
  attention layers from :data:`DEEP` on apply them;
- ``past_drafter_layers``: the chunked delta rule's output in the Gated DeltaNet layers past the deepest one the
  bundled drafter reads (layer :data:`PAST_DRAFTER`, whose output no feature holds), on inputs of more than one
  chunk (so not the fingerprint text): only the logits (the teacher-forced argmax, the completions) show it;
- ``deep_decode``: the recurrent delta rule's output on decode steps (single-token calls) only, in the layers from
  :data:`DEEP` on, noise of :data:`DECODE_REL`: the probe decodes through one layer; the witness decodes the real
  target's first steps after the shortest prompt and the last steps of the longest sequence again (the decode
  entries).

And one no warm check sees (:data:`UNSEEN`: docs/design.md says why), kept to show the limit:

- ``deep_batched_decode``: the same, on decode steps of batches of more than one sequence only: the probe's batched
  decode runs one layer of each type, the witness decodes one sequence at a time.

``install(name)`` patches and returns the undo; ``plugin_source(name)`` is a pytest plugin module that installs it
in a suite subprocess (``-p <module>``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import torch

MODELING = "transformers.models.qwen3_5.modeling_qwen3_5"
LONG = 200  # tokens: longer than the old probe (80) and some bundled prompts + completions, shorter than others
LONG_QUERIES = 64
SHORT = 180  # tokens: between the bundled test prompts' sequences (162 and 211) and above the fingerprint text
CHUNK = 64  # the chunked delta rule's chunk
LONG_KV = 190  # cached keys: the last decode steps of the bundled test prompts' batch only
KV_REL = 2.0  # attention on decode steps: 0.5 flips no greedy token on the last steps of the bundled test prompts
REL = 1e-2
DECODE_REL = 0.5  # decode steps: large enough to flip greedy tokens of the bundled prompts (1e-2 flips none)
HERE = Path(__file__).resolve().parent
DEEP = 2  # the first layer id of the depth-confined faults: the probe's model has layer ids 0 and 1 only
ACT = 8.0  # |x| of a residual-stream row: the bundled target's deeper layers exceed it, the probe's model stays < 2
LATE = 150  # positions: the bundled test prompts' decode steps and long sequences pass it, the fingerprint text not
PAST_DRAFTER = 6  # the bundled target's last Gated DeltaNet layer: the drafter reads layers 1, 3 and 5
ROT_REL = 0.1  # relative noise on the rotary tables (1e-2 moves the features, flips no greedy token)


def noisy(out: torch.Tensor, rel: float = REL) -> torch.Tensor:
    """``out`` plus seeded Gaussian noise of ``rel`` x its RMS (the same noise for every call of one shape)."""
    noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.device)
    return (out.float() + rel * out.float().pow(2).mean().sqrt() * noise).to(out.dtype)


def layer_of_caller() -> int | None:
    """The layer id of the nearest calling module that has one (a Gated DeltaNet or attention layer calling a
    kernel function, through any wrapper the probe or a backend put around it); None when none."""
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(getattr(owner, "layer_idx", None), int):
            return owner.layer_idx
    return None


def _inner(fn: Callable) -> Callable:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _faults(mod) -> dict[str, tuple[object, str, Callable]]:
    """name -> (owner, attribute, replacement)."""
    chunk, recur = _inner(mod.torch_chunk_gated_delta_rule), _inner(mod.torch_recurrent_gated_delta_rule)
    conv, conv_update = mod.causal_conv1d_fn, mod.causal_conv1d_update
    norm_forward = mod.Qwen3_5RMSNormGated.forward
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def chunk_noise(query, key, value, g, beta, **kw):
        out, state = chunk(query, key, value, g, beta, **kw)
        return noisy(out), state

    def gate_times_1_1(query, key, value, g, beta, **kw):
        return chunk(query, key, value, g * 1.1, beta, **kw)

    def bf16_chunk(query, key, value, g, beta, **kw):
        dt = query.dtype
        out, state = chunk(*(t.to(torch.bfloat16) for t in (query, key, value)), g, beta.to(torch.bfloat16), **kw)
        return out.to(torch.bfloat16).to(dt), state

    def long_inputs_chunk(query, key, value, g, beta, **kw):
        out, state = chunk(query, key, value, g, beta, **kw)
        return (noisy(out) if query.shape[1] > LONG else out), state

    def noisy_causal_conv1d_fn(*args, **kw):
        return noisy(conv(*args, **kw))

    def noisy_causal_conv1d_update(*args, **kw):
        return noisy(conv_update(*args, **kw))

    def noisy_gated_norm_forward(self, hidden_states, gate):
        return noisy(norm_forward(self, hidden_states, gate))

    def decode_only_recurrent(query, key, value, g, beta, **kw):
        out, state = recur(query, key, value, g, beta, **kw)
        return (noisy(out, DECODE_REL) if query.shape[1] == 1 else out), state

    def prefill_only_recurrent(query, key, value, g, beta, **kw):
        out, state = recur(query, key, value, g, beta, **kw)
        return (noisy(out) if query.shape[1] > 1 else out), state

    def long_query_sdpa(query, *args, **kw):
        out = sdpa(query, *args, **kw)
        return noisy(out) if query.shape[-2] > LONG_QUERIES else out

    def short_inputs_chunk(query, key, value, g, beta, **kw):
        out, state = chunk(query, key, value, g, beta, **kw)
        return (noisy(out) if query.shape[1] < SHORT else out), state

    def single_chunk(query, key, value, g, beta, **kw):
        out, state = chunk(query, key, value, g, beta, **kw)
        return (noisy(out) if query.shape[1] <= CHUNK else out), state

    def kv_sdpa(keep: Callable[[int], bool]) -> Callable:
        def call(query, key, *args, **kw):  # a decode step attends with fewer queries than cached keys
            out = sdpa(query, key, *args, **kw)
            return noisy(out, KV_REL) if query.shape[-2] < key.shape[-2] and keep(key.shape[-2]) else out
        return call

    def batched_decode_recurrent(query, key, value, g, beta, **kw):
        out, state = recur(query, key, value, g, beta, **kw)
        return (noisy(out, DECODE_REL) if query.shape[0] > 1 and query.shape[1] == 1 else out), state

    def deep(kernel: Callable, keep: Callable[..., bool], rel: float = REL) -> Callable:
        def call(query, key, value, g, beta, **kw):
            out, state = kernel(query, key, value, g, beta, **kw)
            layer = layer_of_caller()
            return (noisy(out, rel) if layer is not None and keep(layer, query) else out), state
        return call

    rms_forward = mod.Qwen3_5RMSNorm.forward

    def large_activations_norm(self, x):
        out = rms_forward(self, x)
        rows = x.detach().abs().amax(dim=-1, keepdim=True) >= ACT
        return torch.where(rows, noisy(out), out) if bool(rows.any()) else out

    layer_forward = mod.Qwen3_5DecoderLayer.forward

    def rotary_late(self, hidden_states, position_embeddings, attention_mask=None, position_ids=None, **kw):
        attn = getattr(self, "self_attn", None)
        if attn is not None and attn.layer_idx >= DEEP and position_ids is not None:
            late = (position_ids >= LATE)[..., None]
            if bool(late.any()):
                cos, sin = position_embeddings
                position_embeddings = (torch.where(late, noisy(cos, ROT_REL), cos),
                                       torch.where(late, noisy(sin, ROT_REL), sin))
        return layer_forward(self, hidden_states, position_embeddings, attention_mask, position_ids, **kw)

    return {"chunk_noise": (mod, "torch_chunk_gated_delta_rule", chunk_noise),
            "gate": (mod, "torch_chunk_gated_delta_rule", gate_times_1_1),
            "bf16_chunk": (mod, "torch_chunk_gated_delta_rule", bf16_chunk),
            "long_inputs": (mod, "torch_chunk_gated_delta_rule", long_inputs_chunk),
            "conv1d": (mod, "causal_conv1d_fn", noisy_causal_conv1d_fn),
            "conv1d_update": (mod, "causal_conv1d_update", noisy_causal_conv1d_update),
            "gated_norm": (mod.Qwen3_5RMSNormGated, "forward", noisy_gated_norm_forward),
            "decode_only": (mod, "torch_recurrent_gated_delta_rule", decode_only_recurrent),
            "recurrent_prefill": (mod, "torch_recurrent_gated_delta_rule", prefill_only_recurrent),
            "attention_long": (torch.nn.functional, "scaled_dot_product_attention", long_query_sdpa),
            "short_inputs": (mod, "torch_chunk_gated_delta_rule", short_inputs_chunk),
            "single_chunk": (mod, "torch_chunk_gated_delta_rule", single_chunk),
            "short_kv": (torch.nn.functional, "scaled_dot_product_attention", kv_sdpa(lambda n: n < SHORT)),
            "long_kv": (torch.nn.functional, "scaled_dot_product_attention", kv_sdpa(lambda n: n > LONG_KV)),
            "batched": (mod, "torch_recurrent_gated_delta_rule", batched_decode_recurrent),
            "deep_chunk": (mod, "torch_chunk_gated_delta_rule", deep(chunk, lambda layer, q: layer >= DEEP)),
            "deep_recurrent": (mod, "torch_recurrent_gated_delta_rule",
                               deep(recur, lambda layer, q: layer >= DEEP, DECODE_REL)),
            "large_activations": (mod.Qwen3_5RMSNorm, "forward", large_activations_norm),
            "bf16_deep": (mod, "torch_chunk_gated_delta_rule",
                          deep(chunk, lambda layer, q: layer >= DEEP and q.dtype == torch.bfloat16)),
            "rotary_late": (mod.Qwen3_5DecoderLayer, "forward", rotary_late),
            "past_drafter_layers": (mod, "torch_chunk_gated_delta_rule",
                                    deep(chunk, lambda layer, q: layer == PAST_DRAFTER and q.shape[1] > CHUNK)),
            "deep_decode": (mod, "torch_recurrent_gated_delta_rule",
                            deep(recur, lambda layer, q: layer >= DEEP and q.shape[1] == 1, DECODE_REL)),
            "deep_batched_decode": (mod, "torch_recurrent_gated_delta_rule",
                                    deep(recur, lambda layer, q: layer >= DEEP and q.shape[0] > 1 and q.shape[1] == 1,
                                         DECODE_REL))}


#: faults the kernel probe cannot see, which the witness must (module docstring)
BLIND = ("deep_chunk", "deep_recurrent", "large_activations", "bf16_deep", "rotary_late", "past_drafter_layers",
         "deep_decode")
#: a fault no warm check sees (module docstring)
UNSEEN = ("deep_batched_decode",)
#: the faults the probe sees, each on the path of some probe
FAULTS = tuple(f for f in _faults(importlib.import_module(MODELING)) if f not in BLIND + UNSEEN)
#: the run's settings under which a fault shows in what the run's own dtype makes (bf16 only: a bf16 run)
SETTINGS: dict[str, dict[str, object]] = {"bf16_deep": {"dtype": "bfloat16"}}


def install(name: str) -> Callable[[], None]:
    """Patch fault ``name`` in; the returned function undoes it."""
    owner, attr, fn = _faults(importlib.import_module(MODELING))[name]
    was = getattr(owner, attr)
    setattr(owner, attr, fn)
    return lambda: setattr(owner, attr, was)


def plugin_source(name: str) -> str:
    """A pytest plugin module that installs fault ``name`` when the suite process imports it."""
    return (f'"""Kernel fault {name!r} patched in from outside dflash-eval (tests/kernel_faults.py)."""\n'
            f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport kernel_faults\n\n"
            f"kernel_faults.install({name!r})\n")
