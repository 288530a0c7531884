"""The measurement plan (pure Python): ficco shapes scaled to fit, the NC/NT/C grid, launch
checks of the channel-copy kernel, and recognising catalog GPUs from CUDA device names."""

import pytest

from ccoverlap.calibrate import grids
from ccoverlap.calibrate.kernels import check_launch
from ccoverlap.calibrate.microbench import catalog_gpu
from ccoverlap.catalog.hardware import GPUS


@pytest.mark.parametrize("quick", [False, True])
def test_ficco_shapes_fit_the_budgets_and_keep_their_character(quick):
    grid = grids.make_grid(quick)
    shapes = grids.ficco_shapes(grid)
    assert [s[0] for s in shapes] == (["g1", "g2", "g5", "g6"] if quick else [f"g{i}" for i in range(1, 17)])
    paper = {name: (m, n, k) for name, m, n, k in grids.FICCO_GEMMS}
    for name, m, n, k, scale in shapes:
        assert 2.0 * m * n * k <= grid.gemm_flop_budget * 1.05
        assert (m * k + k * n + m * n) * 2 <= grid.gemm_mem_budget * 1.05
        assert m % 512 == 0 and k % 512 == 0  # 64-way splits give whole pieces of 8-row multiples
        pm, pn, pk = paper[name]
        assert (m < k) == (pm < pk)  # which split loses more (ficco Fig. 7) depends on M vs K
        assert 0 < scale <= 1


def test_scale_gemm_leaves_small_shapes_alone():
    assert grids.scale_gemm(1024, 2048, 4096, flop_budget=1e15, mem_budget=1e12)[:3] == (1024, 2048, 4096)


def test_scale_gemm_respects_tiny_budgets():
    m, n, k, s = grids.scale_gemm(1048576, 57344, 8192, flop_budget=1e10, mem_budget=1e8)
    assert min(m, n, k) >= 512 and s < 0.05
    assert 2.0 * m * n * k <= 1.05e10 and m > n > k


@pytest.mark.parametrize("quick", [False, True])
def test_contention_grid(quick):
    grid = grids.make_grid(quick)
    pts = grids.contention_points(grid)
    assert len(pts) == len(set(pts))
    main = {(nc, c) for nc, nt, c in pts if nt == grid.threads}
    assert main == {(nc, c) for nc in grid.channels for c in grid.chunks}
    for nc, c in grid.nt_points:
        assert {nt for n, nt, cc in pts if (n, cc) == (nc, c)} == set(grid.nt_sweep)
    for nc, nt, c in pts:
        check_launch(nc=nc, nt=nt, chunk_bytes=c, total_bytes=64 << 20, backend="triton")
    assert max(grid.channels) <= GPUS["H100-SXM"].sms


@pytest.mark.parametrize("quick", [False, True])
def test_gemm_sweep_covers_dtypes_waves_and_k(quick):
    shapes = grids.gemm_sweep(quick)
    assert len(shapes) == len(set(shapes))
    assert {s[0] for s in shapes} == {"bf16", "fp16", "fp32"}
    stair = [m for dt, m, n, k in shapes if dt == "bf16" and (n, k) == (4096, 4096)]
    assert len(stair) >= 8  # crosses several 132-SM wave boundaries
    ks = {k for dt, m, n, k in shapes if dt == "bf16" and (m, n) == (4096, 4096)}
    assert min(ks) <= 128 and max(ks) >= 8192


@pytest.mark.parametrize("kw,msg", [
    (dict(nc=0, nt=128, chunk_bytes=4096, total_bytes=1), "NC"),
    (dict(nc=4, nt=100, chunk_bytes=4096, total_bytes=1), "NT"),
    (dict(nc=4, nt=2048, chunk_bytes=4096, total_bytes=1), "NT"),
    (dict(nc=4, nt=128, chunk_bytes=1000, total_bytes=1), "C must"),
    (dict(nc=4, nt=128, chunk_bytes=4096, total_bytes=0), "total"),
])
def test_check_launch_rejects(kw, msg):
    with pytest.raises(ValueError, match=msg):
        check_launch(**kw)


def test_triton_needs_power_of_two_threads():
    check_launch(nc=4, nt=96, chunk_bytes=4096, total_bytes=1, backend="cuda")
    with pytest.raises(ValueError, match="power of two"):
        check_launch(nc=4, nt=96, chunk_bytes=4096, total_bytes=1, backend="triton")


@pytest.mark.parametrize("name,expected", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"), ("NVIDIA A100-SXM4-40GB", None),
    ("NVIDIA A40", "A40"), ("AMD Instinct MI300X", "MI300X"), ("NVIDIA GeForce RTX 4090", None),
])
def test_catalog_gpu_from_device_name(name, expected):
    assert catalog_gpu(name) == expected
