"""Mixture-of-experts layers with expert parallelism: router, token all-to-all dispatch and
combine, grouped expert GEMMs, shared experts.

Data flow on one rank (Megatron-LM's all-to-all token dispatcher; ``T'`` local tokens = T/t
with sequence parallelism, ``k`` = top_k, ``E`` experts, ``ep`` expert-parallel size):

1. norm, router GEMM ``[T', h] x [h, E]``, permute (gather tokens by expert);
2. dispatch all-to-all on the EP group: per-rank send buffer ``T'·k·h·d`` bytes (uniform routing);
3. (tp > 1) all-gather of the received tokens over TP, experts being TP-sharded too;
4. grouped GEMMs over the ``E/ep`` local experts, ``T·k·ep/E`` tokens each:
   fc1 ``[m_e, h] x [h, up·f_e/t]``, activation, fc2 ``[m_e, f_e/t] x [f_e/t, h]``;
5. (tp > 1) reduce-scatter back; combine all-to-all (same size as dispatch);
6. unpermute (weighted sum of the k expert outputs), plus the shared experts' output.

Blocking vs overlapped: the layer is cut into compute segments and the two all-to-alls
(``comm_only`` segments). Blocking, the next segment waits for the all-to-all. With
``ep_overlap`` the step builder runs each micro-batch as two halves and interleaves them so
that one half's all-to-all runs while the other half computes (DeepSeek-V3's DualPipe
"computation-communication overlap" of two micro-batches; SGLang / Megatron "two-batch
overlap"): compute order ``pre(A) pre(B) experts(A) experts(B) post(A)+pre'(A) ...`` with
the all-to-alls ``dispatch(A) dispatch(B) combine(A) combine(B)`` on the EP stream.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from ccoverlap.parallel import tp as tpc
from ccoverlap.parallel.context import LayerCtx
from ccoverlap.parallel.layer import attn_bwd, attn_fwd
from ccoverlap.parallel.segment import IN, Segment
from ccoverlap.specs import GemmSpec


def _dims(ctx: LayerCtx) -> tuple[int, int, int, int]:
    m = ctx.model
    k, e, ep = m.top_k, m.experts, ctx.p.ep
    local_e = e // ep
    routed = ctx.tokens * k  # token copies processed by this rank's local experts after the TP gather
    m_e = max(1, -(-routed * ep // e))  # tokens per local expert (uniform routing)
    f = m.efh // ctx.tp
    return k, local_e, m_e, f


def a2a(ctx: LayerCtx, name: str, unit: str) -> Segment:
    """One token all-to-all on the EP group (per-rank send buffer T'·k·h·d bytes)."""
    s = Segment(name=name, unit=unit, comm_only=True)
    k = ctx.model.top_k
    s.add(name, ctx.coll("all_to_all", ctx.local_tokens * k * ctx.h * ctx.d, "ep"), "ep", deps=(IN,))
    return s.finish()


def moe_pre_fwd(ctx: LayerCtx, unit: str) -> Segment:
    """Norm, router, permute."""
    s = Segment(name="moe_pre_fwd", unit=unit)
    Tl, h, d, k = ctx.local_tokens, ctx.h, ctx.d, ctx.model.top_k
    n = s.add("mlp_norm", ctx.mem(4 * Tl * h * d), deps=(IN,), export="moe_in")
    r = s.add("router", GemmSpec(m=Tl, n=ctx.model.experts, k=h, dtype_bytes=d), deps=(n,))
    return s.finish(s.add("permute", ctx.mem(Tl * h * d * (1 + k) + 8 * Tl * ctx.model.experts), deps=(r,)))


def experts_fwd(ctx: LayerCtx, unit: str) -> Segment:
    """(TP all-gather), grouped expert fc1, activation, fc2, (TP reduce-scatter)."""
    s = Segment(name="experts_fwd", unit=unit)
    k, local_e, m_e, f = _dims(ctx)
    h, d, up = ctx.h, ctx.d, ctx.up_mult()
    x = IN
    if ctx.tp > 1:
        x = s.add("experts_ag", ctx.coll("all_gather", ctx.tokens * k * h * d, "tp"), "tp", deps=(IN,))
    u = s.add("experts_fc1", GemmSpec(m=m_e, n=up * f, k=h, batch=local_e, dtype_bytes=d), deps=(x,))
    a = s.add("experts_act", ctx.mem((3 if ctx.model.gated_mlp else 2) * m_e * local_e * f * d), deps=(u,))
    o = s.add("experts_fc2", GemmSpec(m=m_e, n=h, k=f, batch=local_e, dtype_bytes=d), deps=(a,))
    if ctx.tp > 1:
        o = s.add("experts_rs", ctx.coll("reduce_scatter", ctx.tokens * k * h * d, "tp"), "tp", deps=(o,))
    return s.finish(o)


def moe_post_fwd(ctx: LayerCtx, unit: str) -> Segment:
    """Shared experts (on the normed input), then unpermute + weighted sum with them."""
    s = Segment(name="moe_post_fwd", unit=unit)
    Tl, h, d, k = ctx.local_tokens, ctx.h, ctx.d, ctx.model.top_k
    deps = [IN]
    if ctx.model.shared_experts:
        fs = ctx.model.efh * ctx.model.shared_experts // ctx.tp
        u = tpc.fwd_ag_gemm(s, ctx, "moe_in", "shared_fc1", ctx.up_mult() * fs, h)
        a = s.add("shared_act", ctx.mem((3 if ctx.model.gated_mlp else 2) * ctx.tokens * fs * d), deps=(u,))
        deps.append(tpc.fwd_gemm_reduce(s, ctx, a, "shared_fc2", h, fs))
    return s.finish(s.add("unpermute", ctx.mem(Tl * h * d * (1 + k)), deps=deps))


def moe_post_bwd(ctx: LayerCtx, unit: str) -> Segment:
    """Unpermute backward and the shared experts' backward (its dX exported as ``shared_dx``)."""
    s = Segment(name="moe_post_bwd", unit=unit)
    Tl, h, d, k = ctx.local_tokens, ctx.h, ctx.d, ctx.model.top_k
    out = s.add("unpermute_bwd", ctx.mem(Tl * h * d * (1 + k)), deps=(IN,))
    if ctx.model.shared_experts:
        fs = ctx.model.efh * ctx.model.shared_experts // ctx.tp
        g = tpc.bwd_row(s, ctx, IN, "shared_fc2", h, fs, "shared_fc2")
        g = s.add("shared_act_bwd", ctx.mem((5 if ctx.model.gated_mlp else 3) * ctx.tokens * fs * d), deps=(g,))
        dx = tpc.bwd_col(s, ctx, g, [("shared_fc1", ctx.up_mult() * fs, h, "shared_fc1")], h)
        s.ops[dx].export = "shared_dx"
    return s.finish(out)


def experts_bwd(ctx: LayerCtx, unit: str) -> Segment:
    """Backward of :func:`experts_fwd` (dgrad and wgrad grouped GEMMs)."""
    s = Segment(name="experts_bwd", unit=unit)
    k, local_e, m_e, f = _dims(ctx)
    h, d, up = ctx.h, ctx.d, ctx.up_mult()
    g = IN
    if ctx.tp > 1:
        g = s.add("experts_grad_ag", ctx.coll("all_gather", ctx.tokens * k * h * d, "tp"), "tp", deps=(IN,))
    g = s.add("experts_fc2_dgrad", GemmSpec(m=m_e, n=f, k=h, batch=local_e, dtype_bytes=d), deps=(g,))
    s.add("experts_fc2_wgrad", GemmSpec(m=f, n=h, k=m_e, batch=local_e, dtype_bytes=d), deps=(g,),
          tensor="experts_fc2")
    g = s.add("experts_act_bwd", ctx.mem((5 if ctx.model.gated_mlp else 3) * m_e * local_e * f * d), deps=(g,))
    g = s.add("experts_fc1_dgrad", GemmSpec(m=m_e, n=h, k=up * f, batch=local_e, dtype_bytes=d), deps=(g,))
    out = g
    if ctx.tp > 1:
        out = s.add("experts_grad_rs", ctx.coll("reduce_scatter", ctx.tokens * k * h * d, "tp"), "tp", deps=(g,))
    s.add("experts_fc1_wgrad", GemmSpec(m=h, n=up * f, k=m_e, batch=local_e, dtype_bytes=d), deps=(g,),
          tensor="experts_fc1")
    return s.finish(out)


def moe_pre_bwd(ctx: LayerCtx, unit: str) -> Segment:
    """Permute backward, router dgrad/wgrad, norm backward (waits for the shared experts' dX)."""
    s = Segment(name="moe_pre_bwd", unit=unit)
    Tl, h, d, k, e = ctx.local_tokens, ctx.h, ctx.d, ctx.model.top_k, ctx.model.experts
    g = s.add("permute_bwd", ctx.mem(Tl * h * d * (1 + k) + 8 * Tl * e), deps=(IN,))
    g = s.add("router_dgrad", GemmSpec(m=Tl, n=h, k=e, dtype_bytes=d), deps=(g,))
    s.add("router_wgrad", GemmSpec(m=h, n=e, k=Tl, dtype_bytes=d), deps=(g,), tensor="router")
    deps = (g, "shared_dx") if ctx.model.shared_experts else (g,)
    return s.finish(s.add("mlp_norm_bwd", ctx.mem(4 * Tl * h * d), deps=deps, tensor="mlp_norm"))


def moe_layer(ctx: LayerCtx, unit: str) -> tuple[list[Segment], list[Segment]]:
    """(forward segments, backward segments) of a MoE layer, in chain order; the all-to-alls are
    ``comm_only`` segments (absent when ep == 1)."""
    ep = ctx.p.ep > 1
    fwd = [attn_fwd(ctx, unit), moe_pre_fwd(ctx, unit)]
    if ep:
        fwd.append(a2a(ctx, "dispatch", unit))
    fwd.append(experts_fwd(ctx, unit))
    if ep:
        fwd.append(a2a(ctx, "combine", unit))
    fwd.append(moe_post_fwd(ctx, unit))
    bwd = [moe_post_bwd(ctx, unit)]
    if ep:
        bwd.append(a2a(ctx, "combine_bwd", unit))
    bwd.append(experts_bwd(ctx, unit))
    if ep:
        bwd.append(a2a(ctx, "dispatch_bwd", unit))
    bwd += [moe_pre_bwd(ctx, unit), attn_bwd(ctx, unit)]
    return fwd, bwd


class _Cuttable(Protocol):
    """A template, or its compiled form: whether it is a lone collective."""

    @property
    def comm_only(self) -> bool: ...


_C = TypeVar("_C", bound=_Cuttable)


def two_batch_groups(chain: list[_C]) -> list[list[_C]]:
    """Cut a chain into groups that each end with an all-to-all (the last may not): the unit of
    interleaving between the two halves of a micro-batch."""
    groups: list[list[_C]] = [[]]
    for seg in chain:
        groups[-1].append(seg)
        if seg.comm_only:
            groups.append([])
    if not groups[-1]:
        groups.pop()
    return groups
