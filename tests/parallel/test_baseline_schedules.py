"""The scheduling of the baselines Centauri was compared with, in the step builder:
gradient sync after the backward and blocking parameter gathers (Megatron-LM e6d7e09,
DeepSpeed ZeRO-1/2), HSDP with ZeRO-1/2 replicas, the interleaved pipeline's group of
micro-batches (Centauri Fig. 7) and DeepSpeed ZeRO-3's per-tensor fetching."""

from __future__ import annotations

import pytest
from parallel_helpers import ToyCost, cluster

from ccoverlap.catalog.models import model_from_dict
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step, estimate_memory
from ccoverlap.parallel import fsdp as fsdp_hook
from ccoverlap.parallel.pp import make_schedule
from ccoverlap.parallel.units import tensor_of, unit_tensors
from ccoverlap.parallel.zero3 import PERSISTENCE_THRESHOLD_NUMEL, _prefetch_triggers, _window_triggers, gathered_tensors
from ccoverlap.sim.simulator import simulate
from ccoverlap.specs import CollectiveSpec, GemmSpec

TINY = model_from_dict({"name": "tiny", "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "kv_heads": 8,
                        "layers": 4, "vocab": 1024, "seq_len": 1024})


def build(p, knobs=None, mb=1, microbatches=1, framework=None, gpus_per_node=8):
    b = BatchConfig(global_batch=p.dp * mb * microbatches, micro_batch=mb, seq_len=1024)
    return build_step(TINY, p, b, cluster(p.world_size, gpus_per_node), knobs or OverlapKnobs(), framework=framework)


def named(sg, prefix, rank=0):
    return [o for o in sg.graph.ops if o.rank == rank and o.name.startswith(prefix)]


# ----------------------------------------------------------------------------- DDP sync timing


def test_grad_reduce_after_the_whole_backward_on_the_compute_stream():
    p = ParallelConfig(dp=8)
    over = build(p)
    after = build(p, OverlapKnobs(overlap_grad_reduce=False))
    assert {o.stream for o in named(over, "grad_ar")} == {"dp_comm"}
    ar = named(after, "grad_ar")
    assert ar and {o.stream for o in ar} == {"compute"}
    last_bwd = max(o.op_id for o in after.graph.ops if o.phase == "bwd" and o.stream == "compute")
    assert min(o.op_id for o in ar) > last_bwd  # issued once the backward is over
    tl_over, tl_after = simulate(over.graph, ToyCost()), simulate(after.graph, ToyCost())
    assert tl_after.end_s.max() > tl_over.end_s.max()  # nothing of it overlaps the backward any more


def test_param_gather_blocking_after_the_step_without_overlap_param_gather():
    p = ParallelConfig(dp=8, distributed_optimizer=True)
    early = named(build(p), "param_ag")
    late_sg = build(p, OverlapKnobs(overlap_param_gather=False))
    late = named(late_sg, "param_ag")
    assert early and {o.phase for o in early} == {"dp"} and {o.stream for o in early} == {"dp_comm"}
    opt = named(late_sg, "optimizer_step")[0]
    assert late and all(o.stream == "compute" and o.op_id > opt.op_id for o in late)
    assert sum(o.spec.bytes for o in early) == sum(o.spec.bytes for o in late)


def test_new_knobs_reject_non_booleans():
    with pytest.raises(ConfigError, match="overlap_grad_reduce"):
        OverlapKnobs(overlap_grad_reduce="no")
    with pytest.raises(ConfigError, match="fsdp_fetch"):
        OverlapKnobs(fsdp_fetch="tensor")


# ----------------------------------------------------------------------------- HSDP, ZeRO-1/2 replicas


def test_hsdp_zero_replicas_reduce_scatter_then_gather_the_shard():
    p_ar = ParallelConfig(dp=16, data_parallel="fsdp", dp_replicate=2)
    p_z = ParallelConfig(dp=16, data_parallel="fsdp", dp_replicate=2, distributed_optimizer=True)
    ar = named(build(p_ar, gpus_per_node=8), "hsdp_ar")
    sg = build(p_z, gpus_per_node=8)
    rs, ag = named(sg, "hsdp_rs"), named(sg, "hsdp_param_ag")
    assert len(rs) == len(ar) and not named(sg, "hsdp_ar")
    assert [o.spec.collective for o in rs] == ["reduce_scatter"] * len(rs)
    assert {o.spec.group.name for o in rs + ag} == {"dp_rep"}
    assert sum(o.spec.bytes for o in rs) == sum(o.spec.bytes for o in ar)  # the same shard, reduce-scattered
    # the updated shard comes back in the compute dtype, before the unit's first gather of the step
    first_ag = named(sg, "fsdp_ag_dp")
    assert all(any(d in {a.op_id for a in ag} for d in o.deps) for o in first_ag if o.microbatch == 0
               and o.phase == "fwd" and o.layer >= 0)
    blocking = named(build(p_z, OverlapKnobs(overlap_param_gather=False)), "hsdp_param_ag")
    assert {o.stream for o in blocking} == {"compute"} and {o.phase for o in blocking} == {"opt"}


def test_hsdp_zero_replicas_shard_the_optimizer_across_replicas():
    b = BatchConfig(global_batch=16, micro_batch=1, seq_len=1024)
    c = cluster(16)
    m_ar = estimate_memory(TINY, ParallelConfig(dp=16, data_parallel="fsdp", dp_replicate=2), b, c)
    m_z = estimate_memory(TINY, ParallelConfig(dp=16, data_parallel="fsdp", dp_replicate=2,
                                                distributed_optimizer=True), b, c)
    assert m_z.optimizer_bytes == pytest.approx(m_ar.optimizer_bytes / 2)
    with pytest.raises(ConfigError, match="needs dp_replicate > 1"):
        ParallelConfig(dp=16, data_parallel="fsdp", distributed_optimizer=True)


# ----------------------------------------------------------------------------- pipeline group


@pytest.mark.parametrize("P,V,M", [(2, 2, 8), (3, 2, 6), (4, 2, 8), (3, 3, 12)])
def test_pipeline_group_schedules_every_task_and_builds(P, V, M):
    default = make_schedule("interleaved", P, M, V)
    assert make_schedule("interleaved", P, M, V, P).orders == default.orders  # group = pp is Megatron-LM's
    for G in range(P, M + 1):
        if M % G:
            continue
        s = make_schedule("interleaved", P, M, V, G)
        want = sorted((k, m, c) for k in "FB" for m in range(M) for c in range(V))
        assert all(sorted(o) == want for o in s.orders)
        # the last rank starts with G micro-batches of chunk 0 and G-1 more chunk-0 forwards come
        # before chunk 1 only when G > P: micro-batch G-1 of chunk 0 precedes micro-batch 0 of chunk 1
        last = s.orders[P - 1]
        assert last.index(("F", G - 1, 0)) < last.index(("F", 0, 1))
    p = ParallelConfig(pp=P, pp_schedule="interleaved", virtual_stages=V, pp_group=M)
    m = model_from_dict({**TINY.to_dict(), "layers": P * V})
    build_step(m, p, BatchConfig(global_batch=M, micro_batch=1, seq_len=512), cluster(P), OverlapKnobs())


def test_pipeline_group_errors():
    with pytest.raises(ConfigError, match="needs pp_schedule='interleaved'"):
        ParallelConfig(pp=2, pp_group=4)
    with pytest.raises(ConfigError, match="at least pp"):
        ParallelConfig(pp=4, pp_schedule="interleaved", virtual_stages=2, pp_group=2)
    p = ParallelConfig(pp=2, pp_schedule="interleaved", virtual_stages=2, pp_group=4)
    with pytest.raises(ConfigError, match="must divide the number of micro-batches"):
        p.validate(TINY, batch=BatchConfig(global_batch=6, micro_batch=1, seq_len=512))


# ----------------------------------------------------------------------------- ZeRO-3 per-tensor fetch


def test_tensor_names_of_ops():
    assert tensor_of("mlp_fc1") == "fc1" and tensor_of("mlp_fc2_dgrad") == "fc2"
    assert tensor_of("qkv_wgrad") == "qkv" and tensor_of("qkv0") == "qkv" and tensor_of("mlp_fc10") == "fc1"
    assert tensor_of("recompute_mlp_fc1") == "fc1" and tensor_of("embedding") == "embedding"
    assert tensor_of("attn_qk") is None and tensor_of("attn_pv_wgrad") is None and tensor_of("mlp_norm") is None


def test_prefetch_bucket_issues_until_the_bucket_is_full():
    # at each hook: its own fetch if not yet issued, then the next ones until 5 elements are new
    assert _prefetch_triggers([3, 3, 3, 3], 5) == [(0, False), (0, True), (0, True), (1, True)]
    assert _prefetch_triggers([9, 9, 9], 5) == [(0, False), (0, True), (1, True)]  # one tensor ahead
    assert _prefetch_triggers([9, 9], 0) == [(0, False), (1, False)]  # no prefetch


def test_zero3_gathers_each_tensor_and_each_gemm_waits_for_its_own():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    unit = build(p)
    sg = build(p, OverlapKnobs(fsdp_fetch="parameter"))
    g = sg.graph
    per = [o for o in g.ops if o.name.startswith("fsdp_ag_dp.") and o.layer == 1 and o.phase == "fwd"]
    names = [o.name.split(".")[1] for o in per]
    assert names == [t for t, _ in gathered_tensors(TINY, p, "L1")] == ["qkv", "proj", "fc1", "fc2"]
    bwd = [o.name.split(".")[1] for o in g.ops if o.name.startswith("fsdp_ag_dp.") and o.layer == 1
           and o.phase == "bwd"]
    assert bwd == names[::-1]  # the backward uses them in reverse
    # bytes: the unit's all-gather less the norm weights, which stay gathered
    whole = next(o for o in unit.graph.ops if o.name == "fsdp_ag_dp" and o.layer == 1 and o.phase == "fwd")
    norms = sum(t.numel for t in TINY.layer_tensors(1) if t.numel < PERSISTENCE_THRESHOLD_NUMEL)
    assert sum(o.spec.bytes for o in per) == pytest.approx(whole.spec.bytes - norms * p.dtype_bytes)
    ag_of = {o.op_id: o.name.split(".")[1] for o in g.ops if o.name.startswith("fsdp_ag_dp.")}
    gemms = [o for o in g.ops if isinstance(o.spec, GemmSpec) and tensor_of(o.name) in ("qkv", "proj", "fc1", "fc2")]
    assert gemms
    for o in gemms:
        waits = {ag_of[d] for d in o.deps if d in ag_of}
        assert waits <= {tensor_of(o.name)}, o.name
        if o.phase == "fwd":
            assert waits == {tensor_of(o.name)}, o.name
    # the norms wait for no gather any more
    assert all(not set(o.deps) & set(ag_of) for o in g.ops if o.name.endswith("norm"))


def test_zero3_prefetch_issues_the_next_tensor_at_the_hook_of_the_previous():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    g = build(p, OverlapKnobs(fsdp_fetch="parameter")).graph
    ags = {o.name.split(".")[1]: o for o in g.ops if o.name.startswith("fsdp_ag_dp.") and o.layer == 2
           and o.phase == "fwd"}
    # TINY's tensors are all under the 5e7 bucket: each hook prefetches up to 5e7 elements, so
    # the whole unit is issued at the first hook after the previous unit's gathers
    for name in ("proj", "fc1", "fc2"):
        assert any(g.ops[d].name.startswith("fsdp_ag_dp.") for d in ags[name].deps)
    tl = simulate(g, ToyCost())
    assert tl.end_s.max() > 0


def test_zero3_rejects_what_it_does_not_model():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    with pytest.raises(ConfigError, match="fsdp_fetch='parameter'.*FSDP2 copies"):
        build(p, OverlapKnobs(fsdp_fetch="parameter"), framework="torchtitan")
    # without overlap every all-gather blocks the compute stream: per unit or per tensor is the same
    off = build(p, OverlapKnobs(fsdp_fetch="parameter", overlap=False))
    assert off.graph.ops == build(p, OverlapKnobs(overlap=False)).graph.ops
    # without FSDP the knob has nothing to fetch
    ddp = build(ParallelConfig(dp=8), OverlapKnobs(fsdp_fetch="parameter"))
    assert not [o for o in ddp.graph.ops if isinstance(o.spec, CollectiveSpec) and o.name.startswith("fsdp")]


def _grad_order(g, rank=0):
    """(tensor, elements, op producing its gradient) in the order the backward produces them."""
    out = []
    model, p = TINY, ParallelConfig(dp=8, data_parallel="fsdp")
    for u in ["head"] + [f"L{i}" for i in range(TINY.layers - 1, -1, -1)] + ["emb"]:
        layer = TINY.layers if u == "head" else -1 if u == "emb" else int(u[1:])
        wgrads = {}
        for o in g.ops:  # the ops the layer builders name as producing a weight's gradient
            if o.rank == rank and o.phase == "bwd" and o.layer == layer:
                t = tensor_of(o.name) if o.name.endswith("_wgrad") else \
                    {"embedding_grad": "embedding"}.get(o.name, o.name.removesuffix("_bwd"))
                wgrads[t] = o.op_id
        out += sorted((wgrads.get(t.name, 10**9), t.numel, t.name) for t in unit_tensors(model, p, u))
    return out


def test_zero3_reduces_gradients_in_buckets_issued_at_the_overflowing_gradient(monkeypatch):
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    whole = build(p, OverlapKnobs(fsdp_fetch="parameter"))
    one = named(whole, "fsdp_rs_dp")
    # TINY's 55M elements fit one 5e8 bucket: one reduce-scatter, after the whole backward
    total = sum(t.numel for u in ["emb", "head"] + [f"L{i}" for i in range(TINY.layers)]
                for t in unit_tensors(TINY, p, u))
    assert len(one) == 1 and one[0].spec.bytes == total * 4  # fp32 gradients (megatron-core)
    last_bwd = max(o.op_id for o in whole.graph.ops if o.rank == 0 and o.phase == "bwd" and o.stream == "compute")
    assert one[0].deps == (last_bwd,)
    # a bucket of 13M elements: DeepSpeed's rule, a bucket closes when the next gradient would overflow it
    monkeypatch.setattr(fsdp_hook, "REDUCE_BUCKET_NUMEL", 13_000_000)
    sg = build(p, OverlapKnobs(fsdp_fetch="parameter"))
    rs = named(sg, "fsdp_rs_dp")
    want, bucket = [], 0
    for op, n, _ in _grad_order(sg.graph):
        if bucket and bucket + n > 13_000_000:
            want.append((bucket, op))
            bucket = 0
        bucket += n
    got = [(int(o.spec.bytes // 4), o.deps[0]) for o in rs]
    assert got[:-1] == want and got[-1][0] == bucket and got[-1][1] == last_bwd
    assert len(rs) > 3 and {o.stream for o in rs} == {"fsdp_rs"}


def test_zero3_host_ahead_issue_order():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    sg = build(p, OverlapKnobs(fsdp_fetch="parameter", zero3_host_ahead=True))
    g = sg.graph
    ags = [o for o in g.ops if o.rank == 0 and o.name.startswith("fsdp_ag_dp.")]
    # the all-gathers wait for no computation; the reduce-scatters join their queue
    assert all(g.ops[d].stream != "compute" for o in ags for d in o.deps)
    queue = [o for o in g.ops if o.rank == 0 and o.stream == ags[0].stream]
    rs = [o for o in queue if o.name == "fsdp_rs_dp"]
    assert rs and all(isinstance(o.spec, CollectiveSpec) for o in queue)
    assert queue[-1].name == "fsdp_rs_dp"  # the one bucket is issued after the backward's last gradient
    # with tensors over the 5e7-element prefetch bucket, hooks that keep pace with the GPU keep
    # one tensor ahead; hooks ahead on the host gather the next ones while the GEMMs run
    wide = model_from_dict({"name": "wide", "hidden": 8192, "ffn_hidden": 22016, "heads": 64, "kv_heads": 64,
                            "layers": 3, "vocab": 1024, "seq_len": 1024})

    def forward_end(ahead):
        graph = build_step(wide, p, BatchConfig(global_batch=8, micro_batch=1, seq_len=1024), cluster(8),
                           OverlapKnobs(fsdp_fetch="parameter", zero3_host_ahead=ahead)).graph
        tl = simulate(graph, ToyCost(flops_per_s=1e13, comm_bw=1e10))
        return max(e for e, st, o in zip(tl.end_s, tl.stream, graph.ops) if st == "compute" and o.phase == "fwd")
    assert forward_end(True) < 0.85 * forward_end(False)


def test_window_triggers_keep_the_live_elements_ahead():
    # each fetch is issued at the first hook from which the elements gathered and not yet
    # released (that hook's own included) leave room for it: DeepSpeed's max_live_parameters
    assert _window_triggers([4, 4, 4, 4], 8) == [(0, False), (0, True), (1, True), (2, True)]
    assert _window_triggers([4, 4, 4, 4], 100) == [(0, False), (0, True), (0, True), (0, True)]
    assert _window_triggers([9, 9, 9], 5) == [(0, False), (1, False), (2, False)]  # no room: no prefetch


def test_zero3_host_ahead_needs_per_tensor_fetch():
    with pytest.raises(ConfigError, match="zero3_host_ahead needs fsdp_fetch='parameter'"):
        OverlapKnobs(zero3_host_ahead=True)
    with pytest.raises(ConfigError, match="zero3_host_ahead must be true or false"):
        OverlapKnobs(fsdp_fetch="parameter", zero3_host_ahead="yes")
