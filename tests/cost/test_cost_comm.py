"""Collective costs: closed forms, nccl-tests bus bandwidth, NCCL knobs, topology, DMA path."""

import dataclasses
import math

import pytest

from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.cost import (
    CostParams,
    bus_bandwidth,
    bus_bandwidth_factor,
    chain_broadcast_time_s,
    collective_profile,
    collective_time_s,
    copy_time_s,
    default_comm_config,
    default_params,
    p2p_time_s,
    pairwise_all_to_all_time_s,
    ring_all_gather_time_s,
    ring_all_reduce_time_s,
    ring_reduce_scatter_time_s,
    tree_all_reduce_time_s,
)
from ccoverlap.cost.comm import chain_all_reduce_latency_s, nvls_all_reduce_time_s
from ccoverlap.errors import ConfigError
from ccoverlap.specs import COLLECTIVES, CollectiveSpec, CommConfig, CopySpec, GroupSpec, P2PSpec

H100 = CLUSTERS["dgx-h100"]
A40 = CLUSTERS["a40-pcie"]
PH = default_params(H100.gpu)
PA = default_params(A40.gpu)
NODE8 = GroupSpec(name="tp", size=8, local_size=8)
TWO_NODES = GroupSpec(name="dp", size=16, local_size=8)
GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


def coll(c, nbytes, group=NODE8, **cfg):
    return CollectiveSpec(collective=c, bytes=nbytes, group=group, config=CommConfig(**cfg))


# ------------------------------------------------------------------ closed forms

def test_ring_all_reduce_closed_form_numbers():
    # 2(N-1)/N * M/B + 2(N-1) * alpha with M = 1 GB, N = 8, B = 100 GB/s, alpha = 1 us
    assert ring_all_reduce_time_s(1e9, 8, 100e9, 1e-6) == pytest.approx(0.0175 + 14e-6)
    assert ring_all_reduce_time_s(1e9, 2, 100e9, 0.0) == pytest.approx(0.01)
    assert ring_all_reduce_time_s(1e9, 1, 100e9, 1e-6) == 0.0


def test_other_closed_forms_numbers():
    assert ring_all_gather_time_s(8e9, 8, 100e9, 1e-6) == pytest.approx(0.07 + 7e-6)
    assert ring_reduce_scatter_time_s(8e9, 8, 100e9, 1e-6) == pytest.approx(0.07 + 7e-6)
    assert pairwise_all_to_all_time_s(8e9, 8, 100e9, 1e-6) == pytest.approx(0.07 + 7e-6)
    assert chain_broadcast_time_s(8e9, 8, 100e9, 1e-6) == pytest.approx(0.08 + 7e-6)
    # double binary tree: ring's bandwidth term, 2*ceil(log2 n) latency steps instead of 2(n-1)
    assert tree_all_reduce_time_s(1e9, 8, 100e9, 1e-6) == pytest.approx(0.0175 + 6e-6)
    assert tree_all_reduce_time_s(1e3, 64, 100e9, 1e-6) < ring_all_reduce_time_s(1e3, 64, 100e9, 1e-6) / 10


@pytest.mark.parametrize("n", [2, 8, 16, 64])
def test_bus_bandwidth_factors_match_nccl_tests(n):
    f = {c: bus_bandwidth_factor(c, n) for c in COLLECTIVES}
    assert f["all_reduce"] == pytest.approx(2 * (n - 1) / n)
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert f[c] == pytest.approx((n - 1) / n)
    assert f["broadcast"] == 1.0 and f["reduce"] == 1.0
    with pytest.raises(ConfigError):
        bus_bandwidth_factor("allreduce", n)


def _ideal(**kw):
    """Parameters under which the model must reduce to the textbook closed forms."""
    base = dict(link_efficiency_nvlink=1.0, channel_bytes_per_s=1e18, chunk_step_overhead_s=0.0,
                chunk_pipeline_depth=0.0, comm_base_latency_s=0.0,
                nvls_link_efficiency=0.0)  # NVLS is not a textbook ring / tree (its own test below)
    base.update(kw)
    return CostParams(**base)


def test_model_reduces_to_ring_closed_form():
    p = _ideal()
    B, a = H100.intra.bandwidth_bytes_per_s, H100.intra.latency_s
    for m in (1 * MiB, 256 * MiB):
        t = collective_time_s(coll("all_reduce", m, algorithm="ring", protocol="simple"), H100, p)
        assert t == pytest.approx(ring_all_reduce_time_s(m, 8, B, a), rel=1e-6)


@pytest.mark.parametrize("c", COLLECTIVES)
def test_busbw_reaches_the_link_for_every_collective(c):
    """nccl-tests' busbw is meant to equal the hardware bottleneck for any n (PERFORMANCE.md)."""
    p = _ideal()
    m = 4 * GiB
    for group in (GroupSpec(name="g", size=4, local_size=4), NODE8):
        t = collective_time_s(coll(c, m, group=group, protocol="simple"), H100, p)
        assert bus_bandwidth(c, m, group.size, t) == pytest.approx(H100.intra.bandwidth_bytes_per_s, rel=5e-3)


# ------------------------------------------------------------------ NCCL knobs

def _ar_time(nc=16, nt=512, chunk=2 * MiB, proto="simple", m=4 * GiB, params=PH):
    return collective_time_s(coll("all_reduce", m, channels=nc, threads=nt, chunk_bytes=chunk,
                                  protocol=proto, algorithm="ring"), H100, params)


def test_more_channels_faster_with_diminishing_returns_and_saturation():
    ncs = [1, 2, 4, 8, 16, 32]
    t = [_ar_time(nc=n) for n in ncs]
    assert all(a > b for a, b in zip(t, t[1:]))
    gains = [a / b for a, b in zip(t, t[1:])]
    assert gains[0] > 1.9 and gains[-1] < 1.05 and gains == sorted(gains, reverse=True)
    busbw = [bus_bandwidth("all_reduce", 4 * GiB, 8, x) for x in t]
    link = H100.intra.bandwidth_bytes_per_s * PH.link_efficiency_nvlink
    assert max(busbw) <= link and busbw[-1] > 0.95 * link
    # one channel is limited by what one SM moves, not by the link
    assert busbw[0] == pytest.approx(PH.channel_bytes_per_s, rel=0.05)


def test_smaller_chunks_slower_and_huge_chunks_lose_pipelining():
    m = 32 * MiB
    t = {c: _ar_time(nc=4, chunk=c, m=m) for c in (4096, 16384, 65536, 1 * MiB, 64 * MiB)}
    assert t[4096] > t[16384] > t[65536] > t[1 * MiB]
    assert t[64 * MiB] > t[1 * MiB]
    assert t[4096] > 3 * t[1 * MiB]


def test_threads_have_a_small_effect():
    t512, t128 = _ar_time(nt=512, nc=4), _ar_time(nt=128, nc=4)
    assert t512 < t128 < 1.3 * t512


def test_protocols_trade_bandwidth_for_latency():
    big = {pr: _ar_time(proto=pr) for pr in ("simple", "ll128", "ll")}
    assert big["simple"] < big["ll128"] < big["ll"]
    assert big["ll"] / big["simple"] == pytest.approx(2.0, rel=0.15)  # LL: half the payload
    small = {pr: _ar_time(proto=pr, m=4096) for pr in ("simple", "ll128", "ll")}
    assert small["ll"] < small["ll128"] < small["simple"]


def test_auto_protocol_and_algorithm_pick_the_fastest():
    for m in (8, 64 * 1024, 16 * MiB, GiB):
        auto = collective_time_s(coll("all_reduce", m), H100, PH)
        forced = [collective_time_s(coll("all_reduce", m, protocol=pr, algorithm=al), H100, PH)
                  for pr in ("simple", "ll", "ll128") for al in ("ring", "tree", "nvls")]
        assert auto == pytest.approx(min(forced))


def test_one_node_tree_is_a_chain_with_a_ring_s_steps():
    """NCCL's tree is a chain inside a node (tuning.cc: 2·(ranks a node − 1) node steps): on one
    8-GPU node a small tree all-reduce pays the 14 steps of a ring, not a binary tree's 6, so
    it does not beat the ring; across 16 nodes its log-depth network part wins small sizes."""
    lat = H100.intra.latency_s
    small = {al: collective_time_s(coll("all_reduce", 8, algorithm=al, protocol="simple"), H100, PH)
             for al in ("ring", "tree")}
    assert PH.comm_base_latency_s + 14 * lat < small["tree"] < PH.comm_base_latency_s + 15 * lat
    assert small["ring"] <= small["tree"]
    big = {al: collective_time_s(coll("all_reduce", GiB, algorithm=al, protocol="simple"), H100, PH)
           for al in ("ring", "tree")}
    assert big["ring"] < big["tree"]
    many = GroupSpec(name="dp", size=128, local_size=8)
    wide = {al: collective_time_s(coll("all_reduce", 8192, many, algorithm=al, protocol="simple"),
                                  H100.with_nodes(16), PH) for al in ("ring", "tree")}
    assert wide["tree"] < wide["ring"]


def test_chain_all_reduce_latency_counts_node_and_network_steps():
    assert chain_all_reduce_latency_s(8, 1, 1e-6, 5e-6) == pytest.approx(14e-6)
    assert chain_all_reduce_latency_s(8, 4, 1e-6, 5e-6) == pytest.approx(14e-6 + 4 * 5e-6)
    assert chain_all_reduce_latency_s(1, 2, 1e-6, 5e-6) == pytest.approx(2 * 5e-6)


def test_default_config_follows_nccl_defaults():
    cfg = default_comm_config("all_gather", NODE8, H100)
    assert (cfg.channels, cfg.threads, cfg.chunk_bytes, cfg.protocol) == (16, 512, 2 * MiB, "simple")
    assert default_comm_config("all_gather", TWO_NODES, A40).channels == 2  # PCIe: few rings
    assert default_comm_config("all_reduce", NODE8, H100, nbytes=8).protocol == "ll"
    assert default_comm_config("all_reduce", NODE8, H100, nbytes=GiB).protocol == "simple"
    # on H100 NVLS (Simple only) takes the large all-reduces
    assert default_comm_config("all_reduce", NODE8, H100, nbytes=GiB).algorithm == "nvls"
    # across nodes NCCL's tuner rates its tree at 0.45 of the ring's bus bandwidth: the tree takes
    # small all-reduces (log latency), the ring the large ones
    assert default_comm_config("all_reduce", TWO_NODES, A40, nbytes=8 * KiB).algorithm == "tree"
    assert default_comm_config("all_reduce", TWO_NODES, A40, nbytes=GiB).algorithm == "ring"
    # NCCL enables LL128 on NVLink, not on PCIe
    assert default_comm_config("all_reduce", TWO_NODES, A40, nbytes=8 * MiB).protocol != "ll128"


def test_ll128_only_where_nccl_enables_it_by_default():
    """NCCL v2.18.3 (tuning.cc) enables LL128 on compute capability 7.0/8.0/9.0 with NVLink
    rings only: on the A40 (8.6) it is off even on Lagom's NVLink cluster, whose bridges join
    pairs, and a ring over more than a pair crosses PCIe anyway."""
    from ccoverlap.cost.comm import allowed_protocols, ll128_enabled

    a40_nvl = CLUSTERS["a40-nvlink"]
    assert a40_nvl.gpu.ll128_default is False and H100.gpu.ll128_default is True
    mid = 32 * MiB  # where LL128 beats Simple by this model when it is allowed
    assert default_comm_config("all_gather", NODE8, H100, nbytes=mid).protocol == "ll128"
    for group in (NODE8, TWO_NODES):
        assert not ll128_enabled(group, a40_nvl)
        assert "ll128" not in allowed_protocols(group, a40_nvl)
        cfg = default_comm_config("all_gather", group, a40_nvl, nbytes=mid)
        assert (cfg.channels, cfg.chunk_bytes, cfg.protocol) == (8, 2 * MiB, "simple")  # lagom §4.3
    # a GPU where NCCL does test LL128, on NVLink pairs: one bridged pair qualifies, a ring
    # over four pairs (PCIe between them) does not
    sm80_pairs = dataclasses.replace(a40_nvl, gpu=dataclasses.replace(a40_nvl.gpu, ll128_default=True))
    assert ll128_enabled(GroupSpec(name="p", size=2, local_size=2), sm80_pairs)
    assert not ll128_enabled(NODE8, sm80_pairs)
    # the tuners search only what NCCL enables
    from ccoverlap.deciders.lagom.space import TuningSpace, implementation_candidates

    protos = {p for _, p in implementation_candidates(coll("all_gather", mid), a40_nvl, TuningSpace())}
    assert protos == {"simple", "ll"}
    protos = {p for _, p in implementation_candidates(coll("all_gather", mid), H100, TuningSpace())}
    assert "ll128" in protos


# ------------------------------------------------------------------ topology

def test_flat_ring_across_nodes_is_bound_by_the_node_nics():
    m = 256 * MiB
    t = collective_time_s(coll("all_gather", m, group=TWO_NODES, algorithm="ring"), A40, PA)
    node_nic = A40.inter.bandwidth_bytes_per_s * TWO_NODES.local_size
    busbw = bus_bandwidth("all_gather", m, 16, t)
    assert 0.9 * PA.link_efficiency_network * node_nic < busbw <= node_nic
    # the same group inside one (hypothetical) 16-GPU PCIe node is far faster
    big_node = dataclasses.replace(A40, nodes=1, gpus_per_node=16)
    one_node = collective_time_s(coll("all_gather", m, group=GroupSpec(name="dp", size=16, local_size=16),
                                      algorithm="ring"), big_node, PA)
    assert one_node < t / 1.5


def test_tree_beats_ring_across_two_nodes():
    # nccl-tests#196: on 2 nodes NCCL's tree all-reduce goes beyond the network bottleneck
    ring = collective_time_s(coll("all_reduce", GiB, group=TWO_NODES, algorithm="ring"), A40, PA)
    tree = collective_time_s(coll("all_reduce", GiB, group=TWO_NODES, algorithm="tree"), A40, PA)
    assert tree < ring
    assert bus_bandwidth("all_reduce", GiB, 16, tree) > A40.inter.bandwidth_bytes_per_s * 8


def test_hierarchical_order_matters():
    # Centauri §3.2.1: gather across nodes on the small shards first, then inside the node
    m = 256 * MiB
    inter_first = collective_time_s(coll("all_gather", m, group=TWO_NODES, algorithm="hierarchical_inter_first"), A40, PA)
    intra_first = collective_time_s(coll("all_gather", m, group=TWO_NODES, algorithm="hierarchical_intra_first"), A40, PA)
    assert collective_time_s(coll("all_gather", m, group=TWO_NODES, algorithm="hierarchical"), A40, PA) == inter_first
    assert intra_first > 2 * inter_first
    # the inter-node phase alone (each GPU on its 1/8 NIC share, half the shards) bounds it below
    floor = (m / 8) * 0.5 / A40.inter.bandwidth_bytes_per_s
    assert inter_first > floor
    rs_intra = collective_time_s(coll("reduce_scatter", m, group=TWO_NODES, algorithm="hierarchical_intra_first"), A40, PA)
    rs_inter = collective_time_s(coll("reduce_scatter", m, group=TWO_NODES, algorithm="hierarchical_inter_first"), A40, PA)
    assert rs_inter > 2 * rs_intra


def test_all_to_all_across_nodes_is_bound_by_each_gpus_nic_share():
    m = 256 * MiB
    t = collective_time_s(coll("all_to_all", m, group=TWO_NODES), A40, PA)
    assert t > m * 8 / 16 / A40.inter.bandwidth_bytes_per_s


def test_group_must_fit_the_cluster_and_algorithms_their_collective():
    with pytest.raises(ConfigError):
        collective_time_s(coll("all_gather", MiB, group=GroupSpec(name="x", size=16, local_size=16)), H100, PH)
    with pytest.raises(ConfigError):
        collective_time_s(coll("all_gather", MiB, algorithm="tree"), H100, PH)
    with pytest.raises(ConfigError):
        collective_time_s(coll("all_reduce", MiB, algorithm="pairwise"), H100, PH)


def test_trivial_collectives_cost_only_launch():
    one = GroupSpec(name="solo", size=1, local_size=1)
    assert collective_time_s(coll("all_reduce", GiB, group=one), H100, PH) == PH.comm_base_latency_s
    assert collective_time_s(coll("all_gather", 0), H100, PH) == PH.comm_base_latency_s


# ------------------------------------------------------------------ p2p, DMA, copies

def test_p2p_intra_faster_than_inter_and_above_wire_time():
    m = 64 * MiB
    intra = p2p_time_s(P2PSpec(bytes=m, inter_node=False), H100, PH)
    inter = p2p_time_s(P2PSpec(bytes=m, inter_node=True), H100, PH)
    assert intra < inter
    assert inter > m / H100.inter.bandwidth_bytes_per_s
    # NCCL's 2 network channels a peer, each bounded by its proxy (vidur h100_dgx send_recv: 36 GB/s)
    reach = min(H100.inter.bandwidth_bytes_per_s * PH.link_efficiency_network, 2 * PH.net_channel_bytes_per_s)
    assert inter < 1.3 * m / reach


def test_p2p_over_nvlink_reaches_the_link_rate():
    """A large send/recv on one NVSwitch node is a one-hop pipeline through NCCL's 8 buffer
    slots: no ring to fill and drain, handshakes hidden behind the other slots, so it reaches
    the link's line rate x efficiency (vidur h100_dgx send_recv: 347 GB/s at 64 MiB, 0.77 of
    450); a collective's chunk pipeline losses (~10% there) do not apply."""
    m = 64 * MiB
    t = p2p_time_s(P2PSpec(bytes=m, inter_node=False), H100, PH)
    link = H100.intra.bandwidth_bytes_per_s * PH.link_efficiency_nvlink
    assert m / link < t < 1.03 * m / link + 20e-6


def test_p2p_chunks_stall_only_when_the_slots_cannot_hide_the_handshake():
    """With 8 slots a chunk's flag round trip is hidden while filling the other 7 takes
    longer; 256-byte chunks cannot hide a 1 us round trip and slow a 64 MiB send down, and a
    send of no more than 8 chunks a channel never waits."""
    from ccoverlap.cost.comm import NCCL_STEPS, p2p_chunk_efficiency

    assert p2p_chunk_efficiency(8 * MiB, 512 * KiB, 25e9, "simple", PH) == 1.0
    assert p2p_chunk_efficiency(NCCL_STEPS * 256, 256, 25e9, "simple", PH) == 1.0
    assert p2p_chunk_efficiency(1 * MiB, 256, 25e9, "simple", PH) < 0.05
    m = 64 * MiB
    tiny = p2p_time_s(P2PSpec(bytes=m, inter_node=False, config=CommConfig(chunk_bytes=256)), H100, PH)
    assert tiny > 5 * p2p_time_s(P2PSpec(bytes=m, inter_node=False), H100, PH)


def test_p2p_protocol_is_ll_up_to_nccl_s_threshold():
    """NCCL sends up to NCCL_P2P_LL_THRESHOLD (16 KiB) with LL, larger with Simple; an explicit
    protocol wins."""
    from ccoverlap.cost.comm import p2p_profile

    assert p2p_profile(P2PSpec(bytes=16 * KiB, inter_node=False), H100, PH).config.protocol == "ll"
    assert p2p_profile(P2PSpec(bytes=16 * KiB + 1, inter_node=False), H100, PH).config.protocol == "simple"
    forced = P2PSpec(bytes=4 * KiB, inter_node=False, config=CommConfig(protocol="simple"))
    assert p2p_profile(forced, H100, PH).config.protocol == "simple"
    ll = p2p_time_s(P2PSpec(bytes=4 * KiB, inter_node=False), H100, PH)
    assert ll < p2p_time_s(forced, H100, PH)  # LL's shorter NVLink step


def test_a_send_between_nodes_waits_for_the_receiver_s_post():
    """A lone send/recv between nodes pays two network hops (the receiver's buffer post, then
    the data) whatever the protocol: NCCL's network transport is a rendezvous."""
    from ccoverlap.cost.comm import p2p_network_latency_s

    assert p2p_network_latency_s(H100.inter) == 2 * H100.inter.latency_s
    small = p2p_time_s(P2PSpec(bytes=2 * KiB, inter_node=True), H100, PH)
    assert small >= PH.comm_base_latency_s + 2 * H100.inter.latency_s
    assert small > p2p_time_s(P2PSpec(bytes=2 * KiB, inter_node=False), H100, PH) + H100.inter.latency_s


def test_dma_collectives():
    m = 256 * MiB
    dma = collective_profile(CollectiveSpec(collective="all_gather", bytes=m, group=NODE8, transport="dma"), H100, PH)
    bw = min(H100.intra.bandwidth_bytes_per_s * PH.dma_link_efficiency,
             H100.gpu.copy_engines * PH.dma_engine_bytes_per_s)
    assert dma.time_s == pytest.approx(7 / 8 * m / bw + math.ceil(7 / 3) * PH.dma_copy_latency_s)
    with pytest.raises(ConfigError, match="DMA"):
        collective_time_s(CollectiveSpec(collective="all_reduce", bytes=m, group=NODE8, transport="dma"), H100, PH)
    with pytest.raises(ConfigError):
        collective_time_s(CollectiveSpec(collective="all_gather", bytes=m, group=TWO_NODES, transport="dma"), A40, PA)
    # DMA is latency-bound for small pieces: slower than NCCL's LL there
    small_dma = collective_time_s(CollectiveSpec(collective="all_gather", bytes=4096, group=NODE8, transport="dma"), H100, PH)
    assert small_dma > collective_time_s(coll("all_gather", 4096), H100, PH)


def test_copies_use_the_host_link_or_copy_engines():
    m = 1e9
    h2d = copy_time_s(CopySpec(bytes=m, direction="h2d"), H100, PH)
    assert h2d == pytest.approx(m / PH.host_link_bytes_per_s + PH.dma_copy_latency_s)
    assert copy_time_s(CopySpec(bytes=m, direction="d2d"), H100, PH) < h2d
    with pytest.raises(ConfigError):
        copy_time_s(CopySpec(bytes=m, direction="sideways"), H100, PH)


def test_full_mesh_peers_each_have_one_link():
    # ficco §III-C: on MI300X's fully connected mesh a peer-to-peer transfer uses one of 7
    # links (up to 7x slower than all-to-all patterns); a 4-GPU group reaches 3 of the 7
    mi = CLUSTERS["mi300x"]
    p = default_params(mi.gpu)
    m = GiB
    ag8 = bus_bandwidth("all_gather", m, 8, collective_time_s(coll("all_gather", m), mi, p))
    ag4 = bus_bandwidth("all_gather", m, 4, collective_time_s(
        coll("all_gather", m, group=GroupSpec(name="tp", size=4, local_size=4)), mi, p))
    p2p = m / p2p_time_s(P2PSpec(bytes=m, inter_node=False), mi, p)
    assert ag4 / ag8 == pytest.approx(3 / 7, rel=0.1)
    assert p2p / ag8 == pytest.approx(1 / 7, rel=0.25)
    # a switch has no such loss
    h4 = bus_bandwidth("all_gather", m, 4, collective_time_s(
        coll("all_gather", m, group=GroupSpec(name="tp", size=4, local_size=4)), H100, PH))
    h8 = bus_bandwidth("all_gather", m, 8, collective_time_s(coll("all_gather", m), H100, PH))
    assert h4 / h8 == pytest.approx(1.0, rel=0.05)


def test_mi300x_small_collectives_start_at_rccls_base_latency():
    """RCCL's time model (src/graph/tuning.cc) starts a collective at 12 us (LL), NCCL's at
    6.6-6.8 us; with the catalog's mesh hop a 1 KiB all-gather of 8 x MI300X then lands within
    15% of RCCL's own figure for it, 12 + 7 x 0.8 us (xGMI per-step latency of its MI300X
    tuning model). Without the MI300X base latency (the NVIDIA default) it would be 44% low."""
    mi = CLUSTERS["mi300x"]
    p = default_params(mi.gpu)
    assert p.comm_base_latency_s == pytest.approx(12e-6)
    assert PH.comm_base_latency_s == pytest.approx(6e-6)  # NVIDIA keeps NCCL's
    rccl_model_s = 12e-6 + 7 * 0.8e-6
    ag = collective_time_s(coll("all_gather", 1024), mi, p)
    assert ag == pytest.approx(rccl_model_s, rel=0.15)
    nvidia_base = collective_time_s(coll("all_gather", 1024), mi, p.with_overrides(comm_base_latency_s=6e-6))
    assert nvidia_base < 0.6 * rccl_model_s


def test_default_params_follow_the_clusters_gpu():
    """Without ``params`` a collective is costed with its cluster GPU's defaults, not the H100
    class defaults (a DGX A100 all-reduce used H100's link efficiency and latencies)."""
    from ccoverlap.cost.params import CostParams

    a100 = CLUSTERS["dgx-a100"]
    spec = coll("all_reduce", 256 * MiB)
    assert collective_time_s(spec, a100) == collective_time_s(spec, a100, default_params(a100.gpu))
    assert collective_time_s(spec, a100) != pytest.approx(collective_time_s(spec, a100, CostParams()), rel=1e-3)
    p2p = P2PSpec(bytes=64 * MiB, inter_node=False)
    assert p2p_time_s(p2p, a100) == p2p_time_s(p2p, a100, default_params(a100.gpu))


def test_nvls_all_reduce_closed_form_and_where_it_applies():
    """NVLS (NVLink SHARP): (1 + 1/n)·M / (line × nvls_link_efficiency × chunk pipeline
    efficiency of its 16 channels' 2 MiB chunks) + latencies, on one NVSwitch node of a GPU
    with NVLS only; 8 x H100 at 4 GiB reaches the ~480 GB/s busbw NVIDIA/nccl-tests#212 reports."""
    from ccoverlap.cost.comm import chunk_efficiency

    m = 4 * GiB
    t = collective_time_s(coll("all_reduce", m, algorithm="nvls", protocol="simple"), H100, PH)
    bw = H100.intra.bandwidth_bytes_per_s * PH.nvls_link_efficiency
    eta = chunk_efficiency(9 / 8 * m / 16, 2 * MiB, bw / 16, "simple", PH)
    fixed = PH.comm_base_latency_s + PH.nvls_latency_s
    assert 0.98 < eta < 1.0
    assert t == pytest.approx(9 / 8 * m / (bw * eta) + fixed)
    assert bus_bandwidth("all_reduce", m, 8, t) == pytest.approx(480e9, rel=0.03)
    with pytest.raises(ConfigError, match="nvls"):
        collective_time_s(coll("all_reduce", m, algorithm="nvls"), CLUSTERS["dgx-a100"])
    with pytest.raises(ConfigError, match="all_reduce only"):
        collective_time_s(coll("all_gather", m, algorithm="nvls"), H100, PH)


def test_ring_over_bridged_pairs_crosses_pcie_and_sockets():
    """NVLink bridges join pairs: 2 GPUs ride the bridge, 4 of one socket ring over PCIe both
    ways round (2 x PCIe), 8 across two sockets lose pcie_socket_crossing_fraction of that
    (vidur a40 all-reduce: ~45, ~58 and ~26 GB/s busbw at 1 GiB)."""
    from ccoverlap.cost.comm import ring_intra_link

    a40 = CLUSTERS["a40-nvlink"]
    pa = default_params(a40.gpu)
    assert ring_intra_link(a40, 2, pa) == a40.intra
    four, eight = ring_intra_link(a40, 4, pa), ring_intra_link(a40, 8, pa)
    assert (four.fabric, four.bandwidth_bytes_per_s) == ("pcie", 2 * a40.intra.pair_bridge_bytes_per_s)
    assert eight.bandwidth_bytes_per_s == pytest.approx(four.bandwidth_bytes_per_s * pa.pcie_socket_crossing_fraction)
    busbw = {n: bus_bandwidth("all_reduce", GiB, n, collective_time_s(
        coll("all_reduce", GiB, group=GroupSpec(name="tp", size=n, local_size=n)), a40, pa)) for n in (2, 4, 8)}
    assert busbw[4] > busbw[2] > busbw[8]


def test_back_to_back_floor_is_the_cluster_s_host_when_it_has_one():
    """A benchmark loop runs no faster than the node's host issues calls: the cluster's
    ``host_issue_s`` where given (a cluster file may set it), else the GPU's default; a
    negative or non-numeric value in a file is one ConfigError."""
    from ccoverlap.catalog.hardware import cluster_from_dict
    from ccoverlap.cost.comm import back_to_back_time_s

    own = dataclasses.replace(H100, host_issue_s=50e-6)
    assert back_to_back_time_s(10e-6, PH, own) == 50e-6
    assert back_to_back_time_s(10e-6, PH, dataclasses.replace(H100, host_issue_s=0.0)) == PH.comm_host_issue_s
    assert back_to_back_time_s(10e-6, PH) == PH.comm_host_issue_s
    assert back_to_back_time_s(80e-6, PH, own) == 80e-6
    base = {"name": "c", "gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8,
            "intra": {"fabric": "nvswitch", "bandwidth_bytes_per_s": 450e9, "latency_s": 2e-6},
            "inter": {"fabric": "roce", "bandwidth_bytes_per_s": 50e9, "latency_s": 6e-6}}
    assert cluster_from_dict({**base, "host_issue_s": 3e-5}).host_issue_s == 3e-5
    for bad in (-1.0, "x"):
        with pytest.raises(ConfigError, match="host_issue_s"):
            cluster_from_dict({**base, "host_issue_s": bad})


# ------------------------------------------------------------------ across nodes, as NCCL tunes it

def test_ring_latency_pays_the_network_only_on_steps_that_cross_nodes():
    """NCCL's ring latency (src/graph/tuning.cc): 2(n-1) steps of an all-reduce, 2(nodes-1) of
    them between nodes: 16 ranks on 2 nodes pay 28 node steps and 2 network steps."""
    from ccoverlap.cost.comm import ring_latency_s

    assert ring_latency_s("all_reduce", 16, 2, 1e-6, 100e-6) == pytest.approx(28e-6 + 200e-6)
    assert ring_latency_s("all_gather", 16, 2, 1e-6, 100e-6) == pytest.approx(14e-6 + 100e-6)
    assert ring_latency_s("all_reduce", 4, 4, 1e-6, 100e-6) == pytest.approx(600e-6)  # one GPU a node
    # a latency-bound ring across two nodes is no longer 30 network steps long
    slow = dataclasses.replace(H100.with_nodes(2), inter=dataclasses.replace(H100.inter, latency_s=100e-6))
    t = collective_time_s(coll("all_reduce", 1024, group=TWO_NODES, algorithm="ring", protocol="simple"), slow, PH)
    assert t < 10 * 100e-6


def test_across_nodes_the_tree_is_chosen_as_nccl_rates_it():
    """Without NVLS-Tree (A100), NCCL's tuner rates a tree across nodes at 0.9 x 0.5 of the
    ring's bus bandwidth, so a large 2 x 8 all-reduce runs as a ring even where the model's tree
    would move the bytes faster; on H100 NVSwitch nodes (NVLS-Tree) the tree stays."""
    a100 = CLUSTERS["dgx-a100"].with_nodes(2)
    pa = default_params(a100.gpu)
    big = coll("all_reduce", GiB, group=TWO_NODES)
    tree = collective_time_s(coll("all_reduce", GiB, group=TWO_NODES, algorithm="tree"), a100, pa)
    ring = collective_time_s(coll("all_reduce", GiB, group=TWO_NODES, algorithm="ring"), a100, pa)
    assert tree < ring
    prof = collective_profile(big, a100, pa)
    assert prof.algorithm == "ring" and prof.time_s == pytest.approx(ring)
    assert collective_profile(coll("all_reduce", 4 * KiB, group=TWO_NODES), a100, pa).algorithm == "tree"
    h100 = H100.with_nodes(2)
    assert collective_profile(big, h100, PH).algorithm == "tree"


def test_nvls_runs_through_the_chunk_pipeline_with_simple_chunks():
    """An NVLS all-reduce of a few chunks a channel is slower than its line-rate form, and its
    protocol does not change it (NVLS is Simple only)."""
    m = 16 * MiB
    nvls = collective_time_s(coll("all_reduce", m, algorithm="nvls"), H100, PH)
    line = PH.comm_base_latency_s + nvls_all_reduce_time_s(
        m, 8, H100.intra.bandwidth_bytes_per_s * PH.nvls_link_efficiency, PH.nvls_latency_s)
    assert nvls > 1.1 * line
    assert collective_time_s(coll("all_reduce", m, algorithm="nvls", protocol="ll"), H100, PH) == pytest.approx(nvls)
