"""FiCCO §V-C heuristic (pure Python): the shape rule, the OTB x MT bands, and the guards."""

from __future__ import annotations

import sys

import pytest

from ccoverlap.deciders.ficco.heuristic import (
    FICCO_SCHEDULES,
    HETERO_UNFUSED_FACTOR,
    choose_schedule,
    gemm_stats,
)

MI300X = {"peak_flops": 1307.4e12, "mem_bw_bytes_per_s": 5.3e12}


def test_module_does_not_import_torch():
    import importlib

    before = "torch" in sys.modules
    importlib.reload(sys.modules["ccoverlap.deciders.ficco.heuristic"])
    src = open(sys.modules["ccoverlap.deciders.ficco.heuristic"].__file__).read()
    assert "import torch" not in src
    assert before == ("torch" in sys.modules)


def test_gemm_stats_units():
    s = gemm_stats(4, 3, 2, 2)
    assert s.flops == 2 * 4 * 3 * 2
    assert s.mem_traffic_bytes == (4 * 2 + 3 * 2 + 4 * 3) * 2
    assert s.op_to_byte == pytest.approx(s.flops / s.mem_traffic_bytes)
    assert s.combined_flops == pytest.approx(s.flops)
    with pytest.raises(ValueError):
        gemm_stats(0, 1, 1, 2)


def test_m_not_above_k_picks_2d():
    # Table I g5 (8192, 8192, 262144): M < K -> column sharding (§V-C)
    name, reason = choose_schedule(8192, 8192, 262144, 8, 2, **MI300X)
    assert name == "uniform-fused-2d"
    assert "M=8192 <= K=262144" in reason


def test_bands_of_the_combined_metric():
    peak = 1e12  # threshold = 1e12 flop with the 1 s reference time
    kw = {"peak_flops": peak, "mem_bw_bytes_per_s": 1e11, "comm_engine": "dma"}
    # M > K; flops = 2*M*N*K
    low = choose_schedule(4096, 1024, 1024, 8, 2, **kw)  # 8.6e9 flop << 1e12
    mid = choose_schedule(65536, 8192, 2048, 8, 2, **kw)  # 2.2e12: between 1x and 5x
    high = choose_schedule(262144, 8192, 8192, 8, 2, **kw)  # 3.5e13 > 5e12
    assert (low[0], mid[0], high[0]) == ("uniform-fused-1d", "hetero-fused-1d", "hetero-unfused-1d")
    # combined metric exactly 5x the threshold is not "exceeds by 5x"
    m, n, k = 5 * 10**6, 500, 200
    f = 2 * m * n * k  # 1e12 flop
    at = choose_schedule(m, n, k, 8, 2, peak_flops=f / HETERO_UNFUSED_FACTOR, mem_bw_bytes_per_s=1e11)
    assert at[0] == "hetero-fused-1d"


def test_sm_engine_shrinks_the_uniform_band():
    kw = {"peak_flops": 1e12, "mem_bw_bytes_per_s": 1e11}
    m, n, k = 65536, 4096, 2048
    f = 2 * m * n * k  # 1.1e12 flop
    kw["peak_flops"] = f / 0.75  # combined = 0.75 x threshold
    assert choose_schedule(m, n, k, 8, 2, comm_engine="dma", **kw)[0] == "uniform-fused-1d"
    assert choose_schedule(m, n, k, 8, 2, comm_engine="sm", **kw)[0] == "hetero-fused-1d"


def test_guards():
    assert choose_schedule(4096, 64, 64, 1, 4, **MI300X)[0] == "serial"
    # 12 rows over 8 ranks: one row per shard, cannot cut into 8 pieces -> ring
    assert choose_schedule(12, 64, 4, 8, 4, **MI300X)[0] == "ring"
    with pytest.raises(ValueError):
        choose_schedule(64, 64, 64, 2, 4, peak_flops=0, mem_bw_bytes_per_s=1)
    with pytest.raises(ValueError):
        choose_schedule(64, 64, 64, 2, 4, comm_engine="nvlink", **MI300X)


def test_every_answer_is_a_runtime_schedule():
    from itertools import product

    seen = set()
    for m, n, k, p in product((64, 4096, 131072), (64, 8192), (64, 16384), (2, 8)):
        name, reason = choose_schedule(m, n, k, p, 2, **MI300X)
        assert name in (*FICCO_SCHEDULES, "serial", "ring")
        assert reason
        seen.add(name)
    assert {"uniform-fused-2d", "uniform-fused-1d"} <= seen


# ---------------------------------------------------------------- step 0: "overlap cannot help"
CPU = {"peak_flops": 1e11, "mem_bw_bytes_per_s": 2e10}


def test_overlap_gain_ratio_units():
    from ccoverlap.deciders.ficco.heuristic import overlap_gain_ratio

    # 2 ranks receive half of [m, k] fp32: 0.5 * 100 * 10 * 4 B at 1e3 B/s = 2 s; GEMM 2*100*5*10 / 1e3 = 10 s
    assert overlap_gain_ratio(100, 5, 10, 2, 4, peak_flops=1e3, link_bw_bytes_per_s=1e3) == pytest.approx(0.2)


def test_gemm_heavy_shape_goes_serial_and_comm_heavy_does_not():
    from ccoverlap.deciders.ficco.heuristic import COMM_DIL, OVERLAP_LOSS_SM, overlap_gain_ratio

    # the documented CPU shapes with the CPU defaults (0.5 GB/s loopback link)
    name, why = choose_schedule(4096, 1024, 1024, 2, 4, **CPU, comm_engine="sm", link_bw_bytes_per_s=5e8)
    r = overlap_gain_ratio(4096, 1024, 1024, 2, 4, peak_flops=1e11, link_bw_bytes_per_s=5e8)
    assert r * (1 - COMM_DIL) < OVERLAP_LOSS_SM
    assert name == "serial" and "overlap cannot help" in why
    name, _ = choose_schedule(8192, 128, 1024, 2, 4, **CPU, comm_engine="sm", link_bw_bytes_per_s=5e8)
    assert name in FICCO_SCHEDULES


def test_serial_branch_threshold_and_engine():
    # ratio 0.2 -> 0.18 after comm DIL: below the SM loss (0.27) and the DMA loss (0.16)? 0.18 > 0.16
    kw = dict(peak_flops=1e3, mem_bw_bytes_per_s=1e3, link_bw_bytes_per_s=1e3)
    assert choose_schedule(100, 5, 10, 2, 4, comm_engine="sm", **kw)[0] == "serial"
    assert choose_schedule(100, 5, 10, 2, 4, comm_engine="dma", **kw)[0] != "serial"
    assert choose_schedule(100, 5, 10, 2, 4, comm_engine="dma", overlap_loss=0.19, **kw)[0] == "serial"
    # a fast link makes communication negligible: serial regardless of shape (also when M <= K)
    assert choose_schedule(64, 64, 4096, 2, 2, **MI300X, link_bw_bytes_per_s=1e18)[0] == "serial"
    # without a link bandwidth the rule is FiCCO's unchanged
    assert choose_schedule(64, 64, 4096, 2, 2, **MI300X)[0] == "uniform-fused-2d"
    with pytest.raises(ValueError):
        choose_schedule(100, 5, 10, 2, 4, link_bw_bytes_per_s=0, **{k: v for k, v in kw.items() if k != "link_bw_bytes_per_s"})


def test_bf16_h100_keeps_overlapping_a_comm_bound_gemm():
    # H100 SXM, bf16, NVLink 450 GB/s: a short-K GEMM is communication-bound -> a FiCCO schedule
    name, _ = choose_schedule(16384, 1024, 8192, 8, 2, peak_flops=989e12, mem_bw_bytes_per_s=3.35e12,
                              comm_engine="sm", link_bw_bytes_per_s=450e9)
    assert name in FICCO_SCHEDULES
