"""FiCCO's static schedule heuristic (FiCCO paper, §V-C and Figure 12(a)). Pure Python, no torch.

FiCCO ("Design Space Exploration of DMA based Finer-Grain Compute Communication Overlap")
moves 1/N-sized pieces of each shard all-to-all and offers four schedules (§V-B):

* ``uniform-fused-1d``  - every step gathers local + remote row pieces and runs one GEMM;
  low decomposition loss (DIL), high contention loss (CIL).
* ``hetero-fused-1d``   - the first step computes the local shard alone (hiding the first
  transfer), later steps run one GEMM on the remote pieces; medium DIL / medium CIL.
* ``hetero-unfused-1d`` - like hetero-fused, but one GEMM per received piece; higher DIL,
  lower CIL.
* ``uniform-fused-2d``  - pieces are column (K) blocks, accumulated with ``C += A_t B_t``.

The rule of §V-C, as written, reads only static quantities of the GEMM one GPU runs (§VI-A:
"the user provides only the GEMM inputs"; for tensor parallelism that is the weight's column
slice, e.g. N / 8 of a Table I row on 8 GPUs):

1. communication shape: 1-D (row / M sharding) if ``M > K``, else 2-D (column / K
   sharding), because row sharding has the larger DIL when ``M < K`` (§IV-C1);
2. among the 1-D schedules, the GEMM's op-to-byte ratio (OTB) and memory traffic (MT)
   are combined and compared with a machine threshold "in terms of its peak compute FLOPs
   (op-to-byte x memory bandwidth = FLOPs)": below the threshold -> ``uniform-fused-1d``;
   more than 5x above it -> ``hetero-unfused-1d``; otherwise ``hetero-fused-1d``.

The quantities, in the units the text gives them:

* ``MT  = (M*K + N*K + M*N) * dtype_bytes``  bytes (§IV-D1, "MK + NK + MN", in bytes);
* ``OTB = 2*M*N*K / MT``                     flop/byte (§IV-C1, ops and bytes from M, N, K);
* combined metric ``OTB * MT`` (flop), which for a GEMM equals its flop count ``2MNK``;
* machine threshold ``machine_OTB * mem_bw = peak_flops``: the same product for the GPU, its
  op-to-byte balance times its memory bandwidth. The paper compares the two numbers
  directly; with consistent units (flop and flop/s, or Tflop and Tflop/s) that is a
  reference time of one second (``reference_time_s``). On MI300X (1307 Tflop/s bf16) the
  threshold is 1.3e15 flop, above every Table I GEMM a GPU runs but g13's.

The paper characterised copy-engine (DMA) communication; ``comm_engine="dma"`` applies its
rule unchanged. Two additions serve runtimes outside that setting and are off in it:
``comm_engine="sm"`` narrows the uniform band (:data:`SM_UNIFORM_BAND_SCALE`), and with
``link_bw_bytes_per_s`` a step 0 answers ``serial`` when overlap cannot pay for its losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ccoverlap.config import short
from ccoverlap.errors import ConfigError

__all__ = [
    "FICCO_SCHEDULES",
    "HETERO_UNFUSED_FACTOR",
    "REFERENCE_TIME_S",
    "SM_UNIFORM_BAND_SCALE",
    "OVERLAP_LOSS_DMA",
    "OVERLAP_LOSS_SM",
    "COMM_DIL",
    "overlap_gain_ratio",
    "GemmStats",
    "gemm_stats",
    "choose_schedule",
]

#: The four FiCCO schedules studied in §V-B (Figure 11(b)), by the names the runtime uses.
FICCO_SCHEDULES = ("uniform-fused-1d", "hetero-fused-1d", "hetero-unfused-1d", "uniform-fused-2d")

#: §V-C: hetero-unfused-1D "is assigned when the combined metric exceeds the threshold by 5x".
HETERO_UNFUSED_FACTOR = 5.0

#: Reference time that turns the machine threshold (peak FLOP/s) into flop: one second, i.e.
#: the two numbers compared as §V-C states them (see the module docstring).
REFERENCE_TIME_S = 1.0

#: Not from the paper (SM-driven communication only): the heuristic was characterised with DMA
#: (copy-engine) communication (§IV-B1); with SM-driven collectives (NCCL/RCCL kernels, or
#: any software transport such as gloo) CIL is "far" higher (§IV-D1, Figure 9), so the band
#: given to the high-CIL ``uniform-fused-1d`` schedule is shrunk by this factor.
#: Set it to 1.0 to apply the paper's DMA thresholds unchanged.
SM_UNIFORM_BAND_SCALE = 0.5

#: "Overlap cannot help" (our step 0, built from FiCCO §IV's loss characterisation; the paper's
#: heuristic always picks a FiCCO schedule). Overlap can at best hide the whole transfer,
#: ``T_comm``, while decomposing costs the GEMM its contention loss (CIL: FiCCO geomean 1.11x
#: slowdown, §IV-D1) plus its decomposition loss (DIL, a few % at 8-way, Fig. 7) and the
#: transfer its own DIL (geomean ~10%, §IV-C2, :data:`COMM_DIL`). So overlap pays only when
#: ``T_comm * (1 - COMM_DIL) > loss * T_gemm``; below that -> ``serial``. ``loss`` is our reading:
#: 0.11 CIL + 0.05 DIL with copy-engine transfers, and twice the CIL with SM-driven (kernel or
#: CPU-thread) transfers, whose contention the paper measures "far" higher (§IV-D1, Fig. 9).
OVERLAP_LOSS_DMA = 0.16
OVERLAP_LOSS_SM = 0.27
COMM_DIL = 0.10


def overlap_gain_ratio(m: int, n: int, k: int, world_size: int, dtype_bytes: int, *,
                       peak_flops: float, link_bw_bytes_per_s: float) -> float:
    """``T_comm / T_gemm`` at datasheet rates: the share of the GEMM time that overlap could hide.

    ``T_comm`` = bytes each rank receives, ``(P-1)/P * m * k * dtype_bytes`` (the all-gathered
    ``[m, k]`` operand, or the reduce-scattered ``[m, k]`` output for the mirrored op) over
    ``link_bw_bytes_per_s``; ``T_gemm`` = ``2mnk / peak_flops``. Dimensionless.
    """
    _check_sizes("overlap_gain_ratio", m=m, n=n, k=k, world_size=world_size, dtype_bytes=dtype_bytes)
    _check_rates("overlap_gain_ratio", peak_flops=peak_flops, link_bw_bytes_per_s=link_bw_bytes_per_s)
    t_comm = (world_size - 1) / world_size * m * k * dtype_bytes / link_bw_bytes_per_s
    t_gemm = 2.0 * m * n * k / peak_flops
    return t_comm / t_gemm


@dataclass(frozen=True, kw_only=True)
class GemmStats:
    """Static GEMM quantities used by FiCCO §IV-C/§IV-D (units in the field names)."""

    flops: float  # 2*M*N*K
    mem_traffic_bytes: float  # (MK + NK + MN) * dtype_bytes
    op_to_byte: float  # flops / mem_traffic_bytes
    combined_flops: float  # op_to_byte * mem_traffic_bytes (the §V-C combined metric)


def gemm_stats(m: int, n: int, k: int, dtype_bytes: int) -> GemmStats:
    """Op-to-byte ratio and memory traffic of an ``[M,K] x [K,N]`` GEMM (FiCCO §IV-C1, §IV-D1).

    ``m``, ``n``, ``k`` are element counts; ``dtype_bytes`` is the element size in bytes.
    Returns flop, byte and flop/byte figures (see :class:`GemmStats`).
    """
    _check_sizes("gemm_stats", m=m, n=n, k=k, dtype_bytes=dtype_bytes)
    flops = 2.0 * m * n * k
    traffic = float(m * k + n * k + m * n) * dtype_bytes
    otb = flops / traffic
    return GemmStats(flops=flops, mem_traffic_bytes=traffic, op_to_byte=otb, combined_flops=otb * traffic)


def choose_schedule(
    m: int,
    n: int,
    k: int,
    world_size: int,
    dtype_bytes: int,
    *,
    peak_flops: float,
    mem_bw_bytes_per_s: float,
    comm_engine: str = "dma",
    hetero_unfused_factor: float = HETERO_UNFUSED_FACTOR,
    reference_time_s: float = REFERENCE_TIME_S,
    sm_uniform_band_scale: float = SM_UNIFORM_BAND_SCALE,
    link_bw_bytes_per_s: float | None = None,
    overlap_loss: float | None = None,
) -> tuple[str, str]:
    """Pick a FiCCO schedule for an all-gather + GEMM from static shapes (FiCCO §V-C, Fig. 12(a)).

    Arguments: the GEMM each rank runs after the all-gather is ``[M, K] x [K, N]`` (``m`` rows
    gathered over ``world_size`` ranks, so every shard has ``m / world_size`` rows); ``k`` is
    the dimension the 2-D schedule splits (the reduction dimension for all-gather + GEMM);
    ``dtype_bytes`` the element size; ``peak_flops`` the machine's peak in flop/s for this
    dtype; ``mem_bw_bytes_per_s`` its memory bandwidth in byte/s (the machine op-to-byte is
    ``peak_flops / mem_bw_bytes_per_s``, and op-to-byte x bandwidth = peak FLOPs, §V-C);
    ``comm_engine`` is ``"dma"`` (copy engines, the paper's setting) or ``"sm"``
    (kernel-driven collectives such as NCCL, or a CPU transport such as gloo).

    Returns ``(schedule_name, reason)``: one of :data:`FICCO_SCHEDULES`, or ``"serial"`` when
    there is a single rank, or ``"ring"`` when the shards are too small to cut into
    ``world_size`` pieces (FiCCO needs at least one row, or column, per piece). ``reason`` is
    one sentence with the numbers that decided it.

    With ``link_bw_bytes_per_s`` (byte/s each rank receives at) a step 0 runs first: when
    ``overlap_gain_ratio * (1 - COMM_DIL)`` is below ``overlap_loss`` (default
    :data:`OVERLAP_LOSS_DMA` / :data:`OVERLAP_LOSS_SM` by engine) the hidden communication
    cannot pay for the decomposition and contention losses, and the answer is ``"serial"``.
    """
    _check_machine_args(world_size, peak_flops, mem_bw_bytes_per_s, comm_engine)
    stats = gemm_stats(m, n, k, dtype_bytes)
    if world_size == 1:
        return "serial", "one rank: there is no communication to overlap"
    if link_bw_bytes_per_s is not None:
        serial = _serial_when_overlap_cannot_pay(m, n, k, world_size, dtype_bytes, peak_flops, link_bw_bytes_per_s,
                                                 comm_engine, overlap_loss)
        if serial is not None:
            return serial
    shape = _shape_step(m, k, world_size)
    if shape is not None:
        return shape
    return _intensity_step(stats, m, k, peak_flops, mem_bw_bytes_per_s, comm_engine, hetero_unfused_factor,
                           reference_time_s, sm_uniform_band_scale)


def _check_sizes(function: str, **sizes: object) -> None:
    """ConfigError naming ``function`` and the first of ``sizes`` (element counts, ranks, bytes
    per element) that is not a positive whole number."""
    for name, value in sizes.items():
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value) or value <= 0):
            raise ConfigError(f"{function}: {name} must be a positive integer, got {short(value)}")


def _check_rates(function: str, **rates: object) -> None:
    """ConfigError naming ``function`` and the first of ``rates`` (flop/s, byte/s) that is not a
    finite number > 0."""
    for name, value in rates.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(f"{function}: {name} must be a finite number > 0, got {short(value)}")


def _check_machine_args(world_size: int, peak_flops: float, mem_bw_bytes_per_s: float, comm_engine: str) -> None:
    """:func:`choose_schedule`'s argument checks: a ConfigError naming the bad argument."""
    if comm_engine not in ("dma", "sm"):
        raise ConfigError(f"choose_schedule: comm_engine must be 'dma' or 'sm', got {short(comm_engine)}")
    _check_sizes("choose_schedule", world_size=world_size)
    _check_rates("choose_schedule", peak_flops=peak_flops, mem_bw_bytes_per_s=mem_bw_bytes_per_s)


def _shape_step(m: int, k: int, world_size: int) -> tuple[str, str] | None:
    """Step 1 of :func:`choose_schedule` (§V-C, §IV-C1): 2-D when M <= K, ring when a shard is too small, else None."""
    rows_per_shard = m // world_size
    if m <= k and k >= world_size:
        return (
            "uniform-fused-2d",
            f"M={m} <= K={k}: row sharding has the larger decomposition loss, so FiCCO "
            "shards columns (2-D), where uniform-fused-2d is the only schedule (§V-C)",
        )
    if rows_per_shard < world_size:
        return (
            "ring",
            f"shard of {rows_per_shard} rows cannot be cut into {world_size} FiCCO pieces; "
            "shard-level ring overlap instead",
        )
    return None


def _intensity_step(stats: GemmStats, m: int, k: int, peak_flops: float, mem_bw_bytes_per_s: float,
                    comm_engine: str, hetero_unfused_factor: float, reference_time_s: float,
                    sm_uniform_band_scale: float) -> tuple[str, str]:
    """Step 2 of :func:`choose_schedule` (§V-C): the 1-D schedule from combined OTB x MT against peak FLOPs."""
    machine_otb = peak_flops / mem_bw_bytes_per_s
    threshold = peak_flops * reference_time_s
    band = threshold * (sm_uniform_band_scale if comm_engine == "sm" else 1.0)
    combined = stats.combined_flops
    detail = (
        f"OTB={stats.op_to_byte:.3g} flop/B x MT={stats.mem_traffic_bytes:.3g} B = {combined:.3g} "
        f"vs machine threshold {threshold:.3g} (OTB_machine={machine_otb:.3g} flop/B x BW, "
        f"{comm_engine} comm)"
    )
    if combined < band:
        return "uniform-fused-1d", f"M={m} > K={k}; low combined OTB and MT: {detail}"
    if combined > hetero_unfused_factor * threshold:
        return (
            "hetero-unfused-1d",
            f"M={m} > K={k}; combined OTB and MT above {hetero_unfused_factor:g}x threshold: {detail}",
        )
    return "hetero-fused-1d", f"M={m} > K={k}; combined OTB and MT between the bands: {detail}"


def _serial_when_overlap_cannot_pay(m: int, n: int, k: int, world_size: int, dtype_bytes: int, peak_flops: float,
                                    link_bw_bytes_per_s: float, comm_engine: str,
                                    overlap_loss: float | None) -> tuple[str, str] | None:
    """Step 0 of :func:`choose_schedule` (not in the paper): ``("serial", reason)`` when hiding the
    whole transfer saves less than the losses of decomposing, else None."""
    _check_rates("choose_schedule", link_bw_bytes_per_s=link_bw_bytes_per_s)
    loss = overlap_loss if overlap_loss is not None else (OVERLAP_LOSS_SM if comm_engine == "sm" else OVERLAP_LOSS_DMA)
    ratio = overlap_gain_ratio(m, n, k, world_size, dtype_bytes, peak_flops=peak_flops,
                               link_bw_bytes_per_s=link_bw_bytes_per_s)
    if ratio * (1.0 - COMM_DIL) >= loss:
        return None
    return (
        "serial",
        f"overlap cannot help: T_comm/T_gemm={ratio:.3g} at {link_bw_bytes_per_s:.3g} B/s and "
        f"{peak_flops:.3g} flop/s; hiding it saves at most {ratio * (1 - COMM_DIL):.3g} of the GEMM "
        f"time, less than the {loss:.2g} that decomposition and contention cost ({comm_engine} comm)",
    )
