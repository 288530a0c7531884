"""Compute kernel times: GEMMs with tile/wave quantisation, fused attention, memory-bound ops.

GEMM model (lagom §3.2, eqs. 4–6). The output is cut into ``tile_m × tile_n`` tiles, one
thread block (CTA) each; ``tiles_per_sm`` CTAs fit on an SM at once, so the kernel runs in

    waves g = ceil(tiles / (SMs_available × tiles_per_sm))                      (eq. 5)

and each wave takes

    f = max(θ, D/B) + (1 − overlap) · min(θ, D/B)                             (eq. 6)

where θ is the tile's main loop (``ceil(K/tile_k) + prologue/epilogue`` K-steps at one SM's
achievable FLOP rate: peak × ``gemm_peak_fraction`` × ``sustained_clock_fraction`` / SMs), D
the HBM bytes the wave moves (its A row-panels and B column-panels, shared across the wave's
tiles through L2, plus its output tiles, read too when accumulating), and B the HBM bandwidth
left to it. ``overlap = 0`` is eq. 6 verbatim (θ + D/B); the default hides most of the
shorter term, as multistage pipelines do. The kernel time is ``Σ_waves f + launch overhead``
(eq. 4). Contention enters through ``sms_available`` (eq. 5) and ``hbm_bytes_per_s_available``
(eq. 6's B̄ − V).

Decomposition loss (ficco §IV-C1) falls out of the same terms: splitting M leaves partial
waves and more launches; splitting K shortens the tile main loop against a fixed
prologue/epilogue and adds the accumulate traffic (read C, write C) of every piece.
As the GEMM libraries do, the model picks the fastest of the main tile and its halves.
"""

from __future__ import annotations

import math

from ccoverlap.catalog.hardware import GPUSpec
from ccoverlap.cost.params import CostParams, causal_attention_factor, checked_inputs
from ccoverlap.errors import ConfigError
from ccoverlap.sim.graph import AttentionSpec, GemmSpec, MemorySpec

_EPS = 1e-9



def gemm_waves(tiles: int, sms_available: float, tiles_per_sm: int = 1) -> int:
    """Number of waves (lagom eq. 5): ``ceil(tiles / (sms_available × tiles_per_sm))``.

    ``sms_available`` may be fractional (SMs partly taken by communication); at least one
    SM is always assumed available.
    """
    if tiles <= 0:
        return 0
    slots = max(float(sms_available), 1.0) * max(int(tiles_per_sm), 1)
    return max(1, math.ceil(tiles / slots - _EPS))


def _tile_candidates(params: CostParams) -> list[tuple[int, int, float]]:
    tm, tn, s = params.gemm_tile_m, params.gemm_tile_n, params.gemm_small_tile_efficiency
    cands = [(tm, tn, 1.0)]
    if s > 0:
        if tn >= 32:
            cands.append((tm, tn // 2, s))
        if tm >= 32:
            cands.append((tm // 2, tn, s))
        if tm >= 32 and tn >= 32:
            cands.append((tm // 2, tn // 2, s * s))
    return cands


def _wave_bytes(active: float, tiles_m: int, tiles_n: int, tm: int, tn: int, k: int,
                dt: int, accumulate: bool) -> tuple[float, float]:
    """HBM bytes one wave of ``active`` tiles moves: ``(shared, unshared)``. ``shared``: the
    A row-panels and B column-panels its tiles need, each read once into L2 and shared by
    the wave's tiles, plus its output tiles. ``unshared``: every tile reading its own panels
    from HBM (no reuse between thread blocks through L2), the most a wave can move when
    communication buffers evict its panels from L2 (lagom §3.2, global resource competition)."""
    per_mat = tiles_m * tiles_n
    out = active * tm * tn * dt * (2.0 if accumulate else 1.0)
    unshared = active * (tm + tn) * k * dt + out
    if active >= per_mat:  # whole matrices (batched GEMMs): each operand read once
        return (active / per_mat) * (tiles_m * tm + tiles_n * tn) * k * dt + out, unshared
    # the wave covers a block of a x b tiles; rasterisation keeps it near the traffic optimum
    a = min(tiles_m, max(1, round(math.sqrt(active * tn / tm))))
    b = math.ceil(active / a)
    if b > tiles_n:
        b = tiles_n
        a = min(tiles_m, math.ceil(active / b))
    return (a * tm + b * tn) * k * dt + out, unshared


def _gemm_eval(spec: GemmSpec, gpu: GPUSpec, params: CostParams, sms: float, bw: float,
               accumulate: bool, l2_pollution: float, tm: int, tn: int, eff: float) -> tuple[float, float]:
    tpsm = params.gemm_tiles_per_sm
    tk = params.gemm_tile_k
    tiles_m = math.ceil(spec.m / tm)
    tiles_n = math.ceil(spec.n / tn)
    tiles = tiles_m * tiles_n * spec.batch
    slots = sms * tpsm
    waves = gemm_waves(tiles, sms, tpsm)
    ksteps = math.ceil(spec.k / tk)
    per_sm_flops = (gpu.flops_for(spec.dtype_bytes) * params.gemm_peak_fraction
                    * params.sustained_clock_fraction / gpu.sms)
    tile_s = 2.0 * tm * tn * tk * (ksteps + params.gemm_tile_overhead_ksteps) / (per_sm_flops * eff)
    dt = spec.dtype_bytes
    ov = params.gemm_mem_overlap

    def wave_time(active: float) -> tuple[float, float]:
        resident = min(tpsm, math.ceil(active / sms - _EPS))  # CTAs sharing one SM in this wave
        theta = max(resident, 1) * tile_s
        shared, unshared = _wave_bytes(active, tiles_m, tiles_n, tm, tn, spec.k, dt, accumulate)
        # L2 pollution grows the traffic, never past every tile reading its own panels
        d = min(shared * (1.0 + l2_pollution), max(shared, unshared))
        mem = d / bw
        return max(theta, mem) + (1.0 - ov) * min(theta, mem), d

    full = min(float(tiles), slots)
    f_full, d_full = wave_time(full)
    last = tiles - (waves - 1) * full
    f_last, d_last = wave_time(last) if waves > 1 else (f_full, d_full)
    if waves == 1:
        return f_full, d_full
    return (waves - 1) * f_full + f_last, (waves - 1) * d_full + d_last


def gemm_profile(spec: GemmSpec, gpu: GPUSpec, params: CostParams | None = None, *,
                 sms_available: float | None = None, hbm_bytes_per_s_available: float | None = None,
                 accumulate: bool | None = None, l2_pollution: float = 0.0,
                 tile: tuple[int, int] | None = None) -> tuple[float, float]:
    """``(seconds, HBM bytes moved)`` of a GEMM; see :func:`gemm_time_s` for the arguments."""
    p = checked_inputs("gemm_time_s", spec, GemmSpec, gpu, params, sms_available=sms_available,
                       hbm_bytes_per_s_available=hbm_bytes_per_s_available, l2_pollution=l2_pollution)
    sms = float(gpu.sms if sms_available is None else min(max(sms_available, 1.0), gpu.sms))
    bw = gpu.hbm_bytes_per_s * p.mem_bw_fraction if hbm_bytes_per_s_available is None \
        else max(float(hbm_bytes_per_s_available), 1.0)
    acc = bool(getattr(spec, "accumulate", False)) if accumulate is None else bool(accumulate)
    cands = [(tile[0], tile[1], 1.0)] if tile is not None else _tile_candidates(p)
    best: tuple[float, float] | None = None
    for tm, tn, eff in cands:
        t, d = _gemm_eval(spec, gpu, p, sms, bw, acc, max(l2_pollution, 0.0), tm, tn, eff)
        if best is None or t < best[0]:
            best = (t, d)
    assert best is not None
    return max(best[0] + p.kernel_launch_overhead_s, _host_floor(spec, p)), best[1]


def gemm_time_s(spec: GemmSpec, gpu: GPUSpec, params: CostParams | None = None, *,
                sms_available: float | None = None, hbm_bytes_per_s_available: float | None = None,
                accumulate: bool | None = None, l2_pollution: float = 0.0,
                tile: tuple[int, int] | None = None) -> float:
    """Seconds one GEMM kernel takes (lagom eqs. 4–6 with tile/wave quantisation).

    ``sms_available``: SMs it may use (default all; fewer when communication holds some,
    eq. 5). ``hbm_bytes_per_s_available``: HBM bytes/s left to it (default the achievable
    bandwidth ``hbm × mem_bw_fraction``; less under contention, eq. 6's B̄ − V).
    ``accumulate``: C += A·B (K-split pieces; default: the spec's ``accumulate`` attribute if
    it has one, else False) reads C as well. ``l2_pollution``: relative growth of the GEMM's
    HBM traffic because communication buffers evict its operands from L2 (0 = none), never
    past every tile reading its own operand panels (no reuse between thread blocks).
    ``tile``: force one ``(tile_m, tile_n)`` instead of choosing the fastest candidate.
    """
    return gemm_profile(spec, gpu, params, sms_available=sms_available,
                        hbm_bytes_per_s_available=hbm_bytes_per_s_available, accumulate=accumulate,
                        l2_pollution=l2_pollution, tile=tile)[0]


def split_gemm(spec: GemmSpec, ways: int, dim: str) -> list[GemmSpec]:
    """The pieces of ``spec`` cut ``ways``-way along ``dim`` (``"m"``, ``"n"`` or ``"k"``),
    as even as integers allow (ficco §IV-C1 row / column sharding)."""
    if dim not in ("m", "n", "k"):
        raise ConfigError(f"split dimension must be 'm', 'n' or 'k', got {dim!r}")
    size = getattr(spec, dim)
    if not 1 <= ways <= size:
        raise ConfigError(f"cannot split {dim}={size} {ways} ways")
    base, rem = divmod(size, ways)
    sizes = [base + (1 if i < rem else 0) for i in range(ways)]
    return [GemmSpec(**{**{"m": spec.m, "n": spec.n, "k": spec.k, "batch": spec.batch,
                           "dtype_bytes": spec.dtype_bytes}, dim: s}) for s in sizes]


def split_gemm_time_s(spec: GemmSpec, ways: int, dim: str, gpu: GPUSpec,
                      params: CostParams | None = None) -> float:
    """Seconds for the ``ways`` pieces of ``spec`` split along ``dim``, run one after another
    (ficco §IV-C1). K pieces after the first accumulate into C (C += A·B), paying the extra
    read of C. Compare with :func:`gemm_time_s` of the whole for the decomposition loss."""
    pieces = split_gemm(spec, ways, dim)
    total = 0.0
    for i, piece in enumerate(pieces):
        total += gemm_time_s(piece, gpu, params, accumulate=(dim == "k" and i > 0))
    return total


def _host_floor(spec, p: CostParams) -> float:
    """Seconds the host needs to dispatch ``spec``'s eager kernels (0 if not host-bound): the
    GPU cannot finish a kernel before the host has launched it (docs/model.md)."""
    return getattr(spec, "host_kernels", 0) * p.eager_host_overhead_s


def _stream_bandwidth(gpu: GPUSpec, p: CostParams, sms: float, bw: float | None) -> float:
    """HBM bytes/s a streaming kernel reaches with ``sms`` SMs and ``bw`` bytes/s left to it."""
    avail = gpu.hbm_bytes_per_s * p.mem_bw_fraction if bw is None else max(float(bw), 1.0)
    sm_share = (sms / gpu.sms) / p.mem_sm_saturation_fraction
    return avail * min(1.0, sm_share)


def attention_time_s(spec: AttentionSpec, gpu: GPUSpec, params: CostParams | None = None, *,
                     sms_available: float | None = None,
                     hbm_bytes_per_s_available: float | None = None, l2_pollution: float = 0.0) -> float:
    """Seconds of a fused (flash) attention kernel: roofline ``max(FLOPs / (peak ×
    fraction × sustained_clock_fraction × SM share), bytes / bandwidth)`` plus launch
    overhead, where the fraction is
    :func:`attention_fraction` of the kernel (forward / backward, native / FA2-class), derated
    on Hopper for a causal mask by :func:`ccoverlap.cost.params.causal_attention_factor`
    (FlashAttention-3 paper Fig. 5). No wave quantisation (flash kernels tile over heads × query blocks, usually many waves)."""
    p = checked_inputs("attention_time_s", spec, AttentionSpec, gpu, params, sms_available=sms_available,
                       hbm_bytes_per_s_available=hbm_bytes_per_s_available, l2_pollution=l2_pollution)
    sms = float(gpu.sms if sms_available is None else min(max(sms_available, 1.0), gpu.sms))
    frac = attention_fraction(spec, p)
    if getattr(spec, "causal_len", 0) and _is_hopper(gpu):
        frac *= causal_attention_factor(spec.kernel, spec.causal_len)
    flops_rate = gpu.flops_for(spec.dtype_bytes) * frac * p.sustained_clock_fraction * sms / gpu.sms
    t_c = spec.flops / flops_rate
    t_m = spec.bytes * (1.0 + max(l2_pollution, 0.0)) / _stream_bandwidth(gpu, p, sms, hbm_bytes_per_s_available)
    return max(max(t_c, t_m) + p.kernel_launch_overhead_s, _host_floor(spec, p))


def _is_hopper(gpu: GPUSpec) -> bool:
    """NVIDIA GPUs with FP8 tensor cores in the catalog (H100 / H200 family): where the
    FlashAttention-3 paper's causal measurements apply."""
    return gpu.vendor.lower() == "nvidia" and "fp8" in gpu.peak_flops


def attention_fraction(spec: AttentionSpec, p: CostParams) -> float:
    """Fraction of the dense peak a flash kernel reaches: ``attention_peak_fraction`` /
    ``attention_bwd_peak_fraction`` for the GPU's native kernel (FlashAttention-3 / cuDNN on
    Hopper, FlashAttention-2 on Ampere), ``attention_fa2_*`` for an FA2-class kernel on a
    newer GPU (PyTorch SDPA's flash backend on H100); sources in :mod:`ccoverlap.cost.params`."""
    bwd = getattr(spec, "backward", False)
    if getattr(spec, "kernel", "native") == "fa2":
        return p.attention_fa2_bwd_peak_fraction if bwd else p.attention_fa2_peak_fraction
    return p.attention_bwd_peak_fraction if bwd else p.attention_peak_fraction


def memory_time_s(spec: MemorySpec, gpu: GPUSpec, params: CostParams | None = None, *,
                  sms_available: float | None = None,
                  hbm_bytes_per_s_available: float | None = None) -> float:
    """Seconds of a memory-bound kernel (or of a chain of ``spec.kernels`` unfused ones):
    ``max(bytes / achievable bandwidth, FLOPs / fp32 CUDA-core peak)`` plus one launch
    overhead per kernel; bandwidth falls when it has fewer SMs than
    ``mem_sm_saturation_fraction`` of them. Never less than the host's dispatch time of its
    eager kernels (``host_kernels × eager_host_overhead_s``)."""
    p = checked_inputs("memory_time_s", spec, MemorySpec, gpu, params, sms_available=sms_available,
                       hbm_bytes_per_s_available=hbm_bytes_per_s_available)
    sms = float(gpu.sms if sms_available is None else min(max(sms_available, 1.0), gpu.sms))
    t_m = spec.bytes / _stream_bandwidth(gpu, p, sms, hbm_bytes_per_s_available)
    t_c = (spec.flops / (gpu.peak_flops["fp32"] * p.sustained_clock_fraction * sms / gpu.sms)
           if spec.flops else 0.0)
    return max(max(t_m, t_c) + p.kernel_launch_overhead_s * spec.kernels, _host_floor(spec, p))
