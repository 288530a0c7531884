"""Context parallelism: the sequence split over ``cp`` ranks, attention computed across them.

Every CP rank holds ``s / cp`` tokens of each sequence (two load-balanced chunks of the causal
sequence, as Megatron-LM / TransformerEngine do, so each rank has the same attention work);
everything outside the attention core is token-local and simply runs on ``T = b·s/cp`` tokens.
The attention core of this rank's queries needs K and V of the whole sequence:

* ``cp_impl="ring"`` (ring attention; Liu et al. 2023, TransformerEngine
  ``AttnFuncWithCPAndKVP2P``): ``cp`` steps; at step ``i`` the rank runs flash attention of its
  queries against the KV block it holds (``1/cp`` of its work) while the block moves on to the
  next CP rank by point-to-point (``2·T·kv_heads·hd·d`` bytes, K and V) on the ``cp_comm``
  stream: step ``i+1`` waits for receive ``i``, so communication hides under attention when a
  block's transfer is shorter than a step. Each step after the first also rescales the partial
  output (read + write the fp32 accumulator: ``8·T·H·hd`` bytes). Backward: ``cp`` steps of
  flash backward; the next K, V block is received during a step (as in forward) and the
  block's partial dK, dV (same size) is passed on after it, so backward moves twice the bytes.
* ``cp_impl="allgather"`` (Llama 3, Dubey et al. 2024 §3.3.2): all-gather K and V over the CP
  group before attention (``cp·2·T·kv_heads·hd·d`` bytes gathered), attention of the local
  queries against all keys; backward all-gathers K, V again and reduce-scatters dK, dV. The
  all-gather is not overlapped with attention (the core waits for it).

Bytes use the local ``kv_heads / tp``; the CP group is laid out with stride ``tp``
(:mod:`ccoverlap.parallel.layout`).
"""

from __future__ import annotations

from ccoverlap.graph import P2PSpec


def kv_block_bytes(ctx) -> float:
    """Bytes of this rank's K and V (one ring block)."""
    return 2.0 * ctx.tokens * ctx.nkv * ctx.hd * ctx.d


def _p2p(ctx, nbytes: float) -> P2PSpec:
    return P2PSpec(bytes=float(nbytes), inter_node=ctx.layout.cp_inter_node, config=ctx.knobs.config_for("cp"),
                   transport=ctx.knobs.comm_transport)


def _rescale_bytes(ctx) -> float:
    return 8.0 * ctx.tokens * ctx.nq * ctx.hd


def forward(seg, ctx, src: int, prefix: str = "") -> int:
    """Attention forward across the CP group (module doc); returns the output op index."""
    from dataclasses import replace

    from ccoverlap.parallel.attention import flash_fwd_spec

    cp, T = ctx.cp, ctx.tokens
    if ctx.p.cp_impl == "allgather":
        ag = seg.add(f"{prefix}cp_kv_ag", ctx.coll("all_gather", cp * kv_block_bytes(ctx), "cp"), "cp", deps=(src,))
        return seg.add(f"{prefix}attention", flash_fwd_spec(ctx, kv_tokens=cp * T), deps=(src, ag))
    share = 1.0 / cp
    blk = kv_block_bytes(ctx)
    recv = src
    a = src
    for i in range(cp):
        spec = flash_fwd_spec(ctx, share=share)
        if i:
            spec = replace(spec, bytes=spec.bytes + _rescale_bytes(ctx))
        a = seg.add(f"{prefix}attention{i}", spec, deps=(a, recv) if i else (src,))
        if i < cp - 1:
            recv = seg.add(f"{prefix}cp_kv{i}", _p2p(ctx, blk), "cp", deps=(recv,))
    return a


def backward(seg, ctx, src: int) -> int:
    """Attention backward across the CP group (module doc); returns the op producing the
    local dQ, dK, dV."""
    from ccoverlap.parallel.attention import flash_bwd_spec

    cp, T = ctx.cp, ctx.tokens
    if ctx.p.cp_impl == "allgather":
        ag = seg.add("cp_kv_ag_bwd", ctx.coll("all_gather", cp * kv_block_bytes(ctx), "cp"), "cp", deps=(src,))
        a = seg.add("attention_bwd", flash_bwd_spec(ctx, kv_tokens=cp * T), deps=(src, ag))
        return seg.add("cp_dkv_rs", ctx.coll("reduce_scatter", cp * kv_block_bytes(ctx), "cp"), "cp", deps=(a,))
    share = 1.0 / cp
    blk = kv_block_bytes(ctx)
    recv = src
    a = src
    dkv = src
    for i in range(cp):
        a = seg.add(f"attention_bwd{i}", flash_bwd_spec(ctx, share=share), deps=(a, recv, dkv) if i else (src,))
        if i < cp - 1:  # the next K, V block arrives while this step runs
            recv = seg.add(f"cp_kv_bwd{i}", _p2p(ctx, blk), "cp", deps=(recv,))
        # the partial dK, dV of the block move on once this step has added to them; the last
        # move brings this rank's own dK, dV home
        dkv = seg.add(f"cp_dkv{i}", _p2p(ctx, blk), "cp", deps=(a,))
    return dkv
