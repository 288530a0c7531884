"""The attention core of a layer on one rank: fused flash attention, or unfused core attention.

*Flash* (FlashAttention-2/3, cuDNN / TransformerEngine fused attention, PyTorch SDPA): one kernel
per direction. Forward FLOPs ``2·T·s·H·hd`` on this rank's ``H`` heads and ``T`` query tokens
(the ``4·b·s²·H·hd`` of QKᵀ and PV halved by causality); backward 2.5× (S recomputed, dV, dP,
dQ, dK). Bytes: Q, K, V, O (and dO, dQ, dK, dV in backward) once, the fp32 log-sum-exp, and the
rotary embedding of Q and K when the profile fuses it (TE ``fused_rope``).

*Unfused* (Megatron-LM's ``CoreAttention`` before FlashAttention; Narayanan et al. 2021,
Korthikanti et al. 2022 §4): per micro-batch ``b`` and local head count ``H``,

* ``attn_qk``: batched GEMM ``[s, hd] x [hd, s]``, ``b·H`` times (the full s×s, no causal skip);
* ``attn_softmax``: scale + causal mask + softmax over the ``b·H·s²`` scores: one fused kernel
  reading and writing them (Megatron's ``scaled_upper_triang_masked_softmax``) or three
  (scale, mask, softmax: 6 passes);
* ``attn_dropout``: dropout on the probabilities (read, write, 1-byte mask);
* ``attn_pv``: batched GEMM ``[s, s] x [s, hd]``;
* ``attn_context``: the ``[b, H, s, hd] -> [s, b, H·hd]`` permute copy of the output.

Backward: dP = dO·Vᵀ and dV = Pᵀ·dO, dropout backward, softmax backward (read P and dP, write
dS), dQ = dS·K and dK = dSᵀ·Q, and the permute of dO. These are memory-bound on ``s²``.

Selective recompute (Korthikanti et al. 2022) re-runs the forward of the core before its
backward (profiles with ``selective_recompute: attention``; torchtitan's per-op variant is
:func:`ccoverlap.parallel.layer.op_sac_recompute`). With context parallelism (``cp > 1``) the core is split over the CP ranks by
:mod:`ccoverlap.parallel.cp` (flash only, as Megatron-LM's / TransformerEngine's CP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ccoverlap.parallel import cp as cpm
from ccoverlap.parallel import pointwise as pw
from ccoverlap.parallel.flash import flash_bwd_spec, flash_fwd_spec
from ccoverlap.specs import GemmSpec

if TYPE_CHECKING:
    from ccoverlap.parallel.context import LayerCtx
    from ccoverlap.parallel.segment import Segment

MASK_BYTES = pw.MASK_BYTES


# ----------------------------------------------------------------------------- unfused core

def _score_elems(ctx: LayerCtx) -> tuple[int, int]:
    """(batch·heads of the batched GEMMs, elements of the local score tensor b·H·s²)."""
    b = max(1, ctx.tokens // ctx.s)
    batch = b * ctx.nq
    return batch, batch * ctx.s * ctx.s


def _gemm(ctx: LayerCtx, m: int, n: int, k: int, batch: int) -> GemmSpec:
    return GemmSpec(m=m, n=n, k=k, batch=batch, dtype_bytes=ctx.d, host_kernels=1 if ctx.fw.eager else 0)


def unfused_fwd(seg: Segment, ctx: LayerCtx, src: int, prefix: str = "") -> int:
    """Unfused core attention forward (module doc); returns the index of its last op."""
    s, hd, d, fw = ctx.s, ctx.hd, ctx.d, ctx.fw
    batch, ns = _score_elems(ctx)
    x = seg.add(f"{prefix}attn_qk", _gemm(ctx, s, s, hd, batch), deps=(src,))
    if fw.softmax_fused:
        x = seg.add(f"{prefix}attn_softmax", pw.kernel_spec(ctx, 2 * ns * d), deps=(x,))
    else:
        x = seg.add(f"{prefix}attn_softmax", pw.kernel_spec(ctx, 6 * ns * d + MASK_BYTES * ns, 3), deps=(x,))
    if fw.attention_dropout:
        x = seg.add(f"{prefix}attn_dropout", pw.kernel_spec(ctx, ns * (2 * d + MASK_BYTES)), deps=(x,))
    x = seg.add(f"{prefix}attn_pv", _gemm(ctx, s, hd, s, batch), deps=(x,))
    return seg.add(f"{prefix}attn_context", pw.kernel_spec(ctx, 2 * ctx.tokens * ctx.nq * hd * d), deps=(x,))


def unfused_bwd(seg: Segment, ctx: LayerCtx, src: int) -> int:
    """Unfused core attention backward (module doc); returns the index of its last op."""
    s, hd, d, fw = ctx.s, ctx.hd, ctx.d, ctx.fw
    batch, ns = _score_elems(ctx)
    x = seg.add("attn_context_bwd", pw.kernel_spec(ctx, 2 * ctx.tokens * ctx.nq * hd * d), deps=(src,))
    dp = seg.add("attn_pv_dgrad", _gemm(ctx, s, s, hd, batch), deps=(x,))
    seg.add("attn_pv_wgrad", _gemm(ctx, s, hd, s, batch), deps=(x,))
    x = dp
    if fw.attention_dropout:
        x = seg.add("attn_dropout_bwd", pw.kernel_spec(ctx, ns * (2 * d + MASK_BYTES)), deps=(x,))
    x = seg.add("attn_softmax_bwd", pw.kernel_spec(ctx, 3 * ns * d, 1 if fw.softmax_fused else 3), deps=(x,))
    seg.add("attn_qk_dgrad", _gemm(ctx, s, hd, s, batch), deps=(x,))
    return seg.add("attn_qk_wgrad", _gemm(ctx, s, hd, s, batch), deps=(x,))


# ----------------------------------------------------------------------------- dispatch

def forward(seg: Segment, ctx: LayerCtx, src: int) -> int:
    """The attention core's forward after the QKV projection ``src``; returns its output op."""
    r = pw.rope(ctx)
    if r is not None:
        src = seg.add("rope", r, deps=(src,))
    if ctx.cp > 1:
        return cpm.forward(seg, ctx, src)
    if not ctx.fw.flash:
        return unfused_fwd(seg, ctx, src)
    return seg.add("attention", flash_fwd_spec(ctx), deps=(src,))


def backward(seg: Segment, ctx: LayerCtx, src: int) -> int:
    """The attention core's backward (with the selective-recompute forward first); returns the
    op producing dQ, dK, dV."""
    g = src
    if ctx.recompute == "selective" and ctx.fw.selective_recompute == "attention":
        if ctx.cp > 1:
            g = cpm.forward(seg, ctx, g, prefix="recompute_")
        elif not ctx.fw.flash:
            g = unfused_fwd(seg, ctx, g, prefix="recompute_")
        else:
            g = seg.add("attention_recompute", flash_fwd_spec(ctx), deps=(g,))
    if ctx.cp > 1:
        g = cpm.backward(seg, ctx, g)
    elif not ctx.fw.flash:
        g = unfused_bwd(seg, ctx, g)
    else:
        g = seg.add("attention_bwd", flash_bwd_spec(ctx), deps=(g,))
    r = pw.rope(ctx)
    if r is not None:
        g = seg.add("rope_bwd", r, deps=(g,))
    return g
