"""Overlap behaviour of the builders, measured on simulated timelines (toy cost model)."""

from __future__ import annotations

import numpy as np
import pytest
from parallel_helpers import ToyCost, cluster

from ccoverlap.catalog.models import get_model, model_from_dict
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step
from ccoverlap.sim.simulator import simulate
from ccoverlap.sim.timeline import rank_metrics, step_time_s
from ccoverlap.specs import CollectiveSpec

SMALL = model_from_dict({"name": "small", "hidden": 2048, "ffn_hidden": 5632, "heads": 16, "kv_heads": 4,
                         "layers": 8, "vocab": 32000, "seq_len": 2048})


def run(model, p, knobs=None, gb=None, mb=1, seq=2048, cost=None):
    b = BatchConfig(global_batch=gb or p.dp * mb, micro_batch=mb, seq_len=seq)
    sg = build_step(model, p, b, cluster(p.world_size), knobs)
    tl = simulate(sg.graph, cost or ToyCost())
    return sg, tl, rank_metrics(tl, 0)


# ----------------------------------------------------------------------------- DDP

def test_ddp_allreduce_overlaps_backward_and_no_overlap_is_slower():
    p = ParallelConfig(dp=8)
    sg, tl, m = run(SMALL, p)
    ars = [o for o in sg.graph.ops if o.name.startswith("grad_ar")]
    assert ars and all(o.stream == "dp_comm" and o.spec.group.size == 8 for o in ars)
    assert m.overlap_ratio > 0.3
    # the first bucket's all-reduce starts before the backward is over
    first = min(o.op_id for o in ars)
    last_bwd = max(o.op_id for o in sg.graph.ops if o.phase == "bwd" and o.stream == "compute")
    assert tl.start_s[first] < tl.end_s[last_bwd]
    sg2, tl2, m2 = run(SMALL, p, OverlapKnobs(overlap=False))
    assert {o.stream for o in sg2.graph.ops} == {"compute"}
    assert m2.overlap_ratio == 0.0
    assert step_time_s(tl2) > step_time_s(tl) + 0.5 * m.overlap_s
    # same work either way
    assert m2.comm_s == pytest.approx(m.comm_s) and m2.compute_s == pytest.approx(m.compute_s)


def _grad_producer(ops, coll):
    """The op whose gradient a bucket collective waits for, through the framework's per-bucket
    kernels (megatron-core: NaN-check norm + 1/dp scaling, ``grad_bucket_prep``)."""
    dep = ops[coll.deps[0]]
    return ops[dep.deps[0]] if dep.name == "grad_bucket_prep" else dep


def test_ddp_buckets_follow_bucket_cap_in_reverse_order():
    p = ParallelConfig(dp=8)
    small, _, _ = run(SMALL, p, OverlapKnobs(bucket_cap_mb=5))
    big, _, _ = run(SMALL, p, OverlapKnobs(bucket_cap_mb=200))
    n_small = [o for o in small.graph.ops if o.name.startswith("grad_ar")]
    n_big = [o for o in big.graph.ops if o.name.startswith("grad_ar")]
    assert len(n_small) > 3 * len(n_big)
    total = sum(o.spec.bytes for o in n_small)
    assert total == pytest.approx(sum(o.spec.bytes for o in n_big))
    assert total == pytest.approx(4 * SMALL.param_count().total)  # fp32 gradients of every weight
    # PyTorch's 1 MiB first bucket: it closes after its first tensor, the (larger) LM head
    assert n_small[0].spec.bytes == 4 * 32000 * 2048
    assert all(o.spec.bytes >= 5 * 2**20 for o in n_small[1:-1])
    # reverse order: the first bucket waits on a late layer's backward, the last on the embedding
    ops = small.graph.ops
    assert _grad_producer(ops, n_small[0]).name == "lm_head_wgrad"
    layers = [_grad_producer(ops, o).layer for o in n_small]
    assert layers == sorted(layers, reverse=True)
    assert _grad_producer(ops, n_small[-1]).name == "embedding_grad"


def test_grad_accumulation_syncs_on_last_microbatch_only():
    p = ParallelConfig(dp=8)
    sg, _, _ = run(SMALL, p, gb=32)  # 4 micro-batches
    ars = [o for o in sg.graph.ops if o.name.startswith("grad_ar")]
    assert {_grad_producer(sg.graph.ops, o).microbatch for o in ars} == {3}


def test_distributed_optimizer_reduce_scatters_and_gathers_params():
    sg, tl, m = run(SMALL, ParallelConfig(dp=8, distributed_optimizer=True))
    names = {o.name for o in sg.graph.ops}
    assert "grad_rs_dp" in names and "param_ag" in names and "grad_ar_dp" not in names
    ags = [o for o in sg.graph.ops if o.name == "param_ag"]
    # overlapped with the forward: issued at step start, first forward of each layer waits for its bucket
    first_fwd = [o for o in sg.graph.ops if o.phase == "fwd" and o.stream == "compute"]
    assert any(set(a.op_id for a in ags) & set(o.deps) for o in first_fwd)
    assert m.overlap_ratio > 0


# ----------------------------------------------------------------------------- FSDP

FSDP_COST = ToyCost(flops_per_s=1e14, mem_bw=1e12, comm_bw=4e11)  # all-gathers shorter than compute


def test_fsdp_prefetch_depth_changes_overlap():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    res = {}
    for d in (0, 1, 2):
        sg, tl, m = run(SMALL, p, OverlapKnobs(fsdp_prefetch=d, fsdp_limit_all_gathers=4), cost=FSDP_COST)
        res[d] = (m.overlap_ratio, step_time_s(tl))
    assert res[0][0] < res[1][0] <= res[2][0] + 1e-9
    assert res[1][1] < res[0][1]
    sg, _, _ = run(SMALL, p, cost=FSDP_COST)
    ags = [o for o in sg.graph.ops if o.name.startswith("fsdp_ag")]
    rss = [o for o in sg.graph.ops if o.name.startswith("fsdp_rs")]
    assert {o.stream for o in ags} == {"fsdp_ag"} and {o.stream for o in rss} == {"fsdp_rs"}
    units = SMALL.layers + 2  # embedding, layers, head
    assert len(ags) == 2 * units and len(rss) == units  # re-gathered in backward (reshard_after_forward)
    sg, _, _ = run(SMALL, p, OverlapKnobs(fsdp_reshard_after_forward=False), cost=FSDP_COST)
    assert len([o for o in sg.graph.ops if o.name.startswith("fsdp_ag")]) == units


def _max_alive_gathered_units(sg, tl) -> int:
    """Most units whose parameters are gathered at once: from the all-gather's start to the end of
    the compute of the unit execution that uses them."""
    ops = sg.graph.ops
    ends: dict = {}
    for o in ops:
        if o.stream == "compute" and o.rank == 0:
            k = (o.layer, o.microbatch, o.phase)
            ends[k] = max(ends.get(k, 0.0), tl.end_s[o.op_id])
    ivs = [(tl.start_s[o.op_id], ends[(o.layer, o.microbatch, o.phase)]) for o in ops
           if o.name.startswith("fsdp_ag") and o.rank == 0]
    ev = sorted([(s, 1) for s, _ in ivs] + [(e, -1) for _, e in ivs], key=lambda x: (x[0], x[1]))
    alive = peak = 0
    for _, d in ev:
        alive += d
        peak = max(peak, alive)
    return peak


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_fsdp_limit_all_gathers_is_respected(limit):
    fast = ToyCost(flops_per_s=1e14, mem_bw=1e12, comm_bw=1e13)
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    sg, tl, _ = run(SMALL, p, OverlapKnobs(fsdp_prefetch=4, fsdp_limit_all_gathers=limit), cost=fast)
    assert _max_alive_gathered_units(sg, tl) == limit
    sg, tl, _ = run(SMALL, p, OverlapKnobs(fsdp_prefetch=4, fsdp_limit_all_gathers=64), cost=fast)
    assert _max_alive_gathered_units(sg, tl) == 5  # prefetch depth + the unit computing


def test_fsdp_no_overlap_blocks():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    sg, tl, m = run(SMALL, p, OverlapKnobs(overlap=False), cost=FSDP_COST)
    _, tl1, m1 = run(SMALL, p, cost=FSDP_COST)
    assert m.overlap_ratio == 0.0 and step_time_s(tl) > step_time_s(tl1)


# ----------------------------------------------------------------------------- EP, TP

def test_ep_overlapped_beats_blocking():
    olmoe = get_model("OLMoE-1B-7B")
    p = ParallelConfig(dp=8, ep=8)
    sg_b, tl_b, m_b = run(olmoe, p, mb=2, seq=4096)
    sg_o, tl_o, m_o = run(olmoe, p, OverlapKnobs(ep_overlap=True), mb=2, seq=4096)
    a2a_b = [o for o in sg_b.graph.ops if isinstance(o.spec, CollectiveSpec) and o.spec.collective == "all_to_all"]
    a2a_o = [o for o in sg_o.graph.ops if isinstance(o.spec, CollectiveSpec) and o.spec.collective == "all_to_all"]
    assert len(a2a_o) == 2 * len(a2a_b)  # two half micro-batches
    assert sum(o.spec.bytes for o in a2a_o) == pytest.approx(sum(o.spec.bytes for o in a2a_b))
    assert {o.stream for o in a2a_o} == {"ep_comm"}
    assert m_o.overlap_ratio > m_b.overlap_ratio + 0.1
    assert step_time_s(tl_o) < step_time_s(tl_b)
    # in the blocking schedule compute never runs during an all-to-all of the same layer
    mask = np.array([isinstance(o.spec, CollectiveSpec) and o.spec.collective == "all_to_all" for o in sg_b.graph.ops])
    comp = np.array([o.stream == "compute" for o in sg_b.graph.ops])
    for i in np.flatnonzero(mask)[:8]:
        s, e = tl_b.start_s[i], tl_b.end_s[i]
        busy = (tl_b.start_s[comp] < e - 1e-12) & (tl_b.end_s[comp] > s + 1e-12)
        assert not busy.any()


def test_tp_chunked_overlap_hides_more_than_none():
    p = ParallelConfig(tp=4, dp=2, sequence_parallel=True)
    _, tl0, m0 = run(SMALL, p)
    _, tl1, m1 = run(SMALL, p, OverlapKnobs(tp_overlap="chunked", tp_chunks=4))
    assert m1.overlap_ratio > m0.overlap_ratio
    assert step_time_s(tl1) < step_time_s(tl0)


def test_comm_config_and_transport_reach_the_collectives():
    from ccoverlap.specs import CommConfig

    k = OverlapKnobs(comm_config=CommConfig(channels=2), comm_config_overrides={"dp": CommConfig(channels=8)},
                     comm_transport="dma")
    sg, _, _ = run(SMALL, ParallelConfig(tp=2, dp=4, sequence_parallel=True), k)
    colls = [o.spec for o in sg.graph.ops if isinstance(o.spec, CollectiveSpec)]
    assert {c.config.channels for c in colls if c.group.name == "tp"} == {2}
    assert {c.config.channels for c in colls if c.group.name == "dp"} == {8}
    assert {c.transport for c in colls} == {"dma"}
