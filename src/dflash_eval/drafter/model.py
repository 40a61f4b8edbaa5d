"""The DFlash drafter in plain torch, and THE drafting primitive (block ids -> draft logits).

Modules (unprefixed checkpoint keys): ``fc`` (Linear L*H -> H, no bias), ``hidden_norm``, ``layers.{i}``
(Qwen3-style pre-norm decoder layers whose attention injects the projected target context as extra keys and
values, non-causal within the block, absolute RoPE positions), final ``norm``. No embedding and no lm_head:
the drafter borrows the target's (see :mod:`dflash_eval.target.head`).

Shapes used throughout: ``N`` sequences, ``T`` context positions, ``R`` blocks per sequence, ``B`` block size,
``H`` hidden size. One forward drafts R blocks per sequence at once; block r of sequence n sees the context
positions ``j < context_len[n, r]`` and all B slots of its own block, nothing else. This makes batching over
rounds exact: masked context positions contribute exactly zero attention weight.

A block at ``start`` is ``[token at start, MASK x (B-1)]`` (:func:`block_ids`) at positions ``start ..
start+B-1`` and sees the context features strictly before ``start``. :func:`draft_logits` turns blocks into
logits through the target's borrowed embedding and lm_head; offline τ (:func:`dflash_eval.metrics.tau.draft_table`),
the online loop and training all draft through it.

Quick check::

    python -c "from dflash_eval.drafter import DFlashDrafter; help(DFlashDrafter.forward)"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash_eval.drafter.config import DrafterConfig

if TYPE_CHECKING:
    from dflash_eval.target.head import TargetHead

__all__ = ["DFlashDrafter", "ContextKV", "ContextCache", "RMSNorm", "rope_cos_sin", "rope_frequencies", "activation",
           "expected_shapes", "block_ids", "draft_logits"]


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: normalise in fp32, scale by ``weight`` in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype, *,
                 inv_freq: Tensor | None = None, scaling: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos/sin tables of shape ``positions.shape + (head_dim,)`` (HF rotate-half layout).

    ``inv_freq`` / ``scaling``: scaled RoPE (:func:`rope_frequencies`); default: plain RoPE with base ``theta``."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
                                    / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float32)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    return cos.to(dtype), sin.to(dtype)


def rope_frequencies(config: DrafterConfig) -> tuple[Tensor | None, float]:
    """(inv_freq, attention scaling) of a scaled RoPE, computed by transformers' own RoPE initialisers from a
    ``Qwen3Config`` with the drafter's RoPE fields (so they equal the reference's); ``(None, 1.0)`` for plain
    RoPE, which :func:`rope_cos_sin` computes itself."""
    if config.rope_type == "default":
        return None, 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    qcfg = Qwen3Config(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                       num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
                       max_position_embeddings=config.max_position_embeddings,
                       rope_parameters=dict(config.rope_parameters))
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[config.rope_type](qcfg, torch.device("cpu"))
    return inv_freq.to(torch.float32), float(scaling)


def activation(name: str) -> Callable[[Tensor], Tensor]:
    """The MLP activation ``name`` as transformers' ``ACT2FN`` defines it (``silu`` without importing it)."""
    if name == "silu":
        return F.silu
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + _rotate_half(x) * sin


class DFlashAttention(nn.Module):
    """Qwen3 attention with KV injection: keys/values = [proj(context); proj(block)], no causal mask."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        h, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def context_kv(self, ctx: Tensor, rope_ctx: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """Keys (normed, rotated) and values of the projected context: ctx [N,T,H] -> ([N,kv,hd,T], [N,kv,T,hd]).

        They depend on the context alone (never on a block), so one computation serves every block and round. They
        are stored contiguous in the layouts the attention's batched matmuls read (keys transposed), so drafting
        against them copies nothing (the einsum would otherwise copy them into these layouts on every forward)."""
        n, t = ctx.shape[:2]
        kc = _apply_rope(self.k_norm(self.k_proj(ctx).view(n, t, self.num_kv_heads, self.head_dim)),
                         rope_ctx[0][:, None, :], rope_ctx[1][:, None, :])
        vc = self.v_proj(ctx).view(n, t, self.num_kv_heads, self.head_dim)
        return kc.permute(0, 2, 3, 1).contiguous(), vc.transpose(1, 2).contiguous()

    def forward(
        self,
        x: Tensor,
        kv: tuple[Tensor, Tensor],
        rope_blk: tuple[Tensor, Tensor],
        ctx_bias: Tensor,
    ) -> Tensor:
        """x: [N,R,B,H] block stream; kv: the context's keys [N,kv,hd,T] and values [N,kv,T,hd] (:meth:`context_kv`);
        rope_blk: [N,R,B,hd]; ctx_bias: [N,1,1,R,1,T] additive mask (0 visible, -inf hidden) for the context keys.

        Scores against the context (shared by the R blocks of a sequence, never copied per block) and against the
        block's own slots are normalised by one joint softmax: exactly attention over [context; block] keys.
        """
        n, r, b, _ = x.shape
        kc, vc = kv
        t = kc.shape[3]
        hd, nh, nkv = self.head_dim, self.num_heads, self.num_kv_heads
        g = nh // nkv
        dtype = x.dtype
        cos_b, sin_b = rope_blk[0][..., None, :], rope_blk[1][..., None, :]
        q = _apply_rope(self.q_norm(self.q_proj(x).view(n, r, b, nh, hd)), cos_b, sin_b)
        kb = _apply_rope(self.k_norm(self.k_proj(x).view(n, r, b, nkv, hd)), cos_b, sin_b)
        vb = self.v_proj(x).view(n, r, b, nkv, hd)
        qg = q.view(n, r, b, nkv, g, hd).permute(0, 3, 4, 1, 2, 5)  # [N,kv,g,R,B,hd]
        scale = hd ** -0.5
        s_ctx = torch.einsum("nkgrbd,nkdt->nkgrbt", qg, kc).float() * scale + ctx_bias
        s_blk = torch.einsum("nkgrbd,nrckd->nkgrbc", qg, kb).float() * scale
        p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1).to(dtype)
        o = torch.einsum("nkgrbt,nktd->nkgrbd", p[..., :t], vc) + torch.einsum("nkgrbc,nrckd->nkgrbd", p[..., t:], vb)
        return self.o_proj(o.permute(0, 3, 4, 1, 2, 5).reshape(n, r, b, nh * hd))


class DFlashMLP(nn.Module):
    """Gated MLP (gate_proj, up_proj, down_proj) with the config's ``hidden_act`` (SwiGLU for silu)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act_fn = activation(cfg.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    """Pre-norm decoder layer; ``input_layernorm`` applies to the block stream only, never to the context."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DFlashMLP(cfg)

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor], rope_blk: tuple[Tensor, Tensor],
                ctx_bias: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), kv, rope_blk, ctx_bias)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """A DFlash block-diffusion drafter. Borrow the target's embedding and lm_head to get tokens in and out."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(config.num_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self._rope: tuple[Tensor | None, float] | None = None  # (inv_freq, scaling), on first forward; never cast

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def project_context(self, features: Tensor) -> Tensor:
        """``hidden_norm(fc(concat(target features)))``: [..., T, L*H] -> [..., T, H]."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, context: Tensor, start: int = 0) -> ContextKV:
        """Every layer's keys and values of a projected context [N, T, H] (:meth:`project_context`) at positions
        ``start .. start + T - 1``, computed once for drafting many blocks against it (:class:`ContextKV`);
        ``forward`` computes them itself from a tensor. A later part of a context (``start`` > 0) gives the keys
        and values to append to the earlier part's (:class:`ContextCache`)."""
        t = context.shape[1]
        dtype = self.fc.weight.dtype
        ctx = context.to(dtype)
        rope_ctx = self._rope_tables(torch.arange(start, start + t, device=ctx.device), dtype)
        layers = cast("list[DFlashDecoderLayer]", list(self.layers))  # nn.ModuleList yields plain nn.Module
        return ContextKV([layer.self_attn.context_kv(ctx, rope_ctx) for layer in layers])

    def _rope_tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin of ``positions`` with the config's RoPE (scaled RoPE frequencies computed on first use)."""
        if self._rope is None:
            self._rope = rope_frequencies(self.config)
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype, inv_freq=self._rope[0],
                            scaling=self._rope[1])

    def forward(self, block_embeds: Tensor, context: Tensor | ContextKV, start: Tensor,
                context_len: Tensor | None = None) -> Tensor:
        """Draft R blocks per sequence in one pass.

        Args:
            block_embeds: [N, R, B, H] target embeddings of each block ([bonus, MASK x (B-1)] at inference).
            context: [N, T, H] projected context (:meth:`project_context`); context token j has RoPE position j.
                Or its keys and values (:meth:`context_kv`), when many forwards draft against the same context.
            start: [N, R] absolute position of slot 0 of each block; slot k has position start + k.
            context_len: [N, R] number of visible context positions per block (default ``start``: strictly
                before the block, as in the DFlash loop and training recipe).

        Returns:
            [N, R, B, H] hidden states after the final norm; apply the target's lm_head for logits.
        """
        kv = context if isinstance(context, ContextKV) else self.context_kv(context)
        n, r, b, _ = block_embeds.shape
        t = kv.length
        if context_len is None:
            context_len = start
        dtype = self.fc.weight.dtype
        x = block_embeds.to(dtype)
        dev = x.device
        rope_blk = self._rope_tables(start.to(dev)[..., None] + torch.arange(b, device=dev), dtype)
        visible = torch.arange(t, device=dev) < context_len.to(dev)[..., None]  # [N,R,T]
        ctx_bias = torch.zeros(n, 1, 1, r, 1, t, dtype=torch.float32, device=dev)
        ctx_bias = ctx_bias.masked_fill(~visible[:, None, None, :, None, :], float("-inf"))
        for layer, layer_kv in zip(self.layers, kv.layers):
            x = layer(x, layer_kv, rope_blk, ctx_bias)
        return self.norm(x)


@dataclass(frozen=True)
class ContextKV:
    """Per-layer (keys [N, kv heads, head_dim, T], values [N, kv heads, T, head_dim]) of N projected contexts.

    Made by :meth:`DFlashDrafter.context_kv`. The drafter's context attention reads only these, so drafting many
    blocks (or many rounds) against the same context computes them once; :meth:`select` picks the contexts of the
    sequences one forward drafts for."""

    layers: list[tuple[Tensor, Tensor]]

    @property
    def length(self) -> int:
        return int(self.layers[0][1].shape[2])

    def select(self, index: Tensor) -> ContextKV:
        """The contexts at ``index`` (a [N'] long tensor) along the sequence dimension: views when ``index`` is a
        run of consecutive sequences (no copy), else copies."""
        n = int(index.numel())
        first = int(index[0]) if n else 0
        if n and torch.equal(index.cpu(), torch.arange(first, first + n)):
            return ContextKV([(k.narrow(0, first, n), v.narrow(0, first, n)) for k, v in self.layers])
        return ContextKV([(k.index_select(0, index), v.index_select(0, index)) for k, v in self.layers])


class ContextCache:
    """One sequence's drafter context keys and values, grown by appending the positions a round commits: what a
    serving engine keeps per request (SGLang's DFlash worker materialises the committed context's keys and values
    into the drafter's own KV cache), so that a round drafts against them without recomputing any.

    Buffers of ``capacity`` positions per layer, in :class:`ContextKV`'s layouts; :attr:`kv` is a view of the
    ``length`` positions filled so far.

    Example::

        ctx = ContextCache(drafter, capacity=len(prompt) + max_new_tokens + B)
        ctx.append(prompt_features)                      # [P, L*H] of positions 0..P-1
        logits = draft_logits(drafter, head, ctx.kv, blocks, starts)
        ctx.append(committed_features)                   # the next positions
    """

    def __init__(self, drafter: DFlashDrafter, capacity: int) -> None:
        cfg, w = drafter.config, drafter.fc.weight
        self.drafter = drafter
        self.capacity = capacity
        self.length = 0
        self._keys = [w.new_empty(1, cfg.num_key_value_heads, cfg.head_dim, capacity) for _ in drafter.layers]
        self._values = [w.new_empty(1, cfg.num_key_value_heads, capacity, cfg.head_dim) for _ in drafter.layers]

    def append(self, features: Tensor) -> None:
        """Project the target features [n, L*H] of the next ``n`` positions and append their keys and values."""
        n = int(features.shape[0])
        if self.length + n > self.capacity:
            raise ValueError(f"drafter context of {self.capacity} positions cannot take {n} more after "
                             f"{self.length}")
        new = self.drafter.context_kv(self.drafter.project_context(features)[None], start=self.length)
        for (k, v), kb, vb in zip(new.layers, self._keys, self._values):
            kb[..., self.length:self.length + n] = k
            vb[:, :, self.length:self.length + n] = v
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget the positions from ``length`` on (their keys and values are overwritten by the next append)."""
        self.length = min(self.length, length)

    @property
    def kv(self) -> ContextKV:
        """The keys and values of the positions appended so far (views, no copy)."""
        return ContextKV([(k[..., :self.length], v[:, :, :self.length]) for k, v in zip(self._keys, self._values)])


def expected_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a drafter built from ``config`` (what a checkpoint must contain)."""
    with torch.device("meta"):
        model = DFlashDrafter(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def block_ids(first_tokens: Tensor, block_size: int, mask_token_id: int) -> Tensor:
    """[...] first tokens -> [..., B] blocks ``[first, MASK x (B-1)]``."""
    out = torch.full((*first_tokens.shape, block_size), mask_token_id, dtype=torch.long, device=first_tokens.device)
    out[..., 0] = first_tokens
    return out


def draft_logits(drafter: DFlashDrafter, head: TargetHead, context: Tensor | ContextKV, blocks: Tensor,
                 starts: Tensor) -> Tensor:
    """Draft logits of R blocks per sequence: embed the block ids, run the drafter, apply the target's lm_head.

    Args:
        drafter: the drafter.
        head: the target's borrowed input embedding and lm_head.
        context: [N, T, H] projected context (:meth:`DFlashDrafter.project_context`), or its keys and values
            (:meth:`DFlashDrafter.context_kv`).
        blocks: [N, R, B] block token ids (:func:`block_ids`).
        starts: [N, R] absolute position of each block's slot 0; the block sees context positions < start.

    Returns:
        [N, R, B-1, V] float32 logits of slots 1..B-1 (slot k predicts the token at start + k). Gradients flow
        (training); callers that only draft wrap it in ``torch.no_grad()``.
    """
    hidden = drafter(head.embed(blocks), context, starts)  # [N,R,B,H]
    # contiguous: a strided 4-D input makes the lm_head a batched matmul against its weight expanded per block
    # (slower: docs/benchmarks.md, "Cold run: drafter without copies"); the flattened matmul gives the same values
    return head.logits(hidden[:, :, 1:].contiguous()).float()
