"""How ops running at the same time on one GPU slow each other (lagom §3.2, eqs. 4–6; ficco §IV-D).

Communication beside computation (lagom §3.2):

* **SM competition** (eq. 5): an SM-driven collective on NC channels holds NC thread blocks,
  one SM each (``comm_sm_fraction_per_channel``), so a GEMM beside it has ``λ − NC`` SMs and
  needs more waves. NT barely matters (``nt_contention_coeff``, lagom's finding).
* **Global resource competition** (eq. 6): the collective moves HBM bytes at
  ``V(NC, C) = rate × bytes-per-wire-byte``; its rate grows with NC and C (comm.py), so V
  does, and the GEMM's per-wave memory time uses ``B̄ − V``. Its channels' FIFOs
  (``NC × C × l2_inflight_chunks`` bytes) stay hot in L2: once they no longer fit beside the
  GEMM's working set (``l2_gemm_working_set`` of L2) they evict its operand panels, and the
  GEMM's HBM traffic grows by up to ``l2_pollution_penalty`` (:func:`l2_share_taken`) —
  larger C, more contention even where the rate has saturated.
* **Wave quantisation at the launch tile and the power-capped clock**: a GEMM library picks
  its tile (and so its thread-block count) for the whole GPU at launch; it does not know
  that communication holds SMs. So the GEMM beside communication keeps the tile it takes
  alone (:func:`launch_tile`), and a one-wave GEMM whose SMs are taken becomes two waves
  (the forum's "tail effect": 132 blocks on 132 - 24 SMs). A wave that leaves SMs idle runs
  at a higher clock, because the chip is power-capped at full load
  (``full_load_clock_fraction``, :func:`clock_fraction`), so the second wave costs less
  than the first.
* **Copy engines** (ficco §IV-D): DMA communication takes no SMs but still takes memory
  bandwidth, and pollutes L2 less (``dma_l2_pollution_fraction``).

Computation beside communication, dispatch: the block scheduler places a running kernel's
pending thread blocks before a later kernel's of the same stream priority, so a
communication kernel launched beside a multi-wave GEMM whose blocks cannot share an SM with
its own gets SMs only once the GEMM has no blocks left to place, at the start of its last
wave (:func:`dispatch_delay_s`), and then holds them. Our H200 sweep shows it: beside an
8192³ GEMM of 16 waves (1.38 ms), a stand-in copy of 0.08-0.35 ms alone (NC 16-64, C <= 256
KiB) ends 1.55-1.63 ms after both start; ROCm/mori's RCCL all-gathers beside a GEMM each take
0.31-0.48 ms longer over a 16x range of sizes. The simulator does not apply it yet (its
engine would delay a collective's start); ``ccoverlap reproduce --paper contention`` does.

Computation beside communication (ficco §IV-D2): the collective's time grows by
``1 + κ·u`` with u the HBM utilisation of the ops beside it, and by the shortfall when the
bandwidth left to it is less than it needs. Collectives sharing a link level (intra/inter)
share its bandwidth. Compute kernels beside each other split SMs and bandwidth evenly.

Everything here is a pure function of specs and the ops' stand-alone profiles, so the
simulator can cache by ``(spec, concurrent)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, TypeGuard

from ccoverlap.catalog.hardware import ClusterSpec, GPUSpec
from ccoverlap.cost.comm import DEFAULT_CHANNELS, DEFAULT_CHUNK, DEFAULT_THREADS, REDUCING
from ccoverlap.cost.compute import GpuMemo, attention_time_s, gemm_time_s, gemm_waves, memory_time_s, tile_candidates
from ccoverlap.cost.params import CostParams
from ccoverlap.specs import AttentionSpec, CollectiveSpec, CopySpec, GemmSpec, MemorySpec, P2PSpec, Spec

COMPUTE_SPECS = (GemmSpec, AttentionSpec, MemorySpec)


def is_sm_comm(spec: Spec) -> TypeGuard[CollectiveSpec | P2PSpec]:
    """True for a collective / p2p driven by SM thread blocks (NCCL kernels)."""
    return isinstance(spec, (CollectiveSpec, P2PSpec)) and spec.transport == "sm"


def is_dma(spec: Spec) -> TypeGuard[CollectiveSpec | P2PSpec | CopySpec]:
    """True for work done by copy engines: DMA collectives / p2p and CopySpec copies."""
    return isinstance(spec, CopySpec) or (isinstance(spec, (CollectiveSpec, P2PSpec)) and spec.transport == "dma")


def nt_factor(threads: int | None, params: CostParams) -> float:
    """Tiny NT effect on contention (lagom §3.2): ``1 + coeff·(NT/512 − 1)``."""
    nt = DEFAULT_THREADS if threads is None else threads
    return max(0.0, 1.0 + params.nt_contention_coeff * (nt / DEFAULT_THREADS - 1.0))


def _channels(spec: CollectiveSpec | P2PSpec, cluster: ClusterSpec | None) -> int:
    if spec.config.channels is not None:
        return spec.config.channels
    if cluster is None:
        return DEFAULT_CHANNELS["nvswitch"]
    if isinstance(spec, P2PSpec):
        return 2 if spec.inter_node else DEFAULT_CHANNELS.get(cluster.intra.fabric, 2)
    fabric = cluster.intra.fabric if spec.group.local_size > 1 else cluster.inter.fabric
    return DEFAULT_CHANNELS.get(fabric, 2)


def comm_sms(spec: Spec, cluster: ClusterSpec | None = None, params: CostParams | None = None) -> float:
    """SMs a communication op holds (lagom eq. 5's NC): ``NC × comm_sm_fraction_per_channel ×
    nt_factor`` for SM-driven collectives and p2p; 0 for DMA, copies and compute. Unset NC
    takes the cluster's NCCL default (16, NVSwitch's, when no cluster is given)."""
    if not is_sm_comm(spec):
        return 0.0
    p = params if params is not None else CostParams()
    return _channels(spec, cluster) * p.comm_sm_fraction_per_channel * nt_factor(spec.config.threads, p)


def l2_footprint_fraction(spec: Spec, cluster: ClusterSpec, params: CostParams) -> float:
    """A communication/copy op's in-flight data in units of the GPU's L2 (may exceed 1):
    ``NC × min(C, bytes) × l2_inflight_chunks / L2`` for SM-driven ops (lagom §3.2: grows
    with NC and C); copy engines stream ``min(bytes, L2)`` scaled by
    ``dma_l2_pollution_fraction``."""
    l2 = cluster.gpu.l2_bytes
    if is_sm_comm(spec):
        chunk = spec.config.chunk_bytes or DEFAULT_CHUNK[spec.config.protocol or "simple"]
        inflight = _channels(spec, cluster) * min(chunk, max(float(spec.bytes), 1.0)) * params.l2_inflight_chunks
        return inflight * nt_factor(spec.config.threads, params) / l2
    if is_dma(spec):
        return params.dma_l2_pollution_fraction * min(1.0, float(spec.bytes) / l2)
    return 0.0


def l2_share_taken(footprint: float, params: CostParams) -> float:
    """Share of a GEMM's L2 working set that in-flight communication data of ``footprint``
    (in units of L2, see :func:`l2_footprint_fraction`) evicts: the GEMM keeps its hot
    operands in ``w = l2_gemm_working_set`` of L2, so buffers up to ``1 - w`` of L2 fit
    beside them and take nothing; beyond that they take ``(F - (1 - w)) / w`` of the working
    set, all of it once they fill L2. ``w = 1`` charges any footprint linearly."""
    w = params.l2_gemm_working_set
    return min(1.0, max(0.0, (float(footprint) - (1.0 - w)) / w))


def hbm_bytes_per_wire_byte(spec: Spec, params: CostParams) -> float:
    """Local HBM bytes a communication op moves per byte it puts on the wire."""
    if is_dma(spec):
        return params.dma_hbm_bytes_per_wire_byte
    extra = params.comm_reduce_extra_hbm_bytes if (
        isinstance(spec, CollectiveSpec) and spec.collective in REDUCING) else 0.0
    return params.comm_hbm_bytes_per_wire_byte + extra


@dataclass(frozen=True)
class Profile:
    """An op alone on an idle GPU: ``time_s``, its HBM demand ``hbm_bytes_per_s`` (V for
    communication), SMs held, L2 share its buffers take, and link ``levels`` it uses."""

    time_s: float
    hbm_bytes_per_s: float = 0.0
    sms: float = 0.0
    l2_fraction: float = 0.0
    levels: frozenset = frozenset()


def clock_fraction(busy_sms: float, gpu: GPUSpec, params: CostParams) -> float:
    """SM clock with ``busy_sms`` SMs at GEMM load, as a fraction of the boost clock: the chip's
    power grows with busy SMs x clock and is capped where every SM runs at
    ``full_load_clock_fraction`` f, so ``min(1, f × SMs / busy)`` (1 when f is 1: no cap)."""
    f = params.full_load_clock_fraction
    busy = min(max(float(busy_sms), 1.0), float(gpu.sms))
    return min(1.0, f * gpu.sms / busy)


def launch_tile(spec: GemmSpec, gpu: GPUSpec, params: CostParams) -> tuple[int, int]:
    """The ``(tile_m, tile_n)`` the GEMM runs with alone: the library chooses it at launch for
    the whole GPU, and keeps it when communication later holds some of the SMs."""
    return _at_launch(spec, gpu, params)[1]


class _AtLaunch(NamedTuple):
    """What a GEMM's time under contention scales: its time alone, its launch tile and that
    tile's count, its time alone at that tile, and its clock-weighted waves per wave alone."""

    alone_s: float
    tile: tuple[int, int]
    tiles: int
    at_tile_alone_s: float
    waves_alone: float


_AT_LAUNCH: GpuMemo[_AtLaunch] = GpuMemo()


def _at_launch(spec: GemmSpec, gpu: GPUSpec, params: CostParams) -> _AtLaunch:
    """:class:`_AtLaunch` of the GEMM, cached like the GEMM times themselves (:class:`GpuMemo`:
    a fit or a plan asks for one GEMM beside many communication configurations)."""
    hit = _AT_LAUNCH.get((spec, params), gpu)
    if hit is not None:
        return hit
    best: tuple[float, tuple[int, int], float] | None = None
    for tm, tn, eff in tile_candidates(params):
        t = gemm_time_s(spec, gpu, params, tile=(tm, tn))
        if best is None or t / eff < best[0]:
            best = (t / eff, (tm, tn), t)
    assert best is not None
    _, tile, at_tile = best
    tiles = _run_tiles(spec, *tile)
    waves_alone = _clocked_waves(tiles, float(gpu.sms), gpu, params) / gemm_waves(tiles, gpu.sms, params.gemm_tiles_per_sm)
    return _AT_LAUNCH.put((spec, params), gpu,
                          _AtLaunch(gemm_time_s(spec, gpu, params), tile, tiles, at_tile, waves_alone))


def _run_tiles(spec: GemmSpec, tm: int, tn: int) -> int:
    """Tiles of ``tm x tn`` in the run of waves the GEMM belongs to: its own, or those of all
    ``packed_pieces`` pieces packed together (:class:`~ccoverlap.specs.GemmSpec`)."""
    return math.ceil(spec.m * spec.packed_pieces / tm) * math.ceil(spec.n / tn) * spec.batch


def _clocked_waves(tiles: int, sms_gemm: float, gpu: GPUSpec, params: CostParams) -> float:
    """Waves of ``tiles`` on ``sms_gemm`` SMs, each weighted by 1 / its clock (in units of a
    full-load wave). The SMs not given to the GEMM are taken to be busy throughout
    (communication, other kernels); the last, partial wave leaves its own idle SMs and runs
    faster when the chip is power-capped."""
    tpsm = max(int(params.gemm_tiles_per_sm), 1)
    waves = gemm_waves(tiles, sms_gemm, tpsm)
    others = float(gpu.sms) - sms_gemm
    last = tiles - (waves - 1) * sms_gemm * tpsm
    f_ref = params.full_load_clock_fraction
    f_full = clock_fraction(min(tiles / tpsm, sms_gemm) + others, gpu, params)
    f_last = clock_fraction(last / tpsm + others, gpu, params)
    return (waves - 1) * f_ref / f_full + f_ref / f_last


def gemm_time_under_s(spec: GemmSpec, gpu: GPUSpec, params: CostParams, *, sms_available: float,
                      hbm_bytes_per_s_available: float, l2_pollution: float) -> float:
    """Seconds a GEMM takes on ``sms_available`` SMs (the rest held by communication or other
    kernels) with
    ``hbm_bytes_per_s_available`` and ``l2_pollution`` (lagom eqs. 4-6): its stand-alone time
    × the slowdown at its :func:`launch_tile` (waves at that tile's block count) × the ratio of
    clock-weighted waves beside and alone (:func:`clock_fraction`)."""
    a = _at_launch(spec, gpu, params)
    at_tile_under = gemm_time_s(spec, gpu, params, tile=a.tile, sms_available=sms_available,
                                hbm_bytes_per_s_available=hbm_bytes_per_s_available, l2_pollution=l2_pollution)
    sms_gemm = min(max(float(sms_available), 1.0), float(gpu.sms))
    w_under = _clocked_waves(a.tiles, sms_gemm, gpu, params) / gemm_waves(a.tiles, sms_gemm, params.gemm_tiles_per_sm)
    return a.alone_s * (at_tile_under / a.at_tile_alone_s) * (w_under / a.waves_alone)


def compute_time_under_s(spec: Spec, gpu: GPUSpec, params: CostParams, *, sms_taken: float,
                         hbm_taken: float, l2_fraction: float, sharers: int) -> float:
    """Seconds a compute op takes while communication holds ``sms_taken`` SMs (eq. 5),
    moves ``hbm_taken`` bytes/s (eq. 6's V), fills ``l2_fraction`` of L2, and ``sharers``
    compute kernels (itself included) split what is left evenly."""
    k = max(1, sharers)
    sms = max(1.0, gpu.sms - sms_taken) / k
    b_ach = gpu.hbm_bytes_per_s * params.mem_bw_fraction
    bw = max(params.min_bandwidth_share * b_ach, b_ach - hbm_taken) / k
    if isinstance(spec, GemmSpec):
        pollution = params.l2_pollution_penalty * l2_share_taken(l2_fraction, params)
        return gemm_time_under_s(spec, gpu, params, sms_available=sms, hbm_bytes_per_s_available=bw,
                                 l2_pollution=pollution)
    if isinstance(spec, AttentionSpec):
        pollution = params.l2_pollution_penalty * l2_share_taken(l2_fraction, params)
        return attention_time_s(spec, gpu, params, sms_available=sms, hbm_bytes_per_s_available=bw,
                                l2_pollution=pollution)
    if not isinstance(spec, MemorySpec):
        raise TypeError(f"compute_time_under_s takes a compute op, not {type(spec).__name__}")
    return memory_time_s(spec, gpu, params, sms_available=sms, hbm_bytes_per_s_available=bw)


def comm_time_under_s(alone_s: float, own_hbm: float, other_hbm: float, link_sharers: int,
                      gpu: GPUSpec, params: CostParams, *, dma: bool) -> float:
    """Seconds a communication/copy op takes beside others (ficco §IV-D2): its stand-alone
    time × ``(1 + κ·u)`` (u = others' HBM demand / achievable bandwidth, capped at 1) ×
    bandwidth shortfall ``max(1, own / left)`` × ``link_sharers`` (ops sharing its link level,
    itself included, split the link)."""
    b_ach = gpu.hbm_bytes_per_s * params.mem_bw_fraction
    u = min(1.0, other_hbm / b_ach)
    kappa = params.dma_compute_interference if dma else params.comm_compute_interference
    left = max(params.min_bandwidth_share * b_ach, b_ach - other_hbm)
    shortfall = max(1.0, own_hbm / left)
    return alone_s * (1.0 + kappa * u) * shortfall * max(1, link_sharers)


def dispatch_delay_s(spec: Spec, gpu: GPUSpec, params: CostParams) -> float:
    """Seconds a communication kernel launched together with compute op ``spec`` waits for
    SMs (module docstring): for a GEMM of W waves at its :func:`launch_tile`, its stand-alone
    time × (W - 1) / W (the waves before its last); 0 for a one-wave GEMM and for other ops."""
    if not isinstance(spec, GemmSpec):
        return 0.0
    a = _at_launch(spec, gpu, params)
    waves = gemm_waves(a.tiles, gpu.sms, params.gemm_tiles_per_sm)
    return a.alone_s * (waves - 1) / waves
