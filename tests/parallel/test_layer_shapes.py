"""Graph shapes: exact GEMM shapes, op counts per layer, collective sizes, FLOP totals."""

from __future__ import annotations

from collections import Counter

import pytest
from parallel_helpers import cluster

from ccoverlap.catalog.models import get_model, model_from_dict
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step
from ccoverlap.specs import AttentionSpec, GemmSpec

L8 = get_model("Llama-3-8B")
S = 4096


def layer_ops(sg, layer=3, mb=0, phase="fwd", rank=0):
    return [o for o in sg.graph.ops if o.rank == rank and o.layer == layer and o.microbatch == mb
            and o.phase == phase]


def gemm(ops, name):
    (o,) = [o for o in ops if o.name == name]
    assert isinstance(o.spec, GemmSpec)
    return (o.spec.m, o.spec.n, o.spec.k, o.spec.batch)


def build(p, gb=None, mb=1, model=L8, knobs=None, seq=S):
    return build_step(model, p, BatchConfig(global_batch=gb or p.dp * mb, micro_batch=mb, seq_len=seq),
                      cluster(p.world_size), knobs)


def test_llama3_8b_tp2_gemm_shapes():
    sg = build(ParallelConfig(tp=2, dp=1))
    T, h, hd = S, 4096, 128
    fwd = layer_ops(sg)
    assert gemm(fwd, "qkv") == (T, (32 + 2 * 8) * hd // 2, h, 1)  # n = (heads + 2 kv) hd / tp = 3072
    assert gemm(fwd, "proj") == (T, h, 32 * hd // 2, 1)
    assert gemm(fwd, "mlp_fc1") == (T, 2 * 14336 // 2, h, 1)  # gate + up fused
    assert gemm(fwd, "mlp_fc2") == (T, h, 14336 // 2, 1)
    bwd = layer_ops(sg, phase="bwd")
    assert gemm(bwd, "mlp_fc2_dgrad") == (T, 7168, h, 1)
    assert gemm(bwd, "mlp_fc2_wgrad") == (7168, h, T, 1)
    assert gemm(bwd, "qkv_dgrad") == (T, h, 3072, 1)
    assert gemm(bwd, "qkv_wgrad") == (h, 3072, T, 1)
    (att,) = [o for o in fwd if o.name == "attention"]
    assert isinstance(att.spec, AttentionSpec)
    assert att.spec.flops == pytest.approx(4 * S * S * 16 * hd / 2)  # causal, 16 local heads
    (attb,) = [o for o in bwd if o.name == "attention_bwd"]
    assert attb.spec.flops == pytest.approx(2.5 * att.spec.flops)


def test_tp_collectives_without_and_with_sequence_parallelism():
    nbytes = S * 4096 * 2
    sg = build(ParallelConfig(tp=2, dp=1))
    fwd, bwd = layer_ops(sg), layer_ops(sg, phase="bwd")
    assert [(o.spec.collective, o.spec.bytes) for o in fwd if o.kind == "comm"] == [("all_reduce", nbytes)] * 2
    assert [o.spec.collective for o in bwd if o.kind == "comm"] == ["all_reduce"] * 2
    sg = build(ParallelConfig(tp=2, dp=1, sequence_parallel=True))
    fwd, bwd = layer_ops(sg), layer_ops(sg, phase="bwd")
    assert [o.spec.collective for o in fwd if o.kind == "comm"] == ["all_gather", "reduce_scatter"] * 2
    assert all(o.spec.bytes == nbytes and o.spec.group.name == "tp" and o.stream == "tp_comm"
               for o in fwd if o.kind == "comm")
    # backward: AG of the output grad (row), AG of the saved input + RS of dX (column), per sublayer
    assert Counter(o.spec.collective for o in bwd if o.kind == "comm") == {"all_gather": 4, "reduce_scatter": 2}
    # the column-parallel wgrad runs after the RS was issued (overlapped with it, as Megatron-LM)
    names = [o.name for o in bwd if o.stream == "compute"]
    assert names.index("qkv_wgrad") == names.index("qkv_dgrad") + 1
    (rs,) = [o for o in bwd if o.name == "dgrad_rs" and o.op_id > next(x.op_id for x in bwd if x.name == "qkv_dgrad")]
    (wg,) = [o for o in bwd if o.name == "qkv_wgrad"]
    assert rs.op_id < wg.op_id and rs.op_id not in wg.deps


@pytest.mark.parametrize("tp,sp,fwd_n,bwd_n", [(1, False, 8, 12), (2, False, 10, 14), (2, True, 12, 18)])
def test_ops_per_layer_per_microbatch_are_lean(tp, sp, fwd_n, bwd_n):
    sg = build(ParallelConfig(tp=tp, dp=1, sequence_parallel=sp))
    assert len(layer_ops(sg)) == fwd_n
    assert len(layer_ops(sg, phase="bwd")) == bwd_n
    assert 8 <= fwd_n <= 20 and 10 <= bwd_n <= 20


def test_recompute_adds_forward_work_to_backward():
    base = len(layer_ops(build(ParallelConfig(tp=2, dp=1, sequence_parallel=True)), phase="bwd"))
    sel = layer_ops(build(ParallelConfig(tp=2, dp=1, sequence_parallel=True, recompute="selective")), phase="bwd")
    assert len(sel) == base + 1 and sum(o.name == "attention_recompute" for o in sel) == 1
    full = layer_ops(build(ParallelConfig(tp=2, dp=1, sequence_parallel=True, recompute="full")), phase="bwd")
    assert len(full) == base + 12  # the whole forward, TP collectives included
    rec = [o for o in full if o.name.startswith("recompute_")]
    assert rec and rec[0].op_id < min(o.op_id for o in full if not o.name.startswith("recompute_"))


def test_chunked_tp_decomposes_gemm_and_collective():
    k = OverlapKnobs(tp_overlap="chunked", tp_chunks=4)
    fwd = layer_ops(build(ParallelConfig(tp=2, dp=1, sequence_parallel=True), knobs=k))
    ags = [o for o in fwd if o.name.startswith("qkv_ag")]
    qkv = [o for o in fwd if o.name.startswith("qkv") and o.kind == "compute"]
    assert len(ags) == 4 and len(qkv) == 4
    assert sum(o.spec.bytes for o in ags) == S * 4096 * 2
    assert all(o.spec.m == S // 4 for o in qkv)
    # chunk i waits only for all-gather piece i, so piece i+1 moves while chunk i computes
    assert all(qkv[i].deps == (ags[i].op_id,) for i in range(4))


def test_global_gemm_flops_equal_six_n_d():
    """Every GEMM of the step, over all simulated ranks times the TP x DP ranks each stands for,
    adds up to 6 x (matmul parameters) x tokens (PaLM's 6N, norms aside)."""
    m = model_from_dict({"hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "layers": 8,
                         "vocab": 32000, "seq_len": 2048})
    p = ParallelConfig(tp=2, pp=2, dp=2, sequence_parallel=True)
    b = BatchConfig(global_batch=8, micro_batch=1, seq_len=2048)
    sg = build_step(m, p, b, cluster(8))
    gemm_flops = sum(o.spec.flops for o in sg.graph.ops if isinstance(o.spec, GemmSpec)) * p.tp * p.dp
    norms = 2 * 1024 * 8
    assert gemm_flops == pytest.approx(6 * (m.matmul_params_per_token() - norms) * b.tokens, rel=1e-9)
    assert sg.model_flops_per_step == pytest.approx(m.flops_per_token(2048) * b.tokens)
    assert sg.tokens_per_step == 8 * 2048 and sg.world_size == 8


def test_moe_expert_gemms_and_all_to_all():
    olmoe = get_model("OLMoE-1B-7B")  # 64 experts, top-8, hidden 2048, expert ffn 1024
    p = ParallelConfig(dp=8, ep=8)
    sg = build(p, mb=2, model=olmoe)
    fwd = layer_ops(sg)
    T = 2 * S
    assert gemm(fwd, "experts_fc1") == (T * 8 * 8 // 64, 2 * 1024, 2048, 64 // 8)
    assert gemm(fwd, "experts_fc2") == (T * 8 * 8 // 64, 2048, 1024, 8)
    assert gemm(fwd, "router") == (T, 64, 2048, 1)
    a2a = [o for o in fwd if o.kind == "comm"]
    assert [o.name for o in a2a] == ["dispatch", "combine"]
    assert all(o.spec.collective == "all_to_all" and o.spec.bytes == T * 8 * 2048 * 2 and o.spec.group.size == 8
               for o in a2a)
    # blocking: the expert GEMM waits for the dispatch
    (disp,) = [o for o in fwd if o.name == "dispatch"]
    assert disp.op_id in next(o for o in fwd if o.name == "experts_fc1").deps


def test_moe_tp_gathers_tokens_and_shared_experts():
    ds = get_model("DeepSeek-MoE-16B")
    p = ParallelConfig(tp=2, dp=4, ep=4, sequence_parallel=True)
    sg = build(p, model=ds)
    assert not any(o.name == "router" for o in layer_ops(sg, layer=0))  # first layer is dense
    fwd = layer_ops(sg, layer=2)
    names = [o.name for o in fwd]
    assert {"experts_ag", "experts_rs", "shared_fc1", "shared_fc2", "dispatch", "combine"} <= set(names)
    (ag,) = [o for o in fwd if o.name == "experts_ag"]
    assert ag.spec.bytes == S * 6 * 2048 * 2  # T k h d: all TP peers' received tokens
    assert gemm(fwd, "experts_fc1")[1] == 2 * 1408 // 2 and gemm(fwd, "experts_fc1")[3] == 64 // 4


def test_embedding_and_head_ops_on_first_and_last_stage():
    sg = build(ParallelConfig(tp=2, pp=2, dp=1))
    r0 = {o.name for o in sg.graph.ops if o.rank == 0}
    r1 = {o.name for o in sg.graph.ops if o.rank == 1}
    assert "embedding" in r0 and "embedding" not in r1
    assert {"lm_head", "cross_entropy", "lm_head_wgrad"} <= r1 and "lm_head" not in r0
    (lm,) = {o.spec for o in sg.graph.ops if o.name == "lm_head"}
    assert (lm.m, lm.n, lm.k) == (S, 128256 // 2, 4096)
    assert {"optimizer_step", "grad_norm"} <= r0 & r1
