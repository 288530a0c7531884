"""Collective and point-to-point times: alpha-beta per algorithm, with NCCL's knobs.

Closed forms (``M`` bytes as nccl-tests' ``size``, ``n`` ranks, ``B`` bytes/s per direction
per GPU, ``α`` seconds per step) — the textbook costs of Thakur et al. / NCCL:

* ring all-reduce            2(n−1)/n · M/B + 2(n−1)·α
* ring all-gather / RS       (n−1)/n · M/B + (n−1)·α
* double binary tree AR      2(n−1)/n · M/B + 2·ceil(log2 n)·α   (full bandwidth, log latency)
  (NCCL's tree is a chain inside a node: one node's tree pays 2(n−1)·α, :func:`chain_all_reduce_latency_s`)
* pairwise all-to-all        (n−1)/n · M/B + (n−1)·α
* pipelined chain bcast/red  M/B + (n−1)·α
* point-to-point             M/B + α
* NVLS all-reduce (NVSwitch) (1 + 1/n)·M/B_nvls + α_nvls    (the switch reduces and multicasts)

Bus bandwidth (nccl-tests doc/PERFORMANCE.md): ``busbw = algbw × factor`` with ``algbw =
M / t`` and factor 2(n−1)/n (all-reduce), (n−1)/n (all-gather, reduce-scatter, all-to-all),
1 (broadcast, reduce).

``B`` in a real collective is what the knobs let it reach (lagom §2.2, §3.2):

* link line rate × ``link_efficiency_<fabric>`` × protocol factor (LL 1/2, LL128 120/128);
* NC channels, each limited to ``channel_bytes_per_s`` (× (NT/512)^e below 512 threads),
  approach that rate with diminishing returns: soft-min of NC·b_ch and the link rate;
* chunks of C bytes: each chunk step pays ``chunk_step_overhead_s`` (small C slow) and the
  pipeline fill/drain costs ``chunk_pipeline_depth`` chunk steps (huge C, few steps, slow).

Topology: a group of ``size`` ranks with ``local_size`` per node spans ``nodes`` nodes. A flat
ring crosses each node boundary once per direction, so its inter-node hop carries one ring
link's traffic through the node's NICs — ``local_size`` per-GPU shares of ``cluster.inter``.
Hierarchical algorithms run an intra-node phase on ``cluster.intra`` and an inter-node phase
in which every GPU uses its own NIC share. On a full mesh (MI300X) each peer is one link,
so groups smaller than the node, and point-to-point transfers, reach only the links to their
peers (ficco §III-C). Where NVLink bridges join pairs of GPUs (``nvlink_pair``), a ring over
more than the pair also crosses the PCIe path between pairs (:func:`ring_intra_link`), which
then bounds it at the PCIe efficiency. Across nodes the algorithm is chosen as NCCL's tuner rates it
(:func:`tuner_time_s`: a tree at 0.45 of the ring's bus bandwidth where there is no NVLS-Tree)
and timed physically; a ring's latency pays the network only on its node-crossing steps
(:func:`ring_latency_s`). The DMA path (``transport="dma"``) copies pieces
peer to peer with copy engines: no SMs, no reductions, intra-node only (ficco §IV-B, §IV-D).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ccoverlap.catalog.hardware import ClusterSpec, LinkSpec
from ccoverlap.cost.params import CostParams, checked_inputs
from ccoverlap.errors import ConfigError
from ccoverlap.specs import (
    COLLECTIVES,
    Collective,
    CollectiveSpec,
    CommConfig,
    CommProtocol,
    CopySpec,
    GroupSpec,
    P2PSpec,
)

KiB = 1 << 10
MiB = 1 << 20

ALGORITHMS = ("auto", "ring", "tree", "nvls", "pairwise", "hierarchical", "hierarchical_intra_first",
              "hierarchical_inter_first", "direct")
REDUCING = ("all_reduce", "reduce_scatter", "reduce")

# NCCL defaults (config defaults, not fitted parameters). Sources:
#  channels  8x H800 on NVSwitch: "16 coll channels ... 16 p2p channels per peer" (NCCL INFO log in
#            NVIDIA/nccl#892); lagom §4.3: NC=8 for an FSDP all-gather on A40 NVLink (cluster A).
#            NCCL v2.18.3 gives the same 8 there: its ring search (src/graph/search.cc) finds 4
#            rings of 12 GB/s over the node's NVLink pairs and PCIe 4.0 hops (24 GB/s per
#            direction in src/graph/topo.cc, two rings each way) and ncclTopoPostset
#            (src/graph/connect.cc) doubles the channels. PCIe alone: 1 ring of 10 GB/s where a
#            dual-socket Intel link caps it (SKL_QPI_BW), doubled to 2, GPUs under different
#            root ports then going through host memory (P2P only up to PATH_PXB on Intel,
#            src/graph/paths.cc); 2 rings of 12 GB/s, doubled to 4, where nothing but PCIe does
#            (dual-socket AMD too: v2.18.3 has no AMD_BW, which 2.16.2 and 2.19+ set to 16 GB/s).
#            2 is kept (the CPUs of lagom's cluster B are not stated; at 4 its Lagom/NCCL ratios
#            change by at most 0.03; docs/seeds.md). xGMI: RCCL opens many
#            (assumption); inter-node p2p: NCCL_NCHANNELS_PER_NET_PEER default 2.
#  threads   NCCL_NTHREADS default 512 on recent GPUs.
#  chunk     Simple: NCCL_BUFFSIZE 4 MiB / NCCL_STEPS 8 steps x 4 chunk steps = 2 MiB (lagom §4.3 sees
#            C=2 MB); LL / LL128 buffers are smaller (order of magnitude, assumption).
#  protocol  the fastest of those NCCL enables (ll128_enabled: LL128 only on compute capability
#            7.0 / 8.0 / 9.0 with NVLink rings, NCCL v2.18.3 src/graph/tuning.cc).
DEFAULT_CHANNELS = {"nvswitch": 16, "nvlink_pair": 8, "pcie": 2, "full_mesh": 32,
                    "infiniband": 2, "roce": 2, "efa": 2, "ethernet": 2}
DEFAULT_P2P_INTER_CHANNELS = 2
DEFAULT_THREADS = 512
DEFAULT_CHUNK = {"simple": 2 * MiB, "ll": 32 * KiB, "ll128": 512 * KiB}
#  p2p chunk NCCL's send/recv pipeline their own chunk, not the collectives' (NCCL >= 2.12
#            src/enqueue.cc / src/init.cc: NCCL_P2P_NVL_CHUNKSIZE 512 KiB over NVLink,
#            NCCL_P2P_PCI_CHUNKSIZE and NCCL_P2P_NET_CHUNKSIZE 128 KiB over PCIe and the network).
DEFAULT_P2P_CHUNK = {"nvlink": 512 * KiB, "other": 128 * KiB}
LL128_FABRICS = ("nvswitch", "nvlink_pair", "full_mesh")
NETWORK_FABRICS = ("infiniband", "roce", "efa", "ethernet")  # NCCL/RCCL enable LL128 by default only there


# ----------------------------------------------------------------------------- closed forms

def ring_all_reduce_time_s(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Ring all-reduce: ``2(n−1)/n · M/B + 2(n−1)·α`` seconds (reduce-scatter + all-gather)."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bw + 2.0 * (n - 1) * latency


def ring_all_gather_time_s(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Ring all-gather of an ``M``-byte output: ``(n−1)/n · M/B + (n−1)·α`` seconds."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * latency


def ring_reduce_scatter_time_s(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Ring reduce-scatter of an ``M``-byte input: ``(n−1)/n · M/B + (n−1)·α`` seconds."""
    return ring_all_gather_time_s(nbytes, n, bw, latency)


def tree_all_reduce_time_s(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Double binary tree all-reduce (NCCL ≥ 2.4): ``2(n−1)/n · M/B + 2·ceil(log2 n)·α``.

    Each rank is interior in one tree and a leaf in the other, so across both trees it sends
    ≈ 2M (M for n = 2): ring's bandwidth term, with logarithmic instead of linear latency.
    """
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bw + 2.0 * math.ceil(math.log2(n)) * latency


def chain_all_reduce_latency_s(local: int, nodes: int, intra_latency: float, inter_latency: float) -> float:
    """Seconds of latency NCCL's tree all-reduce adds over ``nodes`` nodes of ``local`` ranks: a
    chain through each node's ranks, up and back down (2·(local − 1) node steps), and a double
    binary tree across the nodes (2·ceil(log2 nodes) network steps). NVIDIA/nccl
    src/graph/tuning.cc (ncclTopoTuneModel) rates the tree's latency so,
    ``2·((nRanks/nNodes − 1)·intraLat + log2i(nNodes)·interLat)``, and builds its intra-node
    part as a chain (src/graph/connect.cc, the tree's up/down links inside a node): on one
    node the tree has as many steps as a ring."""
    return 2 * (local - 1) * intra_latency + 2 * math.ceil(math.log2(nodes)) * inter_latency


def pairwise_all_to_all_time_s(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Pairwise-exchange all-to-all of an ``M``-byte send buffer per rank:
    ``(n−1)/n · M/B + (n−1)·α`` seconds."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * latency


def chain_broadcast_time_s(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Pipelined chain (ring) broadcast or reduce: ``M/B + (n−1)·α`` seconds."""
    if n <= 1:
        return 0.0
    return nbytes / bw + (n - 1) * latency


def p2p_transfer_time_s(nbytes: float, bw: float, latency: float) -> float:
    """One point-to-point transfer: ``M/B + α`` seconds."""
    return nbytes / bw + latency


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor (doc/PERFORMANCE.md): all_reduce 2(n−1)/n; all_gather,
    reduce_scatter, all_to_all (n−1)/n; broadcast, reduce 1."""
    if n < 1:
        raise ConfigError(f"group size must be >= 1, got {n}")
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ConfigError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """nccl-tests' algbw: ``size / time`` in bytes/s."""
    return nbytes / seconds if seconds > 0 else float("inf")


def bus_bandwidth(collective: str, nbytes: float, n: int, seconds: float) -> float:
    """nccl-tests' busbw in bytes/s: ``algbw × bus_bandwidth_factor``."""
    return algorithm_bandwidth(nbytes, seconds) * bus_bandwidth_factor(collective, n)


_RING_FORMS = {"all_reduce": ring_all_reduce_time_s, "all_gather": ring_all_gather_time_s,
               "reduce_scatter": ring_reduce_scatter_time_s, "all_to_all": pairwise_all_to_all_time_s,
               "broadcast": chain_broadcast_time_s, "reduce": chain_broadcast_time_s}


# ----------------------------------------------------------------------------- knobs -> bandwidth

def proto_bw_factor(protocol: str, params: CostParams) -> float:
    """Fraction of link bandwidth left to payload under ``protocol`` (NVIDIA/nccl#281)."""
    return {"simple": 1.0, "ll": params.proto_ll_bw_factor, "ll128": params.proto_ll128_bw_factor}[protocol]


def proto_latency_factor(protocol: str, params: CostParams) -> float:
    """Per-step latency of ``protocol`` relative to Simple."""
    return {"simple": 1.0, "ll": params.proto_ll_latency_factor,
            "ll128": params.proto_ll128_latency_factor}[protocol]


def channel_bandwidth(params: CostParams, threads: int, protocol: str = "simple") -> float:
    """Bytes/s one channel (thread block) can move with ``threads`` threads."""
    nt = min(1.0, threads / DEFAULT_THREADS)
    return params.channel_bytes_per_s * nt ** params.threads_bw_exponent * proto_bw_factor(protocol, params)


def effective_link_bandwidth(line_bytes_per_s: float, fabric: str, channels: int, threads: int,
                             protocol: str, params: CostParams, *, p2p: bool = False) -> float:
    """Bytes/s ``channels`` channels reach on a link of ``line_bytes_per_s`` per direction:
    the soft minimum of ``NC × channel bandwidth`` and ``line × link_efficiency × protocol``
    (diminishing returns, saturating at the link: lagom §3.2, Fig. 3b). A send/recv over a
    network (``p2p``) runs on NCCL_NCHANNELS_PER_NET_PEER channels, each also bounded by what
    its proxy moves (``net_channel_bytes_per_s``)."""
    link = line_bytes_per_s * params.link_efficiency(fabric) * proto_bw_factor(protocol, params)
    per_channel = channel_bandwidth(params, threads, protocol)
    if p2p and fabric in NETWORK_FABRICS:
        per_channel = min(per_channel, params.net_channel_bytes_per_s * proto_bw_factor(protocol, params))
    x = channels * per_channel / link
    p = params.channel_saturation_sharpness
    return link * x / (1.0 + x ** p) ** (1.0 / p)


def chunk_efficiency(bytes_per_channel: float, chunk_bytes: float, channel_bw: float,
                     protocol: str, params: CostParams) -> float:
    """Fraction of the channel bandwidth left after chunking (lagom §3.2, Fig. 3c):
    ``1 / (1 + depth/k + σ·b_ch/C)`` with ``k = ceil(bytes/C)`` chunk steps per channel,
    σ the per-step handshake (scaled by the protocol's latency factor)."""
    if bytes_per_channel <= 0:
        return 1.0
    c = min(float(chunk_bytes), bytes_per_channel)
    k = math.ceil(bytes_per_channel / c)
    sigma = params.chunk_step_overhead_s * proto_latency_factor(protocol, params)
    return 1.0 / (1.0 + params.chunk_pipeline_depth / k + sigma * channel_bw / c)


#: Buffer slots of one NCCL connection (``NCCL_STEPS`` in src/include/device.h, 8 since NCCL 2.4):
#: a sender may have this many chunks posted before it waits for the receiver.
NCCL_STEPS = 8


#: Largest send/recv NCCL runs with the LL protocol; larger ones run Simple (NCCL_P2P_LL_THRESHOLD,
#: default 16384 bytes, src/enqueue.cc).
P2P_LL_THRESHOLD = 16384


def p2p_chunk_efficiency(bytes_per_channel: float, chunk_bytes: float, channel_bw: float, protocol: str,
                         params: CostParams) -> float:
    """Fraction of the channel bandwidth a send/recv keeps after chunking: a one-hop pipeline
    through :data:`NCCL_STEPS` buffer slots. The first ``NCCL_STEPS`` chunks of a channel go
    out without waiting; after that the sender posts a chunk while the receiver empties the
    other slots, so a slot's flag round trip σ (``chunk_step_overhead_s``, scaled by the
    protocol's latency factor) stalls it only by what exceeds the time to fill the other
    ``NCCL_STEPS − 1`` slots: with ``k`` chunks a channel,
    ``1 / (1 + max(0, k − NCCL_STEPS)/k · max(0, σ·b_ch/C − (NCCL_STEPS − 1)))``. There is no
    ring to fill and drain (a collective's ``chunk_pipeline_depth``): the tail is the
    receiver's local copy of the last chunk."""
    if bytes_per_channel <= 0 or chunk_bytes <= 0 or channel_bw <= 0:
        return 1.0
    c = min(float(chunk_bytes), bytes_per_channel)
    k = math.ceil(bytes_per_channel / c)
    sigma = params.chunk_step_overhead_s * proto_latency_factor(protocol, params)
    stall = max(0.0, sigma * channel_bw / c - (NCCL_STEPS - 1))
    return 1.0 / (1.0 + max(0, k - NCCL_STEPS) / k * stall)


# ----------------------------------------------------------------------------- config defaults

def _check_group(group: GroupSpec, cluster: ClusterSpec) -> None:
    if group.local_size > cluster.gpus_per_node:
        raise ConfigError(f"group {group.name!r}: {group.local_size} ranks per node but the cluster has "
                          f"{cluster.gpus_per_node} GPUs per node")
    if group.nodes > cluster.nodes:
        raise ConfigError(f"group {group.name!r} spans {group.nodes} nodes; the cluster has {cluster.nodes}")


def ll128_enabled(group: GroupSpec, cluster: ClusterSpec) -> bool:
    """Whether the collective library enables LL128 for ``group`` by default (NCCL v2.18.3
    ``src/graph/tuning.cc``): only on GPUs where it is tested (``GPUSpec.ll128_default``:
    compute capability 7.0 / 8.0 / 9.0; A40 is 8.6) and only when the ring's intra-node hops
    are NVLink (``typeIntra <= PATH_NVB``), crossing nodes over InfiniBand / RoCE or AWS EFA
    (GPUDirect RDMA through NCCL's network plugin). NVLink
    bridges join pairs of GPUs (``nvlink_pair``): a ring over more than 2 GPUs of the node
    also crosses PCIe between the pairs, so it does not qualify."""
    if not cluster.gpu.ll128_default:
        return False
    fabrics = [cluster.intra.fabric] if group.local_size > 1 else []
    if group.nodes > 1:
        fabrics.append(cluster.inter.fabric)
    nvlink = [f for f in fabrics if f in LL128_FABRICS]
    if not nvlink or not all(f in LL128_FABRICS or f in ("infiniband", "roce", "efa") for f in fabrics):
        return False
    return not (cluster.intra.fabric == "nvlink_pair" and group.local_size > 2)


def allowed_protocols(group: GroupSpec, cluster: ClusterSpec) -> tuple[CommProtocol, ...]:
    """Protocols NCCL considers for ``group`` by default: Simple and LL, and LL128 where
    :func:`ll128_enabled`."""
    return ("simple", "ll128", "ll") if ll128_enabled(group, cluster) else ("simple", "ll")


def nvls_enabled(group: GroupSpec, cluster: ClusterSpec, params: CostParams) -> bool:
    """Whether NCCL can run an all-reduce of ``group`` with NVLink SHARP: one NVSwitch node of
    a GPU with NVLS (``params.nvls_link_efficiency`` > 0: Hopper), more than 2 ranks (NCCL
    v2.18+ ``src/graph/tuning.cc`` and ``nvls.cc``: NVLS needs the multicast fabric; 2 ranks
    gain nothing). Across nodes, NVLS-Tree: :func:`nvls_tree_enabled`."""
    return (params.nvls_link_efficiency > 0 and cluster.intra.fabric == "nvswitch" and group.nodes == 1
            and group.size > 2)


def nvls_all_reduce_time_s(nbytes: float, n: int, bw: float, latency: float) -> float:
    """NVLS all-reduce: each GPU reads its reduced shard from the switch and multicasts it
    back, ``(1 + 1/n) · M/B + α`` seconds (``B`` the GPU's NVLink rate the traffic reaches)."""
    if n <= 1:
        return 0.0
    return (1.0 + 1.0 / n) * nbytes / bw + latency


def nvls_tree_enabled(group: GroupSpec, cluster: ClusterSpec, params: CostParams) -> bool:
    """Whether NCCL (>= 2.18) can run an all-reduce of ``group`` across nodes as NVLS-Tree: NVLink
    SHARP inside each NVSwitch node of a GPU with NVLS, a tree between the nodes on every GPU's
    NIC. The model's hierarchical tree (:func:`_flat_time`) stands in for it."""
    return (params.nvls_link_efficiency > 0 and cluster.intra.fabric == "nvswitch" and group.nodes > 1
            and group.local_size > 1)


#: The fraction of its channels' bus bandwidth at which NCCL's tuner rates a tree's algorithm
#: bandwidth (a ring's: n / (2(n−1)) of it): tree busBw × 0.9, then × 0.5 to algorithm bandwidth
#: (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel). NCCL picks the algorithm by these
#: ratings, so across nodes it runs a ring for large all-reduces even where a tree would move
#: the bytes faster.
NCCL_TREE_RATED_FRACTION = 0.9 * 0.5


def tuner_time_s(prof: CommProfile, spec: CollectiveSpec, cluster: ClusterSpec, params: CostParams) -> float:
    """The time by which the algorithm is chosen: the profile's own, except for a tree all-reduce
    across nodes without NVLS-Tree (:func:`nvls_tree_enabled`), which NCCL's tuner rates at
    :data:`NCCL_TREE_RATED_FRACTION` of the ring's bus bandwidth on the same channels, plus the
    tree's latency (2·log2(nodes) network steps, 2·(ranks a node − 1) node steps)."""
    group = spec.group
    if (prof.algorithm != "tree" or group.nodes <= 1 or spec.collective != "all_reduce"
            or nvls_tree_enabled(group, cluster, params)):
        return prof.time_s
    cfg, m = prof.config, float(spec.bytes)
    bw, li, lo = _ring_across_nodes(bus_bandwidth_factor("all_reduce", group.size) * m, group, cluster, cfg, params)
    lat = chain_all_reduce_latency_s(group.local_size, group.nodes, li, lo)
    return params.comm_base_latency_s + lat + m / (NCCL_TREE_RATED_FRACTION * bw)


def _allowed_algorithms(collective: str, group: GroupSpec, cluster: ClusterSpec | None = None,
                        params: CostParams | None = None) -> tuple[str, ...]:
    algs: tuple[str, ...]
    if collective == "all_reduce":
        algs = ("ring", "tree")
        if cluster is not None and params is not None and nvls_enabled(group, cluster, params):
            algs += ("nvls",)
    elif collective == "all_to_all":
        algs = ("pairwise",)
    else:
        algs = ("ring",)
    return algs


def default_comm_config(collective: Collective, group: GroupSpec, cluster: ClusterSpec, *,
                        nbytes: float | None = None, params: CostParams | None = None,
                        transport: str = "sm") -> CommConfig:
    """The knobs NCCL would use by default for ``collective`` on ``group`` (sources at
    :data:`DEFAULT_CHANNELS`): channels by intra-node fabric (NVSwitch 16, NVLink pairs 8,
    PCIe 2), 512 threads, Simple's 2 MiB chunk. With ``nbytes``, protocol and algorithm are
    chosen as NCCL's tuner does: the fastest by this model (LL128 only where NCCL enables
    it); without, Simple and ``"auto"``."""
    if collective not in COLLECTIVES:
        raise ConfigError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    _check_group(group, cluster)
    fabric = cluster.intra.fabric if group.local_size > 1 else cluster.inter.fabric
    cfg = CommConfig(channels=DEFAULT_CHANNELS.get(fabric, 2), threads=DEFAULT_THREADS,
                     chunk_bytes=DEFAULT_CHUNK["simple"], protocol="simple",
                     algorithm="direct" if transport == "dma" else "auto")
    if nbytes is None or transport == "dma":
        return cfg
    spec = CollectiveSpec(collective=collective, bytes=nbytes, group=group,
                          config=CommConfig(channels=cfg.channels, threads=cfg.threads))
    return collective_profile(spec, cluster, params).config


def default_p2p_config(inter_node: bool, cluster: ClusterSpec) -> CommConfig:
    """NCCL's default knobs for a send/recv pair: p2p channels per peer (NVSwitch 16, inter-node
    NCCL_NCHANNELS_PER_NET_PEER = 2), 512 threads, Simple, p2p chunks (:data:`DEFAULT_P2P_CHUNK`:
    512 KiB over NVLink, 128 KiB over PCIe and the network)."""
    ch = DEFAULT_P2P_INTER_CHANNELS if inter_node else DEFAULT_CHANNELS.get(cluster.intra.fabric, 2)
    nvlink = not inter_node and cluster.intra.fabric in ("nvswitch", "nvlink_pair", "full_mesh")
    return CommConfig(channels=ch, threads=DEFAULT_THREADS, chunk_bytes=DEFAULT_P2P_CHUNK["nvlink" if nvlink else "other"],
                      protocol="simple", algorithm="direct")


# ----------------------------------------------------------------------------- collective time

@dataclass(frozen=True)
class CommProfile:
    """A communication op alone: ``time_s``; ``wire_bytes`` each GPU sends (all phases);
    ``levels`` it uses ("intra", "inter"); the resolved ``config`` (every knob set)."""

    time_s: float
    wire_bytes: float
    levels: frozenset
    config: CommConfig
    algorithm: str


def _intra_share(cluster: ClusterSpec, peers: int) -> float:
    """Fraction of ``cluster.intra``'s per-GPU bandwidth reachable with ``peers`` peers in the
    node. On a full mesh (MI300X) each peer has its own link (1/(G−1) of the total), so fewer
    peers leave links idle (ficco §III-C: peer-to-peer on a mesh is up to 7x slower); a switch
    gives any peer the full rate."""
    g = cluster.gpus_per_node
    if cluster.intra.fabric != "full_mesh" or g <= 1:
        return 1.0
    return min(1.0, max(peers, 1) / (g - 1))


def ring_intra_link(cluster: ClusterSpec, local: int, params: CostParams) -> LinkSpec:
    """The intra-node link a ring over ``local`` GPUs of a node is bounded by: the node's
    fabric, except where NVLink bridges join pairs and the ring spans more than one pair.
    Then each ring crosses PCIe between the pairs; NCCL runs rings both ways round, each
    GPU sending over its NVLink to one neighbour and over PCIe to the other, so the rings
    together reach twice the slower of the PCIe and NVLink per-direction rates (at that
    link's efficiency: each direction of each link carries one ring), and ``pcie_socket_crossing_fraction`` of it when the ring spans more pairs
    than share one CPU socket (``pairs_per_socket``)."""
    link = cluster.intra
    bridge = link.pair_bridge_bytes_per_s
    if link.fabric != "nvlink_pair" or local <= 2 or bridge <= 0:
        return link
    fraction = params.pcie_socket_crossing_fraction if 0 < link.pairs_per_socket < math.ceil(local / 2) else 1.0
    if bridge >= link.bandwidth_bytes_per_s:  # each NVLink direction carries one ring
        return replace(link, bandwidth_bytes_per_s=2.0 * link.bandwidth_bytes_per_s * fraction)
    return replace(link, fabric="pcie", bandwidth_bytes_per_s=2.0 * bridge * fraction)


def _level(link: LinkSpec, share: float, nbytes_wire: float, cfg: CommConfig,
           params: CostParams, *, p2p: bool = False) -> tuple[float, float]:
    """(effective bytes/s after channel + chunk limits, per-step latency) of one link level
    (``cfg`` resolved: every setting given)."""
    channels, threads, chunk, protocol = cfg.channels, cfg.threads, cfg.chunk_bytes, cfg.protocol
    if channels is None or threads is None or chunk is None or protocol is None:
        raise ValueError(f"the cost model needs a resolved NCCL configuration, got {cfg}")
    bw = effective_link_bandwidth(link.bandwidth_bytes_per_s * share, link.fabric, channels, threads, protocol, params,
                                  p2p=p2p)
    if p2p:
        eta = p2p_chunk_efficiency(nbytes_wire / channels, chunk, bw / channels, protocol, params)
    else:
        eta = chunk_efficiency(nbytes_wire / channels, chunk, bw / channels, protocol, params)
    return bw * eta, link.latency_s * proto_latency_factor(protocol, params)


def _flat_time(coll: str, m: float, group: GroupSpec, cluster: ClusterSpec, cfg: CommConfig,
               params: CostParams, alg: str) -> tuple[float, float, frozenset]:
    """Ring / tree / pairwise over the whole group. Returns (time, wire bytes, levels)."""
    n, local, nodes = group.size, group.local_size, group.nodes
    wire = bus_bandwidth_factor(coll, n) * m
    mesh = _intra_share(cluster, local - 1)
    intra = ring_intra_link(cluster, local, params)
    if alg == "nvls":  # the switch's traffic runs through the channels' chunk pipeline, as a ring's does
        bw = cluster.intra.bandwidth_bytes_per_s * params.nvls_link_efficiency
        nvls_wire = (1.0 + 1.0 / n) * m
        channels = cfg.channels or DEFAULT_CHANNELS["nvswitch"]  # NVLS runs Simple only: its chunk
        chunk = cfg.chunk_bytes if cfg.protocol == "simple" and cfg.chunk_bytes else DEFAULT_CHUNK["simple"]
        bw *= chunk_efficiency(nvls_wire / channels, chunk, bw / channels, "simple", params)
        t = nvls_all_reduce_time_s(m, n, bw, params.nvls_latency_s)
        return t, nvls_wire, frozenset({"intra"})
    if nodes == 1:
        bw, lat = _level(intra, mesh, wire, cfg, params)
        if alg == "tree":  # NCCL's tree is a chain inside the node
            t = wire / (bw * params.tree_bw_efficiency) + chain_all_reduce_latency_s(n, 1, lat, 0.0)
            return t, wire, frozenset({"intra"})
        return _RING_FORMS[coll](m, n, bw, lat), wire, frozenset({"intra"})
    levels = frozenset({"intra", "inter"}) if local > 1 else frozenset({"inter"})
    if coll == "all_to_all":  # every GPU sends its own off-node share through its own NIC share
        intra_b = m * (local - 1) / n
        inter_b = m * (n - local) / n
        bi, li = _level(cluster.intra, mesh, intra_b, cfg, params) if local > 1 else (1.0, 0.0)
        bo, lo = _level(cluster.inter, 1.0, inter_b, cfg, params)
        t = max(intra_b / bi, inter_b / bo) + (local - 1) * li + (n - local) * lo
        return t, intra_b + inter_b, levels
    if alg == "tree":  # NCCL: chain inside each node, double binary tree across nodes
        inter_wire = bus_bandwidth_factor("all_reduce", nodes) * m
        bo, lo = _level(cluster.inter, float(local), inter_wire, cfg, params)
        t_bw = inter_wire / bo
        li = 0.0
        if local > 1:
            bi, li = _level(cluster.intra, _intra_share(cluster, 1), m, cfg, params)  # chain: one peer
            t_bw = max(t_bw, m / bi)
        return t_bw / params.tree_bw_efficiency + chain_all_reduce_latency_s(local, nodes, li, lo), wire, levels
    # flat ring across nodes: the bytes move at the slowest hop's rate, and a chunk's way round
    # the ring adds each hop's latency (ring_latency_s)
    bw, li, lo = _ring_across_nodes(wire, group, cluster, cfg, params)
    return _RING_FORMS[coll](m, n, bw, 0.0) + ring_latency_s(coll, n, nodes, li, lo), wire, levels


def _ring_across_nodes(wire: float, group: GroupSpec, cluster: ClusterSpec, cfg: CommConfig,
                       params: CostParams) -> tuple[float, float, float]:
    """(bytes/s, intra-node step latency, inter-node step latency) of a ring over ``group``
    across nodes: each node boundary is crossed once per direction, through the node's NICs
    (``local_size`` per-GPU shares), so the ring runs at the slower of them and the node's link."""
    local = group.local_size
    bo, lo = _level(cluster.inter, float(local), wire, cfg, params)
    if local == 1:
        return bo, lo, lo
    bi, li = _level(ring_intra_link(cluster, local, params), _intra_share(cluster, local - 1), wire, cfg, params)
    return min(bi, bo), li, lo


def ring_latency_s(coll: str, n: int, nodes: int, intra_latency: float, inter_latency: float) -> float:
    """Seconds of latency a ring over ``n`` ranks on ``nodes`` nodes adds: its steps, of which
    those that cross a node boundary pay the network's latency and the rest the node's
    (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel: ``(nsteps − nInterSteps)·intraLat +
    nInterSteps·interLat``, with 2(n−1) steps of which 2(nodes−1) between nodes for an
    all-reduce, n−1 and nodes−1 for the others)."""
    steps, inter = (2 * (n - 1), 2 * (nodes - 1)) if coll == "all_reduce" else (n - 1, nodes - 1)
    return (steps - inter) * intra_latency + inter * inter_latency


def _hier_time(coll: str, m: float, group: GroupSpec, cluster: ClusterSpec, cfg: CommConfig,
               params: CostParams, order: str) -> tuple[float, float, frozenset]:
    """Two-level algorithm (Centauri §3.1.2 group partition): ring phases on the intra-node
    sub-group and on the inter-node sub-group (each GPU on its own NIC share); ``order`` is
    "intra_first" or "inter_first". Every phase is its own launch."""
    local, nodes = group.local_size, group.nodes
    phases: list[tuple[str, str, float, int]] = []  # (level, collective, message bytes, ranks)
    if coll == "all_reduce":
        phases = [("intra", "reduce_scatter", m, local), ("inter", "all_reduce", m / local, nodes),
                  ("intra", "all_gather", m, local)] if order == "intra_first" else \
                 [("inter", "reduce_scatter", m, nodes), ("intra", "all_reduce", m / nodes, local),
                  ("inter", "all_gather", m, nodes)]
    elif coll == "all_gather":
        phases = [("inter", "all_gather", m / local, nodes), ("intra", "all_gather", m, local)] \
            if order == "inter_first" else [("intra", "all_gather", m / nodes, local), ("inter", "all_gather", m, nodes)]
    elif coll == "reduce_scatter":
        phases = [("intra", "reduce_scatter", m, local), ("inter", "reduce_scatter", m / local, nodes)] \
            if order == "intra_first" else [("inter", "reduce_scatter", m, nodes), ("intra", "reduce_scatter", m / nodes, local)]
    elif coll == "all_to_all":
        first, second = ("intra", "inter") if order == "intra_first" else ("inter", "intra")
        phases = [(first, "all_to_all", m, local if first == "intra" else nodes),
                  (second, "all_to_all", m, local if second == "intra" else nodes)]
    else:  # broadcast / reduce: chain on each level
        levels = [("inter", nodes), ("intra", local)] if order == "inter_first" else [("intra", local), ("inter", nodes)]
        phases = [(lv, coll, m, r) for lv, r in levels]
    t = wire = 0.0
    for level, pc, pm, ranks in phases:
        if ranks <= 1:
            continue
        link = ring_intra_link(cluster, ranks, params) if level == "intra" else cluster.inter
        pw = bus_bandwidth_factor(pc, ranks) * pm
        share = _intra_share(cluster, ranks - 1) if level == "intra" else 1.0
        bw, lat = _level(link, share, pw, cfg, params)
        t += params.comm_base_latency_s + _RING_FORMS[pc](pm, ranks, bw, lat)
        wire += pw
    return t - params.comm_base_latency_s, wire, frozenset({"intra", "inter"})


#: A latency-bound message size ("KB to low MB", DMA-Latte): where the DMA / SM time ratio of
#: :func:`dma_collective_latency_s` is taken.
DMA_LATENCY_PROBE_BYTES = 1 * KiB


def dma_collective_latency_s(coll: str, n: int, cluster: ClusterSpec, params: CostParams) -> float:
    """Fixed seconds a copy-engine collective of ``n`` ranks pays for command scheduling and
    cross-GPU synchronisation (DMA-Latte, arXiv:2511.06605: DMA collectives lag RCCL at
    latency-bound sizes): ``dma_<all-gather | all-to-all>_latency_factor`` x the SM collective's
    time at :data:`DMA_LATENCY_PROBE_BYTES`. Broadcast uses the all-gather factor. 0 when the
    GPU's factor is not measured (0)."""
    factor = params.dma_alltoall_latency_factor if coll == "all_to_all" else params.dma_allgather_latency_factor
    if factor <= 0 or n <= 1:
        return 0.0
    sm_coll: Collective = "all_to_all" if coll == "all_to_all" else "all_gather"
    group = GroupSpec(name="dma_probe", size=n, local_size=n)
    probe = CollectiveSpec(collective=sm_coll, bytes=float(DMA_LATENCY_PROBE_BYTES), group=group)
    return factor * collective_profile(probe, cluster, params).time_s


def _dma_time(coll: str, m: float, n: int, cluster: ClusterSpec, params: CostParams) -> tuple[float, float]:
    engines = cluster.gpu.copy_engines
    if engines < 1:
        raise ConfigError(f"GPU {cluster.gpu.name} has no copy engines for transport='dma'")
    bw = min(cluster.intra.bandwidth_bytes_per_s * _intra_share(cluster, n - 1) * params.dma_link_efficiency,
             engines * params.dma_engine_bytes_per_s)
    wire = (n - 1) * m if coll == "broadcast" else (n - 1) / n * m
    copies = n - 1
    fixed = max(math.ceil(copies / engines) * params.dma_copy_latency_s,
                dma_collective_latency_s(coll, n, cluster, params))
    return wire / bw + fixed, wire


def _one(spec: CollectiveSpec, cluster: ClusterSpec, params: CostParams, cfg: CommConfig,
         alg: str) -> CommProfile:
    coll, m, group = spec.collective, float(spec.bytes), spec.group
    if group.size == 1 or m == 0:
        return CommProfile(params.comm_base_latency_s, 0.0, frozenset(), cfg, alg)
    if alg in ("hierarchical", "hierarchical_intra_first", "hierarchical_inter_first") and group.nodes > 1 \
            and group.local_size > 1:
        order = alg.removeprefix("hierarchical_") if alg != "hierarchical" else \
            ("inter_first" if coll in ("all_gather", "broadcast") else "intra_first")
        t, wire, levels = _hier_time(coll, m, group, cluster, cfg, params, order)
    else:
        flat = "ring" if alg.startswith("hierarchical") else alg
        t, wire, levels = _flat_time(coll, m, group, cluster, cfg, params, flat)
    return CommProfile(params.comm_base_latency_s + t, wire, levels, cfg, alg)


def _check_alg(coll: str, alg: str) -> None:
    if alg not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {alg!r}; expected one of {ALGORITHMS}")
    if alg in ("tree", "nvls") and coll != "all_reduce":
        raise ConfigError(f"algorithm {alg!r} is for all_reduce only (NCCL), not {coll}")
    if alg == "pairwise" and coll != "all_to_all":
        raise ConfigError(f"algorithm 'pairwise' is for all_to_all only, not {coll}")
    if alg == "ring" and coll == "all_to_all":
        raise ConfigError("all_to_all has no ring algorithm; use 'pairwise' or 'hierarchical'")


def collective_profile(spec: CollectiveSpec, cluster: ClusterSpec,
                       params: CostParams | None = None) -> CommProfile:
    """The collective alone on an idle GPU: time, wire bytes and resolved knobs. Unset knobs
    take :func:`default_comm_config`'s values; an unset protocol and ``algorithm="auto"`` are
    chosen as the fastest allowed by this model (as NCCL's tuner does)."""
    p = checked_inputs("collective_time_s", spec, CollectiveSpec, cluster, params)
    group = spec.group
    _check_group(group, cluster)
    c = spec.config
    if spec.transport == "dma":
        if spec.collective in REDUCING:
            raise ConfigError(f"{spec.collective} cannot run on copy engines (DMA has no arithmetic; ficco §IV-B2)")
        if group.nodes > 1:
            raise ConfigError("transport='dma' needs an intra-node group (copy engines do not drive the NIC)")
        if group.size == 1 or spec.bytes == 0:
            return CommProfile(0.0, 0.0, frozenset(), replace(c, algorithm="direct"), "direct")
        t, wire = _dma_time(spec.collective, float(spec.bytes), group.size, cluster, p)
        return CommProfile(t, wire, frozenset({"intra"}), replace(c, algorithm="direct"), "direct")
    fabric = cluster.intra.fabric if group.local_size > 1 else cluster.inter.fabric
    channels = c.channels if c.channels is not None else DEFAULT_CHANNELS.get(fabric, 2)
    threads = c.threads if c.threads is not None else DEFAULT_THREADS
    _check_alg(spec.collective, c.algorithm)
    protos = (c.protocol,) if c.protocol is not None else allowed_protocols(group, cluster)
    if c.algorithm == "nvls" and not nvls_enabled(group, cluster, p):
        raise ConfigError(f"algorithm 'nvls' needs one NVSwitch node of a GPU with NVLink SHARP and more than "
                          f"2 ranks; {cluster.name} ({cluster.gpu.name}, {cluster.intra.fabric}) with "
                          f"{group.size} ranks on {group.nodes} node(s) has none")
    algs = (c.algorithm,) if c.algorithm != "auto" else _allowed_algorithms(spec.collective, group, cluster, p)
    best: CommProfile | None = None
    best_rated = math.inf
    for proto in protos:
        chunk = c.chunk_bytes if c.chunk_bytes is not None else DEFAULT_CHUNK[proto]
        cfg = CommConfig(channels=channels, threads=threads, chunk_bytes=chunk, protocol=proto, algorithm="auto")
        for alg in algs:
            if alg == "nvls" and proto != "simple" and c.algorithm == "auto":
                continue  # NCCL runs NVLS with the Simple protocol only
            prof = _one(spec, cluster, p, replace(cfg, algorithm=alg), alg)
            rated = tuner_time_s(prof, spec, cluster, p)
            if best is None or rated < best_rated:
                best, best_rated = prof, rated
    assert best is not None
    return best


def collective_time_s(spec: CollectiveSpec, cluster: ClusterSpec, params: CostParams | None = None) -> float:
    """Seconds ``spec`` takes alone on ``cluster`` (alpha-beta per algorithm with NCCL's knobs;
    see the module docstring). Contention with ops beside it is in :mod:`.contention`."""
    return collective_profile(spec, cluster, params).time_s


def back_to_back_time_s(seconds: float, params: CostParams, cluster: ClusterSpec | None = None) -> float:
    """Seconds per call of a loop of identical collectives that alone take ``seconds`` on the
    GPU, as benchmarks time them (nccl-tests' per-iteration time, the NCCL kernel durations of
    a torch.distributed loop): a collective waits for every rank's call, so the loop runs no
    faster than the hosts issue them, ``max(seconds, host issue time)``: the ``cluster``'s
    ``host_issue_s`` where its catalog entry gives one (a property of the node's host), else
    ``params.comm_host_issue_s``. (A sender of a send/recv runs ahead of its receiver up to
    NCCL's buffer and is not held to it.) Inside a training step the host's issue time is the
    simulator's, not part of the op's GPU time."""
    host = cluster.host_issue_s if cluster is not None and cluster.host_issue_s > 0 else params.comm_host_issue_s
    return max(seconds, host)


def p2p_network_latency_s(link: LinkSpec) -> float:
    """Seconds a send/recv between nodes waits on the network besides its bytes: two one-way
    hops of ``link``, whatever the protocol. NCCL's network transport is a rendezvous: the
    receiver posts its buffer (address and key) into the sender's FIFO across the network, and
    the sender writes the data only once that post has arrived (NVIDIA/nccl
    src/transport/net_ib.cc: ncclIbIrecv writes the slot with ncclIbPostFifo, ncclIbIsend
    waits for it), so a lone message pays the receiver's post and its own data
    hop. A hop's time is the NIC's and proxy's, not the protocol's flag handling, so LL does
    not shorten it (vidur h100_dgx send_recv between 2 nodes: 17-19 us at 2-10 KiB, sent with
    LL, as at 18-64 KiB with Simple)."""
    return 2.0 * link.latency_s


def p2p_profile(spec: P2PSpec, cluster: ClusterSpec, params: CostParams | None = None) -> CommProfile:
    """A send/recv of ``spec.bytes`` alone: ``M/B + α`` (plus launch) on the intra-node link
    or the GPU's NIC share, ``B`` limited by channels as for collectives and by its buffer
    slots (:func:`p2p_chunk_efficiency`); between nodes ``α`` is the rendezvous of
    :func:`p2p_network_latency_s`. An unset protocol is NCCL's: LL up to
    :data:`P2P_LL_THRESHOLD` bytes, Simple above."""
    p = checked_inputs("p2p_time_s", spec, P2PSpec, cluster, params)
    link = cluster.inter if spec.inter_node else cluster.intra
    level = frozenset({"inter" if spec.inter_node else "intra"})
    m = float(spec.bytes)
    d = default_p2p_config(spec.inter_node, cluster)
    c = spec.config
    proto = c.protocol or ("ll" if m <= P2P_LL_THRESHOLD else "simple")
    cfg = CommConfig(channels=c.channels or d.channels, threads=c.threads or d.threads,
                     protocol=proto, algorithm="direct",
                     chunk_bytes=c.chunk_bytes or (DEFAULT_CHUNK[proto] if proto != "simple" else d.chunk_bytes))
    if spec.transport == "dma":
        if spec.inter_node:
            raise ConfigError("transport='dma' needs an intra-node peer (copy engines do not drive the NIC)")
        if cluster.gpu.copy_engines < 1:
            raise ConfigError(f"GPU {cluster.gpu.name} has no copy engines for transport='dma'")
        bw = min(link.bandwidth_bytes_per_s * _intra_share(cluster, 1) * p.dma_link_efficiency,
                 cluster.gpu.copy_engines * p.dma_engine_bytes_per_s)
        return CommProfile(p2p_transfer_time_s(m, bw, p.dma_copy_latency_s), m, level, cfg, "direct")
    if m == 0:
        return CommProfile(p.comm_base_latency_s, 0.0, level, cfg, "direct")
    bw, lat = _level(link, 1.0 if spec.inter_node else _intra_share(cluster, 1), m, cfg, p, p2p=True)
    if spec.inter_node:
        lat = p2p_network_latency_s(link)
    return CommProfile(p.comm_base_latency_s + p2p_transfer_time_s(m, bw, lat), m, level, cfg, "direct")


def p2p_time_s(spec: P2PSpec, cluster: ClusterSpec, params: CostParams | None = None) -> float:
    """Seconds of a point-to-point transfer alone (see :func:`p2p_profile`)."""
    return p2p_profile(spec, cluster, params).time_s


def copy_bandwidth(spec: CopySpec, cluster: ClusterSpec, params: CostParams) -> float:
    """Bytes/s of a copy-engine copy: host link for h2d/d2h; for d2d the smaller of the copy
    engines' rate and half the achievable HBM bandwidth (each byte is read and written)."""
    if spec.direction in ("h2d", "d2h"):
        return params.host_link_bytes_per_s
    if spec.direction != "d2d":
        raise ConfigError(f"copy direction must be d2d, h2d or d2h, got {spec.direction!r}")
    gpu = cluster.gpu
    hbm = gpu.hbm_bytes_per_s * params.mem_bw_fraction / 2.0
    return min(hbm, max(gpu.copy_engines, 1) * params.dma_engine_bytes_per_s)


def copy_time_s(spec: CopySpec, cluster: ClusterSpec, params: CostParams | None = None) -> float:
    """Seconds of a copy-engine copy alone: ``bytes / copy bandwidth + dma_copy_latency_s``."""
    p = checked_inputs("copy_time_s", spec, CopySpec, cluster, params)
    return float(spec.bytes) / copy_bandwidth(spec, cluster, p) + p.dma_copy_latency_s
