"""Context parallelism, FP8 and HSDP, each against a small case computed by hand."""

from __future__ import annotations

import pytest
from parallel_helpers import ToyCost, cluster

from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.catalog.models import model_from_dict
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, ParallelConfig, build_step, estimate_memory
from ccoverlap.parallel.layout import Layout
from ccoverlap.sim.simulator import simulate
from ccoverlap.specs import AttentionSpec, CollectiveSpec, GemmSpec, P2PSpec

# hidden 1024, 8 heads of 128, 2 KV heads, 2 layers: small enough to write every number down
TINY = model_from_dict({"name": "tiny", "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "kv_heads": 2,
                        "layers": 2, "vocab": 1024, "seq_len": 4096})
S = 4096


def build(p, mb=1, seq=S, knobs=None, framework=None, clus=None):
    b = BatchConfig(global_batch=p.dp * mb, micro_batch=mb, seq_len=seq)
    return build_step(TINY, p, b, clus or cluster(p.world_size), knobs, framework=framework)


def ops(sg, layer=1, phase="fwd", mb=0):
    return [o for o in sg.graph.ops if o.rank == 0 and o.layer == layer and o.phase == phase and o.microbatch == mb]


# ----------------------------------------------------------------------------- CP

def test_cp_ring_splits_attention_and_passes_kv_blocks():
    p = ParallelConfig(cp=2)  # 2 GPUs, one CP group of 2, seq 4096 -> 2048 tokens per rank
    sg = build(p)
    assert sg.world_size == 2
    fwd = ops(sg)
    att = [o for o in fwd if isinstance(o.spec, AttentionSpec)]
    kv = [o for o in fwd if isinstance(o.spec, P2PSpec)]
    # local queries T = 2048; causal FLOPs of the rank = 2 * T * s * heads * hd = 2*2048*4096*8*128,
    # half per ring step
    total = 2 * 2048 * 4096 * 8 * 128
    assert [o.spec.flops for o in att] == [pytest.approx(total / 2)] * 2
    # one K,V block: 2 (K and V) * 2048 tokens * 2 KV heads * 128 * 2 bytes = 2 MiB, sent once (cp - 1)
    assert [o.spec.bytes for o in kv] == [2 * 2048 * 2 * 128 * 2] == [2 * 2**20]
    assert kv[0].stream == "cp_comm"
    # every linear GEMM sees the 2048 local tokens
    qkv = next(o for o in fwd if o.name == "qkv")
    assert (qkv.spec.m, qkv.spec.n, qkv.spec.k) == (2048, (8 + 2 * 2) * 128, 1024)
    # backward: 2 flash-backward steps (2.5x), the next K,V block and the partial dK,dV passed on
    bwd = ops(sg, phase="bwd")
    battn = [o for o in bwd if isinstance(o.spec, AttentionSpec)]
    assert [o.spec.flops for o in battn] == [pytest.approx(2.5 * total / 2)] * 2
    assert sum(o.spec.bytes for o in bwd if isinstance(o.spec, P2PSpec)) == 3 * 2 * 2**20


def test_cp_ring_transfer_overlaps_the_attention_step():
    """Toy costs: attention step 0 and the K,V transfer run side by side; step 1 starts when
    both are done."""
    sg = build(ParallelConfig(cp=2))
    cost = ToyCost(flops_per_s=1e13, mem_bw=1e12, comm_bw=1e10)
    tl = simulate(sg.graph, cost)
    fwd = ops(sg)
    a0, a1 = [o for o in fwd if isinstance(o.spec, AttentionSpec)]
    (kv,) = [o for o in fwd if isinstance(o.spec, P2PSpec)]
    # attention step: 8.6e9 FLOPs / 1e13 = 0.86 ms; block: 2 MiB / 1e10 = 0.21 ms
    assert tl.end_s[a0.op_id] - tl.start_s[a0.op_id] == pytest.approx(2048 * 4096 * 8 * 128 * 2 / 2 / 1e13)
    assert tl.start_s[kv.op_id] < tl.end_s[a0.op_id]  # sent while step 0 computes
    assert tl.start_s[a1.op_id] == pytest.approx(max(tl.end_s[a0.op_id], tl.end_s[kv.op_id]))


def test_cp_allgather_gathers_kv_before_attention():
    sg = build(ParallelConfig(cp=2, cp_impl="allgather"))
    fwd = ops(sg)
    (ag,) = [o for o in fwd if isinstance(o.spec, CollectiveSpec) and o.spec.group.name == "cp"]
    assert ag.spec.collective == "all_gather" and ag.spec.bytes == 2 * 2 * 2**20  # cp x block
    (att,) = [o for o in fwd if isinstance(o.spec, AttentionSpec)]
    assert ag.op_id in att.deps and att.spec.flops == pytest.approx(2 * 2048 * 4096 * 8 * 128)
    bwd = ops(sg, phase="bwd")
    assert [o.spec.collective for o in bwd if isinstance(o.spec, CollectiveSpec)] == ["all_gather", "reduce_scatter"]


def test_cp_layout_gradients_and_memory():
    # tp 2 x cp 2 x dp 2 on one 8-GPU node: CP stride 2, gradients reduced over dp x cp = 4 ranks
    p = ParallelConfig(tp=2, cp=2, dp=2, sequence_parallel=True)
    lay = Layout.build(p, 8)
    assert (lay.cp.size, lay.cp.local_size, lay.dp.size) == (2, 2, 4) and not lay.cp_inter_node
    sg = build(p)
    ars = [o for o in sg.graph.ops if o.name.startswith("grad_ar")]
    assert ars and all(o.spec.group.size == 4 for o in ars)
    # activations scale with the local tokens: cp=2 halves them against cp=1 on the same model
    c1 = estimate_memory(TINY, ParallelConfig(tp=2, dp=4, sequence_parallel=True), BatchConfig(global_batch=4, seq_len=S),
                         cluster(8))
    c2 = estimate_memory(TINY, p, BatchConfig(global_batch=2, seq_len=S), cluster(8))
    assert c2.activation_per_layer_bytes == pytest.approx(c1.activation_per_layer_bytes / 2)
    # a CP group across nodes: tp 8 x cp 2 on 8-GPU nodes
    assert Layout.build(ParallelConfig(tp=8, cp=2), 8).cp_inter_node


def test_cp_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="cp_impl must be one of"):
        ParallelConfig(cp=2, cp_impl="ulysses")
    with pytest.raises(ConfigError, match=r"cp=4: seq_len \(4100\) must be divisible by 2 x cp = 8"):
        build(ParallelConfig(cp=4), seq=4100)
    with pytest.raises(ConfigError, match="cp=2: context parallelism needs flash attention"):
        build(ParallelConfig(cp=2), framework="megatron-lm-2021")
    with pytest.raises(ConfigError, match=r"tp x pp x dp x cp = 1 x 1 x 1 x 2 = 2 must equal the cluster's 4 GPUs"):
        build(ParallelConfig(cp=2), clus=cluster(4))


# ----------------------------------------------------------------------------- FP8

def test_fp8_linears_run_on_fp8_operands_with_cast_kernels():
    h100 = cluster(1)
    sg = build(ParallelConfig(fp8=True), clus=h100)
    fwd, bwd = ops(sg), ops(sg, phase="bwd")
    lin = {o.name: o.spec for o in fwd + bwd if isinstance(o.spec, GemmSpec)}
    assert {lin[n].dtype_bytes for n in ("qkv", "proj", "mlp_fc1", "mlp_fc2", "qkv_dgrad", "mlp_fc2_wgrad")} == {1}
    head = [o for o in sg.graph.ops if o.name == "lm_head"]
    assert head and head[0].spec.dtype_bytes == 2  # output layer stays bf16
    att = next(o for o in fwd if isinstance(o.spec, AttentionSpec))
    assert att.spec.dtype_bytes == 2  # attention stays bf16
    # megatron-core: proj and fc2 cast their bf16 input: (2 + 1 + 1) bytes per element of [T, k]
    casts = {o.name: o.spec.bytes for o in fwd if o.name.endswith("_fp8_cast")}
    assert casts == {"proj_fp8_cast": 4096 * 1024 * 4, "mlp_fc2_fp8_cast": 4096 * 4096 * 4}
    # backward: every linear casts its output gradient [T, n]
    bcasts = {o.name: o.spec.bytes for o in bwd if o.name.endswith("_fp8_cast_bwd")}
    assert bcasts == {"mlp_fc2_fp8_cast_bwd": 4096 * 1024 * 4, "mlp_fc1_fp8_cast_bwd": 4096 * 8192 * 4,  # gate + up
                      "proj_fp8_cast_bwd": 4096 * 1024 * 4, "qkv_fp8_cast_bwd": 4096 * 1536 * 4}


def test_fp8_peak_and_gemm_time():
    from ccoverlap.cost.compute import gemm_time_s

    gpu = CLUSTERS["dgx-h100"].gpu
    assert gpu.flops_for(1) == pytest.approx(1978.9e12) and gpu.flops_for(2) == pytest.approx(989.4e12)
    big = dict(m=8192, n=8192, k=8192)
    t16 = gemm_time_s(GemmSpec(**big, dtype_bytes=2), gpu)
    t8 = gemm_time_s(GemmSpec(**big, dtype_bytes=1), gpu)
    assert 0.45 < t8 / t16 < 0.6  # twice the peak, same tile losses
    with pytest.raises(ConfigError, match="no FP8"):
        CLUSTERS["dgx-a100"].gpu.flops_for(1)


def test_fp8_needs_an_fp8_gpu_and_fp8_allgather_needs_sharding():
    a100 = CLUSTERS["dgx-a100"]
    with pytest.raises(ConfigError, match="fp8=True: GPU A100-80GB-SXM has no FP8"):
        build(ParallelConfig(fp8=True), clus=a100)
    with pytest.raises(ConfigError, match="fp8_param_allgather=True needs fp8=True"):
        ParallelConfig(fp8_param_allgather=True, data_parallel="fsdp")
    with pytest.raises(ConfigError, match="fp8_param_allgather=True needs sharded parameters"):
        ParallelConfig(fp8=True, fp8_param_allgather=True)


def test_fsdp_fp8_param_allgather_halves_gather_bytes():
    base = build(ParallelConfig(dp=4, data_parallel="fsdp", fp8=True))
    fp8 = build(ParallelConfig(dp=4, data_parallel="fsdp", fp8=True, fp8_param_allgather=True))
    ag = lambda sg: sum(o.spec.bytes for o in sg.graph.ops if o.name.startswith("fsdp_ag"))  # noqa: E731
    assert ag(fp8) == pytest.approx(ag(base) / 2)
    # one layer: 1024*(1024+512) qkv + 1024*1024 proj + 3*1024*4096 SwiGLU + 2*1024 norms = 15,206,400
    layer = 1024 * 1536 + 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024  # SwiGLU: gate, up, down
    l1 = [o for o in fp8.graph.ops if o.name.startswith("fsdp_ag") and o.layer == 1 and o.phase == "fwd"]
    assert l1[0].spec.bytes == layer * 1


# ----------------------------------------------------------------------------- HSDP

def test_hsdp_shards_within_group_and_allreduces_across_replicas():
    # dp 8 = 2 replicas x shard groups of 4, on one 8-GPU node
    p = ParallelConfig(dp=8, data_parallel="fsdp", dp_replicate=2)
    lay = Layout.build(p, 8)
    assert (lay.dp.size, lay.dp_rep.size) == (4, 2)
    sg = build(p)
    layer = 1024 * 1536 + 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024  # SwiGLU: gate, up, down
    rs = [o for o in sg.graph.ops if o.name == "fsdp_rs_dp" and o.layer == 1]
    ar = [o for o in sg.graph.ops if o.name == "hsdp_ar" and o.layer == 1]
    assert len(rs) == len(ar) == 1
    assert rs[0].spec.group.size == 4 and rs[0].spec.bytes == 4 * layer  # fp32 grads, nccl size
    # the replicas all-reduce this rank's fp32 shard: layer / 4 elements
    assert ar[0].spec.group.size == 2 and ar[0].spec.bytes == 4 * layer / 4
    assert rs[0].op_id in ar[0].deps and ar[0].stream == rs[0].stream
    # memory: states sharded over 4, not 8
    full = estimate_memory(TINY, ParallelConfig(dp=8, data_parallel="fsdp"), BatchConfig(global_batch=8, seq_len=S),
                           cluster(8))
    hsdp = estimate_memory(TINY, p, BatchConfig(global_batch=8, seq_len=S), cluster(8))
    assert hsdp.optimizer_bytes == pytest.approx(2 * full.optimizer_bytes)


def test_hsdp_config_errors():
    with pytest.raises(ConfigError, match="dp_replicate=2 \\(HSDP\\) needs data_parallel='fsdp'"):
        ParallelConfig(dp=8, dp_replicate=2)
    with pytest.raises(ConfigError, match="dp_replicate=3 must divide dp x cp = 8"):
        ParallelConfig(dp=8, dp_replicate=3, data_parallel="fsdp")
    with pytest.raises(ConfigError, match="dp_replicate=8 leaves shard groups of one rank"):
        ParallelConfig(dp=8, dp_replicate=8, data_parallel="fsdp")


def test_cp_ring_pytorch_fp32_merge_and_gradient_bookkeeping():
    """torchtitan (PyTorch context_parallel, cp_merge_unfused): cp=2, T = 2048 local tokens,
    O = 2048*8*128 = 2 Mi output elements, K = 2048*2*128 = 0.5 Mi elements per K or V."""
    sg = build(ParallelConfig(cp=2), framework="torchtitan")
    o, k = 2048 * 8 * 128, 2048 * 2 * 128
    fwd = {x.name: x for x in ops(sg)}
    # cat(K, V) before the one rotation: read + write 2K bf16 elements = 4*K*2 bytes
    assert fwd["cp_kv_cat0"].spec.bytes == 4 * k * 2
    # step 0: cast the block output to fp32 (2 + 4 bytes); step 1 (last): cast + merge (28) + cast back (6)
    assert fwd["cp_merge0"].spec.bytes == 6 * o
    assert fwd["cp_merge1"].spec.bytes == (6 + 28 + 6) * o
    # the flash steps no longer carry the fused rescale bytes
    assert fwd["attention1"].spec.bytes == fwd["attention0"].spec.bytes
    bwd = ops(sg, phase="bwd")
    acc = {x.name: x.spec.bytes for x in bwd if x.name.startswith("cp_grad_acc")}
    assert acc == {"cp_grad_acc0": 10 * (o + 2 * k) + 16 * k + 4 * (o + 2 * k),
                   "cp_grad_acc1": 10 * (o + 2 * k) + 16 * k + 6 * (o + 2 * k)}
    # K, V move in bf16 (2 MiB), dK, dV in fp32 (4 MiB) twice
    assert sorted(x.spec.bytes for x in bwd if isinstance(x.spec, P2PSpec)) == [2 * 2**20, 4 * 2**20, 4 * 2**20]
    # megatron-core (TransformerEngine) keeps the fused rescale and no extra ops
    mc = build(ParallelConfig(cp=2), framework="megatron-core")
    assert not [x for x in ops(mc) if x.name.startswith(("cp_merge", "cp_kv_cat"))]
