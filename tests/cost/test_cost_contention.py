"""Contention (lagom §3.2 eqs. 4–6, Fig. 3; ficco §IV-D) and the CostModel the simulator calls."""

import math

import pytest

from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.cost import CostModel, comm_sms
from ccoverlap.sim.engine import simulate
from ccoverlap.sim.graph import (
    AttentionSpec,
    CollectiveSpec,
    CommConfig,
    CopySpec,
    GemmSpec,
    GroupSpec,
    MemorySpec,
    OpGraph,
    P2PSpec,
)

H100 = CLUSTERS["dgx-h100"]
A40 = CLUSTERS["a40-pcie"]
NODE8 = GroupSpec(name="tp", size=8, local_size=8)
FFN = GemmSpec(m=8192, n=14336, k=4096)   # Llama-3-8B FFN up-projection, 8192 tokens
MiB = 1 << 20


def allreduce(nbytes=32 * MiB, **cfg):
    return CollectiveSpec(collective="all_reduce", bytes=nbytes, group=NODE8, config=CommConfig(**cfg))


def allgather(nbytes, transport="sm", **cfg):
    return CollectiveSpec(collective="all_gather", bytes=nbytes, group=NODE8, transport=transport,
                          config=CommConfig(**cfg))


def test_gemm_slows_as_channels_grow():
    cm = CostModel(A40)
    alone = cm.duration_s(FFN)
    t = [cm.duration_s(FFN, (allreduce(channels=nc, chunk_bytes=16384),)) for nc in (1, 2, 4, 8, 16, 32)]
    assert alone <= t[0]
    assert all(a <= b for a, b in zip(t, t[1:])) and t[-1] > 1.3 * t[0]


def test_lagom_fig3_more_channels_same_comm_slower_compute():
    """lagom §3.2: NC=16 vs NC=32 -> nearly the same AllReduce(32 MB) time on 8 A40 (PCIe), FFN 30.2% slower."""
    cm = CostModel(A40)
    ar16, ar32 = allreduce(channels=16, chunk_bytes=16384), allreduce(channels=32, chunk_bytes=16384)
    comm16, comm32 = cm.duration_s(ar16, (FFN,)), cm.duration_s(ar32, (FFN,))
    assert abs(comm32 / comm16 - 1) < 0.1
    ratio = cm.duration_s(FFN, (ar32,)) / cm.duration_s(FFN, (ar16,))
    assert 1.15 < ratio < 1.5


@pytest.mark.parametrize("cluster", [H100, A40], ids=["h100", "a40"])
def test_gemm_slows_as_chunk_grows(cluster):
    cm = CostModel(cluster)
    t = [cm.duration_s(FFN, (allreduce(channels=4, chunk_bytes=c),)) for c in (16384, 65536, 262144, MiB)]
    assert all(a < b for a, b in zip(t, t[1:]))


def test_threads_barely_matter_for_contention():
    cm = CostModel(H100)
    t128 = cm.duration_s(FFN, (allreduce(channels=16, threads=128),))
    t512 = cm.duration_s(FFN, (allreduce(channels=16, threads=512),))
    assert t128 != t512 and abs(t128 / t512 - 1) < 0.02


@pytest.mark.parametrize("cluster", [H100, A40], ids=["h100", "a40"])
def test_dma_comm_slows_the_gemm_less_than_sm_comm(cluster):
    cm = CostModel(cluster)
    alone = cm.duration_s(FFN)
    sm = cm.duration_s(FFN, (allgather(64 * MiB),))
    dma = cm.duration_s(FFN, (allgather(64 * MiB, transport="dma"),))
    assert alone < dma < sm
    assert (dma - alone) < 0.5 * (sm - alone)


def test_copy_engine_traffic_takes_memory_bandwidth_from_a_streaming_kernel():
    # ficco §IV-A: DMA offload removes compute interference but memory interference remains
    cm = CostModel(H100)
    stream = MemorySpec(bytes=4e9)
    dma = allgather(256 * MiB, transport="dma")
    v = cm.profile(dma).hbm_bytes_per_s
    b = H100.gpu.hbm_bytes_per_s * cm.params.mem_bw_fraction
    expect = stream.bytes / (b - v) + cm.params.kernel_launch_overhead_s
    assert cm.duration_s(stream, (dma,)) == pytest.approx(expect, rel=1e-6)
    assert cm.duration_s(stream, (dma,)) > 1.1 * cm.duration_s(stream)


def test_comm_beside_compute_is_slower_than_alone():
    cm = CostModel(H100)
    for op in (allreduce(), allgather(64 * MiB, transport="dma"), P2PSpec(bytes=64 * MiB, inter_node=True),
               CopySpec(bytes=1e9, direction="d2h")):
        alone = cm.duration_s(op)
        beside_gemm = cm.duration_s(op, (FFN,))
        beside_memory_bound = cm.duration_s(op, (MemorySpec(bytes=4e9),))
        assert alone < beside_gemm < beside_memory_bound


def test_collectives_sharing_a_link_share_it_but_not_across_levels():
    cm = CostModel(H100)
    ar = allreduce(256 * MiB)
    alone = cm.duration_s(ar)
    assert cm.duration_s(ar, (allgather(256 * MiB),)) > 1.9 * alone
    beside_inter_p2p = cm.duration_s(ar, (P2PSpec(bytes=256 * MiB, inter_node=True),))
    assert alone < beside_inter_p2p < 1.3 * alone  # only memory interference, no link sharing


def test_concurrent_compute_kernels_share_the_gpu():
    cm = CostModel(H100)
    other = GemmSpec(m=4096, n=4096, k=4096)
    assert cm.duration_s(FFN, (other,)) > 1.8 * cm.duration_s(FFN)
    mem = MemorySpec(bytes=2e9)
    assert cm.duration_s(mem, (other,)) > 1.5 * cm.duration_s(mem)


def test_comm_sms():
    assert comm_sms(allreduce(channels=8)) == 8
    assert comm_sms(allreduce(), H100) == 16      # NCCL default on NVSwitch
    assert comm_sms(allreduce(), A40) == 2        # PCIe
    assert comm_sms(allgather(MiB, transport="dma"), H100) == 0
    assert comm_sms(FFN) == 0
    cm = CostModel(H100)
    assert cm.comm_sms(allreduce()) == 16 and cm.comm_config(allreduce()).chunk_bytes is not None


def test_every_spec_type_alone_and_beside_others():
    cm = CostModel(H100)
    specs = [FFN, AttentionSpec(flops=1e12, bytes=1e9), MemorySpec(bytes=1e9, flops=1e8), allreduce(),
             allgather(MiB, transport="dma"), P2PSpec(bytes=MiB, inter_node=False),
             P2PSpec(bytes=MiB, inter_node=True, transport="sm"), CopySpec(bytes=1e8, direction="h2d"),
             CopySpec(bytes=1e8, direction="d2d")]
    for s in specs:
        alone = cm.duration_s(s, ())
        assert math.isfinite(alone) and alone > 0
        mixed = tuple(o for o in specs if o is not s)
        d = cm.duration_s(s, mixed)
        assert math.isfinite(d) and d >= alone
        assert cm.duration_s(s, mixed) == d  # deterministic (and cached)


def test_simulated_overlap_stretches_the_gemm():
    cm = CostModel(H100)
    g = OpGraph()
    g.add("ffn", FFN, stream="compute")
    g.add("ar", allreduce(256 * MiB), stream="comm")
    tl = simulate(g, cm)
    ffn_dur = float((tl.end_s - tl.start_s)[list(tl.name).index("ffn")])
    assert ffn_dur > cm.duration_s(FFN) * 1.02
    assert ffn_dur < cm.duration_s(FFN, (allreduce(256 * MiB),)) * 1.0001
