"""build_step composition: simulated ranks, group layout on nodes, every catalog model builds."""

from __future__ import annotations

import pytest
from parallel_helpers import ToyCost, cluster

from ccoverlap.catalog.models import MODELS, get_model
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step
from ccoverlap.parallel.layout import Layout, local_size
from ccoverlap.sim.simulator import simulate
from ccoverlap.sim.timeline import step_time_s
from ccoverlap.specs import CollectiveSpec


def test_one_simulated_rank_per_pipeline_rank():
    m = get_model("Llama-3-70B")
    p = ParallelConfig(tp=8, pp=8, dp=16, sequence_parallel=True)
    sg = build_step(m, p, BatchConfig(global_batch=256, micro_batch=1, seq_len=8192), cluster(1024))
    assert sg.world_size == 1024 and sg.microbatches == 16
    assert [r for r, _, _ in sg.simulated_ranks] == list(range(8))
    assert all(n == 128 for _, _, n in sg.simulated_ranks)  # tp x dp real ranks each
    assert "layers 0-9 + emb" in sg.simulated_ranks[0][1] and "head" in sg.simulated_ranks[7][1]
    assert {o.rank for o in sg.graph.ops} == set(range(8))
    assert sg.graph.meta["rank_weights"] == {r: 128 for r in range(8)}
    groups = {o.spec.group.name: o.spec.group for o in sg.graph.ops if isinstance(o.spec, CollectiveSpec)}
    assert (groups["tp"].size, groups["tp"].local_size) == (8, 8)  # TP inside a node
    assert (groups["dp"].size, groups["dp"].local_size) == (16, 1)  # DP across nodes
    # lean graph: ~30 ops per layer per micro-batch (fwd + bwd) with SP
    assert len(sg.graph) < 8 * 16 * 10 * 32 * 1.05


def test_layout_local_sizes():
    assert local_size(8, 1, 8) == 8 and local_size(16, 8, 8) == 1 and local_size(4, 2, 8) == 4
    assert local_size(16, 2, 8) == 4 and local_size(6, 2, 8) == 2  # 4 per node does not divide 6
    lay = Layout.build(ParallelConfig(tp=2, dp=8, ep=4), 8)
    assert (lay.tp.local_size, lay.ep.size, lay.ep.local_size) == (2, 4, 4)
    assert (lay.edp.size, lay.edp.local_size, lay.dp.local_size) == (2, 1, 4)
    assert Layout.build(ParallelConfig(tp=8, pp=2), 8).pp_inter_node
    assert not Layout.build(ParallelConfig(tp=2, pp=2), 8).pp_inter_node


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_catalog_model_builds_and_simulates(name):
    m = get_model(name)
    if m.is_moe:
        p = ParallelConfig(tp=2, pp=1, dp=4, ep=2 if m.experts % 2 == 0 else 1, sequence_parallel=True)
    else:
        p = ParallelConfig(tp=2, pp=2, dp=2, sequence_parallel=True)
    if m.layers % p.pp:
        p = ParallelConfig(tp=2, dp=4, sequence_parallel=True)
    sg = build_step(m, p, BatchConfig(global_batch=2 * p.dp, micro_batch=1, seq_len=512), cluster(8),
                    OverlapKnobs(ep_overlap=m.is_moe))
    tl = simulate(sg.graph, ToyCost())
    assert step_time_s(tl) > 0 and len(tl) == len(sg.graph)
    assert sg.model_flops_per_step == pytest.approx(m.flops_per_token(512) * 2 * p.dp * 512)


def test_tied_embeddings_all_reduce_between_first_and_last_stage():
    m = get_model("MPT-7B")  # tied
    p = ParallelConfig(tp=2, pp=2, dp=2)
    sg = build_step(m, p, BatchConfig(global_batch=4, micro_batch=1, seq_len=512), cluster(8))
    ar = [o for o in sg.graph.ops if o.name == "embedding_grad_ar"]
    assert sorted(o.rank for o in ar) == [0, 1] and all(o.spec.group.size == 2 for o in ar)
    opt = {o.rank: o for o in sg.graph.ops if o.name == "grad_norm"}
    assert all(a.op_id in opt[a.rank].deps for a in ar)


def test_validation_runs_first():
    with pytest.raises(ConfigError, match="must equal the cluster's 16 GPUs"):
        build_step(get_model("Llama-3-8B"), ParallelConfig(tp=2, dp=4), BatchConfig(global_batch=8), cluster(16))
    with pytest.raises(ConfigError, match="unknown model"):
        get_model("gpt-5")


def test_build_is_deterministic():
    m = get_model("Mixtral-8x7B")
    p = ParallelConfig(tp=2, dp=4, ep=4, sequence_parallel=True, data_parallel="fsdp")
    b = BatchConfig(global_batch=8, micro_batch=1, seq_len=1024)
    k = OverlapKnobs(ep_overlap=True)
    g1, g2 = build_step(m, p, b, cluster(8), k).graph, build_step(m, p, b, cluster(8), k).graph
    assert [(o.name, o.rank, o.stream, o.deps) for o in g1.ops] == [(o.name, o.rank, o.stream, o.deps) for o in g2.ops]


def test_grad_clip_is_optional_and_p2p_gets_the_pp_config():
    from ccoverlap.specs import CommConfig, P2PSpec

    m = get_model("Llama-3-8B")
    p = ParallelConfig(pp=2, dp=4)
    b = BatchConfig(global_batch=8, micro_batch=1, seq_len=512)
    k = OverlapKnobs(comm_config_overrides={"pp": CommConfig(channels=2)})
    sg = build_step(m, p, b, cluster(8), k)
    assert sum(o.name.startswith("grad_norm") for o in sg.graph.ops) == 4
    assert {o.spec.config.channels for o in sg.graph.ops if isinstance(o.spec, P2PSpec)} == {2}
    sg2 = build_step(m, p, b, cluster(8), k, grad_clip=False)
    assert not any(o.name.startswith("grad_norm") for o in sg2.graph.ops)
    (opt,) = [o for o in sg2.graph.ops if o.name == "optimizer_step" and o.rank == 0]
    assert sg2.graph.ops[opt.deps[0]].name.startswith("grad_ar")
