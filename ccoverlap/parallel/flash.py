"""Fused (flash) attention kernels as cost-model specs: FlashAttention-2/3, cuDNN /
TransformerEngine fused attention, PyTorch SDPA — one kernel per direction (FLOPs and bytes as
in :mod:`ccoverlap.parallel.attention`'s docstring). Used by the attention core and by
context parallelism's ring steps (:mod:`ccoverlap.parallel.cp`), below both."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ccoverlap.specs import AttentionSpec

if TYPE_CHECKING:
    from ccoverlap.parallel.context import LayerCtx


def rope_bytes(ctx: LayerCtx) -> float:
    """Fused rotary embedding on Q and K (read + write), counted inside the attention op."""
    if ctx.model.position != "rope" or not ctx.fw.rope_fused:
        return 0.0
    return 2.0 * ctx.tokens * (ctx.nq + ctx.nkv) * ctx.hd * ctx.d


def _shape(ctx: LayerCtx, whole: bool) -> dict:
    """The kernel's tile shape (batch x local query heads, sequence, head dim) when it runs over
    whole sequences of this rank; empty (roofline only) for a context-parallel block."""
    if not whole or ctx.tokens < ctx.s:
        return {}
    return {"heads": (ctx.tokens // ctx.s) * ctx.nq, "seq": ctx.s, "head_dim": ctx.hd}


def flash_fwd_spec(ctx: LayerCtx, kv_tokens: int | None = None, share: float = 1.0,
                   causal_len: int | None = None) -> AttentionSpec:
    """Causal flash attention forward on this rank's heads and query tokens; ``share`` of the
    work (a ring step), K/V of ``kv_tokens`` tokens read (default the local ones);
    ``causal_len`` the sequence length of the causal-masked kernel (default the model's
    sequence; 0 for a non-causal ring block), for the causal derating of the cost model."""
    T, hd, d = ctx.tokens, ctx.hd, ctx.d
    kv = T if kv_tokens is None else kv_tokens
    flops = 2.0 * T * ctx.s * ctx.nq * hd * share
    nbytes = d * hd * (2 * T * ctx.nq + 2 * kv * ctx.nkv) + 4.0 * T * ctx.nq
    whole = kv_tokens is None and share == 1.0 and causal_len is None
    return AttentionSpec(flops=flops, bytes=nbytes + rope_bytes(ctx) * share, dtype_bytes=d,
                         host_kernels=1 if ctx.fw.eager else 0, kernel=ctx.fw.flash_kernel,
                         causal_len=ctx.s if causal_len is None else causal_len, **_shape(ctx, whole))


def flash_bwd_spec(ctx: LayerCtx, kv_tokens: int | None = None, share: float = 1.0,
                   causal_len: int | None = None) -> AttentionSpec:
    """Flash attention backward: 2.5x the forward FLOPs (see module doc)."""
    T, hd, d = ctx.tokens, ctx.hd, ctx.d
    kv = T if kv_tokens is None else kv_tokens
    flops = 2.5 * 2.0 * T * ctx.s * ctx.nq * hd * share
    nbytes = d * hd * (4 * T * ctx.nq + 4 * kv * ctx.nkv) + 4.0 * T * ctx.nq
    whole = kv_tokens is None and share == 1.0 and causal_len is None
    return AttentionSpec(flops=flops, bytes=nbytes + rope_bytes(ctx) * share, dtype_bytes=d,
                         host_kernels=1 if ctx.fw.eager else 0, kernel=ctx.fw.flash_kernel, backward=True,
                         causal_len=ctx.s if causal_len is None else causal_len, **_shape(ctx, whole))
