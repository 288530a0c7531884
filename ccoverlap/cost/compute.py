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
(eq. 4). On Hopper the kernels are persistent (one CTA per SM looping over tiles): the tile
prologue / epilogue is paid whole in the first wave only, each later wave paying
``gemm_persistent_overhead_fraction`` of it (the next tile's loads start under the last one's
stores). Contention enters through ``sms_available`` (eq. 5) and ``hbm_bytes_per_s_available``
(eq. 6's B̄ − V).

A GEMM piece marked ``packed_pieces`` (pieces issued on several compute streams, as
TransformerEngine's userbuffers overlap issues them) is charged its share of the pieces' tiles
run as one sequence of waves, each piece's CTAs paying the whole prologue on their first tiles.

Decomposition loss (ficco §IV-C1) falls out of the same terms: splitting M leaves partial
waves and more launches; splitting K shortens the tile main loop against a fixed
prologue/epilogue and adds the accumulate traffic (read C, write C) of every piece.
As the GEMM libraries do, the model picks the fastest of the main tile and its halves.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Generic, TypeVar

from ccoverlap.catalog.hardware import GPUSpec
from ccoverlap.cost.params import CostParams, causal_attention_factor, checked_inputs
from ccoverlap.errors import ConfigError
from ccoverlap.specs import AttentionSpec, GemmSpec, MemorySpec

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


def tile_candidates(params: CostParams) -> list[tuple[int, int, float]]:
    """The CTA tiles a GEMM library picks from: the main tile and tiles halved in one or both
    dimensions, each at ``gemm_small_tile_efficiency`` of the per-SM rate per halving of its
    operand reuse ``tm·tn / (tm + tn)`` (FLOPs per byte loaded into shared memory; params.py
    [REUSE]): 128x128 keeps 3/4 of 128x256's reuse, 64x256 3/5, 64x128 1/2."""
    tm, tn, s = params.gemm_tile_m, params.gemm_tile_n, params.gemm_small_tile_efficiency
    cands = {(tm, tn): 1.0}
    reuse = tm * tn / (tm + tn)
    if s > 0:
        for i in range(2):
            for j in range(2):
                x, y = tm >> i, tn >> j
                if (i or j) and x >= 16 and y >= 16:
                    cands[(x, y)] = s ** math.log2(reuse * (x + y) / (x * y))
    return [(x, y, e) for (x, y), e in cands.items()]


def _split_k_candidates(tiles: int, slots: float, ksteps: int, max_split: int,
                        any_count: bool = False) -> list[int]:
    """K-splits worth trying: 1, and powers of two while the split tiles still fit in about
    one wave and each piece keeps at least 8 K steps (cuBLAS / CUTLASS split-K and stream-K).
    ``any_count`` (cuBLASLt's split-K on Ampere): every count up to ``max_split``, whatever the
    number of tiles, its pieces running in as many waves as they need (64 tiles on 108 SMs:
    5 ways are 320 pieces in 3 nearly full waves; 128 tiles, a wave and a fifth: 5 ways are
    640 pieces in 6 waves, the last nearly full)."""
    out = [1]
    s = 2
    while s <= max_split and (tiles * s <= slots or any_count) and ksteps // s >= 8:
        out.append(s)
        s = s + 1 if any_count else s * 2
    return out


def _wave_bytes(active: float, tiles_m: int, tiles_n: int, tm: int, tn: int, k: int,
                dt: int, out_dt: float) -> tuple[float, float]:
    """HBM bytes one wave of ``active`` tiles moves: ``(shared, unshared)``. ``shared``: the
    A row-panels and B column-panels its tiles need, each read once into L2 and shared by
    the wave's tiles, plus its output tiles (``out_dt`` bytes an element: 2x the element when
    accumulating into C, 4 for split-K's fp32 partials). ``unshared``: every tile reading its
    own panels from HBM (no reuse between thread blocks through L2), the most a wave can move
    when communication buffers evict its panels from L2 (lagom §3.2, global resource competition)."""
    per_mat = tiles_m * tiles_n
    out = active * tm * tn * out_dt
    unshared = active * (tm + tn) * k * dt + out
    if active >= per_mat:  # whole matrices (batched GEMMs, split-K pieces): each operand read once
        return (active / per_mat) * (tiles_m * tm + tiles_n * tn) * k * dt + out, unshared
    # the wave covers a block of a x b tiles; rasterisation keeps it near the traffic optimum
    a = min(tiles_m, max(1, round(math.sqrt(active * tn / tm))))
    b = math.ceil(active / a)
    if b > tiles_n:
        b = tiles_n
        a = min(tiles_m, math.ceil(active / b))
    return (a * tm + b * tn) * k * dt + out, unshared


def is_misaligned(spec: GemmSpec) -> bool:
    """True when ``n`` or ``k`` (the leading dimensions of a row-major ``x @ W^T``) is not a
    multiple of 16 bytes of elements: cuBLAS cannot use its TMA / 16-byte-vector kernels and
    falls back to a CUTLASS kernel with narrow loads (``gemm_misaligned_efficiency``)."""
    align = max(16 // spec.dtype_bytes, 1)
    return spec.n % align != 0 or spec.k % align != 0


def power_settled_s(t_full_clock: float, floor: float, settle_s: float) -> float:
    """Seconds a kernel takes whose work takes ``t_full_clock`` seconds at the clock it starts
    at, when the power limiter pulls the clock from there toward ``floor`` x that clock with
    time constant ``settle_s`` (clock(t) = floor + (1 - floor) e^(-t / settle_s)): the T with
    ``floor T + (1 - floor) settle_s (1 - e^(-T / settle_s)) = t_full_clock`` (Newton's method;
    ``t_full_clock`` when ``floor`` is 1, ``t_full_clock / floor`` when ``settle_s`` is 0)."""
    if floor >= 1.0 or t_full_clock <= 0:
        return t_full_clock
    if settle_s <= 0:
        return t_full_clock / floor
    t = t_full_clock
    for _ in range(60):  # the left side is increasing and concave in T: Newton from below converges
        decay = math.exp(-t / settle_s)
        step = (floor * t + (1.0 - floor) * settle_s * (1.0 - decay) - t_full_clock) / (floor + (1.0 - floor) * decay)
        t -= step
        if abs(step) <= 1e-12 * t:
            break
    return t


def _gemm_eval(spec: GemmSpec, gpu: GPUSpec, params: CostParams, sms: float, bw: float,
               accumulate: bool, l2_pollution: float, tm: int, tn: int, eff: float,
               split: int = 1, pieces: int = 1) -> tuple[float, float]:
    """``(seconds without launch overhead, HBM bytes)`` of the GEMM run as ``tm x tn`` tiles with
    per-SM efficiency ``eff``, its K cut into ``split`` pieces run side by side (split-K: fp32
    partials written and reduced once more, from L2 as far as they fit in it:
    :func:`l2_bandwidth_gain`). ``pieces`` > 1: the GEMM is that many kernels' tiles packed
    into one run of waves (:func:`_packed_first_waves`). A GEMM long enough for the power
    limiter to act (``gemm_power_clock_fraction`` < ``sustained_clock_fraction``) computes at
    the clock it averages over its run (:func:`power_settled_s`); its memory traffic does not
    slow."""
    t, d = _gemm_eval_at(spec, gpu, params, sms, bw, accumulate, l2_pollution, tm, tn, eff, split, pieces, 1.0)
    floor = min(1.0, params.gemm_power_clock_fraction / params.sustained_clock_fraction)
    if floor < 1.0:
        clock = t / power_settled_s(t, floor, params.gemm_power_settle_s)
        t, d = _gemm_eval_at(spec, gpu, params, sms, bw, accumulate, l2_pollution, tm, tn, eff, split, pieces, clock)
    return t, d


def _gemm_eval_at(spec: GemmSpec, gpu: GPUSpec, params: CostParams, sms: float, bw: float,
                  accumulate: bool, l2_pollution: float, tm: int, tn: int, eff: float,
                  split: int, pieces: int, clock: float) -> tuple[float, float]:
    """:func:`_gemm_eval` with the SMs at ``clock`` x the parameters' clock."""
    tpsm = params.gemm_tiles_per_sm
    tk = params.gemm_tile_k
    tiles_m = math.ceil(spec.m / tm)
    tiles_n = math.ceil(spec.n / tn)
    tiles = tiles_m * tiles_n * spec.batch * split
    slots = sms * tpsm
    waves = gemm_waves(tiles, sms, tpsm)
    k_piece = math.ceil(spec.k / split)
    ksteps = math.ceil(k_piece / tk)
    per_sm_flops = (gpu.flops_for(spec.dtype_bytes) * params.gemm_peak_fraction
                    * params.sustained_clock_fraction * clock / gpu.sms)
    kstep_s = 2.0 * tm * tn * tk / (per_sm_flops * eff)
    o_first = params.gemm_tile_overhead_ksteps
    o_next = o_first * params.gemm_persistent_overhead_fraction  # a persistent CTA's later tiles
    dt = spec.dtype_bytes
    out_dt = 4.0 if split > 1 else dt * (2.0 if accumulate else 1.0)
    ov = params.gemm_mem_overlap

    def wave_time(active: float, theta: float) -> tuple[float, float]:
        """One wave of ``active`` tiles whose busiest SM computes for ``theta`` seconds."""
        shared, unshared = _wave_bytes(active, tiles_m, tiles_n, tm, tn, k_piece, dt, out_dt)
        # L2 pollution grows the traffic, never past every tile reading its own panels
        d = min(shared * (1.0 + l2_pollution), max(shared, unshared))
        mem = d / bw
        return max(theta, mem) + (1.0 - ov) * min(theta, mem), d

    def theta_of(active: float, overhead: float) -> float:
        resident = min(tpsm, math.ceil(active / sms - _EPS))  # CTAs sharing one SM in this wave
        return max(resident, 1) * (ksteps + overhead) * kstep_s

    full = min(float(tiles), slots)
    last = tiles - (waves - 1) * full
    first = _packed_first_waves(tiles, slots, waves, pieces)
    o_last = o_first if waves <= first else o_next
    f_last, d_last = wave_time(last, theta_of(last, o_last))
    if waves == 1:
        t, d = f_last, d_last
    else:
        f_first, d_first = wave_time(full, theta_of(full, o_first))
        f_next, d_next = wave_time(full, theta_of(full, o_next))
        n_first = min(first, waves - 1)
        t = n_first * f_first + (waves - 1 - n_first) * f_next + f_last
        d = n_first * d_first + (waves - 1 - n_first) * d_next + d_last
    if split > 1:  # reduce the fp32 partials: read them, write C (in the kernel or a second one)
        red = spec.batch * spec.m * spec.n * (4.0 * split + dt * (2.0 if accumulate else 1.0))
        t, d = t + red / (bw * l2_bandwidth_gain(red, gpu, params)), d + red
        t += (split - 1) * params.gemm_split_k_fixup_s  # the pieces of a tile fold in one after another
    return t, d


def _packed_first_waves(tiles: int, slots: float, waves: int, pieces: int) -> int:
    """Waves of a run that pay the whole tile prologue / epilogue: 1 for one kernel (a
    persistent CTA pays it on its first tile only); for ``pieces`` kernels packed together each
    kernel's CTAs pay it again on their first tiles, ``min(piece tiles, slots)`` of them per
    piece, i.e. ``ceil(pieces × that / slots)`` waves' worth (at most ``waves``)."""
    if pieces <= 1:
        return 1
    per_piece = min(tiles / pieces, slots)
    return max(1, min(waves, math.ceil(pieces * per_piece / slots - _EPS)))


def _gemv_eval(spec: GemmSpec, gpu: GPUSpec, params: CostParams, sms: float, bw: float,
               accumulate: bool) -> tuple[float, float]:
    """Matrix-vector-like GEMMs (``min(m, n) <= gemm_gemv_max_dim``): the library's gemv /
    small-batched kernels stream both operands once at ``gemm_gemv_efficiency`` of the
    bandwidth; ``max(bytes / that bandwidth, FLOPs / the CUDA-core peak)``."""
    nbytes = spec.bytes + (spec.batch * spec.m * spec.n * spec.dtype_bytes if accumulate else 0.0)
    rate = gpu.peak_flops["fp32"] * params.sustained_clock_fraction * sms / gpu.sms
    return max(nbytes / (bw * params.gemm_gemv_efficiency), spec.flops / rate), nbytes


_V = TypeVar("_V")


class GpuMemo(Generic[_V]):
    """A bounded memo of a pure model function of one GPU: ``key`` (hashable arguments) and the
    GPU, which is keyed by identity and kept alive with its entry (GPUSpec holds a dict, so is
    not hashable; a live object's id is not reused). Cleared whole when it reaches
    ``max_entries``. Values are never None."""

    def __init__(self, max_entries: int = 65536) -> None:
        self._entries: dict[tuple, tuple[GPUSpec, _V]] = {}
        self._max = max_entries

    def get(self, key: tuple, gpu: GPUSpec) -> _V | None:
        """The value stored for ``key`` on ``gpu``, or None."""
        hit = self._entries.get(key + (id(gpu),))
        return hit[1] if hit is not None and hit[0] is gpu else None

    def put(self, key: tuple, gpu: GPUSpec, value: _V) -> _V:
        """Store ``value`` for ``key`` on ``gpu``; returns it."""
        if len(self._entries) >= self._max:
            self._entries.clear()
        self._entries[key + (id(gpu),)] = (gpu, value)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()


_GEMM_MEMO: GpuMemo[tuple[float, float]] = GpuMemo()


def _gemm_best(spec: GemmSpec, gpu: GPUSpec, p: CostParams, sms: float, bw: float, acc: bool,
               l2: float, tile: tuple[int, int] | None) -> tuple[float, float]:
    """:func:`_gemm_search`, cached (:class:`GpuMemo`): the planner asks for the same shapes
    many times."""
    key = (spec, p, sms, bw, acc, l2, tile)
    hit = _GEMM_MEMO.get(key, gpu)
    if hit is not None:
        return hit
    return _GEMM_MEMO.put(key, gpu, _gemm_search(spec, gpu, p, sms, bw, acc, l2, tile))


def _gemm_search(spec: GemmSpec, gpu: GPUSpec, p: CostParams, sms: float, bw: float, acc: bool,
               l2: float, tile: tuple[int, int] | None) -> tuple[float, float]:
    """The fastest of the library's kernels for the GEMM (tiles x split-K, gemv, the misaligned
    fallback's derating); cached: the planner asks for the same shapes many times. A piece of
    ``spec.packed_pieces`` > 1 is charged that share of the pieces run together (M times the
    pieces, :class:`~ccoverlap.specs.GemmSpec`)."""
    pieces = spec.packed_pieces
    if pieces > 1:
        spec = replace(spec, m=spec.m * pieces, packed_pieces=1)
    eff0 = p.gemm_misaligned_efficiency if is_misaligned(spec) else 1.0
    cands = [(tile[0], tile[1], 1.0)] if tile is not None else tile_candidates(p)
    best: tuple[float, float] | None = None
    # the library picks its split from the shape and the whole GPU: it does not know that
    # communication holds some SMs while the kernel runs
    slots = gpu.sms * p.gemm_tiles_per_sm
    ksteps = math.ceil(spec.k / p.gemm_tile_k)
    for tm, tn, eff in cands:
        tiles = math.ceil(spec.m / tm) * math.ceil(spec.n / tn) * spec.batch
        splits = [1] if tile is not None else _split_k_candidates(tiles, slots, ksteps, p.gemm_max_split_k,
                                                                  bool(p.gemm_split_k_any_count))
        for split in splits:
            t, d = _gemm_eval(spec, gpu, p, sms, bw, acc, l2, tm, tn, eff * eff0, split, pieces)
            if best is None or t < best[0]:
                best = (t, d)
    assert best is not None
    if tile is None and min(spec.m, spec.n) <= p.gemm_gemv_max_dim:
        g = _gemv_eval(spec, gpu, p, sms, bw, acc)
        if g[0] < best[0]:
            best = g
    return best[0] / pieces, best[1] / pieces


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
    t, d = _gemm_best(spec, gpu, p, sms, bw, acc, max(l2_pollution, 0.0),
                      (int(tile[0]), int(tile[1])) if tile is not None else None)
    return max(t + p.kernel_launch_overhead_s, _host_floor(spec, p)), d


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


def _host_floor(spec: GemmSpec | AttentionSpec | MemorySpec, p: CostParams) -> float:
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
    """Seconds of one attention kernel (or, for the ``math`` backend, of its unfused kernels).

    Flash backends (FA2, FA3, cuDNN, memory-efficient) with a known shape (``heads``, ``seq``,
    ``head_dim``): the kernel is ``heads × ceil(seq / 128)`` query-block tiles, one CTA per SM;
    a tile iterates over 128-key blocks (all of them, or those up to the diagonal when causal)
    and pays ``attention_tile_overhead_iters`` more for its prologue / epilogue. Compute time
    is ``max(total tile time / SMs, the longest tile)`` (causal: tiles are uneven) or whole
    waves of equal tiles (non-causal), each block at :func:`attention_fraction` of the per-SM
    peak (causal: × ``attention_causal_efficiency``, the masking of diagonal blocks); the
    HBM term as a roofline beside it. Short sequences and few heads leave SMs idle and pay the
    per-tile overhead: the FlashAttention-3 paper's Fig. 5 causal curves. Without a shape: the
    roofline ``max(FLOPs / rate, bytes / bandwidth)`` derated on Hopper for a causal mask by
    :func:`ccoverlap.cost.params.causal_attention_factor`. Plus launch overhead."""
    p = checked_inputs("attention_time_s", spec, AttentionSpec, gpu, params, sms_available=sms_available,
                       hbm_bytes_per_s_available=hbm_bytes_per_s_available, l2_pollution=l2_pollution)
    sms = float(gpu.sms if sms_available is None else min(max(sms_available, 1.0), gpu.sms))
    bw = _stream_bandwidth(gpu, p, sms, hbm_bytes_per_s_available)
    t_m = spec.bytes * (1.0 + max(l2_pollution, 0.0)) / bw
    backend = attention_backend(spec, gpu)
    if backend == "math":
        t = _math_attention_s(spec, gpu, p, sms, bw)
        return max(t + 4 * p.kernel_launch_overhead_s, _host_floor(spec, p))
    frac = attention_fraction(spec, p, gpu)
    peak = gpu.flops_for(spec.dtype_bytes) * frac * p.sustained_clock_fraction
    if spec.heads and spec.seq and spec.head_dim:
        t_c = _flash_tiles_s(spec, p, peak / gpu.sms, sms)
    else:
        if spec.causal_len and _is_hopper(gpu):
            peak *= causal_attention_factor("fa2" if backend == "fa2" else "native", spec.causal_len)
        t_c = spec.flops / (peak * sms / gpu.sms)
    return max(max(t_c, t_m) + p.kernel_launch_overhead_s, _host_floor(spec, p))


_ATTN_BLOCK = 128  # query and key block of the flash kernels (FA2 / FA3 / cuDNN, head dim <= 128)


def _flash_tiles_s(spec: AttentionSpec, p: CostParams, per_sm_flops: float, sms: float) -> float:
    """Compute seconds of a flash kernel over its query-block tiles (see :func:`attention_time_s`)."""
    qb = math.ceil(spec.seq / _ATTN_BLOCK)
    kvb = qb
    iter_flops = 4.0 * _ATTN_BLOCK * _ATTN_BLOCK * spec.head_dim * (2.5 if spec.backward else 1.0)
    o = p.attention_tile_overhead_iters
    if spec.causal_len:
        rate = per_sm_flops * p.attention_causal_efficiency
        iters = qb * (qb + 1) / 2.0  # tile i runs i + 1 key blocks
        total = spec.heads * (iters + qb * o) * iter_flops / rate
        longest = (kvb + o) * iter_flops / rate
        return max(total / sms, longest)
    tiles = spec.heads * qb
    waves = math.ceil(tiles / sms - _EPS)
    return waves * (kvb + o) * iter_flops / per_sm_flops


def _math_attention_s(spec: AttentionSpec, gpu: GPUSpec, p: CostParams, sms: float, bw: float) -> float:
    """PyTorch SDPA's math backend: QKᵀ and PV as batched GEMMs over the full score matrix (a
    causal mask saves nothing), the scores written and read by scale / mask / softmax (fwd 6,
    bwd 10 passes of 2 bytes an element)."""
    full = spec.flops * (2.0 if spec.causal_len else 1.0)
    t_c = full / (gpu.flops_for(spec.dtype_bytes) * p.gemm_peak_fraction * p.sustained_clock_fraction
                  * sms / gpu.sms)
    if spec.heads and spec.seq:
        scores = float(spec.heads) * spec.seq * spec.seq * 2.0 * (10 if spec.backward else 6)
    else:
        scores = 0.0
    return t_c + (spec.bytes + scores) / bw


def _is_hopper(gpu: GPUSpec) -> bool:
    """NVIDIA GPUs with FP8 tensor cores in the catalog (H100 / H200 family): where the
    FlashAttention-3 paper's causal measurements apply."""
    return gpu.vendor.lower() == "nvidia" and "fp8" in gpu.peak_flops


def attention_backend(spec: AttentionSpec, gpu: GPUSpec) -> str:
    """The backend ``spec.kernel`` runs as on ``gpu``: ``native`` is cuDNN on Hopper (the
    TransformerEngine default there) and FlashAttention-2 elsewhere; FlashAttention-3 needs Hopper
    (elsewhere the GPU's native kernel runs)."""
    k = getattr(spec, "kernel", "native")
    if k == "native":
        return "cudnn" if _is_hopper(gpu) else "fa2"
    if k == "fa3" and not _is_hopper(gpu):
        return "fa2"
    return k


def attention_fraction(spec: AttentionSpec, p: CostParams, gpu: GPUSpec | None = None) -> float:
    """Fraction of the dense peak a flash kernel's main loop reaches: ``attention_peak_fraction``
    / ``attention_bwd_peak_fraction`` for cuDNN / FlashAttention-3 on Hopper and the native kernel
    elsewhere, ``attention_fa2_*`` for FlashAttention-2, the FA2 value ×
    ``attention_efficient_relative`` for SDPA's memory-efficient (xFormers CUTLASS) kernel; sources
    in :mod:`ccoverlap.cost.params`."""
    bwd = getattr(spec, "backward", False)
    k = attention_backend(spec, gpu) if gpu is not None else getattr(spec, "kernel", "native")
    if k in ("fa2", "efficient"):
        f = p.attention_fa2_bwd_peak_fraction if bwd else p.attention_fa2_peak_fraction
        return f * (p.attention_efficient_relative if k == "efficient" else 1.0)
    return p.attention_bwd_peak_fraction if bwd else p.attention_peak_fraction


def l2_bandwidth_gain(kernel_bytes: float, gpu: GPUSpec, p: CostParams) -> float:
    """Factor (>= 1) on the HBM bandwidth of a memory-bound kernel moving ``kernel_bytes`` bytes
    whose inputs the kernel before it left in L2: ``mem_l2_capacity_fraction`` x the GPU's L2
    of its bytes move at ``mem_l2_bandwidth_ratio`` x that bandwidth, the rest from HBM
    (harmonic blend of the two rates; 1 when the ratio is 1 or the kernel moves nothing)."""
    ratio = p.mem_l2_bandwidth_ratio
    if ratio == 1.0 or kernel_bytes <= 0:
        return 1.0
    hit = min(1.0, p.mem_l2_capacity_fraction * gpu.l2_bytes / kernel_bytes)
    return 1.0 / (hit / ratio + (1.0 - hit))


def memory_time_s(spec: MemorySpec, gpu: GPUSpec, params: CostParams | None = None, *,
                  sms_available: float | None = None,
                  hbm_bytes_per_s_available: float | None = None, warm_l2: bool = True) -> float:
    """Seconds of a memory-bound kernel (or of a chain of ``spec.kernels`` unfused ones):
    ``max(bytes / achievable bandwidth, FLOPs / fp32 CUDA-core peak)`` plus one launch
    overhead per kernel (its latency floor); the ``rowwise_bytes`` of row-wise kernels (fused norms,
    rotary) move at ``mem_rowwise_efficiency`` of that bandwidth (less when fewer than
    ``mem_rowwise_blocks_per_sm`` rows per SM keep the SMs busy), never faster than
    ``mem_rowwise_latency_s`` (one block's pass over its row), their ``reread_bytes`` (a two-pass
    norm's second read of its row) moved at the same rate; bytes that fit in L2 move faster
    (:func:`l2_bandwidth_gain`, per kernel of the chain; ``warm_l2=False``: none do, as in a
    benchmark cycling through buffers larger than L2); bandwidth falls when it has fewer SMs than
    ``mem_sm_saturation_fraction`` of them. Never less than the host's dispatch time of its
    eager kernels (``host_kernels × eager_host_overhead_s``)."""
    p = checked_inputs("memory_time_s", spec, MemorySpec, gpu, params, sms_available=sms_available,
                       hbm_bytes_per_s_available=hbm_bytes_per_s_available)
    sms = float(gpu.sms if sms_available is None else min(max(sms_available, 1.0), gpu.sms))
    bw = _stream_bandwidth(gpu, p, sms, hbm_bytes_per_s_available)
    if warm_l2:
        bw *= l2_bandwidth_gain(spec.bytes / max(spec.kernels, 1), gpu, p)
    rowwise = min(float(getattr(spec, "rowwise_bytes", 0.0)), spec.bytes)
    t_row = 0.0
    if rowwise > 0:
        rows = int(getattr(spec, "rows", 0))
        fill = min(1.0, rows / (sms * p.mem_rowwise_blocks_per_sm)) if rows else 1.0  # SMs the rows keep busy
        moved = rowwise + min(float(getattr(spec, "reread_bytes", 0.0)), rowwise)  # a two-pass norm's second read
        t_row = max(moved / (bw * p.mem_rowwise_efficiency * fill), p.mem_rowwise_latency_s)
    t_m = (spec.bytes - rowwise) / bw + t_row
    t_c = (spec.flops / (gpu.peak_flops["fp32"] * p.sustained_clock_fraction * sms / gpu.sms)
           if spec.flops else 0.0)
    return max(max(t_m, t_c) + p.kernel_launch_overhead_s * spec.kernels, _host_floor(spec, p))
