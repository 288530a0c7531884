"""Collectives of one process group on one rank take its NCCL communicator one at a time
(:func:`ccoverlap.sim.simulator.communicator_lanes`): PyTorch runs every collective of a group on
the group's one NCCL stream, NCCL serialises the operations of a communicator (NVIDIA/nccl#574),
so FSDP's all-gather and reduce-scatter wait for each other whatever streams issue them."""

import pytest

from ccoverlap.sim.graph import OpGraph
from ccoverlap.sim.simulator import communicator_lanes, simulate
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, GroupSpec, P2PSpec

DP = GroupSpec(name="dp", size=16, local_size=8)
DP_INTER = GroupSpec(name="dp_inter", size=2, local_size=1)
TP = GroupSpec(name="tp", size=8, local_size=8)


class LinkCost:
    """Collectives: 1 GB/s, and the ones running beside them share it (n at once: n times
    slower); GEMMs at 1 TFLOP/s, untouched by communication."""

    def duration_s(self, spec, concurrent):
        if isinstance(spec, GemmSpec):
            return spec.flops / 1e12
        sharers = 1 + sum(isinstance(c, (CollectiveSpec, P2PSpec)) for c in concurrent)
        return spec.bytes / 1e9 * sharers


def coll(name: str, mb: float, group: GroupSpec = DP, **kw) -> CollectiveSpec:
    return CollectiveSpec(collective=name, bytes=mb * 1e6, group=group, **kw)


def rows(g):
    return {r["name"]: r for r in simulate(g, LinkCost()).rows()}


def test_one_groups_collectives_on_two_streams_run_one_after_the_other():
    g = OpGraph()
    g.add("rs", coll("reduce_scatter", 2.0), stream="fsdp_rs")
    g.add("ag", coll("all_gather", 1.0), stream="fsdp_ag")
    r = rows(g)
    # both ready at 0: the one issued first takes the communicator, the other waits for it
    assert (r["rs"]["start_s"], r["rs"]["end_s"]) == pytest.approx((0.0, 2e-3))
    assert (r["ag"]["start_s"], r["ag"]["end_s"]) == pytest.approx((2e-3, 3e-3))


def test_other_groups_and_other_transports_do_not_wait():
    g = OpGraph()
    g.add("rs", coll("reduce_scatter", 2.0), stream="fsdp_rs")
    g.add("ag_inter", coll("all_gather", 1.0, DP_INTER), stream="fsdp_ag")  # Centauri's sub-group
    g.add("tp_ar", coll("all_reduce", 1.0, TP), stream="tp_comm")
    g.add("send", P2PSpec(bytes=1e6, inter_node=True), stream="pp_send")
    g.add("dma_ag", coll("all_gather", 1.0, DP, transport="dma"), stream="copy")
    g.add("copy", CopySpec(bytes=1e6), stream="offload")
    r = rows(g)
    assert all(r[n]["start_s"] == 0.0 for n in r)  # all six start at once (and share the link)


def test_the_collective_ready_first_goes_first():
    g = OpGraph()
    gemm = g.add("gemm", GemmSpec(m=1000, n=1000, k=500))  # 1 ms
    g.add("rs", coll("reduce_scatter", 1.0), stream="fsdp_rs", deps=[gemm])  # issued first, ready at 1 ms
    g.add("ag", coll("all_gather", 3.0), stream="fsdp_ag")  # ready at 0
    late = g.add("ag2", coll("all_gather", 1.0), stream="fsdp_ag2", deps=[gemm])  # ready with rs, issued after it
    r = rows(g)
    assert (r["ag"]["start_s"], r["ag"]["end_s"]) == pytest.approx((0.0, 3e-3))
    assert (r["rs"]["start_s"], r["rs"]["end_s"]) == pytest.approx((3e-3, 4e-3))  # waits for ag
    assert r["ag2"]["start_s"] == pytest.approx(4e-3)  # same readiness as rs: issue order decides
    assert late == 3


def test_ranks_have_their_own_communicators():
    g = OpGraph()
    g.add("rs0", coll("reduce_scatter", 2.0), rank=0, stream="fsdp_rs")
    g.add("ag0", coll("all_gather", 1.0), rank=0, stream="fsdp_ag")
    g.add("ag1", coll("all_gather", 1.0), rank=1, stream="fsdp_ag")
    r = rows(g)
    assert r["ag1"]["start_s"] == 0.0 and r["ag0"]["start_s"] == pytest.approx(2e-3)


def test_a_quiet_rank_chain_after_a_queued_collective():
    """A collective queued behind another starts when the communicator frees, also when the
    rest of the rank is a chain the simulator books in one pass."""
    g = OpGraph()
    prev = g.add("ag", coll("all_gather", 2.0), stream="fsdp_ag")
    g.add("rs", coll("reduce_scatter", 1.0), stream="fsdp_rs")
    for i in range(5):
        prev = g.add(f"gemm{i}", GemmSpec(m=1000, n=1000, k=500), deps=[prev])
    r = rows(g)
    assert r["rs"]["start_s"] == pytest.approx(2e-3) and r["gemm0"]["start_s"] == pytest.approx(2e-3)
    assert r["gemm4"]["end_s"] == pytest.approx(7e-3)


def test_lanes_are_per_rank_and_group():
    g = OpGraph()
    specs = [coll("all_gather", 1.0), coll("all_gather", 1.0, TP), GemmSpec(m=8, n=8, k=8),
             coll("all_gather", 1.0, GroupSpec(name="one", size=1, local_size=1))]
    for rank in (0, 1):
        for stream in ("a", "b"):
            for i, s in enumerate(specs):
                g.add(f"op{i}", s, rank=rank, stream=stream)
    op_spec = list(range(4)) * 4
    lanes, n = communicator_lanes(g.ops, op_spec, specs)
    assert n == 4 and lanes == [0, 1, -1, -1] * 2 + [2, 3, -1, -1] * 2
    # a group used from one stream only is already serialised by it: no lane
    one = OpGraph()
    for i, s in enumerate(specs):
        one.add(f"op{i}", s, stream="tp_comm")
    assert communicator_lanes(one.ops, list(range(4)), specs) == ([-1] * 4, 0)
