"""GEMM waves (lagom eq. 5), decomposition loss (ficco §IV-C1), attention / memory rooflines."""

import math

import pytest

from ccoverlap.catalog.hardware import GPUS
from ccoverlap.cost import (
    CostParams,
    attention_time_s,
    default_params,
    gemm_profile,
    gemm_time_s,
    gemm_waves,
    memory_time_s,
    split_gemm,
    split_gemm_time_s,
)
from ccoverlap.cost.compute import l2_bandwidth_gain
from ccoverlap.errors import ConfigError
from ccoverlap.specs import AttentionSpec, GemmSpec, MemorySpec

H100 = GPUS["H100-SXM"]
P = default_params(H100, sustained=False)  # the clock the kernel parameters were fitted at
TILE = (P.gemm_tile_m, P.gemm_tile_n)
_P_CLOCK_HELD = P.with_overrides(gemm_power_clock_fraction=1.0)


def test_wave_count_is_eq5():
    assert gemm_waves(132, 132) == 1
    assert gemm_waves(133, 132) == 2
    assert gemm_waves(264, 132) == 2
    assert gemm_waves(265, 132) == 3
    assert gemm_waves(132, 116) == 2        # 16 SMs held by communication
    assert gemm_waves(132, 66, tiles_per_sm=2) == 1
    assert gemm_waves(0, 132) == 0


def _gemm_with_tiles(tiles):
    return GemmSpec(m=P.gemm_tile_m * tiles, n=P.gemm_tile_n, k=4096)


def test_gemm_time_steps_at_wave_boundaries():
    t = {n: gemm_time_s(_gemm_with_tiles(n), H100, P, tile=TILE) for n in (131, 132, 133, 264, 265)}
    # inside a wave, one more tile costs (almost) nothing; across a boundary, a whole wave
    assert t[132] / t[131] < 1.02
    assert t[133] / t[132] > 1.6
    # (n = 256: a wave of 132 tiles reads 132 A row-panels, its HBM time near its compute time, so
    # a full second wave costs some more than a one-tile one)
    assert t[264] / t[133] < 1.2
    assert t[265] / t[264] > 1.3  # a one-tile third wave runs at the boost clock: ~1 + 0.76 / 2
    # the library-style choice among tile sizes softens, but does not remove, the step
    assert gemm_time_s(_gemm_with_tiles(133), H100, P) / gemm_time_s(_gemm_with_tiles(132), H100, P) > 1.3


def test_fewer_sms_more_waves_slower():
    s = GemmSpec(m=8192, n=14336, k=4096)
    t = [gemm_time_s(s, H100, P, sms_available=n) for n in (132, 120, 100, 66)]
    assert t == sorted(t) and t[-1] > 1.8 * t[0]


def test_less_bandwidth_or_polluted_l2_is_slower():
    s = GemmSpec(m=4096, n=4096, k=1024)
    base = gemm_time_s(s, H100, P)
    assert gemm_time_s(s, H100, P, hbm_bytes_per_s_available=1.0e12) > base
    assert gemm_time_s(s, H100, P, l2_pollution=0.5) > base


def test_large_gemm_is_compute_bound_near_calibrated_peak():
    s = GemmSpec(m=8192, n=8192, k=8192)
    eff = s.flops / gemm_time_s(s, H100, P) / H100.peak_flops["bf16"]
    assert 0.7 < eff < P.gemm_peak_fraction


def test_eq6_additive_form_is_slower_than_overlapped():
    s = GemmSpec(m=8192, n=14336, k=4096)
    lagom_literal = P.with_overrides(gemm_mem_overlap=0.0)
    assert gemm_time_s(s, H100, lagom_literal) > gemm_time_s(s, H100, P) * 1.05


FFN = GemmSpec(m=8192, n=14336, k=4096)       # M > K
WIDE_K = GemmSpec(m=2048, n=8192, k=16384)    # M < K


@pytest.mark.parametrize("spec", [FFN, WIDE_K])
@pytest.mark.parametrize("dim", ["m", "k"])
def test_splitting_costs_more_and_more_with_the_split_count(spec, dim):
    whole = gemm_time_s(spec, H100, P)
    t8 = split_gemm_time_s(spec, 8, dim, H100, P)
    t64 = split_gemm_time_s(spec, 64, dim, H100, P)
    assert whole < t8 < t64


def test_k_split_worse_than_m_split_when_m_exceeds_k_and_vice_versa():
    # ficco §IV-C1: row (M) sharding hurts more when M < K, column (K) sharding when M > K
    for ways in (8, 64):
        assert split_gemm_time_s(FFN, ways, "k", H100, P) > split_gemm_time_s(FFN, ways, "m", H100, P)
        assert split_gemm_time_s(WIDE_K, ways, "m", H100, P) > split_gemm_time_s(WIDE_K, ways, "k", H100, P)


def test_accumulate_reads_c_and_costs_more():
    piece = GemmSpec(m=8192, n=14336, k=512)
    t0, d0 = gemm_profile(piece, H100, P, accumulate=False)
    t1, d1 = gemm_profile(piece, H100, P, accumulate=True)
    assert d1 - d0 == pytest.approx(piece.m * piece.n * piece.dtype_bytes, rel=0.05)
    assert t1 > t0


def test_split_pieces_cover_the_dimension():
    pieces = split_gemm(GemmSpec(m=1000, n=64, k=64), 3, "m")
    assert [p.m for p in pieces] == [334, 333, 333]


def test_launch_overhead_is_paid_per_kernel():
    tiny = GemmSpec(m=16, n=16, k=16)
    assert gemm_time_s(tiny, H100, P) >= P.kernel_launch_overhead_s
    more = P.with_overrides(kernel_launch_overhead_s=P.kernel_launch_overhead_s + 1e-5)
    assert gemm_time_s(tiny, H100, more) - gemm_time_s(tiny, H100, P) == pytest.approx(1e-5)


def test_memory_bound_op_is_bytes_over_achievable_bandwidth():
    spec = MemorySpec(bytes=3.0e9)
    expect = 3.0e9 / (H100.hbm_bytes_per_s * P.mem_bw_fraction) + P.kernel_launch_overhead_s
    # the part of its bytes that L2 holds moves faster (l2_bandwidth_gain); 3 GB: ~1% of them
    hit = P.mem_l2_capacity_fraction * H100.l2_bytes / 3.0e9
    assert memory_time_s(spec, H100, P) == pytest.approx(
        expect - 3.0e9 / (H100.hbm_bytes_per_s * P.mem_bw_fraction) * hit * (1 - 1 / P.mem_l2_bandwidth_ratio))
    assert memory_time_s(spec, H100, P.with_overrides(mem_l2_bandwidth_ratio=1.0)) == pytest.approx(expect)
    # fewer SMs than needed to saturate HBM, or less bandwidth: slower
    assert memory_time_s(spec, H100, P, sms_available=20) > 1.5 * expect
    assert memory_time_s(spec, H100, P, hbm_bytes_per_s_available=1e12) > 2.5 * expect


def test_attention_is_max_of_flops_and_bytes():
    p = CostParams(kernel_launch_overhead_s=0.0)
    compute_bound = AttentionSpec(flops=1e12, bytes=1e6)
    t = attention_time_s(compute_bound, H100, p)
    assert t == pytest.approx(1e12 / (H100.peak_flops["bf16"] * p.attention_peak_fraction))
    memory_bound = AttentionSpec(flops=1e6, bytes=3e9)
    assert attention_time_s(memory_bound, H100, p) == pytest.approx(3e9 / (H100.hbm_bytes_per_s * p.mem_bw_fraction))


def test_k_split_pays_for_accumulating_into_c():
    # ficco §IV-C1: column sharding needs C += A·B; each piece after the first reads C back
    for ways in (8, 64):
        pieces = split_gemm(FFN, ways, "k")
        without = sum(gemm_time_s(piece, H100, P, accumulate=False) for piece in pieces)
        extra_read = (ways - 1) * FFN.m * FFN.n * FFN.dtype_bytes / (H100.hbm_bytes_per_s * P.mem_bw_fraction)
        # the fitted overlap hides most of the extra read under the tile loop; some remains
        assert split_gemm_time_s(FFN, ways, "k", H100, P) - without > 0.05 * extra_read


def test_sustained_clock_scales_tensor_work_not_hbm_bandwidth():
    """``sustained_clock_fraction`` c divides the compute-bound time of GEMMs and attention by
    c (the launch overhead is a fixed cost; a GEMM's partly hidden memory term, eq. 6 with
    ``gemm_mem_overlap``, does not scale, hence the 1% tolerance) and leaves a memory-bound
    kernel's time alone. (The GEMM without the power limiter, which takes a long GEMM to its
    limited clock whatever clock it starts at: test_long_gemms_run_at_the_power_limited_clock_on_h100.)"""
    slow = P.with_overrides(sustained_clock_fraction=0.8)
    launch = P.kernel_launch_overhead_s
    g = GemmSpec(m=8192, n=8192, k=8192)  # compute-bound
    free, free_slow = (q.with_overrides(gemm_power_clock_fraction=1.0) for q in (P, slow))
    ratio = (gemm_time_s(g, H100, free_slow) - launch) / (gemm_time_s(g, H100, free) - launch)
    assert 0.99 / 0.8 < ratio <= 1 / 0.8 + 1e-12
    a = AttentionSpec(flops=4e13, bytes=1e8)  # compute-bound flash kernel
    assert (attention_time_s(a, H100, slow) - launch) == pytest.approx((attention_time_s(a, H100, P) - launch) / 0.8,
                                                                       rel=1e-9)
    m = MemorySpec(bytes=4e9)
    assert memory_time_s(m, H100, slow) == memory_time_s(m, H100, P)
    assert P.sustained_clock_fraction == 1.0  # the default changes nothing
    with pytest.raises(Exception, match="sustained_clock_fraction"):
        P.with_overrides(sustained_clock_fraction=1.2)


def test_memory_op_that_fits_in_l2_moves_at_the_l2_rate():
    """A kernel whose bytes fit in the share of L2 its producer left them in moves them at
    mem_l2_bandwidth_ratio x the HBM rate; past it, only that share does (vidur's residual add
    of 19-38 MB on H100 ran at 3.4-3.9 TB/s, past the HBM's 3.35)."""
    p = P.with_overrides(kernel_launch_overhead_s=0.0)
    bw = H100.hbm_bytes_per_s * p.mem_bw_fraction
    small = p.mem_l2_capacity_fraction * H100.l2_bytes / 2
    assert memory_time_s(MemorySpec(bytes=small), H100, p) == pytest.approx(small / (bw * p.mem_l2_bandwidth_ratio))
    big = 4 * p.mem_l2_capacity_fraction * H100.l2_bytes
    assert memory_time_s(MemorySpec(bytes=big), H100, p) == pytest.approx(
        big / bw * (0.25 / p.mem_l2_bandwidth_ratio + 0.75))
    assert l2_bandwidth_gain(small, H100, p.with_overrides(mem_l2_bandwidth_ratio=1.0)) == 1.0
    # a chain of kernels: each kernel's own bytes decide what fits
    two = MemorySpec(bytes=2 * small, kernels=2)
    assert memory_time_s(two, H100, p) == pytest.approx(2 * small / (bw * p.mem_l2_bandwidth_ratio))


def test_two_pass_norm_reads_its_row_again():
    """reread_bytes (a two-pass norm's second read of its row) move at the row-wise rate."""
    p = P.with_overrides(kernel_launch_overhead_s=0.0, mem_l2_bandwidth_ratio=1.0)
    one = MemorySpec(bytes=2e9, rowwise_bytes=2e9)
    two = MemorySpec(bytes=2e9, rowwise_bytes=2e9, reread_bytes=1e9)
    assert memory_time_s(two, H100, p) == pytest.approx(1.5 * memory_time_s(one, H100, p))
    with pytest.raises(ConfigError, match="reread_bytes"):
        MemorySpec(bytes=2.0, rowwise_bytes=1.0, reread_bytes=1.5)


def test_split_k_partials_reduce_through_l2_when_they_fit():
    """The fp32 partials a split-K GEMM writes are read back by its reduction right away: from
    L2 when they fit, as a memory-bound kernel's fresh inputs are."""
    spec = GemmSpec(m=256, n=256, k=4096)  # 2 tiles: split-K, 2 MB of fp32 partials
    cold = P.with_overrides(mem_l2_bandwidth_ratio=1.0)
    assert gemm_time_s(spec, H100, P) < gemm_time_s(spec, H100, cold)


def test_a100_splits_k_any_number_of_ways_to_fill_its_sms():
    """Ampere cuBLAS splits K any number of ways: 32 output tiles on 108 SMs run as 3 x 32
    pieces (96 SMs busy), not 2 x 32 as powers of two would allow; the corpus's vidur A100
    row 256x4096x14336 took 135 us: within 30% of the 3-way split's time, where two ways
    take over 1.5x as long."""
    a100 = GPUS["A100-80GB-SXM"]
    p = default_params(a100, sustained=False)
    assert p.gemm_split_k_any_count == 1
    spec = GemmSpec(m=256, n=4096, k=14336)
    pow2 = p.with_overrides(gemm_split_k_any_count=0)
    t_any, t_pow2 = gemm_time_s(spec, a100, p), gemm_time_s(spec, a100, pow2)
    assert t_pow2 / t_any > 1.2
    assert t_pow2 > 1.5 * 135e-6
    assert t_any == pytest.approx(135e-6, rel=0.3)
    # 64 tiles: no split of them fits in one wave; 5 ways are 320 pieces in 3 nearly full waves
    wide = GemmSpec(m=256, n=8192, k=14336)
    assert gemm_time_s(wide, a100, p) < 0.97 * gemm_time_s(wide, a100, pow2)
    # whole waves of tiles are not split: the same time either way
    big = GemmSpec(m=4096, n=8192, k=8192)
    assert gemm_time_s(big, a100, p) == gemm_time_s(big, a100, pow2)


def test_a100_splits_k_past_one_wave_to_fill_the_last_one():
    """Ampere's any-count split-K is not only for GEMMs of under one wave: 256x8192 is 256
    tiles of 64x128 on 108 SMs, two full waves and a third of one; split K ways, its pieces fill
    their waves nearly whole. The corpus's vidur A100 fit rows 256x8192x8192 (184.5 us) and
    256x5120x5120 (71.0 us) ran within 8% of that, the unsplit kernel's time 4% and 10% over."""
    a100 = GPUS["A100-80GB-SXM"]
    p = default_params(a100, sustained=False)
    pow2 = p.with_overrides(gemm_split_k_any_count=0)
    for (m, n, k), measured in (((256, 8192, 8192), 184.5e-6), ((256, 5120, 5120), 71.0e-6)):
        spec = GemmSpec(m=m, n=n, k=k)
        t_any, t_pow2 = gemm_time_s(spec, a100, p), gemm_time_s(spec, a100, pow2)
        assert t_any == pytest.approx(measured, rel=0.08)
        assert t_pow2 > 1.03 * measured
        assert t_pow2 > 1.05 * t_any


def test_split_k_any_count_is_a_switch():
    with pytest.raises(ConfigError, match="gemm_split_k_any_count"):
        CostParams(gemm_split_k_any_count=2)


def test_persistent_gemm_pays_the_tile_overhead_once_per_sm():
    # Hopper's persistent GEMM kernels: a CTA pays the per-tile prologue / epilogue whole on its
    # first tile only; later waves pay gemm_persistent_overhead_fraction of it. A compute-bound
    # GEMM of four whole waves (4 x 132 tiles of 128 x 256, k = 8192): exactly three waves'
    # hidden overhead shorter than the same GEMM with every wave paying it.
    p1 = P.with_overrides(gemm_persistent_overhead_fraction=1.0, gemm_mem_overlap=1.0, gemm_small_tile_efficiency=0.0,
                          gemm_power_clock_fraction=1.0)  # the clock held: the overhead alone
    p0 = p1.with_overrides(gemm_persistent_overhead_fraction=0.25)
    spec = GemmSpec(m=4 * 128 * 12, n=256 * 11, k=8192)  # 48 x 11 = 528 tiles = 4 waves on 132 SMs
    kstep = 2.0 * 128 * 256 * 64 / (H100.flops_for(2) * p1.gemm_peak_fraction * p1.sustained_clock_fraction / H100.sms)
    saved = 3 * 0.75 * p1.gemm_tile_overhead_ksteps * kstep
    t1 = gemm_time_s(spec, H100, p1, tile=TILE)
    t0 = gemm_time_s(spec, H100, p0, tile=TILE)
    assert t1 - t0 == pytest.approx(saved, rel=1e-9)
    # one wave: nothing to amortise
    one = GemmSpec(m=128 * 12, n=256 * 11, k=8192)
    assert gemm_time_s(one, H100, p0, tile=TILE) == gemm_time_s(one, H100, p1, tile=TILE)


def test_persistent_kernels_are_hopper_only():
    assert default_params(H100).gemm_persistent_overhead_fraction < 1.0
    for name in ("A100-80GB-SXM", "A40", "MI300X"):
        assert default_params(GPUS[name]).gemm_persistent_overhead_fraction == 1.0
    with pytest.raises(ConfigError, match="gemm_persistent_overhead_fraction"):
        CostParams(gemm_persistent_overhead_fraction=1.5)


def test_packed_pieces_pay_wave_quantisation_on_their_tiles_together():
    """Pieces issued on several compute streams (TransformerEngine's userbuffers GEMMs): each
    is charged its share of the pieces' tiles run as one run of waves. 512 x 9216 at 128 x 256
    is 144 tiles, one wave of 132 SMs and 12 tiles over: alone a piece pays two waves; 8
    packed pieces are 1152 tiles, 9 waves (8.7 full), so about 0.55 of a piece alone."""
    P = _P_CLOCK_HELD  # the wave count alone (a packed run is longer: the power limiter takes more)
    piece = GemmSpec(m=512, n=9216, k=18432)
    packed = GemmSpec(m=512, n=9216, k=18432, packed_pieces=8)
    alone, share = gemm_time_s(piece, H100, P), gemm_time_s(packed, H100, P)
    whole = gemm_time_s(GemmSpec(m=8 * 512, n=9216, k=18432), H100, P)
    launch = P.kernel_launch_overhead_s
    assert share < 0.7 * alone
    # the whole GEMM's waves, but each piece's CTAs pay the full tile prologue on their first tile
    assert whole / 8 < share < (whole - launch) / 8 + launch + 0.05 * whole / 8
    # pieces of exactly one wave each (12 x 11 tiles on 132 SMs) leave no partial wave to fill,
    # and each piece's CTAs still pay the whole prologue: packing gains nothing
    exact = GemmSpec(m=128 * 12, n=256 * 11, k=8192)
    packed4 = GemmSpec(m=128 * 12, n=256 * 11, k=8192, packed_pieces=4)
    assert gemm_time_s(packed4, H100, P, tile=TILE) == pytest.approx(gemm_time_s(exact, H100, P, tile=TILE), rel=1e-9)


def test_packed_pieces_must_be_a_positive_count():
    with pytest.raises(ConfigError, match="packed_pieces"):
        GemmSpec(m=512, n=512, k=512, packed_pieces=0)


def test_power_settled_time_is_the_work_at_the_mean_clock():
    from ccoverlap.cost.compute import power_settled_s
    assert power_settled_s(1e-3, 1.0, 1e-4) == 1e-3            # no limiter
    assert power_settled_s(1e-3, 0.8, 0.0) == pytest.approx(1e-3 / 0.8)  # limited from the start
    tau = 1e-4
    for work in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2):
        t = power_settled_s(work, 0.8, tau)
        # the clock's integral over the run is the work: c T + (1 - c) tau (1 - e^(-T/tau))
        assert 0.8 * t + 0.2 * tau * (1 - math.exp(-t / tau)) == pytest.approx(work, rel=1e-9)
        assert work < t < work / 0.8
    assert power_settled_s(1e-6, 0.8, tau) < 1.01e-6            # a short kernel keeps its clock
    assert power_settled_s(1e-1, 0.8, tau) == pytest.approx(1e-1 / 0.8, rel=1e-3)  # a long one runs at c


def test_long_gemms_run_at_the_power_limited_clock_on_h100():
    # vidur's H100 GEMMs of 0.5-3 ms ran 13-16% slower than the model without the limiter while
    # those of 30-200 us agreed within 1% (docs/model.md "Kernels"): a long compute-bound GEMM
    # slows by close to 1 / gemm_power_clock_fraction, a short one hardly at all
    off = P.with_overrides(gemm_power_clock_fraction=1.0)
    assert P.gemm_power_clock_fraction < 0.85 and P.gemm_power_settle_s > 0
    long_gemm = GemmSpec(m=8192, n=8192, k=8192)
    short_gemm = GemmSpec(m=1024, n=1024, k=1024)
    slow_long = gemm_time_s(long_gemm, H100, P) / gemm_time_s(long_gemm, H100, off)
    slow_short = gemm_time_s(short_gemm, H100, P) / gemm_time_s(short_gemm, H100, off)
    assert 1.0 / P.gemm_power_clock_fraction * 0.93 < slow_long <= 1.0 / P.gemm_power_clock_fraction
    assert 1.0 <= slow_short < 1.03
    # in a training step the clock starts at the sustained clock: only the rest of the way is lost
    s = default_params(H100)
    assert s.sustained_clock_fraction > s.gemm_power_clock_fraction
    step = gemm_time_s(long_gemm, H100, s) / gemm_time_s(long_gemm, H100, s.with_overrides(gemm_power_clock_fraction=1.0))
    assert step == pytest.approx(s.sustained_clock_fraction / s.gemm_power_clock_fraction, rel=0.07)
    # GPUs where no limiter was fitted keep the clock
    for name in ("A40", "H200", "MI300X"):
        assert default_params(GPUS[name]).gemm_power_clock_fraction == 1.0
    with pytest.raises(ConfigError, match="gemm_power_clock_fraction"):
        CostParams(gemm_power_clock_fraction=1.2)
    with pytest.raises(ConfigError, match="gemm_power_clock_fraction"):
        CostParams(gemm_power_clock_fraction=0.0)


def test_long_gemms_run_at_the_power_limited_clock_on_a100():
    # the A100's fit half (docs/model.md "Kernels"): GEMMs of 32-256 us ran 2-5% faster than the
    # model at one clock, those past 0.5 ms 1-3% slower; fitted, a long GEMM runs at
    # gemm_power_clock_fraction of the clock short ones start at (1410 MHz, the datasheet's peak)
    a100 = GPUS["A100-80GB-SXM"]
    p = default_params(a100)
    assert 0.75 < p.gemm_power_clock_fraction < 0.9 and p.gemm_power_settle_s > 0
    assert p.sustained_clock_fraction == 1.0  # no sustained clock measured: a step starts at the boost clock
    off = p.with_overrides(gemm_power_clock_fraction=1.0)
    long_gemm, short_gemm = GemmSpec(m=8192, n=8192, k=8192), GemmSpec(m=1024, n=1024, k=1024)
    slow_long = gemm_time_s(long_gemm, a100, p) / gemm_time_s(long_gemm, a100, off)
    slow_short = gemm_time_s(short_gemm, a100, p) / gemm_time_s(short_gemm, a100, off)
    assert 1.0 / p.gemm_power_clock_fraction * 0.95 < slow_long <= 1.0 / p.gemm_power_clock_fraction
    assert 1.0 <= slow_short < 1.1
    # and its split-K pieces fold in one after another, as on the H100
    assert p.gemm_split_k_fixup_s > 0


def test_split_k_pieces_fold_in_one_after_another():
    # gemm_split_k_fixup_s per K piece past the first: a skinny GEMM of long K (split 2-16 ways)
    # pays it once per extra piece, a GEMM that does not split pays nothing
    spec = GemmSpec(m=64, n=1024, k=16384)
    base = P.with_overrides(gemm_split_k_fixup_s=0.0, gemm_power_clock_fraction=1.0)
    for split in (2, 4, 8):
        forced = base.with_overrides(gemm_max_split_k=split, gemm_small_tile_efficiency=0.0)
        t0 = gemm_time_s(spec, H100, forced, tile=None)
        t1 = gemm_time_s(spec, H100, forced.with_overrides(gemm_split_k_fixup_s=1e-6), tile=None)
        assert 0 < t1 - t0 <= (split - 1) * 1e-6 + 1e-15
    big = GemmSpec(m=8192, n=8192, k=4096)  # 2048 tiles: never split
    assert gemm_time_s(big, H100, base) == gemm_time_s(big, H100, base.with_overrides(gemm_split_k_fixup_s=1e-6))
    assert P.gemm_split_k_fixup_s > 0


def test_smaller_tiles_run_at_their_operand_reuse():
    """params.py [REUSE]: a tile's per-SM rate is gemm_small_tile_efficiency per halving of its
    reuse tm*tn/(tm+tn) against the main tile's: on 128x256, 128x128 keeps 3/4 of the reuse,
    64x256 3/5, 64x128 1/2, so 128x128 runs faster than 64x256 though each halves one side."""
    from ccoverlap.cost.compute import tile_candidates

    s = 0.5
    eff = {(tm, tn): e for tm, tn, e in tile_candidates(P.with_overrides(gemm_tile_m=128, gemm_tile_n=256,
                                                                         gemm_small_tile_efficiency=s))}
    assert eff[(128, 256)] == 1.0
    assert eff[(128, 128)] == pytest.approx(s ** math.log2(4 / 3))
    assert eff[(64, 256)] == pytest.approx(s ** math.log2(5 / 3))
    assert eff[(64, 128)] == pytest.approx(s)
    assert eff[(128, 128)] > eff[(64, 256)] > eff[(64, 128)]
    assert [t[:2] for t in tile_candidates(P.with_overrides(gemm_small_tile_efficiency=0.0))] == [TILE]
