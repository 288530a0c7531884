"""GPUs, links and clusters as data, every number with its source.

Peak numbers here are the vendor's datasheet values (dense, i.e. without 2:4 sparsity).
What fraction of a peak is achievable is *not* baked in here: those are named factors in
:mod:`ccoverlap.cost.params` so a calibration (``ccoverlap calibrate``) can replace them.

Bandwidths are bytes/s **per direction**; a link's ``bandwidth_bytes_per_s`` is what one GPU
can send to the fabric (intra-node) or through its share of the node's NICs (inter-node).
Users add their own GPU / cluster with a JSON, TOML or YAML file (:func:`load_cluster_file`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal, get_args

from ccoverlap.config import (
    Count,
    Count0,
    NonNegative,
    Positive,
    check_fields,
    dataclass_from_mapping,
    read_config_file,
    short,
    suggest,
)
from ccoverlap.errors import ConfigError

GB = 1e9
TB = 1e12
MiB = 1 << 20

Fabric = Literal["nvswitch", "pcie", "full_mesh", "nvlink_pair", "infiniband", "roce", "efa", "ethernet"]
FABRICS = get_args(Fabric)


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator. ``peak_flops`` maps dtype name (bf16, fp16, fp32) to dense FLOP/s;
    ``sms`` is the SM count (CUs on AMD); ``copy_engines`` the asynchronous DMA engines
    usable for copies beside kernels; ``ll128_default`` whether the collective library
    enables its LL128 protocol by default on this part (``[LL128]`` below)."""

    name: str
    vendor: str
    sms: Count
    peak_flops: dict[str, Positive]
    hbm_bytes_per_s: Positive
    memory_bytes: Positive
    l2_bytes: Positive
    copy_engines: Count0
    max_threads_per_sm: Count = 2048
    ll128_default: bool = True
    source: str = ""

    def __post_init__(self) -> None:
        check_fields(self, f"GPU {short(self.name)}")
        for dt in ("bf16", "fp16", "fp32"):
            if dt not in self.peak_flops:
                raise ConfigError(f"GPU {self.name!r}: peak_flops needs an entry for {dt!r}")

    def flops_for(self, dtype_bytes: int) -> float:
        """Dense peak FLOP/s for operands of ``dtype_bytes`` (1 -> fp8, 2 -> bf16, 4 -> fp32).
        A GPU without an ``fp8`` entry (Ampere and older) raises ConfigError for 1-byte operands."""
        if dtype_bytes == 1:
            if "fp8" not in self.peak_flops:
                raise ConfigError(f"GPU {self.name!r} has no FP8 peak in the catalog (no FP8 tensor cores)")
            return self.peak_flops["fp8"]
        return self.peak_flops["fp32" if dtype_bytes >= 4 else "bf16"]


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """A fabric as one GPU sees it: per-direction bandwidth per GPU and one-hop latency.

    ``nvlink_pair`` only: ``pair_bridge_bytes_per_s`` is the per-direction line rate of the
    PCIe link of each GPU, the path joining the NVLink-bridged pairs that a ring over more
    than 2 GPUs of the node crosses (0 when not stated: the ring is then taken to run at the
    NVLink rate); ``pairs_per_socket`` how many pairs share one CPU socket's PCIe root (a
    ring over more pairs crosses the inter-socket link; 0 when not stated)."""

    fabric: Fabric
    bandwidth_bytes_per_s: Positive
    latency_s: NonNegative
    pair_bridge_bytes_per_s: NonNegative = 0.0
    pairs_per_socket: Count0 = 0
    source: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "link")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """``nodes`` × ``gpus_per_node`` GPUs; ``intra`` inside a node, ``inter`` between nodes.
    ``host_issue_s``: seconds the node's host (CPU, driver, eager PyTorch) takes to issue one
    collective, the floor of a loop of back-to-back calls (:func:`ccoverlap.cost.comm.back_to_back_time_s`);
    0 when not measured for this node: the GPU's default ``comm_host_issue_s`` then."""

    name: str
    gpu: GPUSpec
    nodes: Count
    gpus_per_node: Count
    intra: LinkSpec
    inter: LinkSpec
    host_issue_s: NonNegative = 0.0

    def __post_init__(self) -> None:
        check_fields(self, f"cluster {short(self.name)}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def with_nodes(self, nodes: int) -> ClusterSpec:
        return replace(self, nodes=nodes)


# ----------------------------------------------------------------------------- GPU catalog
# Sources:
#  [H100]   NVIDIA H100 Tensor Core GPU datasheet (SXM5 column) and "NVIDIA H100 Tensor Core
#           GPU Architecture" whitepaper (132 SMs on SXM5, 50 MB L2).
#  [H200]   NVIDIA H200 Tensor Core GPU datasheet (SXM column): same Hopper compute as H100 SXM,
#           141 GB HBM3e at 4.8 TB/s.
#  [A100]   NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column) and "NVIDIA A100 Tensor Core
#           GPU Architecture" whitepaper (108 SMs, 40 MB L2).
#  [A40]    NVIDIA A40 datasheet (84 SMs, 48 GB GDDR6 696 GB/s, 6 MB L2, BF16 tensor 149.7 TF dense).
#  [MI300X] AMD Instinct MI300X datasheet and CDNA 3 whitepaper (304 CUs, 192 GB HBM3 at
#           5.3 TB/s, 256 MB Infinity Cache, 4 MB L2 per XCD x 8).
#  [FP8]    dense FP8 (E4M3/E5M2) tensor peaks, i.e. the datasheet's "with sparsity" figure halved:
#           H100 SXM5 and H200 SXM 3,958 TFLOPS sparse -> 1,978.9 dense (NVIDIA H100 / H200
#           datasheets; Hopper whitepaper Table 2); MI300X 5,229.8 sparse -> 2,614.9 dense (AMD
#           MI300X datasheet). Ampere (A100, A40) has no FP8 tensor cores: no entry.
#  [LL128]  NCCL enables LL128 by default only on compute capability 7.0, 8.0 and 9.0 with
#           NVLink between the ring's GPUs (NCCL v2.18.3, src/graph/tuning.cc, "Enable LL128 by
#           default only on Volta/Ampere/Hopper+NVLink": a switch on minCompCap with cases 70,
#           80, 90 and `default: pEnable &= 0`). A40 is GA102, compute capability 8.6: off.
#           RCCL enables it on MI300X (the catalog's earlier behaviour, kept).
#  [CE]     copy engines: cudaDeviceProp::asyncEngineCount as printed by CUDA's deviceQuery on
#           these parts; MI300X: SDMA engines per the CDNA 3 whitepaper (ficco §IV-D uses them).
#  [NVL]    NVIDIA H100 NVL datasheet: the same GH100 with 132 SMs at a 350-400 W limit, BF16
#           1,671 / FP8 3,341 TFLOPS with sparsity -> 835.5 / 1,670.5 dense, FP32 60 TFLOPS.
#  [PCAP]   power-limited H100 (Meta's Grand Teton H100, 96 GB HBM2e at 2.4 TB/s, 500 W limit;
#           torchtitan docs/performance.md and arXiv:2410.06511: "the actual peak TFLOPs should
#           be between SXM and NVL, and we don't know the exact value"). ASSUMPTION: the
#           sustainable peak follows the power limit as a power law through the two datasheet
#           points (H100 SXM 700 W, H100 NVL 400 W): peak(P) = peak_SXM * (P/700)^a with
#           a = ln(989.4/835.5)/ln(700/400) = 0.302 (DVFS: dynamic power ~ f*V^2 with V rising
#           with f makes f grow roughly like P^(1/3); the two datasheets give 0.30). At 500 W:
#           0.9035 of every SXM peak. See power_limited_peak().
H100_SXM_TDP_W = 700.0
H100_NVL_TDP_W = 400.0


def power_limited_peak(peak_sxm: float, power_w: float, *, peak_nvl: float = 835.5e12,
                       peak_sxm_ref: float = 989.4e12) -> float:
    """Dense peak (FLOP/s) of an H100 (GH100, 132 SMs) held to ``power_w`` watts: the SXM
    ``peak_sxm`` scaled by the power law through the H100 SXM (700 W, 989.4 TFLOP/s bf16) and
    H100 NVL (400 W, 835.5) datasheet points ([PCAP]; an assumption between two sources)."""
    import math

    if power_w <= 0:
        raise ConfigError(f"power limit must be positive, got {power_w} W")
    a = math.log(peak_sxm_ref / peak_nvl) / math.log(H100_SXM_TDP_W / H100_NVL_TDP_W)
    return peak_sxm * (min(power_w, H100_SXM_TDP_W) / H100_SXM_TDP_W) ** a


GPUS: dict[str, GPUSpec] = {
    "H100-SXM": GPUSpec(
        name="H100-SXM", vendor="nvidia", sms=132,
        peak_flops={"bf16": 989.4 * TB, "fp16": 989.4 * TB, "fp32": 66.9 * TB,  # [H100]
                    "fp8": 1978.9 * TB},  # [FP8]
        hbm_bytes_per_s=3.35 * TB, memory_bytes=80 * GB, l2_bytes=50 * MiB,  # [H100]
        copy_engines=3,  # [CE]
        source="NVIDIA H100 datasheet (SXM5), Hopper whitepaper",
    ),
    "H200": GPUSpec(
        name="H200", vendor="nvidia", sms=132,
        peak_flops={"bf16": 989.4 * TB, "fp16": 989.4 * TB, "fp32": 66.9 * TB,  # [H200]
                    "fp8": 1978.9 * TB},  # [FP8]
        hbm_bytes_per_s=4.8 * TB, memory_bytes=141 * GB, l2_bytes=50 * MiB,  # [H200]
        copy_engines=3,  # [CE]
        source="NVIDIA H200 datasheet (SXM)",
    ),
    "A100-80GB-SXM": GPUSpec(
        name="A100-80GB-SXM", vendor="nvidia", sms=108,
        peak_flops={"bf16": 312 * TB, "fp16": 312 * TB, "fp32": 19.5 * TB},  # [A100]
        hbm_bytes_per_s=2.039 * TB, memory_bytes=80 * GB, l2_bytes=40 * MiB,  # [A100]
        copy_engines=3,  # [CE]
        source="NVIDIA A100 datasheet (80GB SXM), Ampere whitepaper",
    ),
    "A40": GPUSpec(
        name="A40", vendor="nvidia", sms=84,
        peak_flops={"bf16": 149.7 * TB, "fp16": 149.7 * TB, "fp32": 37.4 * TB},  # [A40]
        hbm_bytes_per_s=696 * GB, memory_bytes=48 * GB, l2_bytes=6 * MiB,  # [A40]
        copy_engines=2,  # [CE]
        max_threads_per_sm=1536,  # Ampere GA102 (compute capability 8.6)
        ll128_default=False,  # [LL128]: sm86
        source="NVIDIA A40 datasheet",
    ),
    "H100-96GB-HBM2e-500W": GPUSpec(
        name="H100-96GB-HBM2e-500W", vendor="nvidia", sms=132,
        peak_flops={dt: power_limited_peak(v * TB, 500.0)  # [PCAP]
                    for dt, v in (("bf16", 989.4), ("fp16", 989.4), ("fp32", 66.9), ("fp8", 1978.9))},
        hbm_bytes_per_s=2.4 * TB, memory_bytes=96 * GB, l2_bytes=50 * MiB,  # torchtitan performance.md
        copy_engines=3,  # [CE], as H100 SXM
        source="Meta Grand Teton H100 (torchtitan docs/performance.md: 96 GB HBM2e, 2.4 TB/s, 500 W); "
               "peaks: H100 SXM datasheet scaled to 500 W through the H100 NVL datasheet [PCAP]",
    ),
    "MI300X": GPUSpec(
        name="MI300X", vendor="amd", sms=304,
        peak_flops={"bf16": 1307.4 * TB, "fp16": 1307.4 * TB, "fp32": 163.4 * TB,  # [MI300X]
                    "fp8": 2614.9 * TB},  # [FP8]
        hbm_bytes_per_s=5.3 * TB, memory_bytes=192 * GB, l2_bytes=32 * MiB,  # [MI300X]
        copy_engines=16,  # [CE]
        source="AMD Instinct MI300X datasheet, CDNA 3 whitepaper",
    ),
}

_ALIASES = {"h100": "H100-SXM", "h100-sxm5": "H100-SXM", "h200-sxm": "H200", "a100": "A100-80GB-SXM",
            "a100-80gb": "A100-80GB-SXM", "a100-sxm": "A100-80GB-SXM", "mi300": "MI300X",
            "h100-500w": "H100-96GB-HBM2e-500W", "grand-teton-h100": "H100-96GB-HBM2e-500W"}

# ----------------------------------------------------------------------------- links
# Sources:
#  [NVL4]  H100 datasheet: NVLink 900 GB/s bidirectional per GPU -> 450 GB/s per direction.
#  [NVL3]  A100 datasheet: NVLink 600 GB/s bidirectional per GPU -> 300 GB/s per direction.
#  [PCIe4] PCI Express 4.0 x16: 16 GT/s x 16 lanes, 128b/130b -> 31.5 GB/s per direction.
#  [IF]    ficco §III: MI300X fully connected by Infinity Fabric links of 64 GB/s per direction,
#          7 peers -> 448 GB/s per direction per GPU. Per-step latency: RCCL's time model for
#          8 x MI300X (ROCm/rccl src/graph/tuning.cc, tuning_model_5) uses 2.1 us per Simple
#          ring step on xGMI (0.8 us LL), close to the 2.0 us here.
#  [NDR]   InfiniBand NDR 400 Gb/s = 50 GB/s per direction per NIC (one NIC per GPU on DGX H100).
#  [HDR]   InfiniBand HDR 200 Gb/s = 25 GB/s per direction per NIC (one per GPU on DGX A100).
#  [LAT]   one-hop latencies: NCCL's tuning model uses a few microseconds per step for NVLink and
#          PCIe and ~5-10 µs for IB (nccl src/graph/tuning.cc base latencies); values here are
#          those orders of magnitude and are replaced by calibration.
#  [TCPXOLAT] FITTED: 169 µs per Simple step (63 µs LL, the H100's LL step 0.374 of Simple's)
#          over GPUDirect-TCPXO, with link_efficiency_ethernet 0.752 on the H100, on the fit half of the corpus table
#          nccl_tests_a3mega_h100_2x8_all_reduce (a 2 x 8 all-reduce of 8 B-4 KiB takes 123-147 µs
#          there, against ~40 µs on one NVSwitch node; validation.collectives.FIT_CLUSTER). The
#          traffic crosses a user-space TCP stack on the host, not an RDMA NIC.
#  [HOST]  FITTED: seconds the node's host takes to issue one collective from eager PyTorch
#          (ClusterSpec.host_issue_s), the floor of microsoft/vidur's back-to-back torch.distributed
#          loops, on the fit half of each cluster's vidur all-reduce table with its GPU's other
#          parameters fixed (`python benchmarks/fit_collectives.py`; FIT_CLUSTER): DGX H100 37.3 µs,
#          the Azure 4 x H100 NVL VM 27.8 µs, DGX A100 50.3 µs, the Azure 4 x A100 PCIe VM 59.4 µs.
#          The hosts differ (Xeon 8480C in a DGX H100, EPYC 7742 in a DGX A100, EPYC VMs on
#          Azure), which the GPU's one value (params.comm_host_issue_s) could not follow.
NVSWITCH_H100 = LinkSpec(fabric="nvswitch", bandwidth_bytes_per_s=450 * GB, latency_s=2.0e-6, source="[NVL4][LAT]")
NVSWITCH_A100 = LinkSpec(fabric="nvswitch", bandwidth_bytes_per_s=300 * GB, latency_s=2.0e-6, source="[NVL3][LAT]")
PCIE4 = LinkSpec(fabric="pcie", bandwidth_bytes_per_s=31.5 * GB, latency_s=3.0e-6, source="[PCIe4][LAT]")
IF_MESH = LinkSpec(fabric="full_mesh", bandwidth_bytes_per_s=448 * GB, latency_s=2.0e-6, source="[IF][LAT]")
IB_NDR_PER_GPU = LinkSpec(fabric="infiniband", bandwidth_bytes_per_s=50 * GB, latency_s=5.0e-6, source="[NDR][LAT]")
IB_HDR_PER_GPU = LinkSpec(fabric="infiniband", bandwidth_bytes_per_s=25 * GB, latency_s=5.0e-6, source="[HDR][LAT]")
# lagom §4.1 cluster B: 2 nodes x 8 A40, PCIe 4.0 inside, 100 Gb/s InfiniBand between nodes:
# one 100 Gb/s NIC = 12.5 GB/s per direction, shared by the node's 8 GPUs.
IB_100G_PER_NODE_8GPU = LinkSpec(fabric="infiniband", bandwidth_bytes_per_s=12.5 * GB / 8, latency_s=5.0e-6,
                                 source="lagom §4.1 cluster B (100 Gb/s IB per node)[LAT]")
# lagom §4.1 cluster A: 2 nodes x 8 A40 "connected internally via NVLink with full 400 Gbps
# connectivity and between nodes using 2x400 Gbps InfiniBand".
#  [A40NVL] A40 datasheet: an NVLink bridge joins 2 GPUs, 112.5 GB/s bidirectional (56 GB/s per
#           direction); 8 A40s are 4 bridged pairs, and a ring over the node crosses PCIe 4.0
#           x16 (31.5 GB/s per direction) between the pairs. Read on this node, NCCL's topology
#           model (v2.18.3, src/graph/topo.cc: Gen4 x16 = 24 GB/s, sm86 NVLink 12 GB/s per link
#           x 4; src/graph/search.cc) finds 4 rings of 12 GB/s, two each way round, and
#           src/graph/connect.cc doubles them to the 8 channels lagom §4.3 reports: 48 GB/s per
#           GPU, the paper's 400 Gbps (50 GB/s) within 4%.
#  [SOCK]   8-GPU A40 servers with NVLink bridges are dual-socket, 4 GPUs (2 pairs) under each
#           CPU: NVIDIA/nccl-tests#74 (8 x A40, 4 bridges, two AMD EPYC 7302: "P2P via PCIe"
#           across the sockets slower than through host memory); microsoft/vidur's 8 x A40
#           all-reduce reaches ~58 GB/s busbw on 4 GPUs but ~26 on 8 (corpus table
#           vidur_a40_all_reduce), the 8-GPU ring crossing the sockets.
#           The line rate here is the paper's; what the PCIe hops between pairs reach through the
#           CPUs is not published for the paper's servers (docs/seeds.md).
NVLINK_PAIRS_A40 = LinkSpec(fabric="nvlink_pair", bandwidth_bytes_per_s=50 * GB, latency_s=2.0e-6,
                            pair_bridge_bytes_per_s=31.5 * GB, pairs_per_socket=2,
                            source="lagom §4.1 cluster A (400 Gb/s)[A40NVL][PCIe4][SOCK][LAT]")
#  [PAIRS]  4 GPUs a node, NVLink bridges joining GPUs 0-1 and 2-3, PCIe between the pairs:
#           the nodes behind microsoft/vidur's pairwise-NVLink collective tables (vidur
#           docs/profiling.md: Azure Standard_NC96ads_A100_v4, 4 x A100 80GB PCIe; "Azure internal
#           VM with 4 80GB H100 NVL GPUs"). A100 PCIe datasheet: NVLink bridge 600 GB/s
#           bidirectional (300 per direction), PCIe 4.0 x16 host link; H100 NVL datasheet: NVLink
#           bridge 600 GB/s bidirectional, PCIe 5.0 x16 (63 GB/s per direction). The catalog has
#           no PCIe A100 / H100 NVL GPU entry: the SXM parts stand in (same GA100 / GH100 chip,
#           compute capability 8.0 / 9.0, so NCCL picks the same protocols); use these clusters
#           for communication, not for compute.
NVLINK_PAIRS_A100_PCIE = LinkSpec(fabric="nvlink_pair", bandwidth_bytes_per_s=300 * GB, latency_s=2.0e-6,
                                  pair_bridge_bytes_per_s=31.5 * GB, source="[PAIRS][PCIe4][LAT]")
NVLINK_PAIRS_H100_NVL = LinkSpec(fabric="nvlink_pair", bandwidth_bytes_per_s=300 * GB, latency_s=2.0e-6,
                                 pair_bridge_bytes_per_s=63 * GB, source="[PAIRS][LAT]")
IB_2X400G_PER_NODE_8GPU = LinkSpec(fabric="infiniband", bandwidth_bytes_per_s=2 * 50 * GB / 8, latency_s=5.0e-6,
                                   source="lagom §4.1 cluster A (2 x 400 Gb/s IB per node)[NDR][LAT]")

#  [A3M]   Google Cloud A3 Mega (a3-megagpu-8g): 8 x H100 SXM on NVSwitch, 8 NICs x 200 Gb/s a
#           node (1,600 Gb/s), GPU-to-NIC traffic over GPUDirect-TCPXO (Ethernet): 25 GB/s per
#           direction per GPU. The nccl-tests table of the collective corpus
#           (nccl_tests_a3mega_h100_2x8_all_reduce) ran on two such nodes.
TCPXO_200G_PER_GPU = LinkSpec(fabric="ethernet", bandwidth_bytes_per_s=25 * GB, latency_s=169e-6,
                              source="[A3M][TCPXOLAT]")

#  [EFA]   AWS Elastic Fabric Adapter: an RDMA transport (SRD) that NCCL drives through the
#           aws-ofi-nccl network plugin with GPUDirect RDMA ("via NET/AWS Libfabric/0/GDRDMA" in
#           the p4d NCCL log of the corpus table nccl_tests_aws_p4d_a100_2x8_all_reduce).
#  [P5]    AWS EC2 P5 (p5.48xlarge, aws.amazon.com/ec2/instance-types/p5): 8 x H100 SXM on
#           NVSwitch, 3,200 Gb/s of EFA a node (32 EFA interfaces) = 400 Gb/s = 50 GB/s per
#           direction per GPU.
#  [P4D]   AWS EC2 P4d (p4d.24xlarge, aws.amazon.com/ec2/instance-types/p4): 8 x A100 40GB SXM on
#           NVSwitch (600 GB/s bidirectional per GPU), 400 Gb/s of EFA a node (4 x 100 Gb/s) =
#           50 GB/s a node, 6.25 GB/s per direction per GPU. The catalog's A100 80GB SXM stands in
#           for the 40GB part (same GA100 chip and NVLink; use this cluster for communication).
#  [EFALAT] FITTED: the time NCCL's step across EFA takes, 96 us a Simple step on 2 x p5.48xlarge
#           (36 us LL) and 365 us on 2 x p4d.24xlarge (91 us LL; NCCL 2.8.3), with the GPU's
#           link_efficiency_efa, on the fit half of each cluster's nccl-tests table
#           (validation.collectives.FIT_CLUSTER): a 2 x 8 all-reduce of 8 B-2 KiB takes 77-88 us on
#           p5 and 167-169 us on p4d, against ~40 us on one NVSwitch node. Far above EFA's wire
#           latency: the step is the proxy thread's and the libfabric plugin's, not the wire's.
EFA_P5_PER_GPU = LinkSpec(fabric="efa", bandwidth_bytes_per_s=50 * GB, latency_s=96.1e-6, source="[EFA][P5][EFALAT]")
EFA_P4D_PER_GPU = LinkSpec(fabric="efa", bandwidth_bytes_per_s=50 * GB / 8, latency_s=365e-6,
                           source="[EFA][P4D][EFALAT]")

#  [NDV5]  Azure ND H100 v5 (learn.microsoft.com, "ND H100 v5-series"): 8 x H100 80GB SXM on
#           NVSwitch, 8 x 400 Gb/s NDR InfiniBand (ConnectX-7) a VM, one per GPU [NDR].
#  [NDV4]  Azure NDm A100 v4 (learn.microsoft.com, "NDm A100 v4-series"): 8 x A100 80GB SXM on
#           NVSwitch, 8 x 200 Gb/s HDR InfiniBand a VM, one per GPU [HDR].
#  [NCCLT] FITTED: the floor of an nccl-tests loop of all-reduces on the ND A100 v4 node (a C loop,
#           no PyTorch), 44.4 us, on the fit half of azure_nd_a100_v4_1x8_all_reduce
#           (validation.collectives.FIT_CLUSTER; 42-51 us from 8 KiB to 1 MiB there). The ND H100 v5
#           table ran NVLS at every size, whose time stays above any floor: it does not decide one.

CLUSTERS: dict[str, ClusterSpec] = {
    "dgx-h100": ClusterSpec(name="dgx-h100", gpu=GPUS["H100-SXM"], nodes=1, gpus_per_node=8,
                            intra=NVSWITCH_H100, inter=IB_NDR_PER_GPU, host_issue_s=37.3e-6),  # [HOST]
    "hgx-h200": ClusterSpec(name="hgx-h200", gpu=GPUS["H200"], nodes=1, gpus_per_node=8,
                            intra=NVSWITCH_H100, inter=IB_NDR_PER_GPU),
    "dgx-a100": ClusterSpec(name="dgx-a100", gpu=GPUS["A100-80GB-SXM"], nodes=1, gpus_per_node=8,
                            intra=NVSWITCH_A100, inter=IB_HDR_PER_GPU, host_issue_s=50.3e-6),  # [HOST]
    "a40-pcie": ClusterSpec(name="a40-pcie", gpu=GPUS["A40"], nodes=2, gpus_per_node=8,
                            intra=PCIE4, inter=IB_100G_PER_NODE_8GPU),
    "a40-nvlink": ClusterSpec(name="a40-nvlink", gpu=GPUS["A40"], nodes=2, gpus_per_node=8,
                              intra=NVLINK_PAIRS_A40, inter=IB_2X400G_PER_NODE_8GPU),
    "a100-pcie-nvlink-pairs": ClusterSpec(name="a100-pcie-nvlink-pairs", gpu=GPUS["A100-80GB-SXM"], nodes=1,
                                          gpus_per_node=4, intra=NVLINK_PAIRS_A100_PCIE, inter=IB_HDR_PER_GPU,
                                          host_issue_s=59.4e-6),  # [HOST]
    "h100-nvl-nvlink-pairs": ClusterSpec(name="h100-nvl-nvlink-pairs", gpu=GPUS["H100-SXM"], nodes=1,
                                         gpus_per_node=4, intra=NVLINK_PAIRS_H100_NVL, inter=IB_NDR_PER_GPU,
                                         host_issue_s=27.8e-6),  # [HOST]
    "a3-mega": ClusterSpec(name="a3-mega", gpu=GPUS["H100-SXM"], nodes=2, gpus_per_node=8,
                           intra=NVSWITCH_H100, inter=TCPXO_200G_PER_GPU),
    "aws-p5": ClusterSpec(name="aws-p5", gpu=GPUS["H100-SXM"], nodes=2, gpus_per_node=8,
                          intra=NVSWITCH_H100, inter=EFA_P5_PER_GPU),
    "aws-p4d": ClusterSpec(name="aws-p4d", gpu=GPUS["A100-80GB-SXM"], nodes=2, gpus_per_node=8,
                           intra=NVSWITCH_A100, inter=EFA_P4D_PER_GPU),
    "azure-nd-h100-v5": ClusterSpec(name="azure-nd-h100-v5", gpu=GPUS["H100-SXM"], nodes=1, gpus_per_node=8,
                                    intra=NVSWITCH_H100, inter=IB_NDR_PER_GPU),  # [NDV5]
    "azure-nd-a100-v4": ClusterSpec(name="azure-nd-a100-v4", gpu=GPUS["A100-80GB-SXM"], nodes=1, gpus_per_node=8,
                                    intra=NVSWITCH_A100, inter=IB_HDR_PER_GPU, host_issue_s=44.4e-6),  # [NDV4][NCCLT]
    "mi300x": ClusterSpec(name="mi300x", gpu=GPUS["MI300X"], nodes=1, gpus_per_node=8,
                          intra=IF_MESH, inter=IB_NDR_PER_GPU),
}
DEFAULT_CLUSTER_FOR_GPU = {"H100-SXM": "dgx-h100", "H200": "hgx-h200", "A100-80GB-SXM": "dgx-a100",
                           "A40": "a40-pcie", "MI300X": "mi300x"}


def get_gpu(name: str) -> GPUSpec:
    """The catalog GPU called ``name`` (case-insensitive; a few aliases), else ConfigError."""
    if not isinstance(name, str):
        raise ConfigError(f"GPU name must be a string, got {type(name).__name__}")
    for key in GPUS:
        if key.lower() == name.lower():
            return GPUS[key]
    alias = _ALIASES.get(name.lower())
    if alias:
        return GPUS[alias]
    raise ConfigError(f"unknown GPU {short(name)}{suggest(name, list(GPUS) + list(_ALIASES))}; "
                      f"known: {', '.join(GPUS)} (or give a file with --cluster)")


def get_cluster(name: str, *, nodes: int | None = None) -> ClusterSpec:
    """A catalog cluster by name, or the default cluster of a catalog GPU; ``nodes`` overrides
    (an integer from 1 to 2**20, checked by :class:`ClusterSpec`)."""
    if not isinstance(name, str):
        raise ConfigError(f"cluster name must be a string, got {type(name).__name__}")
    key = name.lower()
    if key in CLUSTERS:
        c = CLUSTERS[key]
    else:
        try:
            gpu = get_gpu(name)
        except ConfigError:
            raise ConfigError(f"unknown cluster {short(name)}{suggest(name, list(CLUSTERS) + list(GPUS))}; "
                              f"clusters: {', '.join(CLUSTERS)} (a GPU name such as H100-SXM gives its "
                              f"default cluster; `ccoverlap list gpus`; or give a cluster file)") from None
        c = CLUSTERS[DEFAULT_CLUSTER_FOR_GPU[gpu.name]]
    return c if nodes is None else c.with_nodes(nodes)


# ----------------------------------------------------------------------------- user files

def gpu_from_dict(data: dict, where: str = "gpu") -> GPUSpec:
    """A GPUSpec from a mapping (numbers in base units: FLOP/s, bytes/s, bytes)."""
    return dataclass_from_mapping(GPUSpec, data, where)


def cluster_from_dict(data: dict, where: str = "cluster") -> ClusterSpec:
    """A ClusterSpec from a mapping; ``gpu`` may be a catalog name or a full GPU mapping,
    ``intra``/``inter`` full link mappings."""
    data = dict(data)
    gpu = data.get("gpu")
    if isinstance(gpu, str):
        data["gpu"] = get_gpu(gpu)
    elif isinstance(gpu, dict):
        data["gpu"] = gpu_from_dict(gpu, f"{where}.gpu")
    else:
        raise ConfigError(f"{where}.gpu: expected a GPU name or mapping")
    for link in ("intra", "inter"):
        if link not in data:
            raise ConfigError(f"{where}: missing field {link!r}")
        data[link] = dataclass_from_mapping(LinkSpec, data[link], f"{where}.{link}")
    return dataclass_from_mapping(ClusterSpec, data, where)


def load_cluster_file(path: str | os.PathLike) -> ClusterSpec:
    """A cluster from a JSON/TOML/YAML file (top level, or under a ``cluster`` key)."""
    data = read_config_file(path)
    if "cluster" in data and isinstance(data["cluster"], dict):
        data = data["cluster"]
    return cluster_from_dict(data, where=str(path))
