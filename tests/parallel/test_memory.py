"""Memory estimate: Korthikanti et al. 2022 activation formulas, a hand-computed total, fits."""

from __future__ import annotations

import pytest
from parallel_helpers import cluster

from ccoverlap.catalog.models import get_model, model_from_dict
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, estimate_memory, layer_activation_bytes
from ccoverlap.parallel.memory import MEMORY_RESERVE_FRACTION

h, a, s, b = 4096, 32, 2048, 2
# the paper's GPT: 4h GELU MLP, multi-head attention, dropout, 16-bit activations
GPT = model_from_dict({"hidden": h, "ffn_hidden": 4 * h, "heads": a, "layers": 8, "vocab": 51200, "seq_len": s,
                       "gated_mlp": False, "norm": "layernorm", "dropout": True})


def act(**kw):
    return layer_activation_bytes(GPT, ParallelConfig(**kw), b, s, 0, flash_attention=False)


def test_korthikanti_table2_formulas():
    sbh = s * b * h
    t = 4
    assert act() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(tp=t, sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert act(tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert act(tp=t, sequence_parallel=True, recompute="selective") == pytest.approx(sbh * 34 / t)
    assert act(recompute="full") == pytest.approx(2 * sbh)
    assert act(tp=t, sequence_parallel=True, recompute="full") == pytest.approx(2 * sbh / t)
    # FlashAttention keeps no a·s² scores, only the fp32 log-sum-exp
    flash = layer_activation_bytes(GPT, ParallelConfig(), b, s, 0, flash_attention=True)
    assert flash == pytest.approx(sbh * 34 + 4 * s * b * a)


def test_hand_computed_total_llama3_8b_ddp():
    m = get_model("Llama-3-8B")
    n = 8_030_261_248
    T = 4096
    est = estimate_memory(m, ParallelConfig(dp=8), BatchConfig(global_batch=8, micro_batch=1, seq_len=T), cluster(8))
    assert est.weights_bytes == 2 * n and est.gradients_bytes == 4 * n and est.optimizer_bytes == 12 * n
    # per layer (bf16, flash attention, no dropout): norm inputs 2·2Th, norm outputs 2·2Th,
    # Q K V 2T(4096 + 2·1024), out-proj input 2T·4096, lse 4T·32, fc1 out 2T·2·14336, act out 2T·14336
    per_layer = T * (8 * 4096 + 2 * 6144 + 2 * 4096 + 4 * 32 + 2 * 3 * 14336)
    assert est.activation_per_layer_bytes == per_layer
    logits = T * 128256 * (2 + 4) + 2 * 2 * T * 4096  # bf16 logits + fp32 softmax, final norm in/out
    embedding = 2 * T * 4096
    assert est.activations_bytes == 32 * per_layer + logits + embedding
    assert est.comm_buffers_bytes == 2 * 25 * 2**20  # two DDP buckets in flight
    assert est.total_bytes == pytest.approx(18 * n + 32 * per_layer + logits + embedding + 50 * 2**20)
    assert est.total_bytes > est.usable_bytes and not est.fits  # 18 bytes/param of 8B: > 80 GB
    assert est.usable_bytes == pytest.approx(80e9 * (1 - MEMORY_RESERVE_FRACTION))


def test_sharding_brings_it_under_and_too_big_does_not_fit():
    m = get_model("Llama-3-8B")
    bt = BatchConfig(global_batch=8, micro_batch=1, seq_len=4096)
    ddp = estimate_memory(m, ParallelConfig(dp=8), bt, cluster(8))
    zero1 = estimate_memory(m, ParallelConfig(dp=8, distributed_optimizer=True), bt, cluster(8))
    fsdp = estimate_memory(m, ParallelConfig(dp=8, data_parallel="fsdp"), bt, cluster(8))
    n = m.param_count().total
    assert zero1.optimizer_bytes == pytest.approx(12 * n / 8)
    assert fsdp.weights_bytes + fsdp.gradients_bytes + fsdp.optimizer_bytes == pytest.approx(16 * n / 8)
    assert fsdp.total_bytes < zero1.total_bytes < ddp.total_bytes
    assert fsdp.fits and not ddp.fits
    big = estimate_memory(get_model("Llama-3-70B"), ParallelConfig(dp=8, data_parallel="fsdp"), bt, cluster(8))
    assert not big.fits and big.total_bytes > 80e9


def test_pipeline_in_flight_and_recompute():
    m = get_model("Llama-3-8B")
    c = cluster(8)
    bt = BatchConfig(global_batch=8, micro_batch=1, seq_len=4096)
    one = estimate_memory(m, ParallelConfig(tp=2, pp=4), bt, c)
    gp = estimate_memory(m, ParallelConfig(tp=2, pp=4, pp_schedule="gpipe"), bt, c)
    assert one.inflight_microbatches == 4 and gp.inflight_microbatches == 8
    assert gp.activations_bytes > one.activations_bytes
    assert one.worst_rank in (0, 3) and len(one.per_rank_total) == 4
    sp = estimate_memory(m, ParallelConfig(tp=2, pp=4, sequence_parallel=True), bt, c)
    full = estimate_memory(m, ParallelConfig(tp=2, pp=4, sequence_parallel=True, recompute="full"), bt, c)
    assert full.activations_bytes < sp.activations_bytes < one.activations_bytes
    dual = estimate_memory(m, ParallelConfig(tp=2, pp=4, pp_schedule="dualpipe"), bt, c)
    assert dual.inflight_microbatches == 5 and dual.weights_bytes == pytest.approx(2 * one.weights_bytes, rel=0.1)


def test_fsdp_buffers_follow_the_limit():
    m = get_model("Llama-3-8B")
    bt = BatchConfig(global_batch=8, micro_batch=1, seq_len=4096)
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    e1 = estimate_memory(m, p, bt, cluster(8), OverlapKnobs(fsdp_limit_all_gathers=1))
    e4 = estimate_memory(m, p, bt, cluster(8), OverlapKnobs(fsdp_limit_all_gathers=4))
    keep = estimate_memory(m, p, bt, cluster(8), OverlapKnobs(fsdp_reshard_after_forward=False))
    assert e1.comm_buffers_bytes < e4.comm_buffers_bytes < keep.comm_buffers_bytes
    assert keep.comm_buffers_bytes >= 2 * m.param_count().total  # every unit stays gathered (bf16)


def test_step_graph_carries_the_estimate():
    from ccoverlap.parallel import build_step

    m = get_model("Llama-3-8B")
    p = ParallelConfig(tp=2, pp=2, dp=2)
    bt = BatchConfig(global_batch=4, micro_batch=1, seq_len=2048)
    sg = build_step(m, p, bt, cluster(8))
    assert sg.memory == estimate_memory(m, p, bt, cluster(8))
    d = sg.memory.to_dict()
    assert d["total_bytes"] == sg.memory.total_bytes and isinstance(d["per_rank_total"], list)


def test_per_op_selective_recompute_keeps_every_other_matmul():
    """torchtitan's per-op selective AC (profile ``selective_recompute: op``): a Llama layer
    keeps its input, the 1st, 3rd, 5th and 7th matmul outputs (Q, V, gate, down projection),
    the attention output and its fp32 log-sum-exp; with SP also the two reduce-scatter outputs
    and the block input as a [T/t, h] shard. Megatron-LM's selective (attention core) keeps
    more; with recompute 'none' the profiles agree."""
    m = get_model("Llama-3-8B")
    T, hid, q, kv, f, heads = 4096, m.hidden, m.q_dim, m.kv_dim, m.ffn_hidden, m.heads
    sel = ParallelConfig(recompute="selective")
    op = layer_activation_bytes(m, sel, 1, T, 0, framework="torchtitan")
    assert op == 2 * T * (hid + q + kv + f + hid) + 2 * T * q + 4 * T * heads
    assert op < layer_activation_bytes(m, sel, 1, T, 0, framework="megatron-core")
    t = 4
    sp = ParallelConfig(tp=t, sequence_parallel=True, recompute="selective")
    want = 2 * T / t * hid + 2 * T * (q + kv + f) / t + 2 * T * hid + 2 * T * q / t + 4 * T * heads / t
    assert layer_activation_bytes(m, sp, 1, T, 0, framework="torchtitan") == pytest.approx(want + 2 * 2 * T / t * hid)
    none = ParallelConfig()
    assert (layer_activation_bytes(m, none, 1, T, 0, framework="torchtitan")
            == layer_activation_bytes(m, none, 1, T, 0, framework="megatron-core"))


def test_loss_buffers_and_deferred_pipeline_gradients_follow_the_profile():
    """torchtitan's loss (F.cross_entropy on fp32 logits) peaks at 12 bytes a logit where
    Megatron-LM's in-place vocab-parallel loss holds 6; with pipeline parallelism
    torchtitan's FSDP accumulates every unit's gradient unsharded in fp32 over the
    micro-batches (``fsdp_pp_deferred_sync``)."""
    m = get_model("Llama-3-8B")
    T = 4096
    bt = BatchConfig(global_batch=8, micro_batch=1, seq_len=T)
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    tt = estimate_memory(m, p, bt, cluster(8), framework="torchtitan")
    mc = estimate_memory(m, p, bt, cluster(8), framework="megatron-core")
    assert tt.activations_bytes - mc.activations_bytes == pytest.approx(T * m.vocab * (12 - 6))
    assert tt.comm_buffers_bytes == mc.comm_buffers_bytes

    pp = ParallelConfig(pp=4, dp=2, data_parallel="fsdp")
    bt = BatchConfig(global_batch=8, micro_batch=1, seq_len=T)
    tt = estimate_memory(m, pp, bt, cluster(8), framework="torchtitan")
    mc = estimate_memory(m, pp, bt, cluster(8), framework="megatron-core")
    stage = (tt.weights_bytes * 2) / 4  # fp32 shard over dp = 2 -> the stage's parameters
    largest_unit = get_model("Llama-3-8B").vocab * m.hidden  # the embedding (or LM head) unit
    assert tt.comm_buffers_bytes - mc.comm_buffers_bytes == pytest.approx(4 * stage - 4 * largest_unit, rel=1e-6)


def test_framework_profile_rejects_a_bad_loss_entry():
    from ccoverlap.catalog.frameworks import profile_from_mapping
    from ccoverlap.errors import ConfigError

    for bad in (0, -3, "twelve", True, float("inf")):
        with pytest.raises(ConfigError, match="loss_bytes_per_logit must be a positive number of bytes"):
            profile_from_mapping({"name": "x", "entries": {"loss_bytes_per_logit": {"value": bad, "source": "s"}}}, "x")


def test_gradient_buffers_follow_the_profiles_reduce_dtype():
    """Replicated weights keep their main gradients in the profile's ``ddp_reduce_dtype``
    (Megatron-LM 2021 in fp16: the parameter dtype; Megatron-Core with bf16: fp32); a gathered
    FSDP unit's unsharded gradient is in ``fsdp_reduce_dtype`` (fms-fsdp: bf16)."""
    m = get_model("Llama-3-8B")
    bt = BatchConfig(global_batch=8, micro_batch=1, seq_len=2048)
    ddp = ParallelConfig(dp=8)
    old = estimate_memory(m, ddp, bt, cluster(8), framework="megatron-lm-2021")
    new = estimate_memory(m, ddp, bt, cluster(8), framework="megatron-core")
    assert new.gradients_bytes == pytest.approx(2 * old.gradients_bytes)  # 4 bytes against 2
    fsdp = ParallelConfig(dp=8, data_parallel="fsdp")
    fms = estimate_memory(m, fsdp, bt, cluster(8), framework="fms-fsdp")
    mc = estimate_memory(m, fsdp, bt, cluster(8), framework="megatron-core")
    largest_unit = m.vocab * m.hidden
    # the largest unit: the LM head (and the final norm beside it)
    assert mc.comm_buffers_bytes - fms.comm_buffers_bytes == pytest.approx(2 * largest_unit, rel=1e-4)


def test_zero2_keeps_only_this_ranks_gradient_shard():
    """``shard_gradients`` (ZeRO-2) divides the gradients by dp on top of the distributed
    optimizer's sharded optimizer state; it needs DDP with ``distributed_optimizer``."""
    from ccoverlap.errors import ConfigError

    m = get_model("Llama-3-8B")
    bt = BatchConfig(global_batch=16, micro_batch=1, seq_len=2048)
    z1 = estimate_memory(m, ParallelConfig(dp=16, distributed_optimizer=True), bt, cluster(16))
    z2 = estimate_memory(m, ParallelConfig(dp=16, distributed_optimizer=True, shard_gradients=True), bt, cluster(16))
    assert z2.gradients_bytes == pytest.approx(z1.gradients_bytes / 16)
    assert z2.optimizer_bytes == z1.optimizer_bytes and z2.weights_bytes == z1.weights_bytes
    for bad in ({"dp": 16, "shard_gradients": True},
                {"dp": 16, "data_parallel": "fsdp", "shard_gradients": True}):
        with pytest.raises(ConfigError, match="shard_gradients=True .ZeRO-2. needs data_parallel='ddp' with "
                                              "distributed_optimizer=True"):
            ParallelConfig(**bad)


def test_loss_buffers_count_the_last_stages_own_micro_batches():
    """The loss's buffers on the last pipeline stage are held for that stage's micro-batches in
    flight (1F1B: one; GPipe: all), not for every chunk the rank holds: two models that differ
    only in their vocabulary differ on the last rank by the LM head's states (2 + 4 + 12 bytes
    a parameter) and the logits' 6 bytes per held micro-batch."""
    from ccoverlap.parallel.pp import in_flight, make_schedule

    base = {"hidden": 1024, "ffn_hidden": 4096, "heads": 8, "layers": 8, "seq_len": 1024, "gated_mlp": False,
            "norm": "layernorm", "tied_embeddings": False}
    small, big = (model_from_dict({**base, "name": f"v{v}", "vocab": v}) for v in (32000, 64000))
    T, M = 1024, 8
    bt = BatchConfig(global_batch=M, micro_batch=1, seq_len=T)
    il = make_schedule("interleaved", 4, M, 2, 0)
    assert in_flight(il, 3, (1,)) < in_flight(il, 3)  # the last chunk holds fewer than the rank
    for sched, held in (("1f1b", 1), ("gpipe", M), ("interleaved", in_flight(il, 3, (1,)))):
        p = ParallelConfig(pp=4, dp=1, pp_schedule=sched, virtual_stages=2 if sched == "interleaved" else 1)
        a, b = (estimate_memory(m, p, bt, cluster(4)).per_rank_total[3] for m in (small, big))
        dv = 64000 - 32000
        assert b - a == pytest.approx(dv * 1024 * (2 + 4 + 12) + held * T * dv * (2 + 4)), sched
