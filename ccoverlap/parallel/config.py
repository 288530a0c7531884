"""Parallelism, batch and overlap-knob configurations, and their validation against a model and cluster.

Conventions (documented choices, following Megatron-LM where it has a rule):

* ``tp × cp × pp × dp == world size`` (``cp`` context parallelism, default 1). Expert parallelism is carved out of data parallelism
  (Megatron-LM's original MoE layout): ``ep`` must divide ``dp``; the experts of a layer are
  split over the ``ep`` ranks of an EP group, and expert gradients are reduced over the
  remaining ``dp / ep`` ranks (the "expert-data-parallel" group). Expert weights are also
  sharded ``tp``-ways (expert tensor parallel = tp, Megatron's default).
* Attention heads: ``tp`` must divide ``heads`` and ``kv_heads`` (Megatron-LM divides
  ``num_query_groups`` by the TP size; KV-head replication as in inference engines is not
  supported).
* Layers: ``pp`` must divide ``layers``; with the interleaved schedule ``pp × virtual_stages``
  must divide ``layers`` and the number of micro-batches must be a multiple of ``pp``
  (Megatron-LM's interleaved-schedule requirement). DualPipe (DeepSeek-V3) needs an even
  ``pp`` and an even number of micro-batches ≥ 2·pp (its reference implementation asserts
  ``num_chunks >= num_ranks * 2``).
* MoE with ``tp > 1`` needs sequence parallelism (Megatron-LM asserts it).
* Sequence parallelism needs ``seq_len % (tp·cp) == 0``; context parallelism ``seq_len % 2cp == 0``
  (two load-balanced causal chunks per CP rank, Megatron-LM / TransformerEngine).
* ``dp_replicate`` (HSDP) needs FSDP and must divide ``dp·cp``; ``fp8`` needs a GPU with an FP8
  peak in the catalog; ``fp8_param_allgather`` needs ``fp8`` and sharded parameters.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from ccoverlap.catalog.hardware import ClusterSpec
from ccoverlap.catalog.models import ModelSpec
from ccoverlap.config import (
    Count,
    Size,
    bounded,
    check_fields,
    check_keys,
    dataclass_from_mapping,
    field_names,
    short,
)
from ccoverlap.errors import ConfigError
from ccoverlap.specs import CommConfig, Transport

DataParallel = Literal["ddp", "fsdp"]
PPSchedule = Literal["gpipe", "1f1b", "interleaved", "dualpipe"]
Recompute = Literal["none", "selective", "full"]
CPImpl = Literal["ring", "allgather"]
TPOverlap = Literal["none", "chunked", "symm_mem", "userbuffers"]
#: Element width in bytes (1 = fp8, 2 = bf16 / fp16, 4 = fp32, 8 = fp64).
DtypeBytes = Literal[1, 2, 4, 8]
if TYPE_CHECKING:  # the checker sees the plain types; at run time they carry msgspec's bounds
    BucketMiB = float
    SmallCount = int
    SmallCount0 = int
else:
    #: DDP bucket size in MiB: more than 0, at most 1 TiB.
    BucketMiB = bounded(float, gt=0, le=2**20)
    #: A small count (virtual stages, prefetch depth, chunks): 1 .. 1024.
    SmallCount = bounded(int, ge=1, le=1024)
    SmallCount0 = bounded(int, ge=0, le=1024)

#: Most operations one simulated step may have (estimated by :func:`estimate_step_ops` before
#: anything is built; ~1.3 KB and ~7 us of simulation each, so ~5 GB at most). The largest run of
#: the shipped published set estimates 3.1 million. ``CCOVERLAP_MAX_STEP_OPS`` changes it.
MAX_STEP_OPS = 4_000_000
FSDPFetch = Literal["unit", "parameter"]


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Degrees of parallelism and training-recipe choices.

    ``data_parallel``: ``"ddp"`` (replicated weights, gradient all-reduce; with
    ``distributed_optimizer`` the optimizer state is sharded ZeRO-1 style and gradients are
    reduce-scattered, parameters all-gathered, as Megatron-LM's distributed optimizer) or
    ``"fsdp"`` (ZeRO-3: parameters, gradients and optimizer state sharded over dp; with HSDP,
    ``dp_replicate > 1``, ``distributed_optimizer`` makes the replicas ZeRO-1/2: the gradient
    shard is reduce-scattered across them and the updated shard all-gathered back).
    ``shard_gradients`` (with ``distributed_optimizer`` and DDP): each rank keeps only its
    shard of the gradients once they are reduce-scattered (DeepSpeed ZeRO stage 2), where
    Megatron-LM's distributed optimizer keeps the whole gradient buffer; it changes memory only.
    ``recompute``: activation recomputation (Korthikanti et al., 2022): ``"selective"``
    recomputes the attention core, ``"full"`` the whole layer from its input.
    ``dtype_bytes``: width of weights / activations in compute (2 = bf16).
    """

    tp: Count = 1
    pp: Count = 1
    dp: Count = 1
    ep: Count = 1
    sequence_parallel: bool = False
    data_parallel: DataParallel = "ddp"
    distributed_optimizer: bool = False
    # ZeRO-2: with distributed_optimizer, only this rank's gradient shard is kept (memory only)
    shard_gradients: bool = False
    pp_schedule: PPSchedule = "1f1b"
    virtual_stages: SmallCount = 1
    # interleaved schedule: micro-batches launched together per model chunk (0 = pp, Megatron-LM's)
    pp_group: SmallCount0 = 0
    recompute: Recompute = "none"
    dtype_bytes: DtypeBytes = 2
    # context parallelism (docs/model.md): cp ranks each hold seq_len / cp tokens
    cp: Count = 1
    cp_impl: CPImpl = "ring"
    # HSDP: with data_parallel="fsdp", dp x cp ranks = dp_replicate replicas x shard groups
    dp_replicate: Count = 1
    # FP8 linear-layer GEMMs (TransformerEngine / torchao float8 style, per-tensor scaling)
    fp8: bool = False
    # all-gather parameters in FP8 (FSDP float8 all-gather, Megatron --fp8-param-gather)
    fp8_param_allgather: bool = False

    def __post_init__(self) -> None:
        check_fields(self)  # types, ranges and choices: the annotations above, as for a config file
        problems = []
        if self.fp8_param_allgather and not self.fp8:
            problems.append("fp8_param_allgather=True needs fp8=True")
        if self.fp8_param_allgather and self.data_parallel != "fsdp" and not self.distributed_optimizer:
            problems.append("fp8_param_allgather=True needs sharded parameters: data_parallel='fsdp' or "
                            "distributed_optimizer=True")
        if self.dp_replicate > 1 and self.data_parallel != "fsdp":
            problems.append(f"dp_replicate={self.dp_replicate} (HSDP) needs data_parallel='fsdp', "
                            f"got {short(self.data_parallel)}")
        if (self.dp * self.cp) % self.dp_replicate:
            problems.append(f"dp_replicate={self.dp_replicate} must divide dp x cp = {self.dp * self.cp} "
                            f"(HSDP: replicas x shard-group size)")
        elif self.dp_replicate > 1 and self.dp_replicate == self.dp * self.cp:
            problems.append(f"dp_replicate={self.dp_replicate} leaves shard groups of one rank: that is DDP, "
                            f"use data_parallel='ddp' (HSDP needs dp x cp / dp_replicate >= 2)")
        if self.shard_gradients and (self.data_parallel != "ddp" or not self.distributed_optimizer):
            problems.append("shard_gradients=True (ZeRO-2) needs data_parallel='ddp' with distributed_optimizer=True "
                            "(FSDP shards gradients already)")
        if self.distributed_optimizer and self.data_parallel == "fsdp" and self.dp_replicate == 1:
            problems.append("distributed_optimizer=True with data_parallel='fsdp' shards the optimizer across HSDP "
                            "replicas (ZeRO-1/2 over dp_replicate): it needs dp_replicate > 1")
        if self.pp_group and self.pp_schedule != "interleaved":
            problems.append(f"pp_group={self.pp_group} needs pp_schedule='interleaved', got {self.pp_schedule!r}")
        elif self.pp_group and self.pp_group < self.pp:
            problems.append(f"pp_group={self.pp_group} must be at least pp={self.pp}")
        if self.virtual_stages > 1 and self.pp_schedule != "interleaved":
            problems.append(f"virtual_stages={self.virtual_stages} needs pp_schedule='interleaved', "
                            f"got {short(self.pp_schedule)}")
        if self.dp % self.ep:
            problems.append(f"ep={self.ep} must divide dp={self.dp} (expert parallelism is carved out of data "
                            f"parallelism)")
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def world_size(self) -> int:
        """Ranks the configuration uses: tp × cp × pp × dp (EP is carved out of DP, so it does
        not multiply)."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def dp_cp(self) -> int:
        """Ranks holding the same parameters: dp × cp. Gradients are reduced, and (distributed
        optimizer, FSDP) states sharded, over this group, as Megatron-LM's
        ``data_parallel_group_with_context_parallel`` and torchtitan's ``dp_shard_cp`` mesh."""
        return self.dp * self.cp

    @property
    def dp_shard(self) -> int:
        """FSDP shard-group size: dp × cp / dp_replicate (HSDP), else dp × cp."""
        return self.dp_cp // self.dp_replicate

    @property
    def expert_dp(self) -> int:
        """Size of the group that reduces expert gradients (dp × cp / ep)."""
        return self.dp * self.cp // self.ep

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks held by one pipeline rank: V for interleaved, 2 for DualPipe, else 1."""
        if self.pp_schedule == "interleaved":
            return self.virtual_stages
        if self.pp_schedule == "dualpipe":
            return 2
        return 1

    # named predicates (as torchtitan's ParallelDims): what the layout uses
    @property
    def tp_enabled(self) -> bool:
        """Tensor parallelism in use (tp > 1)."""
        return self.tp > 1

    @property
    def sp_enabled(self) -> bool:
        """Sequence parallelism in use (needs tp > 1 to shard anything)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        """Pipeline parallelism in use (pp > 1)."""
        return self.pp > 1

    @property
    def cp_enabled(self) -> bool:
        """Context parallelism in use (a ``cp`` degree > 1)."""
        return self.cp > 1

    @property
    def dp_enabled(self) -> bool:
        """Data parallelism in use (dp > 1)."""
        return self.dp > 1

    @property
    def ep_enabled(self) -> bool:
        """Expert parallelism in use (ep > 1)."""
        return self.ep > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters sharded over data parallelism (FSDP / ZeRO-3 with dp > 1)."""
        return self.dp > 1 and self.data_parallel == "fsdp"

    @property
    def ddp_enabled(self) -> bool:
        """Replicated weights with gradient all-reduce or reduce-scatter (DDP with dp > 1)."""
        return self.dp > 1 and self.data_parallel == "ddp"

    @staticmethod
    def data_parallel_for(world_size: int, *, tp: int = 1, pp: int = 1, cp: int = 1) -> int | None:
        """The dp degree that fills ``world_size`` GPUs given the other degrees
        (``world / (tp × cp × pp)``, as launchers such as torchrun + torchtitan / Megatron-LM
        do when dp is left out), or None when they do not divide it."""
        model_parallel = tp * pp * cp
        if model_parallel < 1 or world_size % model_parallel:
            return None
        return world_size // model_parallel

    def validate(self, model: ModelSpec, cluster: ClusterSpec | None = None,
                 batch: BatchConfig | None = None) -> None:
        """Check this configuration against ``model`` (a ModelSpec), ``cluster`` (a
        ClusterSpec, optional) and ``batch`` (optional). Raises one ConfigError whose message
        lists every problem found, one sentence each."""
        problems = config_problems(self, model, cluster, batch)
        if problems:
            raise ConfigError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (field name -> value)."""
        return asdict(self)


def config_problems(p: ParallelConfig, model: ModelSpec, cluster: ClusterSpec | None = None,
                    batch: BatchConfig | None = None) -> list[str]:
    """Every problem of ``p`` against model / cluster / batch, one sentence each (empty = valid)."""
    out: list[str] = []
    if model.heads % p.tp:
        out.append(f"tp={p.tp} must divide the model's {model.heads} attention heads")
    if model.kv_heads % p.tp:
        out.append(f"tp={p.tp} must divide the model's {model.kv_heads} KV heads (Megatron-LM splits "
                   f"query groups across TP and does not replicate KV heads)")
    if model.layers % p.pp:
        out.append(f"pp={p.pp} must divide the model's {model.layers} layers")
    if p.pp_schedule == "interleaved":
        if p.pp < 2:
            out.append("the interleaved schedule needs pp >= 2")
        if model.layers % (p.pp * p.virtual_stages):
            out.append(f"pp x virtual_stages = {p.pp * p.virtual_stages} must divide the model's "
                       f"{model.layers} layers for the interleaved schedule")
    if p.pp_schedule == "dualpipe" and p.pp % 2:
        out.append(f"DualPipe needs an even pp, got pp={p.pp}")
    if p.ep > 1 and not model.is_moe:
        out.append(f"ep={p.ep} needs a mixture-of-experts model; {model.name} has no experts")
    if model.is_moe and model.experts % p.ep:
        out.append(f"ep={p.ep} must divide the model's {model.experts} experts")
    if model.is_moe and p.tp > 1 and not p.sequence_parallel:
        out.append("a mixture-of-experts model with tp > 1 needs sequence_parallel=True (as in Megatron-LM)")
    if p.sequence_parallel and p.tp == 1:
        pass  # harmless: nothing to shard
    if cluster is not None and p.world_size != cluster.world_size:
        cp = p.cp > 1
        out.append(f"tp x pp x dp{' x cp' if cp else ''} = {p.tp} x {p.pp} x {p.dp}{' x ' + str(p.cp) if cp else ''} "
                   f"= {p.world_size} must equal the cluster's "
                   f"{cluster.world_size} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node})")
    if p.fp8 and cluster is not None and "fp8" not in cluster.gpu.peak_flops:
        out.append(f"fp8=True: GPU {cluster.gpu.name} has no FP8 tensor cores in the hardware catalog "
                   f"(FP8 needs Hopper / Ada / CDNA 3 or newer)")
    if batch is not None:
        out.extend(batch.problems(p))
    return out


def validate(model: ModelSpec, parallel: ParallelConfig, batch: BatchConfig | None = None,
             cluster: ClusterSpec | None = None, knobs: OverlapKnobs | None = None) -> None:
    """Check ``parallel`` (and ``batch``, ``cluster`` when given) against ``model``; one
    ConfigError listing every problem. Same checks as :meth:`ParallelConfig.validate`, after
    checking that each argument is the object it must be (a ModelSpec, a ParallelConfig, a
    BatchConfig, a ClusterSpec, OverlapKnobs; ``batch``, ``cluster`` and ``knobs`` may be
    None): the entry check of every function that takes them (:func:`build_step`,
    :func:`ccoverlap.parallel.memory.estimate_memory`, a workload)."""
    wanted = [("model", model, ModelSpec, "ccoverlap.catalog.models.get_model(name) gives one"),
              ("parallel", parallel, ParallelConfig, "ParallelConfig(tp=..., dp=...)"),
              ("batch", batch, BatchConfig, "BatchConfig(global_batch=...)"),
              ("cluster", cluster, ClusterSpec, "ccoverlap.catalog.hardware.get_cluster(name) gives one"),
              ("knobs", knobs, OverlapKnobs, "OverlapKnobs(...)")]
    for name, value, cls, how in wanted:
        if not isinstance(value, cls) and (value is not None or name in ("model", "parallel")):
            article = "an" if cls.__name__[0] in "AEIOU" else "a"
            raise ConfigError(f"{name} must be {article} {cls.__name__} ({how}), got {short(value)}")
    parallel.validate(model, cluster, batch)


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """``global_batch`` sequences per optimizer step, ``micro_batch`` sequences per
    forward/backward pass on one rank, ``seq_len`` tokens per sequence."""

    global_batch: Size
    micro_batch: Size = 1
    seq_len: Size = 2048

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step (global)."""
        return self.global_batch * self.seq_len

    def microbatches(self, dp: int) -> int:
        """Micro-batches per rank per step: global_batch / (dp × micro_batch), which must be integral."""
        per = dp * self.micro_batch
        if self.global_batch % per:
            raise ConfigError(f"global_batch={self.global_batch} must be a multiple of dp x micro_batch = "
                              f"{dp} x {self.micro_batch} = {per}")
        return self.global_batch // per

    def problems(self, p: ParallelConfig) -> list[str]:
        """Problems of this batch under parallel config ``p`` (one sentence each)."""
        out = []
        per = p.dp * self.micro_batch
        if self.global_batch % per:
            out.append(f"global_batch={self.global_batch} must be a multiple of dp x micro_batch = "
                       f"{p.dp} x {self.micro_batch} = {per}")
            return out
        m = self.global_batch // per
        if p.sequence_parallel and self.seq_len % (p.tp * p.cp):
            div = f"tp={p.tp}" if p.cp == 1 else f"tp x cp = {p.tp * p.cp}"
            out.append(f"sequence parallelism needs seq_len ({self.seq_len}) divisible by {div}")
        if p.cp > 1 and self.seq_len % (2 * p.cp):
            out.append(f"cp={p.cp}: seq_len ({self.seq_len}) must be divisible by 2 x cp = {2 * p.cp} "
                       f"(each CP rank holds two load-balanced chunks of the causal sequence, as Megatron-LM)")
        if p.pp_schedule == "interleaved" and p.pp > 1 and m % p.pp:
            out.append(f"the interleaved schedule needs the number of micro-batches ({m}) to be a multiple "
                       f"of pp={p.pp}")
        elif p.pp_schedule == "interleaved" and p.pp > 1 and p.pp_group and (m % p.pp_group or p.pp_group > m):
            out.append(f"pp_group={p.pp_group} must divide the number of micro-batches ({m})")
        if p.pp_schedule == "dualpipe" and (m % 2 or m < 2 * p.pp):
            out.append(f"DualPipe needs an even number of micro-batches >= 2 x pp = {2 * p.pp}, got {m}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (field name -> value)."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class OverlapKnobs:
    """The overlap knobs real frameworks expose.

    ``overlap``: False = no overlap at all (every collective blocks on the compute stream).
    ``bucket_cap_mb``: DDP gradient bucket size in MiB (PyTorch default 25; the first bucket
    is 1 MiB as in PyTorch DDP). ``fsdp_prefetch``: how many units ahead an all-gather is
    issued, forward and backward (0 = none: each unit's all-gather blocks its compute).
    ``fsdp_fetch``: ``"unit"`` (PyTorch FSDP: one all-gather per wrapped unit, prefetched
    ``fsdp_prefetch`` units ahead) or ``"parameter"`` (DeepSpeed ZeRO-3: one all-gather per
    parameter tensor at its submodule's hook, the next tensors prefetched up to 5e7 elements,
    gradients reduce-scattered in buckets of 5e8 elements;
    :mod:`ccoverlap.parallel.zero3`; ``fsdp_prefetch`` is then not used; with ``overlap=False``
    every all-gather blocks and the two are the same). ``zero3_host_ahead`` (with
    ``fsdp_fetch="parameter"``): the hooks run on the host ahead of the GPU, as DeepSpeed's do,
    so all-gathers wait for no computation and queue on the communicator with the
    reduce-scatters in the host's issue order, up to ``stage3_max_live_parameters`` ahead;
    False: each hook runs when the computation reaches it (all-gather B issued beside MatMul A,
    Centauri Fig. 3).
    ``fsdp_limit_all_gathers``: most unsharded units alive at once (FSDP1
    ``limit_all_gathers`` rate limiter / FSDP2 buffer reuse). ``fsdp_reshard_after_forward``:
    free gathered parameters after forward (all-gather again in backward).
    ``tp_overlap``: ``"chunked"`` decomposes AG+GEMM and GEMM+RS (or +AR) into ``tp_chunks``
    pieces pipelined on two streams; ``"symm_mem"`` is PyTorch's async TP (symmetric-memory
    fused all-gather+matmul / matmul+reduce-scatter, with sequence parallelism): one step per
    TP rank, each moving one shard by a copy-engine peer copy; ``"userbuffers"`` is
    TransformerEngine's userbuffers overlap (Megatron-Core ``--tp-comm-overlap``, with sequence
    parallelism): ring-exchange copy-engine all-gathers, reduce-scatters pipelined in 4 pieces
    on 16 SMs, bulk overlaps in backward (:mod:`ccoverlap.parallel.tp`). ``ep_overlap``: split each micro-batch in two and
    overlap one half's all-to-all with the other half's compute (DualPipe / two-batch
    overlap). ``pp_p2p_overlap``: pipeline sends/receives on their own streams (False:
    blocking on the compute stream). ``overlap_grad_reduce``: DDP gradient buckets are
    reduced as soon as their gradients are ready, on their own stream (PyTorch DDP;
    Megatron-Core ``--overlap-grad-reduce``); False: after the rank's whole backward, on the
    compute stream (Megatron-LM before that flag, e.g. at ``e6d7e09``: ``reduce_model_grads``
    after ``forward_backward_func``; DeepSpeed ZeRO-1/2 with ``overlap_comm`` false).
    ``overlap_param_gather``: with a sharded optimizer (``distributed_optimizer``, DDP or HSDP)
    the updated parameters are all-gathered at the start of the next step, each unit's first
    forward waiting for its own (Megatron-Core ``--overlap-param-gather``); False: blocking,
    after the optimizer step (Megatron-LM ``gather_model_params`` at ``e6d7e09``; DeepSpeed
    ZeRO-1/2 all-gathers the updated partitions at the end of ``step``). ``comm_config`` applies to every collective;
    ``comm_config_overrides`` maps a group name (``tp``, ``dp``, ``ep``, ``edp``, ``pp``, ...)
    to its own CommConfig (a dict is accepted and stored as sorted pairs, so knobs stay hashable).
    """

    overlap: bool = True
    bucket_cap_mb: BucketMiB = 25.0
    fsdp_prefetch: SmallCount0 = 1
    fsdp_fetch: FSDPFetch = "unit"
    zero3_host_ahead: bool = False
    fsdp_limit_all_gathers: SmallCount = 2
    fsdp_reshard_after_forward: bool = True
    tp_overlap: TPOverlap = "none"
    tp_chunks: SmallCount = 4
    ep_overlap: bool = False
    pp_p2p_overlap: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    comm_config: CommConfig = field(default_factory=CommConfig)
    comm_config_overrides: tuple = ()
    comm_transport: Transport = "sm"

    def __post_init__(self) -> None:
        ov = self.comm_config_overrides  # a mapping is stored as sorted (group, CommConfig) pairs
        try:
            ov = tuple((str(k), v) for k, v in (sorted(ov.items()) if isinstance(ov, dict) else ov))
        except (TypeError, ValueError):
            raise ConfigError("comm_config_overrides must map group names to CommConfig") from None
        problems = [f"comm_config_overrides[{short(k)}] must be a CommConfig, got {type(v).__name__}"
                    for k, v in ov if not isinstance(v, CommConfig)]
        if problems:
            raise ConfigError("; ".join(problems))
        object.__setattr__(self, "comm_config_overrides", ov)
        check_fields(self)  # types, ranges and choices: the annotations above, as for a config file
        if self.zero3_host_ahead and self.fsdp_fetch != "parameter":
            raise ConfigError("zero3_host_ahead needs fsdp_fetch='parameter' (it times DeepSpeed ZeRO-3's "
                              "per-tensor fetches)")

    def config_for(self, group: str) -> CommConfig:
        """The CommConfig for collectives on group ``group``."""
        for k, v in self.comm_config_overrides:
            if k == group:
                return v
        return self.comm_config

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form; CommConfigs become mappings, overrides a group -> mapping dict."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["comm_config"] = asdict(self.comm_config)
        d["comm_config_overrides"] = {k: asdict(v) for k, v in self.comm_config_overrides}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "knobs") -> OverlapKnobs:
        """Knobs from a mapping (``comm_config`` and overrides may be nested mappings)."""

        data = check_keys(d, field_names(cls), where)

        def cc(v: Any, w: str) -> CommConfig:
            if isinstance(v, CommConfig):
                return v
            return dataclass_from_mapping(CommConfig, v, f"{where}.{w}")

        if "comm_config" in data:
            data["comm_config"] = cc(data["comm_config"], "comm_config")
        if "comm_config_overrides" in data:
            ov = data["comm_config_overrides"]
            if not isinstance(ov, dict):
                raise ConfigError(f"{where}.comm_config_overrides: expected a mapping of group name to CommConfig")
            data["comm_config_overrides"] = tuple(sorted(
                (str(k), cc(v, f"comm_config_overrides[{short(k)}]")) for k, v in ov.items()))
        return dataclass_from_mapping(cls, data, where)


# ----------------------------------------------------------------------------- step size

#: Operations per micro-batch and layer of a simulated step (forward + backward, compute and
#: communication), measured on the step builder: 21-41 without TP overlap (DDP/FSDP, PP, CP,
#: MoE); TP overlap adds ~14 per chunk (chunked) or per TP rank (symm_mem, userbuffers); EP overlap doubles it.
OPS_PER_LAYER = 48
OPS_PER_TP_PIECE = 16


def max_step_ops() -> int:
    """:data:`MAX_STEP_OPS`, or the positive integer in ``CCOVERLAP_MAX_STEP_OPS``."""
    text = os.environ.get("CCOVERLAP_MAX_STEP_OPS", "")
    return int(text) if text.isdigit() and int(text) > 0 else MAX_STEP_OPS


def estimate_step_ops(layers: int, p: ParallelConfig, b: BatchConfig, knobs: OverlapKnobs | None = None) -> int:
    """Operations a simulated step of a ``layers``-layer model under ``p`` and ``b`` has, about
    (micro-batches per pipeline x layers x ops per micro-batch and layer; exact integers, so a
    huge batch is counted, never built)."""
    microbatches = -(-b.global_batch // (p.dp * b.micro_batch))
    per_layer = OPS_PER_LAYER
    if knobs is not None and p.tp > 1 and knobs.tp_overlap != "none":
        per_layer += OPS_PER_TP_PIECE * (knobs.tp_chunks if knobs.tp_overlap == "chunked" else p.tp)
    if knobs is not None and knobs.ep_overlap and p.ep > 1:
        per_layer *= 2
    return microbatches * layers * per_layer + 1000


def check_step_size(layers: int, p: ParallelConfig, b: BatchConfig, knobs: OverlapKnobs | None = None) -> None:
    """ConfigError when the step would have more than :func:`max_step_ops` operations: said
    before anything is built, with what makes it large."""
    n, limit = estimate_step_ops(layers, p, b, knobs), max_step_ops()
    if n > limit:
        microbatches = -(-b.global_batch // (p.dp * b.micro_batch))
        raise ConfigError(f"the step would have about {n:.3g} operations ({microbatches} micro-batches x "
                          f"{layers} layers), more than the {limit:,} the simulator builds; use fewer "
                          f"micro-batches (smaller global_batch, larger micro_batch or dp) or set "
                          f"CCOVERLAP_MAX_STEP_OPS")
