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

PyTorch's ``context_parallel`` (profiles with ``cp_merge_unfused``, torchtitan;
``torch/distributed/tensor/experimental/_attention.py``) does the ring's bookkeeping with
separate eager kernels in fp32 (``_cp_options.convert_to_f32``), charged as memory-bound ops
on the compute stream (``O = T·H·hd`` output elements, ``K = T·kv_heads·hd`` per K or V):

* before every rotation, ``torch.cat`` of K and V into one send buffer (``4·K·d`` bytes);
* after every step, the block output and LSE cast to fp32 (``(d + 4)·O``) and, from the second
  step, the merge ``out - sigmoid(lse_b - lse)·(out - out_b)`` (three fp32 passes, ``32·O``;
  for load-balanced "partial" steps half of it plus the ``torch.cat`` that writes the chunk
  back, ``24·O``; half the later steps are partial on average: ``28·O``); at the end the
  fp32 output cast back (``6·O``);
* backward: fp32 ``zeros_like`` accumulators (``4·(O + 2K)``), per step ``grad += grad_b`` on
  dQ, dK, dV in fp32 (``10·(O + 2K)``), the ``torch.cat`` of the fp32 dK, dV before their
  rotation (``16·K``) and of K, V (``4·K·d``); the rotated dK, dV are **fp32** (twice the
  bytes on the wire); at the end dQ, dK, dV cast back (``6·(O + 2K)``).

Bytes use the local ``kv_heads / tp``; the CP group is laid out with stride ``tp``
(:mod:`ccoverlap.parallel.layout`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ccoverlap.parallel.flash import flash_bwd_spec, flash_fwd_spec
from ccoverlap.parallel.pointwise import kernel_spec
from ccoverlap.specs import P2PSpec

if TYPE_CHECKING:
    from ccoverlap.parallel.context import LayerCtx
    from ccoverlap.parallel.segment import Segment


def kv_block_bytes(ctx: LayerCtx) -> float:
    """Bytes of this rank's K and V (one ring block)."""
    return 2.0 * ctx.tokens * ctx.nkv * ctx.hd * ctx.d


def _p2p(ctx: LayerCtx, nbytes: float) -> P2PSpec:
    return P2PSpec(bytes=float(nbytes), inter_node=ctx.layout.cp_inter_node, config=ctx.knobs.config_for("cp"),
                   transport=ctx.knobs.comm_transport)


def _rescale_bytes(ctx: LayerCtx) -> float:
    return 8.0 * ctx.tokens * ctx.nq * ctx.hd


def _out_elems(ctx: LayerCtx) -> float:
    return float(ctx.tokens * ctx.nq * ctx.hd)


def _kv_elems(ctx: LayerCtx) -> float:
    return float(ctx.tokens * ctx.nkv * ctx.hd)


def _unfused(ctx: LayerCtx) -> bool:
    return bool(getattr(ctx.fw, "cp_merge_unfused", False))


def merge_fwd_bytes(ctx: LayerCtx, step: int, last: bool) -> float:
    """fp32 bookkeeping bytes after ring step ``step`` in PyTorch's context_parallel (module doc)."""
    o, d = _out_elems(ctx), ctx.d
    b = (d + 4.0) * o  # the LSE casts (T·H floats) are left out
    if step:
        b += 28.0 * o
    if last:
        b += 6.0 * o
    return b


def grad_acc_bytes(ctx: LayerCtx, step: int, last: bool) -> float:
    """fp32 gradient bookkeeping bytes of backward ring step ``step`` (module doc)."""
    o, k = _out_elems(ctx), _kv_elems(ctx)
    b = 10.0 * (o + 2 * k) + 16.0 * k
    if step == 0:
        b += 4.0 * (o + 2 * k)
    if last:
        b += 6.0 * (o + 2 * k)
    return b


def forward(seg: Segment, ctx: LayerCtx, src: int, prefix: str = "") -> int:
    """Attention forward across the CP group (module doc); returns the output op index."""
    from dataclasses import replace


    cp, T = ctx.cp, ctx.tokens
    if ctx.p.cp_impl == "allgather":
        ag = seg.add(f"{prefix}cp_kv_ag", ctx.coll("all_gather", cp * kv_block_bytes(ctx), "cp"), "cp", deps=(src,))
        return seg.add(f"{prefix}attention", flash_fwd_spec(ctx, kv_tokens=cp * T), deps=(src, ag))

    share = 1.0 / cp
    blk = kv_block_bytes(ctx)
    unfused = _unfused(ctx)
    recv = src
    a = src
    for i in range(cp):
        # step 0: the causal diagonal block of the local tokens; later blocks are unmasked
        spec = flash_fwd_spec(ctx, share=share, causal_len=T if i == 0 else 0)
        if i and not unfused:
            spec = replace(spec, bytes=spec.bytes + _rescale_bytes(ctx))
        send = recv
        if unfused and i < cp - 1:  # torch.cat(K, V) into the send buffer, before this step
            send = a = seg.add(f"{prefix}cp_kv_cat{i}", kernel_spec(ctx, 2.0 * blk), deps=(a, recv) if i else (src,))
        a = seg.add(f"{prefix}attention{i}", spec, deps=(a, recv) if i else (a,))
        if unfused:
            a = seg.add(f"{prefix}cp_merge{i}", kernel_spec(ctx, merge_fwd_bytes(ctx, i, i == cp - 1),
                                                             9 if i else 2), deps=(a,))
        if i < cp - 1:
            recv = seg.add(f"{prefix}cp_kv{i}", _p2p(ctx, blk), "cp", deps=(send,))
    return a


def backward(seg: Segment, ctx: LayerCtx, src: int) -> int:
    """Attention backward across the CP group (module doc); returns the op producing the
    local dQ, dK, dV."""

    cp, T = ctx.cp, ctx.tokens
    if ctx.p.cp_impl == "allgather":
        ag = seg.add("cp_kv_ag_bwd", ctx.coll("all_gather", cp * kv_block_bytes(ctx), "cp"), "cp", deps=(src,))
        a = seg.add("attention_bwd", flash_bwd_spec(ctx, kv_tokens=cp * T), deps=(src, ag))
        return seg.add("cp_dkv_rs", ctx.coll("reduce_scatter", cp * kv_block_bytes(ctx), "cp"), "cp", deps=(a,))

    share = 1.0 / cp
    blk = kv_block_bytes(ctx)
    unfused = _unfused(ctx)
    dkv_blk = blk * 4.0 / ctx.d if unfused else blk  # PyTorch rotates fp32 dK, dV
    recv = src
    a = src
    dkv = src
    for i in range(cp):
        send = recv
        if unfused and i < cp - 1:
            send = a = seg.add(f"cp_kv_cat_bwd{i}", kernel_spec(ctx, 2.0 * blk), deps=(a, recv, dkv) if i else (src,))
        a = seg.add(f"attention_bwd{i}", flash_bwd_spec(ctx, share=share, causal_len=T if i == 0 else 0),
                    deps=(a, recv, dkv) if i else (a,))
        if unfused:  # fp32 accumulation of dQ, dK, dV and the cat of dK, dV for their rotation
            a = seg.add(f"cp_grad_acc{i}", kernel_spec(ctx, grad_acc_bytes(ctx, i, i == cp - 1), 4), deps=(a,))
        if i < cp - 1:  # the next K, V block arrives while this step runs
            recv = seg.add(f"cp_kv_bwd{i}", _p2p(ctx, blk), "cp", deps=(send,))
        # the partial dK, dV of the block move on once this step has added to them; the last
        # move brings this rank's own dK, dV home
        dkv = seg.add(f"cp_dkv{i}", _p2p(ctx, dkv_blk), "cp", deps=(a,))
    return dkv
