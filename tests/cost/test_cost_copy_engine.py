"""Copy-engine (DMA) traffic beside a GEMM (ficco §IV-A, §IV-D1): the memory-subsystem
interference that DMA offload leaves, one coefficient per GPU type."""

from __future__ import annotations

import pytest

from ccoverlap.catalog.hardware import get_gpu
from ccoverlap.cost import copy_engine as ce
from ccoverlap.cost.model import CostModel
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.deciders.ficco import schedules as ficco
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, GroupSpec, MemorySpec, P2PSpec

MESH = ficco.machine("MI300X", "full_mesh", 8)
GROUP = GroupSpec(name="tp", size=8, local_size=8)
GEMM = GemmSpec(m=16384, n=2048, k=16384)  # compute-bound (an 8-way piece of Table I's g2 per GPU)
STEP = CollectiveSpec(collective="all_gather", bytes=537e6, group=GROUP, transport="dma")


def test_only_copy_engine_work_counts():
    assert ce.is_copy_engine_op(STEP)
    assert ce.is_copy_engine_op(CopySpec(bytes=1e6, direction="d2d"))
    assert ce.is_copy_engine_op(P2PSpec(bytes=1e6, inter_node=False, transport="dma"))
    assert not ce.is_copy_engine_op(CollectiveSpec(collective="all_gather", bytes=1e6, group=GROUP))
    assert not ce.is_copy_engine_op(MemorySpec(bytes=1e6))
    gpu, p = get_gpu("MI300X"), CostParams()
    ach = gpu.hbm_bytes_per_s * p.mem_bw_fraction
    sm = CollectiveSpec(collective="all_gather", bytes=1e6, group=GROUP)
    assert ce.copy_engine_hbm_share([STEP, sm], [0.25 * ach, 0.5 * ach], gpu, p) == pytest.approx(0.25)


def test_slowdown_is_a_step_plus_a_share_and_gemm_only():
    p = CostParams(copy_engine_gemm_slowdown=0.05, copy_engine_gemm_interference=0.5)
    assert ce.gemm_slowdown_beside_copy_engines(GEMM, 0.2, p) == pytest.approx(1.15)
    assert ce.gemm_slowdown_beside_copy_engines(GEMM, 1e-6, p) == pytest.approx(1.05, abs=1e-5)
    assert ce.gemm_slowdown_beside_copy_engines(GEMM, 3.0, p) == pytest.approx(1.55)  # share capped at 1
    assert ce.gemm_slowdown_beside_copy_engines(GEMM, 0.0, p) == 1.0  # no copy engine busy
    assert ce.gemm_slowdown_beside_copy_engines(MemorySpec(bytes=1e9), 0.2, p) == 1.0
    assert ce.gemm_slowdown_beside_copy_engines(GEMM, 0.2, CostParams()) == 1.0  # not measured: off


def test_one_value_per_gpu_type():
    """Measured (fitted on FiCCO's Fig. 9) for MI300X only; no public measurement for NVIDIA's
    copy engines, so their coefficient is 0 and their GEMMs see only the bandwidth term."""
    mi = default_params(get_gpu("MI300X"))
    assert mi.copy_engine_gemm_slowdown > 0 and mi.copy_engine_gemm_interference > 0
    for name in ("H100-SXM", "H200", "A100-80GB-SXM", "A40"):
        p = default_params(get_gpu(name))
        assert p.copy_engine_gemm_slowdown == 0.0 and p.copy_engine_gemm_interference == 0.0


def test_cost_model_slows_a_gemm_beside_copy_engine_traffic():
    """FiCCO §IV-D1: ~11% beside a FiCCO transfer step on MI300X. The terms are what do it: with
    the coefficients at 0 the compute-bound GEMM is < 3% slower (HBM bandwidth and L2 only)."""
    cost = CostModel(MESH)
    off = CostModel(MESH, cost.params.with_overrides(copy_engine_gemm_slowdown=0.0,
                                                     copy_engine_gemm_interference=0.0))
    alone = cost.alone_s(GEMM)
    with_term = cost.duration_s(GEMM, [STEP]) / alone
    without = off.duration_s(GEMM, [STEP]) / alone
    assert without < 1.03
    assert with_term == pytest.approx(1.11, abs=0.01)
    share = cost.profile(STEP).hbm_bytes_per_s / (MESH.gpu.hbm_bytes_per_s * cost.params.mem_bw_fraction)
    p = cost.params
    assert with_term / without == pytest.approx(1 + p.copy_engine_gemm_slowdown + p.copy_engine_gemm_interference * share)


def test_sm_driven_collectives_keep_their_own_contention():
    """The copy-engine term never touches SM-driven communication (lagom §3.2's model)."""
    cost = CostModel(MESH)
    off = CostModel(MESH, cost.params.with_overrides(copy_engine_gemm_slowdown=0.0,
                                                     copy_engine_gemm_interference=0.0))
    sm = CollectiveSpec(collective="all_gather", bytes=537e6, group=GROUP)
    assert cost.duration_s(GEMM, [sm]) == off.duration_s(GEMM, [sm])
