"""Data-parallel gradient sync as each framework profile runs it (ddp_buckets, per-bucket
kernels, FSDP1 flat parameters, reduce dtype): graph structure and hand-computed bytes."""

from __future__ import annotations

import math

import pytest
from parallel_helpers import cluster

from ccoverlap.catalog.frameworks import get_framework, profile_from_mapping
from ccoverlap.catalog.models import model_from_dict
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step
from ccoverlap.parallel.units import unit_tensors

TINY = model_from_dict({"name": "tiny", "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "kv_heads": 8,
                        "layers": 4, "vocab": 8192, "seq_len": 1024})
MiB = 1 << 20


def build(p, framework, knobs=None, gb=None):
    b = BatchConfig(global_batch=gb or p.dp * p.pp, micro_batch=1, seq_len=1024)
    return build_step(TINY, p, b, cluster(p.world_size), knobs or OverlapKnobs(), framework=framework)


def local_params(p, units=None):
    from ccoverlap.parallel.units import stage_units

    units = units if units is not None else stage_units(TINY, p.pp, 0)
    return sum(t.numel for u in units for t in unit_tensors(TINY, p, u))


# ----------------------------------------------------------------------------- per-bucket kernels

def test_megatron_core_scales_and_nan_checks_every_bucket_on_the_compute_stream():
    p = ParallelConfig(dp=8, distributed_optimizer=True)
    sg = build(p, "megatron-core")
    ops = sg.graph.ops
    rs = [o for o in ops if o.name == "grad_rs_dp"]
    prep = [o for o in ops if o.name == "grad_bucket_prep"]
    assert len(prep) == len(rs) > 1
    assert {o.stream for o in prep} == {"compute"}
    # every reduce-scatter waits for its bucket's kernels, which read 4 B (norm) and read+write 8 B
    # (x 1/dp) per fp32 gradient element: 12 B per element of the bucket (reduce-scatter input = 4 B)
    for r in rs:
        pre = ops[r.deps[0]]
        assert pre.name == "grad_bucket_prep"
        assert pre.spec.bytes == pytest.approx(3 * r.spec.bytes)
        assert pre.spec.kernels == 2
    assert sum(o.spec.bytes for o in prep) == pytest.approx(12 * local_params(p))


def test_megatron_2021_reduces_param_dtype_grads_through_a_flat_copy():
    """Megatron-LM 2021 (defaults at 50a4b5fa02): fp16/bf16 gradients flattened (read + write
    2 B), divided by dp (2 B read + write), all-reduced in 2 B, copied back (2 B read + write)."""
    p = ParallelConfig(dp=8)
    n = local_params(p)
    ops = build(p, "megatron-lm-2021").graph.ops
    prep = [o for o in ops if o.name == "grad_bucket_prep"]
    ars = [o for o in ops if o.name == "grad_ar_dp"]
    back = [o for o in ops if o.name == "grad_bucket_copy_back"]
    assert len(prep) == len(ars) == len(back) == 1  # one buffer (ddp_buckets: single)
    assert prep[0].spec.bytes == 8 * n and prep[0].spec.kernels == 2
    assert ars[0].spec.bytes == 2 * n
    assert back[0].spec.bytes == 4 * n and back[0].deps == (ars[0].op_id,) and back[0].stream == "compute"
    # the optimizer waits for the copy back
    opt = [o for o in ops if o.name in ("grad_norm", "optimizer_step")][0]
    assert back[0].op_id in opt.deps
    assert not [o for o in build(p, "torchtitan").graph.ops if o.name.startswith("grad_bucket")]


# ----------------------------------------------------------------------------- bucketing rules

def _buckets(sg, rank):
    return [o for o in sg.graph.ops if o.rank == rank and o.name.startswith(("grad_ar", "grad_rs"))]


def test_megatron_buckets_only_on_the_first_pipeline_stage():
    p = ParallelConfig(dp=2, pp=2)
    knobs = OverlapKnobs(bucket_cap_mb=20)
    mc = build(p, "megatron-core", knobs, gb=8)
    pt = build(p, "torchtitan", knobs, gb=8)
    # rank 0: buckets of >= 20 MiB (no 1 MiB first bucket); rank 1: one bucket
    r0 = _buckets(mc, 0)
    assert len(r0) > 1 and all(o.spec.bytes >= 20 * MiB for o in r0[:-1])
    assert len(_buckets(mc, 1)) == 1
    assert len(_buckets(pt, 1)) > 1  # PyTorch DDP buckets every stage
    # same bytes either way
    for r in (0, 1):
        assert sum(o.spec.bytes for o in _buckets(mc, r)) == pytest.approx(sum(o.spec.bytes for o in _buckets(pt, r)))
    # the single bucket waits for the stage's last gradient: issued after the stage's last backward op
    last = _buckets(mc, 1)[0]
    bwd = [o.op_id for o in mc.graph.ops if o.rank == 1 and o.phase == "bwd" and o.stream == "compute"]
    assert last.op_id > max(bwd)


def test_pytorch_rule_keeps_the_1_mib_first_bucket_and_single_rule_has_one_bucket():
    p = ParallelConfig(dp=8)
    knobs = OverlapKnobs(bucket_cap_mb=20)
    pt = _buckets(build(p, "torchtitan", knobs), 0)
    # the first bucket closes after its first tensor (the LM head, 8192 x 1024 fp32 = 32 MiB >= 1 MiB)
    assert pt[0].spec.bytes == 4 * 8192 * 1024
    assert len(_buckets(build(p, "megatron-lm-2021", knobs), 0)) == 1


# ----------------------------------------------------------------------------- FSDP1 and reduce dtype

def _named(sg, name):
    return [o for o in sg.graph.ops if o.name == name]


def test_fsdp1_flat_parameter_kernels_and_bf16_reduce_hand_computed():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    sg = build(p, "fms-fsdp")
    layer = [t.numel for t in unit_tensors(TINY, p, "layer0")]
    n = sum(layer)  # unsharded elements of one layer unit
    shard = math.ceil(n / 8)
    rs = [o for o in _named(sg, "fsdp_rs_dp") if o.layer == 0]
    assert len(rs) == 1 and rs[0].spec.bytes == 2 * n  # bf16 reduce-scatter (bfSixteen reduce_dtype)
    cat = [o for o in _named(sg, "fsdp_flat_grad_cat") if o.layer == 0]
    assert cat[0].stream == "compute" and cat[0].spec.bytes == 2 * 2 * n  # read + write bf16 grads
    pre = [o for o in _named(sg, "fsdp_grad_predivide") if o.layer == 0]
    assert pre[0].stream == "fsdp_rs" and pre[0].spec.bytes == 2 * 2 * n  # in-place bf16 divide, no cast
    post = [o for o in _named(sg, "fsdp_grad_postdivide") if o.layer == 0]
    assert post[0].spec.bytes == shard * (2 * 2 + 2 + 4)  # divide the bf16 shard, cast it to fp32
    cast = [o for o in _named(sg, "fsdp_shard_cast") if o.layer == 0]
    assert len(cast) == 2 and cast[0].spec.bytes == shard * (4 + 2)  # fwd + bwd gathers: fp32 -> bf16 shard
    # order: grad cat -> predivide -> reduce-scatter -> postdivide
    ops = sg.graph.ops
    assert ops[rs[0].deps[0]].name == "fsdp_grad_predivide"
    assert ops[pre[0].deps[0]].name == "fsdp_flat_grad_cat"
    assert ops[post[0].deps[0]].name == "fsdp_rs_dp"
    assert not _named(sg, "fsdp_copy_out") and not _named(sg, "fsdp_rs_copy_in")


def test_fsdp2_keeps_fp32_reduce_and_copies():
    p = ParallelConfig(dp=8, data_parallel="fsdp")
    sg = build(p, "torchtitan")
    n = sum(t.numel for t in unit_tensors(TINY, p, "layer0"))
    rs = [o for o in _named(sg, "fsdp_rs_dp") if o.layer == 0]
    assert rs[0].spec.bytes == 4 * n
    copy_in = [o for o in _named(sg, "fsdp_rs_copy_in") if o.layer == 0]
    assert copy_in[0].spec.bytes == (2 + 4) * n
    assert not _named(sg, "fsdp_flat_grad_cat") and not _named(sg, "fsdp_shard_cast")


def test_hsdp_all_reduce_uses_the_reduce_dtype():
    p = ParallelConfig(dp=8, data_parallel="fsdp", dp_replicate=2)
    n = sum(t.numel for t in unit_tensors(TINY, p, "layer0"))
    shard = math.ceil(n / 4)
    for fw, nbytes in (("fms-fsdp", 2), ("torchtitan", 4)):
        ar = [o for o in _named(build(p, fw), "hsdp_ar") if o.layer == 0]
        assert ar[0].spec.bytes == nbytes * shard


def test_bad_new_entries_name_the_entry():
    with pytest.raises(ConfigError, match="fsdp_reduce_dtype must be one of"):
        profile_from_mapping({"name": "x", "entries": {"fsdp_reduce_dtype": {"value": "fp16", "source": "s"}}}, "f")
    with pytest.raises(ConfigError, match="ddp_buckets must be one of"):
        profile_from_mapping({"name": "x", "entries": {"ddp_buckets": {"value": "nccl", "source": "s"}}}, "f")
    with pytest.raises(ConfigError, match="ddp_reduce_dtype must be one of"):
        profile_from_mapping({"name": "x", "entries": {"ddp_reduce_dtype": {"value": "fp16", "source": "s"}}}, "f")
    with pytest.raises(ConfigError, match="fsdp_flat_param must be true or false"):
        profile_from_mapping({"name": "x", "entries": {"fsdp_flat_param": {"value": "yes", "source": "s"}}}, "f")
    assert get_framework("fms-fsdp").fsdp_reduce_bytes == 2


# ----------------------------------------------------------------------------- FSDP under torch pipelining

def test_pipelining_defers_fsdp_reduce_scatter_to_the_stage_end_and_gathers_once():
    p = ParallelConfig(dp=2, pp=2, data_parallel="fsdp")
    knobs = OverlapKnobs(fsdp_reshard_after_forward=False)
    sg = build(p, "torchtitan", knobs, gb=8)  # 4 micro-batches per step
    assert sg.microbatches == 4
    ops = sg.graph.ops
    for rank in (0, 1):
        mine = [o for o in ops if o.rank == rank]
        ags = [o for o in mine if o.name == "fsdp_ag_dp"]
        rss = [o for o in mine if o.name == "fsdp_rs_dp"]
        units = {o.layer for o in ags}
        assert len(ags) == len(units) == len(rss)  # one gather and one reduce-scatter per unit and step
        last_bwd = max(o.op_id for o in mine if o.phase == "bwd" and o.stream == "compute")
        assert min(o.op_id for o in rss) > last_bwd  # all after the stage's last backward
        # every copy-in (FSDP2) waits for the end of the stage's last backward, not its own unit
        copy_in = [o for o in mine if o.name == "fsdp_rs_copy_in"]
        assert len({o.deps for o in copy_in}) == 1
        # unsharded gradients accumulated in fp32 after every micro-batch's backward
        acc = [o for o in mine if o.name == "fsdp_grad_accumulate" and o.layer == rss[0].layer]
        n = rss[0].spec.bytes / 4  # fp32 reduce-scatter input: elements of that unit
        assert [o.spec.bytes for o in acc] == [6 * n] + [10 * n] * 3
        assert all(o.stream == "compute" for o in acc)
    # without the deferral (megatron-core's FSDP hook): a reduce-scatter per unit and micro-batch
    mc = build(p, "megatron-core", knobs, gb=8)
    rs0 = [o for o in mc.graph.ops if o.rank == 0 and o.name == "fsdp_rs_dp"]
    ag0 = [o for o in mc.graph.ops if o.rank == 0 and o.name == "fsdp_ag_dp"]
    assert len(rs0) == 4 * len({o.layer for o in rs0}) and len(ag0) == len(rs0)


def test_pipelining_with_reshard_after_forward_still_gathers_per_execution():
    p = ParallelConfig(dp=2, pp=2, data_parallel="fsdp")
    sg = build(p, "torchtitan", OverlapKnobs(fsdp_reshard_after_forward=True), gb=8)
    ags = [o for o in sg.graph.ops if o.rank == 0 and o.name == "fsdp_ag_dp"]
    rss = [o for o in sg.graph.ops if o.rank == 0 and o.name == "fsdp_rs_dp"]
    assert len(ags) == 2 * 4 * len(rss)  # forward and backward of each of 4 micro-batches
