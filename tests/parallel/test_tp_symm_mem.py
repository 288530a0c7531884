"""``tp_overlap="symm_mem"``: PyTorch's async TP (symmetric-memory fused AG+matmul and
matmul+RS) as one layer's op list, hand-checked on a small case, and no change where it does
not apply (tp=1, no sequence parallelism, ``tp_overlap="none"``)."""

from __future__ import annotations

import pytest
from parallel_helpers import cluster, validate_error_of_tp_run

from ccoverlap.catalog.models import get_model
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, MemorySpec, P2PSpec

L8 = get_model("Llama-3-8B")
S = 4096
TP = 4
ROWS = S // TP  # local [T/tp] rows of one micro-batch of 1 x 4096 tokens
H = 4096


def build(p, mode):
    return build_step(L8, p, BatchConfig(global_batch=p.dp, micro_batch=1, seq_len=S), cluster(p.world_size),
                      OverlapKnobs(tp_overlap=mode))


def layer(sg, phase="fwd", layer=3):
    return [o for o in sg.graph.ops if o.rank == 0 and o.layer == layer and o.microbatch == 0 and o.phase == phase]


def by_name(ops, name):
    (o,) = [o for o in ops if o.name == name]
    return o


SP4 = ParallelConfig(tp=TP, dp=1, sequence_parallel=True)


def test_fused_all_gather_matmul_steps_and_peer_copies():
    fwd = layer(build(SP4, "symm_mem"))
    ids = {o.op_id: o.name for o in fwd}
    shard = ROWS * H * 2  # one [T/tp, h] bf16 shard
    mv = by_name(fwd, "qkv_symm_mv")
    assert isinstance(mv.spec, CopySpec) and mv.spec.bytes == shard and mv.stream == "compute"
    gemms = [by_name(fwd, f"qkv{s}") for s in range(TP)]
    # qkv: [T/tp, h] x [h, (32 + 2*8) * 128 / 4] per step, 4 steps = the whole [T, h] x [h, 1536]
    assert all((g.spec.m, g.spec.n, g.spec.k) == (ROWS, 1536, H) for g in gemms)
    copies = [by_name(fwd, f"qkv_symm_cp{s}") for s in range(1, TP)]
    assert all(isinstance(c.spec, P2PSpec) and c.spec.transport == "dma" and not c.spec.inter_node
               and c.spec.bytes == shard and c.stream == "tp_comm" for c in copies)
    # the local shard first, after the mv only; step s's GEMM waits for its copy; copy s waits
    # for the GEMM of step s-2 (same stream in torch's two-stream alternation)
    assert [ids[d] for d in gemms[0].deps] == ["qkv_symm_mv"]
    assert [[ids[d] for d in gemms[s].deps] for s in range(1, TP)] == [[f"qkv_symm_cp{s}"] for s in range(1, TP)]
    assert [[ids[d] for d in c.deps] for c in copies] == [["qkv_symm_mv"], ["qkv_symm_mv", "qkv0"],
                                                          ["qkv_symm_mv", "qkv1"]]
    # no NCCL-style collective left in the forward: AG+qkv, proj+RS, AG+fc1, fc2+RS all fused
    assert not [o for o in fwd if isinstance(o.spec, CollectiveSpec)]
    assert len([o for o in fwd if isinstance(o.spec, P2PSpec)]) == 4 * (TP - 1)


def test_fused_matmul_reduce_scatter_partials_copies_and_reduction():
    fwd = layer(build(SP4, "symm_mem"))
    ids = {o.op_id: o.name for o in fwd}
    names = [o.name for o in fwd if o.name.startswith("proj")]
    # remote partials 1..3 (each pulled by its owner), the local partial last, then the sum
    assert names == ["proj1", "proj_symm_cp1", "proj2", "proj_symm_cp2", "proj3", "proj_symm_cp3", "proj0",
                     "proj_symm_reduce"]
    part = ROWS * H * 2  # one [T/tp, h] bf16 partial
    for s in range(1, TP):
        g, c = by_name(fwd, f"proj{s}"), by_name(fwd, f"proj_symm_cp{s}")
        assert (g.spec.m, g.spec.n, g.spec.k) == (ROWS, H, 32 * 128 // TP)
        assert c.spec.bytes == part and c.spec.transport == "dma" and [ids[d] for d in c.deps] == [f"proj{s}"]
    # two symmetric buffers: step 3's GEMM overwrites step 1's buffer only after step 1's pull
    assert "proj_symm_cp1" in [ids.get(d) for d in by_name(fwd, "proj3").deps]
    red = by_name(fwd, "proj_symm_reduce")
    # torch.sum over [tp, T/tp, h]: reads tp partials, writes one
    assert isinstance(red.spec, MemorySpec) and red.spec.bytes == (TP + 1) * part
    assert sorted(ids[d] for d in red.deps) == ["proj0", "proj_symm_cp3"]


def test_backward_fuses_only_the_output_gradient_all_gather_with_dgrad():
    sg, ref = build(SP4, "symm_mem"), build(SP4, "none")
    bwd, bwd_ref = layer(sg, "bwd"), layer(ref, "bwd")
    dgrads = [by_name(bwd, "proj_grad_symm_mv")] + [by_name(bwd, f"proj_dgrad{s}") for s in range(TP)]
    assert all((g.spec.m, g.spec.n, g.spec.k) == (ROWS, 32 * 128 // TP, H) for g in dgrads[1:])
    assert len([o for o in bwd if isinstance(o.spec, P2PSpec)]) == 2 * (TP - 1)  # proj and fc2 dgrads
    colls = sorted((o.name, o.spec.collective) for o in bwd if isinstance(o.spec, CollectiveSpec))
    # the saved-input all-gather and the input-gradient reduce-scatter of column-parallel GEMMs stay NCCL
    assert colls == sorted((o.name, o.spec.collective) for o in bwd_ref if isinstance(o.spec, CollectiveSpec)
                           and o.name.startswith(("input_ag", "dgrad_rs")))
    assert colls and {c for _, c in colls} == {"all_gather", "reduce_scatter"}


def test_same_gemm_work_as_without_overlap():
    def flops(sg):
        return sum(o.spec.flops for o in sg.graph.ops if isinstance(o.spec, GemmSpec))
    assert flops(build(SP4, "symm_mem")) == pytest.approx(flops(build(SP4, "none")), rel=1e-12)


@pytest.mark.parametrize("p", [ParallelConfig(tp=1, dp=2), ParallelConfig(tp=2, dp=1, sequence_parallel=False)])
def test_nothing_changes_without_tp_or_sequence_parallelism(p):
    def ops(sg):
        return [(o.name, o.stream, o.spec, o.deps) for o in sg.graph.ops]
    assert ops(build(p, "symm_mem")) == ops(build(p, "none"))


def test_only_the_tp_ops_change():
    """The step changes only through TP ops: tp_overlap none and symm_mem build the same
    non-TP ops (norms, attention, FSDP/DP collectives) in the same number."""
    a, b = build(SP4, "none"), build(SP4, "symm_mem")
    def others(sg):
        return sorted(o.name for o in sg.graph.ops if "symm" not in o.name and not isinstance(o.spec, GemmSpec)
                      and not (isinstance(o.spec, CollectiveSpec) and o.spec.group.name == "tp"))
    assert others(a) == others(b)


def test_bad_mode_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"tp_overlap must be one of \['none', 'chunked', 'symm_mem', 'userbuffers'\], got 'async'"):
        OverlapKnobs(tp_overlap="async")


def test_bad_mode_in_a_runs_file_exits_2_with_one_line(tmp_path, capsys):
    code, err = validate_error_of_tp_run(tmp_path, capsys, parallel={"tp": 8, "dp": 1, "sequence_parallel": True},
                                         knobs={"tp_overlap": "async"}, framework="torchtitan-compile")
    assert code == 2
    assert "\n" not in err and "Traceback" not in err and "tp_overlap must be one of" in err


def test_simulated_peer_copies_take_time_on_the_tp_stream_and_count_as_tp_traffic():
    from ccoverlap.cost import CostModel
    from ccoverlap.sim.simulator import simulate

    sg = build(SP4, "symm_mem")
    c = cluster(SP4.world_size)
    tl = simulate(sg.graph, CostModel(c))
    copies = [i for i, o in enumerate(sg.graph.ops) if "_symm_cp" in o.name]
    assert copies and all(tl.group[i] == "tp" and tl.collective[i] == "p2p" and tl.stream[i] == "tp_comm"
                          for i in copies)
    # a copy-engine copy of one 8 MiB shard alone: bytes / (link x dma efficiency, capped by the engines) + latency
    from ccoverlap.cost.comm import p2p_time_s
    i = copies[0]
    assert tl.end_s[i] - tl.start_s[i] >= p2p_time_s(sg.graph.ops[i].spec, c) * (1 - 1e-9)


def test_a_tp_group_across_nodes_is_refused_with_one_message():
    p = ParallelConfig(tp=4, dp=1, sequence_parallel=True)
    with pytest.raises(ConfigError, match=r"tp_overlap 'symm_mem' needs the TP group inside one node \(tp=4 spans 2"):
        build_step(L8, p, BatchConfig(global_batch=1, micro_batch=1, seq_len=S), cluster(4, gpus_per_node=2),
                   OverlapKnobs(tp_overlap="symm_mem"))
