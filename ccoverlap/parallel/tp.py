"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with and without sequence parallelism
(Korthikanti et al. 2022): the collectives around column- and row-parallel GEMMs.

=================  ===========================  ==========================================
                   without SP                   with SP
=================  ===========================  ==========================================
fwd, before col.   (identity)                   all-gather of the [T/t, h] input
fwd, after row     all-reduce of [T, h]         reduce-scatter to [T/t, h]
bwd, before row    (identity)                   all-gather of the output grad
bwd, column        all-reduce of input grad,    all-gather of the saved input (for wgrad)
                   overlapped with wgrad        overlapped with dgrad; reduce-scatter of the
                                                input grad overlapped with wgrad
=================  ===========================  ==========================================

The backward overlaps in the last row are what Megatron-LM's
``LinearWithGradAccumulationAndAsyncCommunication`` does by default. ``tp_overlap="chunked"``
additionally decomposes the forward AG+GEMM and GEMM+RS/AR pairs, and the backward
AG+dgrad pair, into ``tp_chunks`` pieces along the token dimension, so that piece ``i+1``'s
communication runs while piece ``i`` computes (TransformerEngine's userbuffers overlap; the
"shard-based overlap" of FiCCO §II-B).

With ``fp8`` the linear GEMMs run on FP8 operands (``LayerCtx.gemm``) and the framework
profile decides which inputs / output gradients need their own cast kernel (``_cast``); TP
collectives stay in the compute dtype.

Every function appends ops to a :class:`~ccoverlap.parallel.segment.Segment` and returns the
local index of the op the next step should depend on. ``ctx`` is a
:class:`~ccoverlap.parallel.layer.LayerCtx`.
"""

from __future__ import annotations

from ccoverlap.parallel import pointwise as pw


def _cast(seg, ctx, src, name: str, direction: str, rows: int, cols: int, weight_elems: int = 0):
    """With FP8, the cast(+transpose) kernel of a linear's input (fwd) or output gradient (bwd)
    when the framework profile does not fuse it into the previous kernel, and in forward the
    cast of its ``weight_elems`` local weight elements when the profile casts weights on every
    use (``fp8_weight_cast_bytes``, torchao ``Float8Linear``: amax + cast, 2 kernels); else ``src``."""
    wbytes = ctx.fp8_weight_cast_bytes(name) * weight_elems if direction == "fwd" else 0.0
    if not ctx.fp8_cast(name, direction):
        if wbytes <= 0:
            return src
        return seg.add(f"{name}_fp8_weight_cast", pw.kernel_spec(ctx, wbytes, 2), deps=(src,))
    spec = pw.fp8_cast(ctx, rows, cols)
    if wbytes > 0:
        spec = pw.kernel_spec(ctx, spec.bytes + wbytes, spec.kernels + 2)
    return seg.add(f"{name}_fp8_cast" + ("_bwd" if direction == "bwd" else ""), spec, deps=(src,))


def _chunks(ctx, m: int) -> int:
    c = ctx.tp_chunks if (ctx.tp > 1 and ctx.tp_overlap == "chunked") else 1
    return max(1, min(c, m))


def _split(m: int, c: int) -> int:
    return -(-m // c)


def fwd_ag_gemm(seg, ctx, src: int, name: str, n: int, k: int, tensor: str = "") -> int:
    """Column-parallel GEMM [T, k] x [k, n] in forward, preceded by the SP all-gather of its
    input (T·h·dtype bytes, the gathered size). Returns the index of the (last) GEMM."""
    T, d = ctx.tokens, ctx.d
    src = _cast(seg, ctx, src, name, "fwd", ctx.local_tokens, k, n * k)
    if ctx.tp == 1 or not ctx.sp:
        return seg.add(name, ctx.gemm(T, n, k, name), deps=(src,), tensor=tensor)
    c = _chunks(ctx, T)
    if c == 1:
        ag = seg.add(f"{name}_ag", ctx.coll("all_gather", T * k * d, "tp"), "tp", deps=(src,))
        return seg.add(name, ctx.gemm(T, n, k, name), deps=(ag,), tensor=tensor)
    mc = _split(T, c)
    g = -1
    for i in range(c):
        ag = seg.add(f"{name}_ag{i}", ctx.coll("all_gather", mc * k * d, "tp"), "tp", deps=(src,))
        g = seg.add(f"{name}{i}", ctx.gemm(mc, n, k, name), deps=(ag,), tensor=tensor)
    return g


def fwd_gemm_reduce(seg, ctx, src: int, name: str, n: int, k: int, deps=()) -> int:
    """Row-parallel GEMM [T, k] x [k, n] in forward followed by the reduce-scatter (SP) or
    all-reduce of its [T, n] output. Returns the index of the op producing the reduced output."""
    T, d = ctx.tokens, ctx.d
    src = _cast(seg, ctx, src, name, "fwd", T, k, n * k)
    gemm = ctx.gemm(T, n, k, name)
    if ctx.tp == 1:
        return seg.add(name, gemm, deps=(src, *deps))
    coll = "reduce_scatter" if ctx.sp else "all_reduce"
    c = _chunks(ctx, T)
    if c == 1:
        g = seg.add(name, gemm, deps=(src, *deps))
        return seg.add(f"{name}_{'rs' if ctx.sp else 'ar'}", ctx.coll(coll, T * n * d, "tp"), "tp", deps=(g,))
    mc = _split(T, c)
    r = -1
    for i in range(c):
        g = seg.add(f"{name}{i}", ctx.gemm(mc, n, k, name), deps=(src, *deps))
        r = seg.add(f"{name}_{'rs' if ctx.sp else 'ar'}{i}", ctx.coll(coll, mc * n * d, "tp"), "tp", deps=(g,))
    return r


def bwd_row(seg, ctx, src: int, name: str, n: int, k: int, tensor: str) -> int:
    """Backward of a row-parallel Y[T, n] = X[T, k] W[k, n]: (SP) all-gather of dY, dgrad
    dX = dY Wᵀ ([T, n] x [n, k]) and wgrad dW = Xᵀ dY ([k, T] x [T, n]). Returns the dgrad index
    (the wgrad follows it on the compute stream)."""
    T, d = ctx.tokens, ctx.d
    wgrad = ctx.gemm(k, n, T, name)
    if ctx.tp == 1 or not ctx.sp:
        src = _cast(seg, ctx, src, name, "bwd", T, n)
        dg = seg.add(f"{name}_dgrad", ctx.gemm(T, k, n, name), deps=(src,))
        seg.add(f"{name}_wgrad", wgrad, deps=(dg,), tensor=tensor)
        return dg
    c = _chunks(ctx, T)
    mc = _split(T, c)
    dg = -1
    for i in range(c):
        sfx = str(i) if c > 1 else ""
        ag = seg.add(f"{name}_grad_ag{sfx}", ctx.coll("all_gather", mc * n * d, "tp"), "tp", deps=(src,))
        ag = _cast(seg, ctx, ag, name, "bwd", mc, n)
        dg = seg.add(f"{name}_dgrad{sfx}", ctx.gemm(mc, k, n, name), deps=(ag,))
    seg.add(f"{name}_wgrad", wgrad, deps=(dg,), tensor=tensor)
    return dg


def bwd_col(seg, ctx, src: int, gemms: list[tuple[str, int, int, str]], in_dim: int) -> int:
    """Backward of column-parallel GEMMs that read the same input X[T, in_dim] (QKV; or QKV and
    fc1 of a parallel attention+MLP block). ``gemms`` = [(name, n, k, tensor)]. Order, as
    Megatron-LM: (SP) all-gather of the saved input on the TP stream, every dgrad, then the
    reduce-scatter (SP) / all-reduce of dX on the TP stream while the wgrads run. Returns the
    index of the op producing the reduced dX."""
    T, d = ctx.tokens, ctx.d
    ag = None
    if ctx.tp > 1 and ctx.sp:
        ag = seg.add("input_ag", ctx.coll("all_gather", T * in_dim * d, "tp"), "tp", deps=(src,))
    dg = src
    for name, n, k, _ in gemms:
        g = _cast(seg, ctx, src, name, "bwd", T, n)
        dg = seg.add(f"{name}_dgrad", ctx.gemm(T, k, n, name), deps=(g,))
    out = dg
    if ctx.tp > 1:
        coll = "reduce_scatter" if ctx.sp else "all_reduce"
        out = seg.add(f"dgrad_{'rs' if ctx.sp else 'ar'}", ctx.coll(coll, T * in_dim * d, "tp"), "tp", deps=(dg,))
    for name, n, k, tensor in gemms:
        seg.add(f"{name}_wgrad", ctx.gemm(k, n, T, name),
                deps=() if ag is None else (ag,), tensor=tensor)
    return out
