"""Framework profiles: loading, validation, and what each profile makes a layer compute."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

import pytest
from parallel_helpers import cluster

from ccoverlap.catalog.frameworks import builtin_frameworks, get_framework, profile_from_mapping
from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.catalog.models import model_from_dict
from ccoverlap.commands.options import add_workload_arguments, workload_from_args
from ccoverlap.cost.compute import attention_fraction, memory_time_s
from ccoverlap.cost.params import CostParams
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, ParallelConfig, build_step
from ccoverlap.predict.workload import workload_from_mapping
from ccoverlap.specs import AttentionSpec, GemmSpec, MemorySpec

# a GPT-2 style model: LayerNorm, biases, GELU, 16 heads of 64, seq 1024
GPT = model_from_dict({"name": "gpt", "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 16,
                       "layers": 2, "vocab": 2048, "seq_len": 1024, "gated_mlp": False, "norm": "layernorm",
                       "bias": True, "position": "learned", "tied_embeddings": True})
S = 1024


def layer(framework, p=None, phase="fwd", mb=2):
    p = p or ParallelConfig()
    sg = build_step(GPT, p, BatchConfig(global_batch=p.dp * mb, micro_batch=mb, seq_len=S), cluster(p.world_size),
                    framework=framework)
    return [o for o in sg.graph.ops if o.rank == 0 and o.layer == 1 and o.microbatch == 0 and o.phase == phase]


def test_builtin_profiles_exist_and_every_entry_has_a_source():
    names = builtin_frameworks()
    assert {"megatron-lm-2021", "megatron-core", "torchtitan", "deepspeed"} <= set(names)
    for n in names:
        fw = get_framework(n)
        assert fw.name == n
        assert set(fw.sources) == set(fw.to_dict()) - {"name", "description"}
        assert all(len(s) > 10 for s in fw.sources.values())
    assert get_framework(None).name == "megatron-core"


def test_bad_profiles_name_the_entry(tmp_path):
    with pytest.raises(ConfigError, match="unknown profile 'nope'"):
        get_framework("nope")
    with pytest.raises(ConfigError, match="entry 'attention' has no 'source'"):
        profile_from_mapping({"name": "x", "entries": {"attention": {"value": "flash"}}}, "f")
    with pytest.raises(ConfigError, match="unknown entry 'atention'"):
        profile_from_mapping({"name": "x", "entries": {"atention": {"value": "flash", "source": "typo"}}}, "f")
    with pytest.raises(ConfigError, match="attention must be one of"):
        profile_from_mapping({"name": "x", "entries": {"attention": {"value": "sparse", "source": "s"}}}, "f")
    f = tmp_path / "mine.yaml"
    f.write_text("name: mine\nentries:\n  eager: {value: false, source: 'CUDA graphs'}\n")
    fw = get_framework(str(f))
    assert fw.name == "mine" and fw.eager is False and fw.attention == "flash"


def test_a_variant_profile_takes_every_entry_it_does_not_list_from_its_base():
    base = get_framework("torchtitan")
    fw = profile_from_mapping({"name": "v", "base": "torchtitan",
                               "entries": {"norm_fused": {"value": True, "source": "a fused norm"}}}, "f")
    assert fw.norm_fused is True and fw.sources["norm_fused"] == "a fused norm"
    for key in set(base.sources) - {"norm_fused"}:
        assert getattr(fw, key) == getattr(base, key) and fw.sources[key] == base.sources[key], key
    # the shipped variants list only what they change
    for name, changed in (("torchtitan-fused-rmsnorm", "norm_fused"), ("torchtitan-compile", "bias_act_fused")):
        v = get_framework(name)
        assert getattr(v, changed) != getattr(base, changed)
        assert v.optimizer_bytes_per_param == base.optimizer_bytes_per_param
        assert v.sources["optimizer_bytes_per_param"] == base.sources["optimizer_bytes_per_param"]
    for bad in ("nope", "v", 3):
        with pytest.raises(ConfigError, match="'base' must name another built-in profile"):
            profile_from_mapping({"name": "v", "base": bad, "entries": {}}, "f")


def test_unfused_attention_hand_computed():
    """megatron-lm-2021, micro-batch 2, 16 heads of 64, s = 1024: the batched GEMMs and the
    memory-bound score ops over b·a·s² = 2·16·1024² = 33.5M elements."""
    ops = {o.name: o for o in layer("megatron-lm-2021")}
    qk, pv = ops["attn_qk"].spec, ops["attn_pv"].spec
    assert isinstance(qk, GemmSpec) and (qk.m, qk.n, qk.k, qk.batch) == (1024, 1024, 64, 32)
    assert (pv.m, pv.n, pv.k, pv.batch) == (1024, 64, 1024, 32)
    ns = 2 * 16 * 1024 * 1024
    assert ops["attn_softmax"].spec.bytes == 2 * ns * 2  # fused scale+mask+softmax: read + write bf16
    assert ops["attn_dropout"].spec.bytes == ns * (2 * 2 + 1)  # read, write, 1-byte mask
    assert "attention" not in ops  # no flash kernel
    bwd = {o.name: o.spec for o in layer("megatron-lm-2021", phase="bwd")}
    assert {"attn_pv_dgrad", "attn_pv_wgrad", "attn_qk_dgrad", "attn_qk_wgrad"} <= set(bwd)
    assert bwd["attn_softmax_bwd"].bytes == 3 * ns * 2
    # the four backward GEMMs carry twice the forward's two
    f = qk.flops + pv.flops
    assert sum(bwd[n].flops for n in ("attn_pv_dgrad", "attn_pv_wgrad", "attn_qk_dgrad", "attn_qk_wgrad")) == 2 * f


def test_dropout_bias_and_cross_entropy_per_profile():
    """Hidden dropout and biases add bytes to the norm ops (which carry the residual
    epilogue); the unfused fp32 cross-entropy moves (d + 36) bytes per logit."""
    T, h = 2 * S, 1024
    old = {o.name: o.spec for o in layer("megatron-lm-2021")}
    new = {o.name: o.spec for o in layer("megatron-core")}
    # megatron-core: norm 2 passes + fused bias-dropout-add without dropout 3 passes
    assert new["mlp_norm"].bytes == 5 * T * h * 2
    # megatron-lm-2021: + the 1-byte dropout mask
    assert old["mlp_norm"].bytes == 5 * T * h * 2 + T * h
    sg = build_step(GPT, ParallelConfig(), BatchConfig(global_batch=2, micro_batch=2, seq_len=S), cluster(1),
                    framework="megatron-lm-2021")
    (ce,) = [o for o in sg.graph.ops if o.name == "cross_entropy"]
    assert ce.spec.bytes == T * 2048 * (2 + 36) and ce.spec.kernels == 6


def test_recompute_meaning_depends_on_the_framework():
    p = ParallelConfig(recompute="selective")
    mc = [o.name for o in layer("megatron-core", p, phase="bwd")]
    assert mc.count("attention_recompute") == 1
    tt = [o.name for o in layer("torchtitan", p, phase="bwd")]
    assert "attention_recompute" not in tt
    # torchtitan per-op SAC, GELU MLP: matmuls wq wk wv wo w1 w2 -> wk, wo, w2 recomputed
    assert [n for n in tt if n.startswith("recompute_w")] == ["recompute_wk", "recompute_wo", "recompute_w2"]
    # megatron-lm-2021 selective: the whole unfused core is recomputed
    old = [o.name for o in layer("megatron-lm-2021", p, phase="bwd")]
    assert {"recompute_attn_qk", "recompute_attn_softmax", "recompute_attn_dropout", "recompute_attn_pv"} <= set(old)


def test_eager_host_floor_and_unfused_chain_launches():
    gpu = CLUSTERS["dgx-h100"].gpu
    p = CostParams()
    tiny = MemorySpec(bytes=1e3)
    assert memory_time_s(tiny, gpu, p) == pytest.approx(p.kernel_launch_overhead_s, rel=1e-3)
    # eager: a 1 kB kernel cannot finish before the host has dispatched it
    assert memory_time_s(replace(tiny, host_kernels=1), gpu, p) == pytest.approx(p.eager_host_overhead_s)
    # an unfused chain of 6 kernels pays 6 launches (and 6 dispatches when eager)
    chain = MemorySpec(bytes=1e3, kernels=6)
    assert memory_time_s(chain, gpu, p) == pytest.approx(6 * p.kernel_launch_overhead_s, rel=1e-3)
    assert memory_time_s(replace(chain, host_kernels=6), gpu, p) == pytest.approx(6 * p.eager_host_overhead_s)
    # a long kernel is not host-bound
    big = MemorySpec(bytes=3e9, host_kernels=1)
    assert memory_time_s(big, gpu, p) == pytest.approx(memory_time_s(MemorySpec(bytes=3e9), gpu, p))


def test_attention_fraction_by_direction_and_kernel():
    p = CostParams()
    fwd = AttentionSpec(flops=1e12, bytes=0)
    assert attention_fraction(fwd, p) == p.attention_peak_fraction
    assert attention_fraction(replace(fwd, backward=True), p) == p.attention_bwd_peak_fraction
    assert attention_fraction(replace(fwd, kernel="fa2"), p) == p.attention_fa2_peak_fraction
    assert p.attention_fa2_peak_fraction < p.attention_peak_fraction  # FA2 on H100 (FA3 paper)
    tt = {o.name: o.spec for o in layer("torchtitan")}
    assert tt["attention"].kernel == "fa2"


def test_workload_framework_from_config_and_flag():
    base = {"model": "llama-3-8b", "cluster": "dgx-h100", "nodes": 1, "parallel": {"dp": 8},
            "batch": {"global_batch": 8, "seq_len": 2048}}
    assert workload_from_mapping(dict(base)).framework == "megatron-core"
    assert workload_from_mapping({**base, "framework": "torchtitan"}).framework == "torchtitan"
    with pytest.raises(ConfigError, match="unknown profile 'titan'"):
        workload_from_mapping({**base, "framework": "titan"})
    with pytest.raises(ConfigError, match="cp=2: context parallelism needs flash attention"):
        workload_from_mapping({**base, "parallel": {"dp": 4, "cp": 2}, "framework": "megatron-lm-2021"})
    ap = argparse.ArgumentParser()
    add_workload_arguments(ap)
    w = workload_from_args(ap.parse_args(["--model", "llama-3-8b", "--cluster", "dgx-h100", "--nodes", "1",
                                          "--dp", "8", "--global-batch", "8", "--framework", "torchtitan"]))
    assert w.framework == "torchtitan"


def test_embedding_backward_writes_the_dense_gradient():
    """PyTorch's embedding backward writes a dense [V, h] gradient, then it is added into the
    fp32 main gradient: T·h·d + V·h·(2d + 8) bytes (T = 2048, V = 2048, h = 1024, d = 2)."""
    sg = build_step(GPT, ParallelConfig(), BatchConfig(global_batch=2, micro_batch=2, seq_len=S), cluster(1))
    (e,) = [o for o in sg.graph.ops if o.name == "embedding_grad" and o.microbatch == 0]
    assert e.spec.bytes == 2048 * 1024 * 2 + 2048 * 1024 * (2 * 2 + 8)


def test_fsdp2_copies_only_in_the_torchtitan_profile():
    """FSDP2 copies the gathered unit into the parameters on the compute stream (read + write,
    bf16) and packs its gradients as fp32 for the reduce-scatter (read 2, write 4 bytes)."""
    p = ParallelConfig(dp=4, data_parallel="fsdp")
    b = BatchConfig(global_batch=4, micro_batch=1, seq_len=S)
    n = sum(t.numel for t in GPT.layer_tensors(1))
    tt = build_step(GPT, p, b, cluster(4), framework="torchtitan")
    out = [o for o in tt.graph.ops if o.name == "fsdp_copy_out" and o.layer == 1 and o.phase == "fwd"]
    cin = [o for o in tt.graph.ops if o.name == "fsdp_rs_copy_in" and o.layer == 1]
    assert len(out) == 1 and out[0].stream == "compute" and out[0].spec.bytes == 2 * n * 2
    assert len(cin) == 1 and cin[0].stream == "fsdp_rs" and cin[0].spec.bytes == n * (2 + 4)
    mc = build_step(GPT, p, b, cluster(4), framework="megatron-core")
    assert not [o for o in mc.graph.ops if o.name.startswith("fsdp_copy") or o.name == "fsdp_rs_copy_in"]


@pytest.mark.parametrize("argv,needle", [
    (["--dp", "8", "--framework", "titan"], "unknown profile 'titan'"),
    (["--dp", "4", "--cp", "2", "--framework", "megatron-lm-2021"], "cp=2: context parallelism needs flash"),
    (["--dp", "2", "--cp", "4", "--seq-len", "4100"], "seq_len (4100) must be divisible by 2 x cp = 8"),
])
def test_cli_bad_framework_or_cp_is_one_line_exit_2(capsys, tmp_path, argv, needle):
    from ccoverlap.cli import main

    code = main(["simulate", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--nodes", "1",
                 "--global-batch", "8", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_torchtitan_fp32_norm_foreach_adamw_and_clip_bytes():
    """torchtitan's eager RMSNorm upcasts to fp32 (36 / 92 bytes per element, 8 / 15 kernels);
    compiled per block it is one fused kernel; its foreach AdamW moves 80 bytes per local
    parameter and clip_grad_norm_ 12, against 30 and 4 for Megatron's fused kernels."""
    n = 2 * S * 1024  # micro-batch 2 x S tokens x hidden
    eager = {o.name: o.spec for o in layer("torchtitan")}
    # + the unfused epilogue of the sublayer before: bias add 2 + residual add 3 passes of bf16
    assert eager["mlp_norm"].bytes == 36 * n + 5 * n * 2 and eager["mlp_norm"].kernels == 8 + 2
    bwd = {o.name: o.spec for o in layer("torchtitan", phase="bwd")}
    # + autograd's residual-gradient add (3 passes) + the bias gradient of the epilogue (1 pass)
    assert bwd["mlp_norm_bwd"].bytes == 92 * n + 3 * n * 2 + n * 2 and bwd["mlp_norm_bwd"].kernels == 15 + 1 + 1
    compiled = {o.name: o.spec for o in layer("torchtitan-compile")}
    # fused norm (2 passes) + fused bias-residual add (3 passes), one kernel each
    assert compiled["mlp_norm"].bytes == 2 * n * 2 + 3 * n * 2 and compiled["mlp_norm"].kernels == 2
    p = ParallelConfig(dp=4, data_parallel="fsdp")
    b = BatchConfig(global_batch=4, micro_batch=1, seq_len=S)

    def opt_ops(fw):
        sg = build_step(GPT, p, b, cluster(4), framework=fw)
        return {o.name: o.spec.bytes for o in sg.graph.ops if o.rank == 0 and o.name in ("grad_norm", "optimizer_step")}

    tt, mc, tc = opt_ops("torchtitan"), opt_ops("megatron-core"), opt_ops("torchtitan-compile")
    local = mc["optimizer_step"] / 30
    assert local == int(local) and local > 0
    assert tt == {"grad_norm": 12 * local, "optimizer_step": 80 * local} == tc
    assert mc["grad_norm"] == 4 * local


@pytest.mark.parametrize("entry,value,needle", [
    ("norm_bytes", [36], "norm_bytes must be [forward, backward]"),
    ("norm_bytes", [36, -1], "norm_bytes must be [forward, backward]"),
    ("rope_bytes", [4, 0], "rope_bytes must be [bytes per element"),
    ("optimizer_bytes_per_param", -1, "optimizer_bytes_per_param must be a non-negative"),
    ("grad_clip_bytes_per_param", "many", "grad_clip_bytes_per_param must be a non-negative"),
])
def test_bad_byte_entries_name_the_entry(entry, value, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        profile_from_mapping({"name": "x", "entries": {entry: {"value": value, "source": "test"}}}, "f")


def test_torchao_fp8_weight_cast_on_every_forward():
    """torchtitan (torchao Float8Linear, tensorwise, no float8 all-gather) casts each bf16 weight
    in every forward: amax read 2 + cast read 2, write 1 = 5 bytes per weight element, on top of
    the input's cast(+transpose); TransformerEngine's per-step cached weight cast is not charged."""
    p = ParallelConfig(fp8=True)
    T, h = 2 * S, 1024
    tt = {o.name: o.spec for o in layer("torchtitan", p)}
    # the MLP's fc1 [T, h] x [h, 4h]: input cast (d + 2 bytes per element) + weight cast 5 per weight element
    assert tt["mlp_fc1_fp8_cast"].bytes == T * h * (2 + 2) + 5 * h * 4 * h
    assert tt["mlp_fc1_fp8_cast"].kernels == 3
    mc = {o.name: o.spec for o in layer("megatron-core", p)}
    assert mc["mlp_fc2_fp8_cast"].bytes == T * 4 * h * (2 + 2)
    assert "mlp_fc1_fp8_cast" not in mc and not any(n.endswith("_fp8_weight_cast") for n in mc)
    # no FP8, no weight casts
    assert not any("fp8" in o.name for o in layer("torchtitan"))


def test_no_per_use_weight_cast_with_fp8_param_allgather():
    """With FSDP's float8 all-gather the weight is gathered already in FP8: no per-forward cast."""
    p = ParallelConfig(dp=2, data_parallel="fsdp", fp8=True, fp8_param_allgather=True)
    ops = {o.name: o.spec for o in layer("torchtitan", p)}
    T, h = 2 * S, 1024
    assert ops["mlp_fc1_fp8_cast"].bytes == T * h * (2 + 2) and ops["mlp_fc1_fp8_cast"].kernels == 1
