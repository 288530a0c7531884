"""Sanity numbers against published measurements, with generous bounds.

Run ``pytest tests/cost/test_cost_sanity.py -s`` to see the values printed.
"""

from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.cost import CostModel, bus_bandwidth
from ccoverlap.specs import CollectiveSpec, CommConfig, GemmSpec, GroupSpec

MiB = 1 << 20
GiB = 1 << 30


def test_llama3_8b_ffn_gemm_on_h100():
    """m=8192 tokens, k=4096, n=14336 (Llama-3-8B FFN), bf16, H100 SXM.

    Reference: large bf16 cuBLAS GEMMs on H100 SXM reach roughly 70-80% of the 989 TFLOP/s
    dense peak (~700-800 TFLOP/s) in public benchmarks, i.e. ~1.2-1.4 ms for this 0.96 TFLOP GEMM.
    """
    cm = CostModel(CLUSTERS["dgx-h100"])
    spec = GemmSpec(m=8192, n=14336, k=4096)
    t = cm.duration_s(spec)
    frac = spec.flops / t / cm.gpu.peak_flops["bf16"]
    print(f"\nLlama-3-8B FFN GEMM on H100: {t * 1e3:.3f} ms, {spec.flops / t / 1e12:.0f} TFLOP/s = {frac:.1%} of peak")
    assert 1.1e-3 < t < 1.45e-3
    assert 0.68 < frac < 0.82


def test_h100_nvswitch_all_reduce_busbw():
    """8 x H100 on NVSwitch, all-reduce: ring, and NVLink SHARP (NVLS, NCCL's default there).

    Reference: NVIDIA/nccl-tests#212 (sjeaugey): 450 GB/s line rate, ~20% protocol overhead,
    "NCCL can get an effective NVLink bandwidth of 370GB/s" with NCCL_ALGO=RING, and 256 MB
    "is too small to reach peak bandwidth"; with NVLS "a peak busBw of ~480GB/s" on 8 GPUs
    (476 GB/s in NVIDIA/nccl-tests#290, 475 on 8 x H200 in #272).
    """
    cm = CostModel(CLUSTERS["dgx-h100"])
    g = GroupSpec(name="tp", size=8, local_size=8)
    ring, nvls = {}, {}
    for m in (256 * MiB, 4 * GiB):
        t = cm.duration_s(CollectiveSpec(collective="all_reduce", bytes=m, group=g, config=CommConfig(algorithm="ring")))
        ring[m] = bus_bandwidth("all_reduce", m, 8, t)
        nvls[m] = bus_bandwidth("all_reduce", m, 8, cm.duration_s(CollectiveSpec(collective="all_reduce", bytes=m, group=g)))
        print(f"\nH100 x8 all-reduce {m / MiB:.0f} MiB: busbw ring {ring[m] / 1e9:.0f}, default {nvls[m] / 1e9:.0f} GB/s")
    assert 320e9 < ring[256 * MiB] < 400e9
    assert 350e9 < ring[4 * GiB] < 390e9
    assert ring[256 * MiB] < ring[4 * GiB]
    assert 465e9 < nvls[4 * GiB] < 490e9
    assert nvls[256 * MiB] < nvls[4 * GiB]


def test_a40_two_node_all_gather_is_inter_node_bound():
    """16 ranks, 2 nodes x 8 A40, PCIe 4.0 inside, one 100 Gb/s IB NIC per node (lagom §4.1
    cluster B): 12.5 GB/s per node, 1.56 GB/s per GPU share.

    A ring crosses each node boundary once per direction, so busbw is bound by the node's NIC
    (~12.5 GB/s; NVIDIA/nccl-tests#196 shows this ring bound on 2 x 8 GPUs with a single
    100 Gb/s NIC), i.e. ~1.5 GB/s per GPU share of the NIC.
    """
    cl = CLUSTERS["a40-pcie"]
    cm = CostModel(cl)
    m = 256 * MiB
    g = GroupSpec(name="dp", size=16, local_size=8)
    t = cm.duration_s(CollectiveSpec(collective="all_gather", bytes=m, group=g))
    busbw = bus_bandwidth("all_gather", m, 16, t)
    per_gpu = busbw / 8
    print(f"\nA40 2x8 all-gather {m / MiB:.0f} MiB: {t * 1e3:.1f} ms, busbw {busbw / 1e9:.2f} GB/s "
          f"= {per_gpu / 1e9:.2f} GB/s per GPU share of the node NIC")
    assert 1.1e9 < per_gpu <= cl.inter.bandwidth_bytes_per_s
    assert busbw < 12.5e9


def test_h100_one_gpu_per_node_reduce_scatter_busbw():
    """The DP group of a TP 8 layout on DGX H100: one GPU per node, 48 nodes, each GPU on its own
    NDR 400G NIC; fp32 gradient reduce-scatter of 1 GB (Megatron-Core bucket order of magnitude).

    Reference: NVIDIA/nccl-tests#290 (AddyLaddy, NVIDIA): "For NDR @ 400Gbps you should see
    46-48GB/s per NIC". No in-network reduction helps a ring reduce-scatter with one GPU per node.
    """
    from ccoverlap.catalog.hardware import get_cluster

    cluster = get_cluster("dgx-h100", nodes=48)
    cm = CostModel(cluster)
    g = GroupSpec(name="dp", size=48, local_size=1)
    m = 1e9
    t = cm.duration_s(CollectiveSpec(collective="reduce_scatter", bytes=m, group=g))
    bw = bus_bandwidth("reduce_scatter", m, 48, t)
    print(f"\nreduce-scatter, 48 nodes x 1 GPU, 1 GB: {t * 1e3:.2f} ms, busbw {bw / 1e9:.1f} GB/s")
    assert 42e9 < bw < 48.5e9
    # two GPUs of the group per node use two NICs: twice the bus bandwidth (TP 4 layout)
    g2 = GroupSpec(name="dp", size=48, local_size=2)
    t2 = CostModel(get_cluster("dgx-h100", nodes=24)).duration_s(
        CollectiveSpec(collective="reduce_scatter", bytes=m, group=g2))
    assert 1.8 < t / t2 < 2.1
