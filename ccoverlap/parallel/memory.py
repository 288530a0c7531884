"""Per-GPU memory estimate: weights, gradients, optimizer state, activations, communication buffers.

Model states (bytes per local parameter):

* DDP, Megatron-LM mixed precision: bf16 weights (``dtype_bytes``), main gradients in the
  framework profile's ``ddp_reduce_dtype`` (fp32: 4; ``param``: the compute dtype, as
  Megatron-LM in fp16 without ``--accumulate-allreduce-grads-in-fp32``), fp32 master weights
  + Adam moments (12): 18 bytes with fp32 gradients; with ``distributed_optimizer`` the 12 are
  divided by dp (ZeRO-1; Megatron-LM's "6 + 12/d"), and with ``shard_gradients`` the
  gradients too (ZeRO-2).
* FSDP (ZeRO-3): fp32 sharded parameters (they are the master copy), fp32 sharded gradients
  and moments: 16 / dp bytes (HSDP with ``distributed_optimizer``, ZeRO-1/2 across the
  replicas: the shard in the compute dtype, fp32 gradients, fp32 master and moments over
  ``1/dp_replicate`` of the shard), plus communication buffers: the unsharded bf16 units alive
  (the ``min(limit_all_gathers, prefetch + 1)`` largest units; every unit with
  ``reshard_after_forward=False``) and one unit's unsharded gradients in the profile's
  ``fsdp_reduce_dtype`` (every unit's, with pipeline parallelism under
  ``fsdp_pp_deferred_sync``).

The loss holds the profile's ``loss_bytes_per_logit`` at its peak (unset: the compute-dtype
logits and an fp32 softmax, for every micro-batch in flight on the last stage).

Other buffers: DDP, the bucket being reduced and the next (2 × ``bucket_cap_mb``; gradients
themselves live in one contiguous buffer, as Megatron-LM's, so buckets are views); pipeline
send and receive buffers of one activation each.

Routed-expert parameters are divided by tp·ep and their sharded states by dp/ep instead of dp.

Activations follow Korthikanti et al., 2022, "Reducing Activation Recomputation in Large
Transformer Models", §4 and Table 2, per layer per micro-batch (``s`` sequence, ``b``
micro-batch, ``h`` hidden, ``a`` heads, ``t`` tp, 16-bit activations):

* no recompute: ``sbh(34 + 5as/h)``; TP: ``sbh(10 + 24/t + 5as/(ht))``; TP+SP: ``sbh(34/t + 5as/(ht))``
* selective recompute: the ``5as/h`` score terms vanish; full recompute: ``2sbh`` (``/t`` with SP)
  for the layer input, plus one layer's full activations while it is recomputed.

The formula is generalised term by term to the model's real shapes (the paper's GPT has a
4h GELU MLP, multi-head attention and dropout): the two norm inputs and outputs, Q K V
(GQA-sized K, V), the out-projection input, the fc1 output (2·ffn wide for SwiGLU) and the
activation output; dropout masks (1 byte) only if the model uses dropout; the ``a·s²`` score
terms (softmax output, and with dropout its mask and output) only when attention is not a
fused flash kernel (``flash_attention=False``) — FlashAttention stores only the fp32
log-sum-exp. With the paper's GPT shapes and ``flash_attention=False`` the numbers are the
paper's exactly. MoE layers store router probabilities, permuted tokens, the expert
inputs / fc1 outputs / activation outputs of ``T·k`` routed tokens (uniform routing), and
the combine output.

Context parallelism (``cp``): every term uses the ``s / cp`` local tokens (flash attention
only, so no ``s²`` term); HSDP shards model states over the shard group (``dp·cp /
dp_replicate``) only; ``fp8_param_allgather`` keeps gathered FSDP units in FP8 (1 byte).
PyTorch DTensor TP with SP saves the all-gathered QKV / fc1 inputs (``[T, h]`` each) where
Megatron-LM keeps the ``[T/t, h]`` shard (``sp_save_gathered_input``, the framework profile's
``tp_sp_save_gathered_input``); saved FP8 copies of linear inputs are not modelled.

In-flight micro-batches come from the schedule itself: the most forward chunks a pipeline
rank has run without their backward (1F1B: ``min(P − r, M)``, first stage P; GPipe: M;
interleaved: Megatron's warm-up + 1 virtual micro-batches; DualPipe: P + 1).

``fits`` compares the total with the GPU memory minus ``MEMORY_RESERVE_FRACTION`` (CUDA
context, NCCL workspaces, caching-allocator fragmentation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ccoverlap.catalog.frameworks import FrameworkProfile, get_framework
from ccoverlap.config import short
from ccoverlap.errors import ConfigError
from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, validate
from ccoverlap.parallel.context import GRAD_BYTES
from ccoverlap.parallel.pp import in_flight, make_schedule
from ccoverlap.parallel.units import layer_index, stage_units, unit_tensors

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import ParallelConfig
    from ccoverlap.parallel.pp import Schedule

MEMORY_RESERVE_FRACTION = 0.10
MiB = 1 << 20


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU on the most loaded pipeline rank (``worst_rank``); ``per_rank_total``
    lists every pipeline rank's total."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    comm_buffers_bytes: float
    total_bytes: float
    capacity_bytes: float
    usable_bytes: float
    reserve_fraction: float
    fits: bool
    worst_rank: int
    per_rank_total: tuple
    inflight_microbatches: int
    activation_per_layer_bytes: float

    def to_dict(self) -> dict:
        """Plain-data form (bytes, booleans, the per-rank list)."""
        d = asdict(self)
        d["per_rank_total"] = list(self.per_rank_total)
        return d


def layer_activation_bytes(model: ModelSpec, parallel: ParallelConfig, micro_batch: int, seq_len: int, layer: int, *,
                           flash_attention: bool | None = None, sp_save_gathered_input: bool | None = None,
                           framework: str | FrameworkProfile | None = None) -> float:
    """Activation bytes one layer keeps for backward, per micro-batch, on one rank
    (Korthikanti et al. 2022, generalised; see module doc). ``framework`` (a profile or its
    name; default ``megatron-core``) decides flash attention, what ``recompute="selective"``
    keeps (:func:`_op_sac_bytes` for ``selective_recompute: op``) and
    ``sp_save_gathered_input``: with sequence parallelism the QKV / fc1 inputs are kept
    all-gathered (``[T, h]``, PyTorch DTensor TP) instead of as the ``[T/t, h]`` shard
    Megatron-LM keeps; ``flash_attention`` / ``sp_save_gathered_input`` given here override the
    profile's. ``micro_batch`` sequences of ``seq_len`` tokens; ``layer`` from 0 to
    ``model.layers - 1``. ConfigError when ``parallel`` does not fit ``model``
    (:func:`ccoverlap.parallel.config.validate`) or a size is out of range."""
    BatchConfig(global_batch=1, micro_batch=micro_batch, seq_len=seq_len)  # the sizes: checked as a batch's
    validate(model, parallel)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < model.layers:
        raise ConfigError(f"layer must be an integer from 0 to {model.layers - 1} ({model.name} has "
                          f"{model.layers} layers), got {short(layer)}")
    ms = _memory_style(get_framework(framework), flash_attention, sp_save_gathered_input)
    return _layer_activation_bytes(model, parallel, micro_batch, seq_len, layer, ms)


@dataclass(frozen=True)
class _MemoryStyle:
    """The framework profile memory follows, with the two flags a caller may override."""

    fw: FrameworkProfile
    flash_attention: bool
    sp_save_gathered_input: bool


def _memory_style(fw: FrameworkProfile, flash_attention: bool | None = None,
                  sp_save_gathered_input: bool | None = None) -> _MemoryStyle:
    """``fw``, with explicit flags overriding the profile's."""
    return _MemoryStyle(
        fw=fw, flash_attention=fw.flash if flash_attention is None else bool(flash_attention),
        sp_save_gathered_input=(fw.tp_sp_save_gathered_input if sp_save_gathered_input is None
                                else bool(sp_save_gathered_input)))


def _layer_activation_bytes(model: ModelSpec, parallel: ParallelConfig, micro_batch: int, seq_len: int, layer: int,
                            ms: _MemoryStyle) -> float:
    """:func:`layer_activation_bytes` of arguments already checked."""
    if parallel.recompute == "selective" and ms.fw.selective_recompute == "op":
        return _op_sac_bytes(model, parallel, micro_batch * seq_len, layer)
    flash_attention, sp_save_gathered_input = ms.flash_attention, ms.sp_save_gathered_input
    t = parallel.tp
    sp = parallel.sequence_parallel and t > 1
    d = parallel.dtype_bytes
    T = micro_batch * seq_len
    Tl = T / t if sp else T  # tokens outside the TP region on this rank
    h = model.hidden
    drop = 1.0 if model.dropout else 0.0
    if parallel.recompute == "full":
        return d * Tl * h
    # attention block
    rep = 2 * d * Tl * h  # inputs of the two norms
    Tin = T if sp_save_gathered_input else Tl  # tokens of the saved QKV / fc1 input
    rep += 2 * d * Tin * h if not model.parallel_attn_mlp else d * Tin * h  # norm outputs (QKV / fc1 input)
    rep += 2 * drop * Tl * h  # residual dropout masks
    split = d * T * (model.q_dim + 2 * model.kv_dim) / t + d * T * model.q_dim / t
    a_local = model.heads / t
    if flash_attention:
        split += 4.0 * T * a_local  # fp32 log-sum-exp
    elif parallel.recompute == "none":
        scores = micro_batch * a_local * seq_len * seq_len
        split += scores * (d + drop * (1 + d))
    up = model.mlp_mats - 1
    if model.is_moe_layer(layer):
        k, e = model.top_k, model.experts
        f = model.efh / t
        split += 4.0 * Tl * e  # router probabilities (fp32)
        split += 2 * d * Tl * k * h  # permuted tokens (dispatch input) and combine output
        split += d * T * k * (h + up * f + f)  # expert inputs, fc1 outputs, activation outputs
        if model.shared_experts:
            fs = model.efh * model.shared_experts / t
            split += d * T * (up * fs + fs)
    else:
        f = model.ffn_hidden / t
        split += d * T * (up * f + f)
    return rep + split


def _op_sac_bytes(model: ModelSpec, parallel: ParallelConfig, T: int, layer: int) -> float:
    """Bytes one layer keeps under per-op selective activation checkpointing (torchtitan's
    ``selective_ac_option = "op"``, ``_apply_ac_to_transformer_block``): the block's input, the
    outputs of ``aten.mm`` except every second one of the block (in call order Q, K, V, output
    projection, then the MLP's gate, up and down projections, or fc1 and fc2), the flash
    attention output with its fp32 log-sum-exp, and with sequence parallelism the two
    reduce-scatter outputs; everything element-wise is recomputed. FP8 linears count alike (the
    policy's dispatch mode sees their ``aten.mm`` before the float8 tensor subclass turns it
    into ``torch._scaled_mm``). MoE layers keep the router's logits; grouped expert GEMMs are not ``aten.mm``."""
    t = parallel.tp
    sp = parallel.sequence_parallel and t > 1
    d = parallel.dtype_bytes
    Tl = T / t if sp else T
    h = model.hidden
    kept = d * Tl * h  # the checkpointed block's input
    kept += d * T * model.q_dim / t + 4.0 * T * model.heads / t  # attention output and log-sum-exp
    if sp:
        kept += 2 * d * Tl * h  # reduce-scatter outputs of the two row-parallel projections
    mm = [model.q_dim / t, model.kv_dim / t, model.kv_dim / t, h]  # output widths, call order
    if model.is_moe_layer(layer):
        mm.append(model.experts)  # the router's linear; the experts' GEMMs are grouped
    else:
        f = model.ffn_hidden / t
        mm += [f] * (model.mlp_mats - 1) + [h]
    return kept + sum(d * T * w for w in mm[0::2])  # the 1st, 3rd, 5th ... mm of the block


def _rank_layers(model: ModelSpec, parallel: ParallelConfig, sched: Schedule, rank: int) -> tuple[list[list[str]], int]:
    chunks = [stage_units(model, sched.stages, sched.stage_of(rank, c)) for c in range(len(sched.chunk_stage[rank]))]
    return chunks, model.layers // sched.stages


def estimate_memory(model: ModelSpec, parallel: ParallelConfig, batch: BatchConfig, cluster: ClusterSpec,
                    knobs: OverlapKnobs | None = None, *, flash_attention: bool | None = None,
                    sp_save_gathered_input: bool | None = None,
                    framework: str | FrameworkProfile | None = None) -> MemoryEstimate:
    """Memory per GPU for ``model`` under ``parallel`` / ``batch`` on ``cluster`` (bytes).

    ``knobs`` (OverlapKnobs) sets the DDP bucket size and the FSDP gathered units;
    ``framework`` (a profile or its name; default ``megatron-core``) decides what a layer keeps
    (:func:`layer_activation_bytes`, whose ``flash_attention`` and ``sp_save_gathered_input``
    overrides these are), the loss's buffers (``loss_bytes_per_logit``) and, with pipeline
    parallelism, FSDP gradients accumulated unsharded (``fsdp_pp_deferred_sync``); see the
    module docstring for every term and its source. ConfigError when the arguments are not a
    ModelSpec, ParallelConfig, BatchConfig, ClusterSpec and OverlapKnobs that fit together
    (:func:`ccoverlap.parallel.config.validate`)."""

    knobs = OverlapKnobs() if knobs is None else knobs
    validate(model, parallel, batch, cluster, knobs)
    ms = _memory_style(get_framework(framework), flash_attention, sp_save_gathered_input)
    p = parallel
    M = batch.microbatches(p.dp)
    sched = make_schedule(p.pp_schedule, p.pp, M, p.virtual_stages, p.pp_group)
    d = p.dtype_bytes
    seq_local = batch.seq_len // p.cp  # context parallelism: each rank holds s / cp tokens (flash only)
    ctx = _MemoryInputs(
        model=model, p=p, batch=batch, knobs=knobs,
        sched=sched, microbatches=M, d=d, seq_local=seq_local, T=batch.micro_batch * seq_local, sp=p.sequence_parallel and p.tp > 1,
        shard=p.dp_shard if p.data_parallel == "fsdp" else p.dp_cp, ag_bytes=1 if p.fp8_param_allgather else d,
        style=ms,
    )  # fmt: skip
    capacity = float(cluster.gpu.memory_bytes)
    usable = capacity * (1.0 - MEMORY_RESERVE_FRACTION)
    rows = [_rank_memory(ctx, r) for r in range(p.pp)]
    worst = max(range(len(rows)), key=lambda i: rows[i][0])
    total, weights, grads, optim, act, comm, live, per_layer = rows[worst]
    return MemoryEstimate(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=optim, activations_bytes=act,
        comm_buffers_bytes=comm, total_bytes=total, capacity_bytes=capacity, usable_bytes=usable,
        reserve_fraction=MEMORY_RESERVE_FRACTION, fits=total <= usable, worst_rank=worst,
        per_rank_total=tuple(r[0] for r in rows), inflight_microbatches=live,
        activation_per_layer_bytes=per_layer,
    )


@dataclass(frozen=True)
class _MemoryInputs:
    """What :func:`estimate_memory`'s per-rank steps share: the job and the sizes derived from it."""

    model: Any
    p: Any  # ParallelConfig
    batch: Any
    knobs: OverlapKnobs
    sched: Any  # the pipeline schedule
    microbatches: int  # M
    d: int  # bytes per element of the compute dtype
    seq_local: int  # s / cp tokens per rank
    T: int  # tokens per micro-batch on this rank
    sp: bool  # sequence parallelism in effect (tp > 1)
    shard: int  # ranks the dense model states are sharded over
    ag_bytes: int  # bytes per element of a gathered FSDP unit
    style: _MemoryStyle  # what the framework profile decides


def _rank_memory(c: _MemoryInputs, r: int) -> tuple:
    """Pipeline rank ``r``: (total, weights, grads, optim, act, comm, in-flight, per-layer activation bytes)."""
    chunks, per_chunk = _rank_layers(c.model, c.p, c.sched, r)
    dense, expert, unit_params = _local_params(c, chunks)
    weights, grads, optim, comm = _model_state_bytes(c, dense, expert, unit_params)
    if c.p.pp > 1:
        comm += 2.0 * c.T * c.model.hidden * c.d / (c.p.tp if c.sp else 1)  # send + receive buffers
    act, live, per_layer = _activation_bytes(c, r, chunks, per_chunk)
    total = weights + grads + optim + act + comm
    return (total, weights, grads, optim, act, comm, live, per_layer)


def _local_params(c: _MemoryInputs, chunks: list[list[str]]) -> tuple[int, int, list[int]]:
    """Parameters this rank holds: dense, routed-expert, and the count of each unit (for FSDP's gathers)."""
    dense = expert = 0
    unit_params: list[int] = []
    for units in chunks:
        for u in units:
            n = 0
            for tns in unit_tensors(c.model, c.p, u):
                n += tns.numel
                if tns.group == "edp":
                    expert += tns.numel
                else:
                    dense += tns.numel
            unit_params.append(n)
    return dense, expert, unit_params


def _model_state_bytes(c: _MemoryInputs, dense: int, expert: int,
                       unit_params: list[int]) -> tuple[float, float, float, float]:
    """Weights, gradients, optimizer state and DP communication buffers of one rank (bytes; module docstring)."""
    p, knobs, d = c.p, c.knobs, c.d
    n_local = dense + expert
    sharded = dense / c.shard + expert / p.expert_dp
    comm: float
    if p.data_parallel == "fsdp":
        weights = 4.0 * sharded
        grads = GRAD_BYTES * sharded
        optim = 8.0 * sharded
        if p.distributed_optimizer:  # HSDP, ZeRO-1/2 replicas: the compute-dtype shard is
            # gathered, the fp32 master and moments cover 1/dp_replicate of it
            weights = d * sharded + 4.0 * sharded / p.dp_replicate
            optim = 8.0 * sharded / p.dp_replicate
        if knobs.fsdp_reshard_after_forward:
            n_alive = min(knobs.fsdp_limit_all_gathers, knobs.fsdp_prefetch + 1)
            alive = sorted(unit_params, reverse=True)[:n_alive]
            comm = c.ag_bytes * sum(alive)
        else:
            comm = c.ag_bytes * sum(unit_params)
        if p.pp > 1 and c.style.fw.fsdp_pp_deferred_sync:  # every unit's unsharded gradient, accumulated
            comm += c.style.fw.fsdp_reduce_bytes * sum(unit_params)  # over the micro-batches
        else:
            comm += c.style.fw.fsdp_reduce_bytes * max(unit_params)  # unsharded gradients of the unit being reduced
    else:
        weights = float(d * n_local)
        # main gradients in the reduce dtype; ZeRO-2 keeps this rank's shard of them only
        grads = float(c.style.fw.ddp_grad_bytes(d) * (sharded if p.shard_gradients else n_local))
        optim = 12.0 * (sharded if p.distributed_optimizer else n_local)
        comm = 2.0 * knobs.bucket_cap_mb * MiB if p.dp_cp > 1 else 0.0
    return weights, grads, optim, comm


def _activation_bytes(c: _MemoryInputs, r: int, chunks: list[list[str]], per_chunk: int) -> tuple[float, int, float]:
    """Rank ``r``'s stored activations (bytes), its in-flight micro-batches and one layer's activation bytes."""
    p, batch, model, d, T = c.p, c.batch, c.model, c.d, c.T
    # activations: in-flight chunk-micro-batches x layers per chunk (first chunk's layers)
    live = in_flight(c.sched, r)
    layers = [layer_index(u) for u in chunks[0] if layer_index(u) >= 0]
    per_layer = max(_layer_activation_bytes(model, p, batch.micro_batch, c.seq_local, li, c.style) for li in layers)
    act = live * per_chunk * per_layer
    if p.recompute == "full" or (p.recompute == "selective" and c.style.fw.selective_recompute == "op"):
        # the layer being recomputed before its backward holds all its activations at once
        full = type(p)(**{**p.to_dict(), "recompute": "none"})
        act += max(_layer_activation_bytes(model, full, batch.micro_batch, c.seq_local, li, c.style) for li in layers)
    stages = [c.sched.stage_of(r, ch) for ch in range(len(chunks))]
    Tl = T / p.tp if c.sp else T
    if c.sched.stages - 1 in stages:  # the loss's logit buffers, and the final norm's input and output
        logits = T * model.vocab / p.tp
        last = tuple(ch for ch, st in enumerate(stages) if st == c.sched.stages - 1)
        held = min(in_flight(c.sched, r, last), c.microbatches)  # the last stage's own micro-batches
        per = c.style.fw.loss_bytes_per_logit
        if per is None:  # logits (compute dtype) and fp32 softmax kept for each micro-batch's backward
            act += held * logits * (d + 4)
        else:  # the loss's peak once; the fp32 (log-)softmax kept for the other micro-batches
            act += logits * (per + 4.0 * (held - 1))
        # the final norm's input, and its output as the LM head keeps it (gathered to [T, h]
        # where the profile's TP saves a column-parallel linear's gathered input)
        Tin = T if c.sp and c.style.sp_save_gathered_input else Tl
        act += held * d * (Tl + Tin) * model.hidden
    if 0 in stages:
        act += live * d * Tl * model.hidden
    return act, live, per_layer
