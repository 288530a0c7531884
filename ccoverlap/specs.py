"""What an operation of a training step computes or moves: the specs the cost model prices.

A *spec* is plain data: a GEMM's shape, an attention kernel's sequence and heads, a
memory-bound kernel's bytes, a collective's type, size, group and NCCL configuration, a
point-to-point transfer or a copy. The cost model (:mod:`ccoverlap.cost`) turns a spec into
seconds; the step graph (:mod:`ccoverlap.sim.graph`) orders operations that carry one. Specs sit
below both, so the cost model needs nothing of the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union, get_args

from ccoverlap.config import Dim, Dim0, ElementBytes, NonNegative, Threads, check_fields
from ccoverlap.errors import ConfigError

# Op kinds, the same vocabulary as a Timeline's ``kind`` column.
COMPUTE = "compute"
COMM = "comm"
MEMCPY = "memcpy"

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"]
CommProtocol = Literal["simple", "ll", "ll128"]  # NCCL's protocols
Transport = Literal["sm", "dma"]  # SM-driven kernels (NCCL) or copy engines (cudaMemcpyAsync)
COLLECTIVES = get_args(Collective)
PROTOCOLS = get_args(CommProtocol)
TRANSPORTS = get_args(Transport)


@dataclass(frozen=True, kw_only=True)
class GemmSpec:
    """C[m, n] = A[m, k] @ B[k, n], ``batch`` independent times; operands ``dtype_bytes`` wide.

    ``accumulate`` marks a piece of a K-split GEMM that adds into an existing C (reads C as
    well as writing it: the extra traffic of ficco §IV-C's K-decomposition).

    ``packed_pieces`` > 1 marks one of that many equal pieces (cut along M) whose kernels are
    issued on several compute streams, so that one piece's last partial wave fills with the
    next piece's tiles: each piece is charged 1 / ``packed_pieces`` of the pieces' tiles run
    together (wave quantisation on their sum, not per piece; :func:`ccoverlap.cost.compute.gemm_time_s`)."""

    m: Dim
    n: Dim
    k: Dim
    batch: Dim = 1
    dtype_bytes: ElementBytes = 2
    accumulate: bool = False
    host_kernels: Dim0 = 0  # kernels eager PyTorch dispatches from the host for this op (0: not host-bound)
    packed_pieces: Dim = 1  # equal M-pieces whose waves pack across compute streams (1: runs alone)

    def __post_init__(self) -> None:
        check_fields(self, "GEMM")

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def bytes(self) -> float:
        """Minimum HBM traffic: read A and B once, write C once."""
        return float(self.batch * (self.m * self.k + self.k * self.n + self.m * self.n) * self.dtype_bytes)


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """A fused (flash) attention kernel: its FLOPs and HBM bytes, computed by the model builder."""

    flops: NonNegative
    bytes: NonNegative
    dtype_bytes: ElementBytes = 2
    host_kernels: Dim0 = 0  # kernels eager PyTorch dispatches from the host for this op (0: not host-bound)
    backward: bool = False  # the backward kernel (lower efficiency than forward)
    # the backend: "native" = the GPU's own (cuDNN on Hopper, FA2 on Ampere), or one named:
    # FlashAttention-2 / -3, cuDNN fused attention, PyTorch SDPA's memory-efficient or math backend
    kernel: Literal["native", "fa2", "fa3", "cudnn", "efficient", "math"] = "native"
    causal_len: Dim0 = 0  # sequence length of a causal-masked kernel (0: no causal mask / unknown)
    # shape, when known (0: unknown, roofline only): (batch x query heads), query sequence, head dim;
    # sets how many query-block tiles the kernel has, for its wave / per-tile latency term
    heads: Dim0 = 0
    seq: Dim0 = 0
    head_dim: Dim0 = 0

    def __post_init__(self) -> None:
        check_fields(self, "attention")


@dataclass(frozen=True, kw_only=True)
class MemorySpec:
    """A memory-bound kernel (norm, activation, residual add, optimizer step): bytes read + written."""

    bytes: NonNegative
    flops: NonNegative = 0.0
    kernels: Dim = 1  # kernels this op stands for (an unfused element-wise chain: each pays a launch)
    # of ``bytes``, those moved by row-wise kernels (a fused norm, rotary embedding: one thread
    # block per token row, a reduction across it), which reach less bandwidth than streaming ones
    rowwise_bytes: NonNegative = 0.0
    rows: Dim0 = 0  # rows (tokens) the row-wise kernels run over, one thread block each (0: many)
    # bytes the row-wise kernels read a second time, beyond ``bytes``: a two-pass norm reads its
    # row once for the reduction (sum of squares), then again to normalise and write it
    reread_bytes: NonNegative = 0.0
    host_kernels: Dim0 = 0  # of them dispatched by eager PyTorch from the host (0: not host-bound)

    def __post_init__(self) -> None:
        check_fields(self, "memory-bound op")
        if self.rowwise_bytes > self.bytes:
            raise ConfigError(f"memory-bound op: rowwise_bytes ({self.rowwise_bytes}) exceeds bytes ({self.bytes})")
        if self.reread_bytes > self.rowwise_bytes:
            raise ConfigError(f"memory-bound op: reread_bytes ({self.reread_bytes}) exceeds rowwise_bytes "
                              f"({self.rowwise_bytes}): only a row-wise kernel reads its row again")


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """A process group's shape on the cluster: ``size`` ranks, ``local_size`` of them per node.

    ``size == local_size`` means the group lives inside one node (intra-node fabric only);
    otherwise it spans ``size // local_size`` nodes. ``name`` is the parallelism it serves
    (``"tp"``, ``"dp"``, ``"ep"``, ...) and shows up in timelines and reports.
    """

    name: str
    size: Dim
    local_size: Dim

    def __post_init__(self) -> None:
        check_fields(self, f"group {self.name!r}")
        if self.local_size > self.size or self.size % self.local_size:
            raise ConfigError(
                f"group {self.name!r}: local_size {self.local_size} must divide size {self.size}"
            )

    @property
    def nodes(self) -> int:
        return self.size // self.local_size

    @property
    def intra_node(self) -> bool:
        return self.nodes == 1


@dataclass(frozen=True, kw_only=True)
class CommConfig:
    """The resource knobs NCCL exposes for one collective (lagom §2.2, Table 1).

    ``channels`` NC (one SM / thread block each), ``threads`` NT per block, ``chunk_bytes`` C,
    ``protocol`` (simple | ll | ll128), ``algorithm`` (``"auto"`` lets the cost model choose
    ring/tree/... as NCCL's tuner would). ``None`` for a knob means the library default.
    """

    channels: Dim | None = None
    threads: Threads | None = None
    chunk_bytes: Dim | None = None
    protocol: CommProtocol | None = None
    algorithm: str = "auto"

    def __post_init__(self) -> None:
        check_fields(self, "comm config")


@dataclass(frozen=True, kw_only=True)
class CollectiveSpec:
    """A collective on ``group``. ``bytes`` is the message size as nccl-tests' ``size``:
    the full (output) buffer of all-gather, the input of reduce-scatter, the buffer of
    all-reduce / broadcast / reduce, the per-rank send buffer of all-to-all."""

    collective: Collective
    bytes: NonNegative
    group: GroupSpec
    config: CommConfig = field(default_factory=CommConfig)
    transport: Transport = "sm"

    def __post_init__(self) -> None:
        check_fields(self, "collective")


@dataclass(frozen=True, kw_only=True)
class P2PSpec:
    """A point-to-point transfer of ``bytes`` (pipeline activations / gradients, or one peer's
    shard of a symmetric-memory TP step). ``group`` names the parallelism it serves (timelines)."""

    bytes: NonNegative
    inter_node: bool
    config: CommConfig = field(default_factory=CommConfig)
    transport: Transport = "sm"
    group: str = "pp"

    def __post_init__(self) -> None:
        check_fields(self, "p2p")


@dataclass(frozen=True, kw_only=True)
class CopySpec:
    """A device copy on a copy engine (e.g. offload, or a DMA-driven collective piece)."""

    bytes: NonNegative
    direction: Literal["d2d", "h2d", "d2h"] = "d2d"

    def __post_init__(self) -> None:
        check_fields(self, "copy")


Spec = Union[GemmSpec, AttentionSpec, MemorySpec, CollectiveSpec, P2PSpec, CopySpec]


def kind_of(spec: Spec) -> str:
    """The Timeline kind (compute | comm | memcpy) of an op with this spec."""
    if isinstance(spec, (CollectiveSpec, P2PSpec)):
        return COMM
    if isinstance(spec, CopySpec):
        return MEMCPY
    return COMPUTE
