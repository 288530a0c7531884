"""``tp_overlap="userbuffers"``: TransformerEngine's userbuffers overlap (Megatron-Core
``--tp-comm-overlap``) as one layer's op list, hand-checked on a small case: ring-exchange
copy-engine all-gathers, the 4-piece pipelined reduce-scatter on 16 (last 32) SMs, the bulk
backward overlaps; in simulation the copies run beside the GEMM pieces; bad configurations
are one ConfigError."""

from __future__ import annotations

import numpy as np
import pytest
from parallel_helpers import cluster, validate_error_of_tp_run

from ccoverlap.catalog.models import get_model
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step
from ccoverlap.parallel import tp as tp_module
from ccoverlap.parallel.tp import UB_COMPUTE_STREAMS, UB_MAX_SM, UB_NUM_SM, UB_PIPELINE_SPLITS
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, P2PSpec

L8 = get_model("Llama-3-8B")
S = 4096
TP = 4
ROWS = S // TP  # local [T/tp] rows of one micro-batch of 1 x 4096 tokens
H = 4096
SP4 = ParallelConfig(tp=TP, dp=1, sequence_parallel=True)


def build(p, mode, gpus_per_node=8):
    return build_step(L8, p, BatchConfig(global_batch=p.dp, micro_batch=1, seq_len=S),
                      cluster(p.world_size, gpus_per_node), OverlapKnobs(tp_overlap=mode))


def layer(sg, phase="fwd", layer=3):
    return [o for o in sg.graph.ops if o.rank == 0 and o.layer == layer and o.microbatch == 0 and o.phase == phase]


def by_name(ops, name):
    (o,) = [o for o in ops if o.name == name]
    return o


@pytest.fixture(scope="module")
def ub():
    return build(SP4, "userbuffers")


def test_forward_all_gather_is_a_ring_of_copy_engine_copies_beside_gemm_steps(ub):
    fwd = layer(ub)
    ids = {o.op_id: o.name for o in fwd}
    shard = ROWS * H * 2  # one [T/tp, h] bf16 shard
    gemms = [by_name(fwd, f"qkv{s}") for s in range(TP)]
    # qkv: [T/tp, h] x [h, (32 + 2*8) * 128 / 4] per step, 4 steps = the whole [T, h] x [h, 1536]
    assert all((g.spec.m, g.spec.n, g.spec.k) == (ROWS, 1536, H) for g in gemms)
    copies = [by_name(fwd, f"qkv_ub_cp{s}") for s in range(1, TP)]
    assert all(isinstance(c.spec, P2PSpec) and c.spec.transport == "dma" and not c.spec.inter_node
               and c.spec.bytes == shard and c.stream == "tp_comm" for c in copies)
    # the local shard's GEMM needs no copy (the norm writes into the buffer); step s's GEMM waits
    # for the copy of step s; each copy waits for the previous one only (send after receive)
    assert not any(ids.get(d, "").startswith("qkv_ub_cp") for d in gemms[0].deps)
    assert [[ids[d] for d in gemms[s].deps] for s in range(1, TP)] == [[f"qkv_ub_cp{s}"] for s in range(1, TP)]
    assert [[ids[d] for d in c.deps] for c in copies[1:]] == [[f"qkv_ub_cp{s}"] for s in range(1, TP - 1)]
    assert copies[0].deps == gemms[0].deps
    # no device copy in forward, and no all-gather collective: qkv and fc1 both ring-exchange
    assert not [o for o in fwd if isinstance(o.spec, CopySpec)]
    assert not [o for o in fwd if isinstance(o.spec, CollectiveSpec) and o.spec.collective == "all_gather"]
    assert len([o for o in fwd if isinstance(o.spec, P2PSpec)]) == 2 * (TP - 1)


def test_forward_reduce_scatter_is_pipelined_in_four_pieces_on_te_sm_counts(ub):
    fwd = layer(ub)
    ids = {o.op_id: o.name for o in fwd}
    names = [o.name for o in fwd if o.name.startswith("proj")]
    assert names == [x for i in range(UB_PIPELINE_SPLITS) for x in (f"proj{i}", f"proj_rs{i}")]
    piece = S // UB_PIPELINE_SPLITS
    rs = [by_name(fwd, f"proj_rs{i}") for i in range(UB_PIPELINE_SPLITS)]
    for i, r in enumerate(rs):
        g = by_name(fwd, f"proj{i}")
        assert (g.spec.m, g.spec.n, g.spec.k) == (piece, H, 32 * 128 // TP)
        assert r.spec.collective == "reduce_scatter" and r.spec.bytes == piece * H * 2 and r.stream == "tp_comm"
        assert r.spec.transport == "sm" and [ids[d] for d in r.deps] == [f"proj{i}"]
    assert [r.spec.config.channels for r in rs] == [UB_NUM_SM] * (UB_PIPELINE_SPLITS - 1) + [UB_MAX_SM]
    assert (UB_NUM_SM, UB_PIPELINE_SPLITS, UB_MAX_SM) == (16, 4, 32)  # TransformerEngine v1.7's defaults


def test_backward_ring_for_row_parallel_dgrad_and_bulk_for_column_parallel(ub):
    bwd = layer(ub, "bwd")
    ids = {o.op_id: o.name for o in bwd}
    cp = by_name(bwd, "proj_grad_ub_copy")  # copy_input_to_ubuf of the local output gradient
    assert isinstance(cp.spec, CopySpec) and cp.spec.bytes == ROWS * H * 2
    dgrads = [by_name(bwd, f"proj_dgrad{s}") for s in range(TP)]
    assert all((g.spec.m, g.spec.n, g.spec.k) == (ROWS, 32 * 128 // TP, H) for g in dgrads)
    assert [ids[d] for d in by_name(bwd, "proj_grad_ub_cp1").deps] == ["proj_grad_ub_copy"]
    assert [ids[d] for d in by_name(bwd, "proj_wgrad").deps] == [f"proj_dgrad{TP - 1}"]
    # bulk: the saved input copied in, all-gathered beside the dgrad; dX reduce-scattered beside the wgrad
    ags = [o for o in bwd if o.name == "input_ag"]
    rss = [o for o in bwd if o.name == "dgrad_rs"]
    assert len(ags) == len(rss) == 2  # attention (qkv) and MLP (fc1)
    assert all([ids[d] for d in ag.deps] == ["input_ub_copy"] for ag in ags)
    assert all(o.spec.bytes == ROWS * H * 2 for o in bwd if o.name == "input_ub_copy")
    assert all(o.spec.config.channels == UB_NUM_SM for o in ags + rss)
    assert not [o for o in bwd if isinstance(o.spec, CollectiveSpec) and o.spec.collective == "all_gather"
                and o.name != "input_ag"]


def test_the_lm_head_keeps_its_plain_all_gather(ub):
    names = {o.name for o in ub.graph.ops if o.rank == 0}
    assert "lm_head_ag" in names and not any(n.startswith("lm_head_ub") for n in names)


def test_same_gemm_work_as_without_overlap(ub):
    def flops(sg):
        return sum(o.spec.flops for o in sg.graph.ops if isinstance(o.spec, GemmSpec))
    assert flops(ub) == pytest.approx(flops(build(SP4, "none")), rel=1e-12)


def test_simulated_ring_copies_run_beside_the_gemm_steps_and_hide_tp_communication(ub):
    """The mechanism: each ring copy runs while the previous step's GEMM runs, so the forward
    all-gathers leave (almost) nothing exposed where the plain all-gather waits in full."""
    from ccoverlap.cost import CostModel
    from ccoverlap.sim.simulator import simulate

    c = cluster(SP4.world_size)
    tl = simulate(ub.graph, CostModel(c))
    ops = ub.graph.ops
    idx = {(o.rank, o.layer, o.microbatch, o.phase, o.name): i for i, o in enumerate(ops)}
    key = (0, 3, 0, "fwd")
    for s in range(1, TP):
        cp, g = idx[(*key, f"qkv_ub_cp{s}")], idx[(*key, f"qkv{s - 1}")]
        overlap = min(tl.end_s[cp], tl.end_s[g]) - max(tl.start_s[cp], tl.start_s[g])
        assert overlap > 0.5 * (tl.end_s[cp] - tl.start_s[cp])

    def exposed_fwd_tp(sg):
        t = simulate(sg.graph, CostModel(c))
        first = [i for i, o in enumerate(sg.graph.ops) if o.rank == 0 and o.phase == "fwd" and o.layer == 3
                 and o.microbatch == 0]
        lo, hi = min(t.start_s[first]), max(t.end_s[first])
        r0 = t.for_rank(0)
        comp = (r0.kind == "compute") & (r0.end_s > lo) & (r0.start_s < hi)
        grid = np.linspace(lo, hi, 20001)
        busy = np.zeros_like(grid, dtype=bool)
        for a, b in zip(r0.start_s[comp], r0.end_s[comp]):
            busy |= (grid >= a) & (grid < b)
        return float(np.mean(~busy) * (hi - lo))
    assert exposed_fwd_tp(ub) < 0.5 * exposed_fwd_tp(build(SP4, "none"))


def test_pieces_on_te_compute_streams_pack_their_waves(ub):
    """TE issues the ring-exchange and pipeline GEMM pieces round-robin on 3 compute streams:
    each ring piece is one of ``tp`` packed pieces, each pipeline piece one of 4; the bulk
    GEMMs (one kernel each) and the LM head are not pieces."""
    assert UB_COMPUTE_STREAMS == 3  # _NUM_MAX_UB_STREAMS in TransformerEngine v1.7's module/base.py
    fwd, bwd = layer(ub), layer(ub, "bwd")
    assert {by_name(fwd, f"{n}{s}").spec.packed_pieces for n in ("qkv", "mlp_fc1") for s in range(TP)} == {TP}
    assert {by_name(fwd, f"{n}{i}").spec.packed_pieces for n in ("proj", "mlp_fc2")
            for i in range(UB_PIPELINE_SPLITS)} == {UB_PIPELINE_SPLITS}
    assert {by_name(bwd, f"{n}_dgrad{s}").spec.packed_pieces for n in ("proj", "mlp_fc2") for s in range(TP)} == {TP}
    assert {o.spec.packed_pieces for o in bwd if o.name.endswith("_wgrad") or o.name in ("qkv_dgrad", "mlp_fc1_dgrad")} == {1}
    assert {o.spec.packed_pieces for o in ub.graph.ops if o.name.startswith("lm_head") and isinstance(o.spec, GemmSpec)} == {1}


def test_packed_pieces_shorten_the_simulated_layer(ub, monkeypatch):
    """The wave packing in simulation: Llama-3-8B's qkv piece is 1024 x 1536 (48 tiles of
    128 x 256 on 132 SMs, a third of a wave); on one compute stream each piece pays its own
    partial wave, on TE's three the 4 pieces share 192 tiles' waves, so the forward is shorter."""
    from ccoverlap.cost import CostModel
    from ccoverlap.sim.simulator import simulate

    def fwd_s(sg):
        tl = simulate(sg.graph, CostModel(cluster(SP4.world_size)))
        sel = [i for i, o in enumerate(sg.graph.ops) if o.rank == 0 and o.phase == "fwd" and o.layer == 3
               and o.microbatch == 0]
        return float(max(tl.end_s[sel]) - min(tl.start_s[sel]))
    packed = fwd_s(ub)
    monkeypatch.setattr(tp_module, "UB_COMPUTE_STREAMS", 1)
    one_stream = build(SP4, "userbuffers")
    assert {o.spec.packed_pieces for o in one_stream.graph.ops if isinstance(o.spec, GemmSpec)} == {1}
    assert packed < 0.97 * fwd_s(one_stream)


@pytest.mark.parametrize("p", [ParallelConfig(tp=1, dp=2)])
def test_nothing_changes_without_tp(p):
    def ops(sg):
        return [(o.name, o.stream, o.spec, o.deps) for o in sg.graph.ops]
    assert ops(build(p, "userbuffers")) == ops(build(p, "none"))


def test_bad_mode_names_the_choices():
    with pytest.raises(ConfigError, match=r"tp_overlap must be one of \[.*'userbuffers'\], got 'ub'"):
        OverlapKnobs(tp_overlap="ub")


def test_without_sequence_parallelism_is_one_clear_error():
    p = ParallelConfig(tp=2, dp=1, sequence_parallel=False)
    with pytest.raises(ConfigError, match=r"tp_overlap 'userbuffers' needs sequence_parallel with tp=2"):
        build(p, "userbuffers")


def test_a_tp_group_across_nodes_is_refused_with_one_message():
    with pytest.raises(ConfigError, match=r"tp_overlap 'userbuffers' needs the TP group inside one node \(tp=4 spans 2"):
        build(SP4, "userbuffers", gpus_per_node=2)


def test_bad_config_in_a_runs_file_exits_2_with_one_line(tmp_path, capsys):
    code, err = validate_error_of_tp_run(tmp_path, capsys, parallel={"tp": 8, "dp": 1, "sequence_parallel": False},
                                         knobs={"tp_overlap": "userbuffers"}, framework="megatron-core")
    assert code == 2
    assert "\n" not in err and "Traceback" not in err and "needs sequence_parallel" in err
