"""One transformer layer's forward and backward as op templates, on one tensor-parallel rank.

Shapes (``T`` = micro_batch × seq_len / cp tokens, ``t`` = tp, ``d`` = dtype bytes, ``hd`` head dim):

* QKV: GEMM ``[T, h] x [h, (heads + 2·kv_heads)·hd / t]``; out-proj ``[T, heads·hd/t] x [heads·hd/t, h]``.
* MLP: fc1 ``[T, h] x [h, m·ffn/t]`` with ``m`` = 2 for a gated MLP (gate and up projections
  fused into one GEMM, as Megatron-LM's ``linear_fc1``) or 1; fc2 ``[T, ffn/t] x [ffn/t, h]``.
* Backward of every linear: dgrad ``dY Wᵀ`` and wgrad ``Xᵀ dY``, two GEMMs with the forward's FLOPs each.
* Attention core (:mod:`ccoverlap.parallel.attention`): one flash kernel per direction, or
  Megatron-LM's unfused core (batched QKᵀ, scale+mask+softmax, dropout, PV), or split over the
  context-parallel ranks (:mod:`ccoverlap.parallel.cp`), as the framework profile and
  ``ParallelConfig.cp`` say.
* Memory-bound ops (:mod:`ccoverlap.parallel.pointwise`): each norm op also carries the
  previous sublayer's epilogue (bias add, hidden dropout, residual add); each norm-backward op
  carries autograd's residual-gradient add and the next sublayer's dropout / bias backward;
  activations, rotary embedding and cross-entropy are fused or unfused per the profile
  (:mod:`ccoverlap.catalog.frameworks`, docs/model.md).
* FP8 (``ParallelConfig.fp8``): linear GEMMs on FP8 operands (:meth:`LayerCtx.gemm`) with the
  profile's cast kernels (:mod:`ccoverlap.parallel.tp`).

Recomputation (Korthikanti et al., 2022): ``selective`` re-runs the attention core's forward
before its backward (Megatron-LM), or, in a profile with ``selective_recompute: op``
(torchtitan), every second matmul and every element-wise op of the layer
(:func:`op_sac_recompute`); ``full`` re-runs the whole layer forward (with its TP collectives)
before the layer's backward (added by the step builder). With sequence parallelism the
backward all-gathers the saved [T/t, h] input again for the wgrad GEMMs (``input_ag``,
:func:`ccoverlap.parallel.tp.bwd_col`), the TP communication selective recompute keeps,
unless the profile's ``tp_sp_save_gathered_input`` says autograd saved the gathered input
(PyTorch DTensor TP; its per-op recompute then re-runs the forward all-gathers instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ccoverlap.parallel import attention as attn
from ccoverlap.parallel import pointwise as pw
from ccoverlap.parallel import tp as tpc
from ccoverlap.parallel.context import GRAD_BYTES, LayerCtx
from ccoverlap.parallel.segment import IN, Segment

if TYPE_CHECKING:
    pass

# ----------------------------------------------------------------------------- sublayers

def attn_fwd(ctx: LayerCtx, unit: str) -> Segment:
    """Norm, (SP all-gather), QKV, attention core, out-proj, reduce (RS/AR), residual epilogue."""
    s = Segment(name="attn_fwd", unit=unit)
    n = s.add("attn_norm", pw.norm_fwd(ctx), deps=(IN,))
    q = tpc.fwd_ag_gemm(s, ctx, n, "qkv", ctx.qkv_n, ctx.h)
    a = attn.forward(s, ctx, q)
    return s.finish(tpc.fwd_gemm_reduce(s, ctx, a, "proj", ctx.h, ctx.nq * ctx.hd))


def mlp_fwd(ctx: LayerCtx, unit: str, ffn: int | None = None, name: str = "mlp") -> Segment:
    """Norm, (SP all-gather), fc1 (gate+up), activation, fc2, reduce, residual epilogue."""
    s = Segment(name=f"{name}_fwd", unit=unit)
    f = ctx.ffn_local(ffn or ctx.model.ffn_hidden)
    n = s.add("mlp_norm", pw.norm_fwd(ctx), deps=(IN,))
    u = tpc.fwd_ag_gemm(s, ctx, n, f"{name}_fc1", ctx.up_mult() * f, ctx.h)
    a = s.add(f"{name}_act", pw.act_fwd(ctx, f), deps=(u,))
    return s.finish(tpc.fwd_gemm_reduce(s, ctx, a, f"{name}_fc2", ctx.h, f))


def attn_bwd(ctx: LayerCtx, unit: str) -> Segment:
    """Backward of :func:`attn_fwd`; ``selective`` recompute re-runs the attention core's forward first."""
    s = Segment(name="attn_bwd", unit=unit)
    g = tpc.bwd_row(s, ctx, IN, "proj", ctx.h, ctx.nq * ctx.hd, "proj")
    g = attn.backward(s, ctx, g)
    out = tpc.bwd_col(s, ctx, g, [("qkv", ctx.qkv_n, ctx.h, "qkv")], ctx.h)
    return s.finish(s.add("attn_norm_bwd", pw.norm_bwd(ctx), deps=(out,), tensor="attn_norm"))


def mlp_bwd(ctx: LayerCtx, unit: str, ffn: int | None = None, name: str = "mlp") -> Segment:
    """Backward of :func:`mlp_fwd`."""
    s = Segment(name=f"{name}_bwd", unit=unit)
    f = ctx.ffn_local(ffn or ctx.model.ffn_hidden)
    h = ctx.h
    g = tpc.bwd_row(s, ctx, IN, f"{name}_fc2", h, f, f"{name}_fc2" if name != "mlp" else "fc2")
    g = s.add(f"{name}_act_bwd", pw.act_bwd(ctx, f), deps=(g,))
    out = tpc.bwd_col(s, ctx, g, [(f"{name}_fc1", ctx.up_mult() * f, h, f"{name}_fc1" if name != "mlp" else "fc1")], h)
    return s.finish(s.add("mlp_norm_bwd", pw.norm_bwd(ctx), deps=(out,), tensor="mlp_norm"))


def parallel_block_fwd(ctx: LayerCtx, unit: str) -> Segment:
    """GPT-J / Phi-2 block: one norm, attention and MLP on the same input, one reduce of the sum."""
    s = Segment(name="block_fwd", unit=unit)
    T, h = ctx.tokens, ctx.h
    f = ctx.ffn_local(ctx.model.ffn_hidden)
    n = s.add("attn_norm", pw.norm_fwd(ctx), deps=(IN,))
    q = tpc.fwd_ag_gemm(s, ctx, n, "qkv", ctx.qkv_n, h)
    a = attn.forward(s, ctx, q)
    p = s.add("proj", ctx.gemm(T, h, ctx.nq * ctx.hd, "proj"), deps=(a,))
    u = s.add("fc1", ctx.gemm(T, ctx.up_mult() * f, h, "fc1"), deps=(q,))
    act = s.add("act", pw.act_fwd(ctx, f), deps=(u,))
    return s.finish(tpc.fwd_gemm_reduce(s, ctx, act, "fc2", h, f, deps=(p,)))


def parallel_block_bwd(ctx: LayerCtx, unit: str) -> Segment:
    """Backward of :func:`parallel_block_fwd`."""
    s = Segment(name="block_bwd", unit=unit)
    T, h = ctx.tokens, ctx.h
    f = ctx.ffn_local(ctx.model.ffn_hidden)
    g = tpc.bwd_row(s, ctx, IN, "fc2", h, f, "fc2")
    g = s.add("act_bwd", pw.act_bwd(ctx, f), deps=(g,))
    pg = s.add("proj_dgrad", ctx.gemm(T, ctx.nq * ctx.hd, h, "proj"), deps=(g,))
    s.add("proj_wgrad", ctx.gemm(ctx.nq * ctx.hd, h, T, "proj"), deps=(pg,), tensor="proj")
    a = attn.backward(s, ctx, pg)
    out = tpc.bwd_col(s, ctx, a, [("fc1", ctx.up_mult() * f, h, "fc1"), ("qkv", ctx.qkv_n, h, "qkv")], h)
    return s.finish(s.add("attn_norm_bwd", pw.norm_bwd(ctx), deps=(out,), tensor="attn_norm"))


def op_sac_recompute(ctx: LayerCtx, unit: str) -> Segment:
    """torchtitan's per-op selective recompute before a dense layer's backward: outputs of
    matmuls and attention are saved except every second matmul of the block (counted in
    forward order over the separate projections wq, wk, wv, wo, w1, w3, w2 -- or wq, wk, wv,
    wo, fc1, fc2 without gating), and every element-wise op is recomputed: the two norms,
    the rotary embedding and the activation, plus the 2nd, 4th, 6th matmul (wk, wo, w3).
    With sequence parallelism and a profile that saves the gathered input
    (``tp_sp_save_gathered_input``, PyTorch DTensor TP) the SP all-gathers of the attention and
    MLP inputs are re-run too: torchtitan's ``_save_list`` holds mm, SDPA and reduce-scatter
    but not all-gather, so the recompute repeats it (``recompute_attn_ag``,
    ``recompute_mlp_ag``: plain collectives in every ``tp_overlap`` mode)."""
    s = Segment(name="op_sac_recompute", unit=unit)
    T, h, hd = ctx.tokens, ctx.h, ctx.hd
    f = ctx.ffn_local(ctx.model.ffn_hidden)
    mms = [("wq", ctx.nq * hd, h), ("wk", ctx.nkv * hd, h), ("wv", ctx.nkv * hd, h), ("wo", h, ctx.nq * hd)]
    mms += [("w1", f, h), ("w3", f, h), ("w2", h, f)] if ctx.model.gated_mlp else [("w1", f, h), ("w2", h, f)]
    regather = ctx.tp > 1 and ctx.sp and ctx.fw.tp_sp_save_gathered_input

    def gather(dep: int, name: str, linear: str) -> int:
        if not regather:
            return dep
        nbytes = T * h * ctx.tp_gather_bytes(linear, "input_ag")
        return s.add(name, ctx.coll("all_gather", nbytes, "tp"), "tp", deps=(dep,))
    g = s.add("recompute_attn_norm", pw.norm_fwd(ctx), deps=(IN,))
    g = gather(g, "recompute_attn_ag", "qkv")
    r = pw.rope(ctx)
    if r is not None:
        g = s.add("recompute_rope", r, deps=(g,))
    for i, (name, n, k) in enumerate(mms):
        if i % 2 == 1:
            g = s.add(f"recompute_{name}", ctx.gemm(T, n, k, "fc1" if name in ("w1", "w3") else name), deps=(g,))
    g = s.add("recompute_mlp_norm", pw.norm_fwd(ctx), deps=(g,))
    g = gather(g, "recompute_mlp_ag", "fc1")
    return s.finish(s.add("recompute_act", pw.act_fwd(ctx, f), deps=(g,)))


def dense_layer(ctx: LayerCtx, unit: str) -> tuple[list[Segment], list[Segment]]:
    """(forward segments, backward segments) of a dense layer, in execution order."""
    if ctx.model.parallel_attn_mlp:
        fwd, bwd = [parallel_block_fwd(ctx, unit)], [parallel_block_bwd(ctx, unit)]
    else:
        fwd, bwd = [attn_fwd(ctx, unit), mlp_fwd(ctx, unit)], [mlp_bwd(ctx, unit), attn_bwd(ctx, unit)]
    if ctx.recompute == "selective" and ctx.fw.selective_recompute == "op":
        bwd = [op_sac_recompute(ctx, unit)] + bwd
    return fwd, bwd


# ----------------------------------------------------------------------------- embedding / head

def embedding_fwd(ctx: LayerCtx) -> Segment:
    """Vocab-parallel embedding lookup (+ learned positions), its TP reduce (AR, or RS with SP),
    and the embedding dropout when the profile has hidden dropout."""
    s = Segment(name="embedding_fwd", unit="emb")
    T, h, d = ctx.tokens, ctx.h, ctx.d
    pos = T * h * d if ctx.model.position == "learned" else 0
    e = s.add("embedding", ctx.mem(2 * T * h * d + pos), deps=(IN,))
    if ctx.tp > 1:
        e = s.add("embedding_rs" if ctx.sp else "embedding_ar",
                  ctx.coll("reduce_scatter" if ctx.sp else "all_reduce", T * h * d, "tp"), "tp", deps=(e,))
    if ctx.fw.hidden_dropout:
        e = s.add("embedding_dropout", ctx.mem(ctx.local_tokens * h * (2 * d + pw.MASK_BYTES)), deps=(e,))
    return s.finish(e)


def embedding_bwd(ctx: LayerCtx) -> Segment:
    """(SP all-gather of the grad) and the embedding's weight gradient: PyTorch's dense
    ``embedding_dense_backward`` writes a zero-filled [V/tp, h] gradient and scatter-adds the
    T rows into it (read T·h, write V/tp·h), then autograd / Megatron's main-grad hook adds it
    into the fp32 gradient (read V/tp·h·d, read + write V/tp·h·4)."""
    s = Segment(name="embedding_bwd", unit="emb")
    T, h, d = ctx.tokens, ctx.h, ctx.d
    g = IN
    if ctx.tp > 1 and ctx.sp:
        g = s.add("embedding_grad_ag", ctx.coll("all_gather", T * h * d, "tp"), "tp", deps=(IN,))
    v = ctx.model.vocab // ctx.tp
    nbytes = T * h * d + v * h * (2 * d + 2 * GRAD_BYTES)
    return s.finish(s.add("embedding_grad", ctx.mem(nbytes), deps=(g,), tensor="embedding"))


def head_fwd(ctx: LayerCtx) -> Segment:
    """Final norm, (SP all-gather), vocab-parallel LM head GEMM, cross-entropy (fused, or the
    framework's fp32 passes) with its three small TP all-reduces (max, sum of exp, target
    logit) merged into one."""
    s = Segment(name="head_fwd", unit="head")
    T, h = ctx.tokens, ctx.h
    v = ctx.model.vocab // ctx.tp
    n = s.add("final_norm", pw.norm_fwd(ctx), deps=(IN,))
    lg = tpc.fwd_ag_gemm(s, ctx, n, "lm_head", v, h)
    x = s.add("cross_entropy", pw.cross_entropy_fwd(ctx, v), deps=(lg,))
    if ctx.tp > 1:
        x = s.add("cross_entropy_ar", ctx.coll("all_reduce", 3 * T * 4, "tp"), "tp", deps=(x,))
    return s.finish(x)


def head_bwd(ctx: LayerCtx) -> Segment:
    """Cross-entropy backward, LM-head dgrad/wgrad with the TP reduce of dX, final-norm backward."""
    s = Segment(name="head_bwd", unit="head")
    h = ctx.h
    v = ctx.model.vocab // ctx.tp
    tensor = "lm_head" if not ctx.model.tied_embeddings or ctx.p.pp > 1 else "embedding"
    x = s.add("cross_entropy_bwd", pw.cross_entropy_bwd(ctx, v), deps=(IN,))
    out = tpc.bwd_col(s, ctx, x, [("lm_head", v, h, tensor)], h)
    return s.finish(s.add("final_norm_bwd", pw.final_norm_bwd(ctx), deps=(out,), tensor="final_norm"))
