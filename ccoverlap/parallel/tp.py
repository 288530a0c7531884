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
communication runs while piece ``i`` computes (the "shard-based overlap" of FiCCO §II-B, with
NCCL collectives; TransformerEngine's own schedule is ``tp_overlap="userbuffers"`` below).

``tp_overlap="symm_mem"`` is PyTorch's async TP as torchtitan enables it
(``torch._inductor.config._micro_pipeline_tp`` + ``enable_symm_mem_for_group``), with sequence
parallelism only (the inductor pass fuses all-gather -> matmul and matmul -> reduce-scatter;
there is no all-reduce form). Source: ``torch/distributed/_symmetric_memory/__init__.py``
(``_pipelined_all_gather_and_consume``, ``_pipelined_produce_and_all2all``,
``_fused_matmul_reduce_scatter_impl``) and ``torch/_inductor/fx_passes/micro_pipeline_tp.py``:

* fused AG+GEMM (:func:`fwd_ag_gemm`, and the output-gradient all-gather + dgrad of
  :func:`bwd_row`): ``tp`` steps. The local shard is consumed first ("shard_consumer(shard,
  rank)"); step ``s = 1..tp-1`` pulls one peer's ``[T/tp, k]`` shard from its symmetric-memory
  buffer with ``Tensor.copy_`` (a peer copy on a copy engine: :class:`~ccoverlap.specs.P2PSpec`
  with ``transport="dma"``) and runs the GEMM on those rows. Steps alternate between the
  current stream and one backend stream, so step ``s``'s copy waits for step ``s-2``'s GEMM.
  Before the local GEMM each rank copies its shard into its own symmetric buffer ("mv",
  not overlapped: "we are giving up the chance to overlap mv and b with the first
  shard_consumer for now"): a device-local copy-engine copy (:class:`~ccoverlap.specs.CopySpec`).
* fused GEMM+RS (:func:`fwd_gemm_reduce`): steps ``s = 1..tp-1`` compute the partial output
  ``[T/tp, n]`` for rank ``rank+s`` into one of two symmetric buffers, then every rank pulls
  the partial meant for it from a peer (copy engine); the GEMM of step ``s`` reuses the
  buffer of step ``s-2`` only after that copy (the second barrier). The local partial is
  computed last, then ``torch.sum`` over the stacked ``[tp, T/tp, n]`` partials (one
  memory-bound kernel: reads ``T·n``, writes ``T/tp·n`` elements) -- the reduction NCCL's
  reduce-scatter does inside its kernel.
* Not fused (kept as collectives): the backward reduce-scatter of a column-parallel input
  gradient (its input is the sum of several dgrads, not one matmul: the pass's
  ``_find_producer_matmul`` finds no ``mm``) and the backward all-gather of the saved input
  for the wgrads (the gathered tensor is the wgrad's second operand, not the ``mm``'s lhs
  that ``_find_consumer_matmuls`` looks for).

The GEMMs of all steps run on the compute stream in step order (the source's two streams
let two steps' GEMMs overlap each other, which is not modelled); the peer copies run on the
``tp`` stream one after another ("cp from different streams cannot overlap").

``tp_overlap="userbuffers"`` is TransformerEngine's userbuffers overlap as Megatron-Core's
``--tp-comm-overlap`` runs it, with sequence parallelism and the TP group inside one node.
Source: TransformerEngine v1.7 (the release whose ``initialize_ub(shape, tp_size, ...)``
Megatron-Core r0.8.0's ``megatron/training/initialize.py`` calls, with ``ub_cfgs = {}``
unless ``--tp-comm-overlap-cfg`` is given), ``transformer_engine/pytorch/module/base.py``
(``initialize_ub``: methods ``ring_exchange`` for ``qkv_fprop, fc1_fprop, proj_dgrad,
fc2_dgrad``, ``pipeline`` for ``proj_fprop, fc2_fprop``, ``bulk`` for ``qkv_dgrad, qkv_wgrad,
fc1_dgrad, fc1_wgrad``; ``add_ub(num_sm=16, ...)``, ``num_splits=4`` for pipeline) and
``transformer_engine/pytorch/csrc/comm_gemm_overlap.h``:

* ring exchange (:func:`fwd_ag_gemm`, and the output-gradient all-gather + dgrad of
  :func:`bwd_row`), ``UbufP2PCommOverlap::split_overlap_ag`` with ``use_ce = 1``: ``tp``
  steps; step ``i`` runs the GEMM on the shard in hand (the local one first) while the same
  shard is sent to the next rank and the next one received from the previous rank by
  ``cudaMemcpyAsync`` into the peer's registered buffer (a copy engine: :class:`P2PSpec`
  with ``transport="dma"``); the send of step ``i`` waits for the receive of step ``i-1``
  and GEMM ``i+1`` for that receive. The layer norm writes the forward input straight into
  the buffer; the backward copies the local output gradient into it first
  (``copy_input_to_ubuf``, a device copy). The wgrad reads the gathered buffer.
* pipeline (:func:`fwd_gemm_reduce`), ``UbufCommOverlap::split_overlap_rs``: the GEMM in
  ``num_splits`` = 4 pieces along the tokens, each piece's reduce-scatter on the
  communication stream after its GEMM, by userbuffers' SM kernels on ``num_sm`` = 16
  thread blocks (the last piece on ``UB_MAX_SM`` = 32): a collective on that many channels.
* bulk (:func:`bwd_col`), ``UbufCommOverlap::bulk_overlap``: the saved input copied into the
  buffer and all-gathered (16 SMs) beside the dgrad, then the dgrad reduce-scattered (16 SMs)
  beside the wgrad -- the order the plain mode already has.

``set_sm_margin`` is 0 by default, so the GEMMs keep every SM. TE issues the pieces' GEMMs of
the ring exchange and of the pipeline round-robin on its compute streams
(``_stream_compute[i % _stream_compute.size()]``, :data:`UB_COMPUTE_STREAMS` of them), so a
piece's last, partial wave runs beside the next piece's first wave: the pieces' GEMMs are
charged wave quantisation on the sum of their tiles, each piece its share
(``GemmSpec.packed_pieces``), still in step order behind their copies.

With ``fp8`` the linear GEMMs run on FP8 operands (``LayerCtx.gemm``) and the framework
profile decides which inputs / output gradients need their own cast kernel (``_cast``). TP
reductions stay in the compute dtype; the all-gathers the profile lists in
``fp8_tp_collectives`` move 1-byte elements in every ``tp_overlap`` mode (torchao's Float8 TP
styles cast before the all-gather, ``LayerCtx.tp_gather_bytes``): ``input_ag`` (forward input,
and the backward re-gather where there is one) and ``grad_ag`` (a row-parallel output
gradient, whose cast then runs once on the local ``[T/t, n]`` shard before the all-gather).

Frameworks differ in what the backward of a column-parallel linear re-gathers: Megatron-LM
saves the ``[T/t, h]`` shard and all-gathers it again (``input_ag`` above); PyTorch DTensor TP
(torchtitan) saves the gathered input, so with the profile's ``tp_sp_save_gathered_input``
:func:`bwd_col` has no ``input_ag`` in any ``tp_overlap`` mode.

Every function appends ops to a :class:`~ccoverlap.parallel.segment.Segment` and returns the
local index of the op the next step should depend on. ``ctx`` is a
:class:`~ccoverlap.parallel.context.LayerCtx`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ccoverlap.errors import ConfigError
from ccoverlap.parallel import pointwise as pw
from ccoverlap.parallel.context import linear_kind
from ccoverlap.specs import CommConfig, CopySpec, P2PSpec

if TYPE_CHECKING:
    from ccoverlap.parallel.context import LayerCtx
    from ccoverlap.parallel.segment import Dep, Segment
    from ccoverlap.specs import Collective, CollectiveSpec, GemmSpec

#: TransformerEngine v1.7 userbuffers defaults (``tp_overlap="userbuffers"``): thread blocks
#: (one SM each) of the SM-driven pipeline / bulk collectives, ``add_ub(num_sm=16, ...)`` in
#: transformer_engine/pytorch/module/base.py ``initialize_ub``.
UB_NUM_SM = 16
#: GEMM + reduce-scatter pieces of the ``pipeline`` method: ``num_splits=4 if method ==
#: "pipeline"`` (same function).
UB_PIPELINE_SPLITS = 4
#: Thread blocks of the last pipeline piece's reduce-scatter: ``_ub_comm->sms = UB_MAX_SM``
#: with ``#define UB_MAX_SM 32`` in transformer_engine/pytorch/csrc/comm_gemm_overlap.h.
UB_MAX_SM = 32
#: Compute streams the ring-exchange / pipeline GEMM pieces are issued on, round-robin
#: (``_stream_compute[i % _stream_compute.size()]``): ``initialize_ub`` passes
#: ``num_max_streams=_NUM_MAX_UB_STREAMS`` (``= 3``, transformer_engine/pytorch/module/base.py)
#: and transformer_engine/pytorch/csrc/comm_gemm_overlap.h creates
#: ``min(num_max_streams, num_splits)`` of them (TransformerEngine v1.7).
UB_COMPUTE_STREAMS = 3


def _cast(seg: Segment, ctx: LayerCtx, src: Dep, name: str, direction: str, rows: int, cols: int,
          weight_elems: int = 0) -> Dep:
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


def _chunks(ctx: LayerCtx, m: int) -> int:
    c = ctx.tp_chunks if (ctx.tp > 1 and ctx.tp_overlap == "chunked") else 1
    return max(1, min(c, m))


def _split(m: int, c: int) -> int:
    return -(-m // c)


def _symm_mem(ctx: LayerCtx) -> bool:
    """Whether the TP matmuls run as PyTorch's symmetric-memory async TP (SP only). Symmetric
    memory maps the peers' buffers over NVLink, so the TP group must sit inside one node."""
    if not (ctx.tp > 1 and ctx.sp and ctx.tp_overlap == "symm_mem"):
        return False
    if ctx.layout.tp.nodes > 1:
        raise ConfigError(f"tp_overlap 'symm_mem' needs the TP group inside one node (tp={ctx.tp} spans "
                          f"{ctx.layout.tp.nodes} nodes; symmetric memory maps peers' buffers over the intra-node fabric)")
    return True


def _userbuffers(ctx: LayerCtx, name: str) -> bool:
    """Whether linear ``name``'s TP communication runs as TransformerEngine's userbuffers
    overlap. It overlaps the sequence-parallel all-gathers / reduce-scatters (Megatron-LM
    asserts sequence parallelism with ``--tp-comm-overlap``) over peers' buffers mapped inside
    one node, for TE's layers only: qkv, proj, fc1, fc2 (``initialize_ub``'s buffer names), not
    the LM head (Megatron-Core's own ``ColumnParallelLinear``, plain collectives)."""
    if not (ctx.tp > 1 and ctx.tp_overlap == "userbuffers"):
        return False
    if not ctx.sp:
        raise ConfigError(f"tp_overlap 'userbuffers' needs sequence_parallel with tp={ctx.tp} (TransformerEngine's "
                          "userbuffers overlap gathers and scatters the sequence-parallel activations)")
    if ctx.layout.tp.nodes > 1:
        raise ConfigError(f"tp_overlap 'userbuffers' needs the TP group inside one node (tp={ctx.tp} spans "
                          f"{ctx.layout.tp.nodes} nodes; userbuffers maps peers' buffers over the intra-node fabric)")
    return linear_kind(name) != "lm_head"


def _ub_coll(ctx: LayerCtx, collective: Collective, nbytes: float, sms: int = UB_NUM_SM) -> CollectiveSpec:
    """A userbuffers SM-driven collective on the TP group: ``nbytes`` as :meth:`LayerCtx.coll`,
    on ``sms`` thread blocks (channels) whatever the NCCL knobs say (it is not NCCL)."""
    return replace(ctx.coll(collective, nbytes, "tp"), config=CommConfig(channels=sms), transport="sm")


def _ub_gemm(ctx: LayerCtx, m: int, n: int, k: int, name: str, pieces: int) -> GemmSpec:
    """One of ``pieces`` userbuffers GEMM pieces [m, k] x [k, n]: with more than one compute
    stream (:data:`UB_COMPUTE_STREAMS`) their waves pack, so each is charged its share of the
    pieces' tiles together (``packed_pieces``); on one stream it runs alone."""
    spec = ctx.gemm(m, n, k, name)
    return replace(spec, packed_pieces=pieces) if min(UB_COMPUTE_STREAMS, pieces) > 1 else spec


def _peer_copy(ctx: LayerCtx, nbytes: float) -> P2PSpec:
    """One peer's shard pulled from its symmetric-memory buffer by ``Tensor.copy_``: a
    copy-engine transfer over the intra-node fabric (``nbytes`` bytes)."""
    return P2PSpec(bytes=float(nbytes), inter_node=False, transport="dma", group="tp")


def _symm_ag_consume(seg: Segment, ctx: LayerCtx, src: Dep, name: str, rows: int, k: int,
                     consume: Callable[[int, int], int], elem_bytes: int) -> int:
    """Async TP's ``_pipelined_all_gather_and_consume`` over a ``[rows, k]`` local shard of
    ``elem_bytes`` bytes per element: copy it into the local symmetric buffer, consume it, then
    for each of the ``tp - 1`` peers a peer copy (``tp`` stream) and its consumer.
    ``consume(step, dep)`` appends the consumer op(s) of one step depending on ``dep`` and
    returns the last one. Returns the last consumer's index."""
    nbytes = rows * k * elem_bytes
    mv = seg.add(f"{name}_symm_mv", CopySpec(bytes=float(nbytes)), deps=(src,))
    done = [consume(0, mv)]
    for s in range(1, ctx.tp):
        deps = (mv,) if s < 2 else (mv, done[s - 2])  # the backend stream waits for the mv; stream order
        cp = seg.add(f"{name}_symm_cp{s}", _peer_copy(ctx, nbytes), "tp", deps=deps)
        done.append(consume(s, cp))
    return done[-1]


def _ub_ring_ag(seg: Segment, ctx: LayerCtx, src: Dep, name: str, rows: int, k: int,
                consume: Callable[[int, Dep], int], elem_bytes: int) -> int:
    """TransformerEngine's ring-exchange all-gather + GEMM (``split_overlap_ag``, copy engine)
    over a ``[rows, k]`` local shard of ``elem_bytes`` bytes per element: the local shard's
    consumer, then for each of the ``tp - 1`` further steps the copy of one shard to the next
    rank (``tp`` stream, each after the previous one) and the consumer of the received shard.
    ``consume(step, dep)`` appends one step's consumer op(s) depending on ``dep`` and returns
    the last one. Returns the last consumer's index."""
    nbytes = rows * k * elem_bytes
    last = consume(0, src)
    prev: Dep = src
    for s in range(1, ctx.tp):
        prev = seg.add(f"{name}_ub_cp{s}", _peer_copy(ctx, nbytes), "tp", deps=(prev,))
        last = consume(s, prev)
    return last


def fwd_ag_gemm(seg: Segment, ctx: LayerCtx, src: Dep, name: str, n: int, k: int, tensor: str = "") -> int:
    """Column-parallel GEMM [T, k] x [k, n] in forward, preceded by the SP all-gather of its
    input (T·k elements of ``LayerCtx.tp_gather_bytes(name, "input_ag")`` bytes, the gathered
    size). Returns the index of the (last) GEMM."""
    T = ctx.tokens
    d = ctx.tp_gather_bytes(name, "input_ag")
    src = _cast(seg, ctx, src, name, "fwd", ctx.local_tokens, k, n * k)
    if ctx.tp == 1 or not ctx.sp:
        return seg.add(name, ctx.gemm(T, n, k, name), deps=(src,), tensor=tensor)
    if _symm_mem(ctx):
        rows = ctx.local_tokens
        return _symm_ag_consume(seg, ctx, src, name, rows, k, lambda s, dep: seg.add(
            f"{name}{s}", ctx.gemm(rows, n, k, name), deps=(dep,), tensor=tensor), d)
    if _userbuffers(ctx, name):
        rows = ctx.local_tokens
        return _ub_ring_ag(seg, ctx, src, name, rows, k, lambda s, dep: seg.add(
            f"{name}{s}", _ub_gemm(ctx, rows, n, k, name, ctx.tp), deps=(dep,), tensor=tensor), d)
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


def fwd_gemm_reduce(seg: Segment, ctx: LayerCtx, src: Dep, name: str, n: int, k: int,
                    deps: tuple[Dep, ...] = ()) -> int:
    """Row-parallel GEMM [T, k] x [k, n] in forward followed by the reduce-scatter (SP) or
    all-reduce of its [T, n] output. Returns the index of the op producing the reduced output."""
    T, d = ctx.tokens, ctx.d
    src = _cast(seg, ctx, src, name, "fwd", T, k, n * k)
    gemm = ctx.gemm(T, n, k, name)
    if ctx.tp == 1:
        return seg.add(name, gemm, deps=(src, *deps))
    if _symm_mem(ctx):
        return _symm_gemm_rs(seg, ctx, src, name, n, k, deps)
    if _userbuffers(ctx, name):
        return _ub_gemm_rs(seg, ctx, src, name, n, k, deps)
    coll: Collective = "reduce_scatter" if ctx.sp else "all_reduce"
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


def _ub_gemm_rs(seg: Segment, ctx: LayerCtx, src: Dep, name: str, n: int, k: int,
                deps: tuple[Dep, ...] = ()) -> int:
    """TransformerEngine's pipelined GEMM + reduce-scatter (``split_overlap_rs``): the GEMM in
    :data:`UB_PIPELINE_SPLITS` pieces along the tokens, each piece's reduce-scatter (userbuffers
    SM kernels on :data:`UB_NUM_SM` thread blocks, the last on :data:`UB_MAX_SM`) on the ``tp``
    stream after its GEMM. Returns the index of the last reduce-scatter."""
    T, d = ctx.tokens, ctx.d
    c = max(1, min(UB_PIPELINE_SPLITS, T))
    mc = _split(T, c)
    r = -1
    for i in range(c):
        g = seg.add(f"{name}{i}", _ub_gemm(ctx, mc, n, k, name, c), deps=(src, *deps))
        sms = UB_MAX_SM if i == c - 1 else UB_NUM_SM
        r = seg.add(f"{name}_rs{i}", _ub_coll(ctx, "reduce_scatter", mc * n * d, sms), "tp", deps=(g,))
    return r


def _symm_gemm_rs(seg: Segment, ctx: LayerCtx, src: Dep, name: str, n: int, k: int,
                  deps: tuple[Dep, ...] = ()) -> int:
    """Async TP's fused matmul + reduce-scatter (``_fused_matmul_reduce_scatter_impl`` over
    ``_pipelined_produce_and_all2all``): ``tp - 1`` remote partials ``[T/tp, n]`` each computed
    and pulled by its owner with a peer copy, the local partial last, then the ``torch.sum``
    over the ``tp`` stacked partials (reads ``T·n``, writes ``T/tp·n`` elements). Returns the
    index of the reduction."""
    rows, d = ctx.local_tokens, ctx.d
    gemms: list[int] = []
    copies: list[int] = []
    for s in range(1, ctx.tp):
        g_deps = (src, *deps) if s < 3 else (src, *deps, copies[s - 3])  # two buffers, reused after the pull
        gemms.append(seg.add(f"{name}{s}", ctx.gemm(rows, n, k, name), deps=g_deps))
        copies.append(seg.add(f"{name}_symm_cp{s}", _peer_copy(ctx, rows * n * d), "tp", deps=(gemms[-1],)))
    local = seg.add(f"{name}0", ctx.gemm(rows, n, k, name), deps=(src, *deps))
    return seg.add(f"{name}_symm_reduce", ctx.mem((ctx.tp + 1) * rows * n * d), deps=(local, copies[-1]))


def bwd_row(seg: Segment, ctx: LayerCtx, src: Dep, name: str, n: int, k: int, tensor: str) -> int:
    """Backward of a row-parallel Y[T, n] = X[T, k] W[k, n]: (SP) all-gather of dY, dgrad
    dX = dY Wᵀ ([T, n] x [n, k]) and wgrad dW = Xᵀ dY ([k, T] x [T, n]). With an FP8
    ``grad_ag`` (``LayerCtx.fp8_tp_collective``) dY is cast once on the local shard and
    gathered at 1 byte per element; otherwise the gathered rows are cast. Returns the dgrad
    index (the wgrad follows it on the compute stream)."""
    T = ctx.tokens
    wgrad = ctx.gemm(k, n, T, name)
    if ctx.tp == 1 or not ctx.sp:
        src = _cast(seg, ctx, src, name, "bwd", T, n)
        dg = seg.add(f"{name}_dgrad", ctx.gemm(T, k, n, name), deps=(src,))
        seg.add(f"{name}_wgrad", wgrad, deps=(dg,), tensor=tensor)
        return dg
    fp8_gather = ctx.fp8_tp_collective(name, "grad_ag")
    d = ctx.tp_gather_bytes(name, "grad_ag")
    if fp8_gather:
        src = _cast(seg, ctx, src, name, "bwd", ctx.local_tokens, n)

    def cast_gathered(dep: Dep, rows: int) -> Dep:
        return dep if fp8_gather else _cast(seg, ctx, dep, name, "bwd", rows, n)
    if _symm_mem(ctx):
        rows = ctx.local_tokens

        def dgrad(s: int, dep: int) -> int:
            g = cast_gathered(dep, rows)
            return seg.add(f"{name}_dgrad{s}", ctx.gemm(rows, k, n, name), deps=(g,))
        dg = _symm_ag_consume(seg, ctx, src, f"{name}_grad", rows, n, dgrad, d)
        seg.add(f"{name}_wgrad", wgrad, deps=(dg,), tensor=tensor)
        return dg
    if _userbuffers(ctx, name):
        rows = ctx.local_tokens
        if not fp8_gather:  # copy_input_to_ubuf: the local bf16 gradient into the registered buffer
            src = seg.add(f"{name}_grad_ub_copy", CopySpec(bytes=float(rows * n * d)), "tp", deps=(src,))

        def ub_dgrad(s: int, dep: Dep) -> int:
            g = cast_gathered(dep, rows)
            return seg.add(f"{name}_dgrad{s}", _ub_gemm(ctx, rows, k, n, name, ctx.tp), deps=(g,))
        dg = _ub_ring_ag(seg, ctx, src, f"{name}_grad", rows, n, ub_dgrad, d)
        seg.add(f"{name}_wgrad", wgrad, deps=(dg,), tensor=tensor)
        return dg
    c = _chunks(ctx, T)
    mc = _split(T, c)
    dg = -1
    for i in range(c):
        sfx = str(i) if c > 1 else ""
        ag = seg.add(f"{name}_grad_ag{sfx}", ctx.coll("all_gather", mc * n * d, "tp"), "tp", deps=(src,))
        g = cast_gathered(ag, mc)
        dg = seg.add(f"{name}_dgrad{sfx}", ctx.gemm(mc, k, n, name), deps=(g,))
    seg.add(f"{name}_wgrad", wgrad, deps=(dg,), tensor=tensor)
    return dg


def bwd_col(seg: Segment, ctx: LayerCtx, src: int, gemms: list[tuple[str, int, int, str]], in_dim: int) -> int:
    """Backward of column-parallel GEMMs that read the same input X[T, in_dim] (QKV; or QKV and
    fc1 of a parallel attention+MLP block). ``gemms`` = [(name, n, k, tensor)]. Order, as
    Megatron-LM: (SP) all-gather of the saved input on the TP stream (none where the profile's
    ``tp_sp_save_gathered_input`` says autograd kept the gathered input: PyTorch DTensor TP),
    every dgrad, then the reduce-scatter (SP) / all-reduce of dX on the TP stream while the
    wgrads run. Returns the index of the op producing the reduced dX."""
    T, d = ctx.tokens, ctx.d
    ub = _userbuffers(ctx, gemms[0][0])
    ag = None
    if ctx.tp > 1 and ctx.sp and not ctx.fw.tp_sp_save_gathered_input:
        ab = ctx.tp_gather_bytes(gemms[0][0], "input_ag")
        if ub:  # bulk: copy_input_to_ubuf of the saved [T/t, in_dim] input, then the SM all-gather
            cp = seg.add("input_ub_copy", CopySpec(bytes=float(ctx.local_tokens * in_dim * ab)), "tp", deps=(src,))
            ag = seg.add("input_ag", _ub_coll(ctx, "all_gather", T * in_dim * ab), "tp", deps=(cp,))
        else:
            ag = seg.add("input_ag", ctx.coll("all_gather", T * in_dim * ab, "tp"), "tp", deps=(src,))
    dg = src
    for name, n, k, _ in gemms:
        g = _cast(seg, ctx, src, name, "bwd", T, n)
        dg = seg.add(f"{name}_dgrad", ctx.gemm(T, k, n, name), deps=(g,))
    out = dg
    if ctx.tp > 1:
        coll: Collective = "reduce_scatter" if ctx.sp else "all_reduce"
        spec = _ub_coll(ctx, coll, T * in_dim * d) if ub else ctx.coll(coll, T * in_dim * d, "tp")
        out = seg.add(f"dgrad_{'rs' if ctx.sp else 'ar'}", spec, "tp", deps=(dg,))
    for name, n, k, tensor in gemms:
        seg.add(f"{name}_wgrad", ctx.gemm(k, n, T, name),
                deps=() if ag is None else (ag,), tensor=tensor)
    return out
