"""Tensor parallelism as torchtitan runs it (PyTorch DTensor TP + torchao Float8 TP styles), as
two framework-profile entries, checked on one Llama 3 8B layer at TP 4 with sequence
parallelism by hand:

* ``tp_sp_save_gathered_input``: autograd keeps the all-gathered QKV / fc1 input, so the
  backward has no ``input_ag`` (Megatron-LM re-gathers the saved shard) in any ``tp_overlap``
  mode; torchtitan's per-op recompute re-runs the forward all-gathers instead; the activation
  estimate keeps ``[T, h]`` instead of ``[T/t, h]``.
* ``fp8_tp_collectives``: with FP8 the input all-gathers and the output-gradient all-gathers
  move 1 byte per element (cast before the gather); reductions and the LM head stay bf16.

The Megatron profiles keep both defaults and build what they built before."""

from __future__ import annotations

import pytest
from parallel_helpers import cluster

from ccoverlap.catalog.frameworks import builtin_frameworks, get_framework, profile_from_mapping
from ccoverlap.catalog.models import get_model
from ccoverlap.cli import main
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step
from ccoverlap.parallel.memory import layer_activation_bytes
from ccoverlap.parallel.step import step_totals
from ccoverlap.specs import CollectiveSpec, MemorySpec, P2PSpec

L8 = get_model("Llama-3-8B")
S, TP, H = 4096, 4, 4096
ROWS = S // TP
FFN = 14336
MODES = ("none", "chunked", "symm_mem")


def build(p, mode="none", framework="torchtitan"):
    return build_step(L8, p, BatchConfig(global_batch=p.dp, micro_batch=1, seq_len=S), cluster(p.world_size),
                      OverlapKnobs(tp_overlap=mode), framework=framework)


def ops(sg, phase):
    return [o for o in sg.graph.ops if o.rank == 0 and o.layer == 3 and o.microbatch == 0 and o.phase == phase]


def named(ops_, prefix):
    return [o for o in ops_ if o.name == prefix or o.name.startswith(prefix)]


def sp(**kw):
    return ParallelConfig(tp=TP, dp=1, sequence_parallel=True, **kw)


def test_profiles_say_which_framework_saves_the_gathered_input_and_gathers_fp8():
    for name in builtin_frameworks():
        fw = get_framework(name)
        titan = name.startswith("torchtitan")
        assert fw.tp_sp_save_gathered_input is titan, name
        assert fw.fp8_tp_collectives == (("input_ag", "grad_ag") if titan else ()), name
        if titan:
            assert "parallelize_llama.py" in fw.sources["tp_sp_save_gathered_input"]
            assert "float8_tensor_parallel.py" in fw.sources["fp8_tp_collectives"]


@pytest.mark.parametrize("mode", MODES)
def test_no_backward_regather_of_the_saved_input_in_torchtitan(mode):
    mega = ops(build(sp(), mode, "megatron-core"), "bwd")
    titan = ops(build(sp(), mode, "torchtitan"), "bwd")
    # Megatron-LM: the [T/tp, h] shard re-gathered once for qkv's wgrad and once for fc1's:
    # T·h·2 bytes each (the gathered size), one all-gather each
    regather = [o for o in mega if o.name == "input_ag"]
    assert len(regather) == 2
    assert all(isinstance(o.spec, CollectiveSpec) and o.spec.collective == "all_gather"
               and o.spec.bytes == S * H * 2 for o in regather)
    wgrads = [o for o in mega if o.name in ("qkv_wgrad", "mlp_fc1_wgrad")]
    assert all(any(d in {r.op_id for r in regather} for d in w.deps) for w in wgrads)
    # torchtitan: no input_ag at all, and the wgrads wait for no TP collective
    assert not [o for o in titan if o.name == "input_ag"]
    tp_ids = {o.op_id for o in titan if o.stream == "tp_comm"}
    for w in (o for o in titan if o.name in ("qkv_wgrad", "mlp_fc1_wgrad")):
        assert not set(w.deps) & tp_ids


def test_the_other_tp_collectives_are_unchanged_without_fp8():
    for mode in MODES:
        for phase in ("fwd", "bwd"):
            mega = {(o.name, type(o.spec).__name__, getattr(o.spec, "bytes", None)) for o in ops(build(sp(), mode, "megatron-core"), phase)
                    if isinstance(o.spec, (CollectiveSpec, P2PSpec)) and o.name != "input_ag"}
            titan = {(o.name, type(o.spec).__name__, getattr(o.spec, "bytes", None)) for o in ops(build(sp(), mode, "torchtitan"), phase)
                     if isinstance(o.spec, (CollectiveSpec, P2PSpec))}
            assert mega == titan, (mode, phase)


def test_op_selective_recompute_regathers_in_the_recompute_instead():
    p = sp(recompute="selective")
    bwd = ops(build(p, "none", "torchtitan"), "bwd")
    ags = [o for o in bwd if o.name in ("recompute_attn_ag", "recompute_mlp_ag")]
    assert [o.name for o in ags] == ["recompute_attn_ag", "recompute_mlp_ag"]
    assert all(o.spec.collective == "all_gather" and o.spec.bytes == S * H * 2 and o.stream == "tp_comm" for o in ags)
    assert not [o for o in bwd if o.name == "input_ag"]
    # a profile with per-op recompute that keeps Megatron's saved shard: backward re-gather, no
    # all-gather in the recompute
    data = {"name": "op-sac-shard", "base": "torchtitan", "entries": {
        "tp_sp_save_gathered_input": {"value": False, "source": "test: Megatron-style saved shard"}}}
    other = ops(build(p, "none", profile_from_mapping(data, "test")), "bwd")
    assert not [o for o in other if o.name.startswith("recompute_") and o.name.endswith("_ag")]
    assert len([o for o in other if o.name == "input_ag"]) == 2


def coll_bytes(ops_):
    return {o.name: o.spec.bytes for o in ops_ if isinstance(o.spec, (CollectiveSpec, P2PSpec))}


def test_fp8_tp_all_gathers_move_one_byte_in_torchtitan_and_reductions_stay_bf16():
    p = sp(fp8=True)
    fwd = coll_bytes(ops(build(p, "none", "torchtitan"), "fwd"))
    bwd = coll_bytes(ops(build(p, "none", "torchtitan"), "bwd"))
    assert fwd == {"qkv_ag": S * H * 1, "mlp_fc1_ag": S * H * 1, "proj_rs": S * H * 2, "mlp_fc2_rs": S * H * 2}
    # bwd: output-gradient all-gathers FP8, input-gradient reduce-scatters bf16, no re-gather
    assert bwd == {"proj_grad_ag": S * H * 1, "mlp_fc2_grad_ag": S * H * 1, "dgrad_rs": S * H * 2}
    # megatron-core with FP8: every TP collective in bf16 (as before), re-gather included
    mega = coll_bytes(ops(build(p, "none", "megatron-core"), "bwd"))
    assert mega == {"proj_grad_ag": S * H * 2, "mlp_fc2_grad_ag": S * H * 2, "dgrad_rs": S * H * 2,
                    "input_ag": S * H * 2}


def test_fp8_output_gradient_is_cast_on_the_local_shard_before_its_all_gather():
    p = sp(fp8=True)
    bwd = ops(build(p, "none", "torchtitan"), "bwd")
    ids = {o.op_id: o.name for o in bwd}
    (cast,) = named(bwd, "proj_fp8_cast_bwd")
    (ag,) = named(bwd, "proj_grad_ag")
    (dgrad,) = named(bwd, "proj_dgrad")
    # cast + transpose of the local [T/tp, h] bf16 gradient: read 2 + write 1 + transpose 1 bytes
    assert isinstance(cast.spec, MemorySpec) and cast.spec.bytes == ROWS * H * (2 + 2)
    assert [ids[d] for d in ag.deps] == ["proj_fp8_cast_bwd"] and [ids[d] for d in dgrad.deps] == ["proj_grad_ag"]
    # megatron-core casts the gathered [T, h] gradient after the all-gather
    mbwd = ops(build(p, "none", "megatron-core"), "bwd")
    mids = {o.op_id: o.name for o in mbwd}
    (mcast,) = named(mbwd, "proj_fp8_cast_bwd")
    assert mcast.spec.bytes == S * H * (2 + 2) and [mids[d] for d in mcast.deps] == ["proj_grad_ag"]


def test_fp8_gathers_in_chunked_and_symm_mem_modes():
    p = sp(fp8=True)
    chunked = ops(build(p, "chunked", "torchtitan"), "fwd") + ops(build(p, "chunked", "torchtitan"), "bwd")
    for prefix in ("qkv_ag", "mlp_fc1_ag", "proj_grad_ag", "mlp_fc2_grad_ag"):
        parts = named(chunked, prefix)
        assert len(parts) > 1 and sum(o.spec.bytes for o in parts) == S * H * 1, prefix
    assert sum(o.spec.bytes for o in named(chunked, "proj_rs")) == S * H * 2
    assert not named(chunked, "input_ag")
    symm = ops(build(p, "symm_mem", "torchtitan"), "fwd") + ops(build(p, "symm_mem", "torchtitan"), "bwd")
    for prefix in ("qkv_symm", "mlp_fc1_symm", "proj_grad_symm", "mlp_fc2_grad_symm"):
        moves = named(symm, prefix)
        # the mv copy and tp-1 peer copies of one [T/tp, h] FP8 shard each
        assert len(moves) == TP and all(o.spec.bytes == ROWS * H * 1 for o in moves), prefix
    # the fused GEMM + reduce-scatter pulls bf16 partials
    assert all(o.spec.bytes == ROWS * H * 2 for o in named(symm, "proj_symm_cp"))
    assert not named(symm, "input_ag")


def test_lm_head_all_gather_stays_bf16_with_fp8():
    p = sp(fp8=True)
    sg = build(p, "none", "torchtitan")
    head = [o for o in sg.graph.ops if o.rank == 0 and o.microbatch == 0 and o.name == "lm_head_ag"]
    assert head and all(o.spec.bytes == S * H * 2 for o in head)


def test_activation_estimate_keeps_the_gathered_input():
    p = sp()
    shard = layer_activation_bytes(L8, p, 1, S, 3)
    gathered = layer_activation_bytes(L8, p, 1, S, 3, sp_save_gathered_input=True)
    # the two norm outputs (QKV input, fc1 input) kept as [T, h] bf16 instead of [T/tp, h]
    assert gathered - shard == 2 * 2 * (S - ROWS) * H
    # no SP: nothing to gather, same bytes
    nosp = ParallelConfig(tp=TP, dp=1)
    assert layer_activation_bytes(L8, nosp, 1, S, 3, sp_save_gathered_input=True) == layer_activation_bytes(L8, nosp, 1, S, 3)
    b = BatchConfig(global_batch=1, micro_batch=1, seq_len=S)
    _, _, titan = step_totals(L8, p, b, cluster(TP), framework="torchtitan")
    _, _, mega = step_totals(L8, p, b, cluster(TP), framework="megatron-core")
    layers = L8.layers  # one stage, one micro-batch in flight
    # and the loss: torchtitan's F.cross_entropy(logits.float()) peaks at 12 bytes a logit,
    # Megatron-LM's in-place vocab-parallel cross entropy holds bf16 logits + fp32 softmax (6)
    loss = S * L8.vocab / TP * (12 - 6)
    head = 2 * (S - ROWS) * H  # the LM head's input, kept gathered as well
    assert titan.activations_bytes - mega.activations_bytes == layers * 2 * 2 * (S - ROWS) * H + loss + head


@pytest.mark.parametrize("entry,value,needle", [
    ("fp8_tp_collectives", ["reduce_scatter"], "fp8_tp_collectives must be a list of some of"),
    ("fp8_tp_collectives", "input_ag", "fp8_tp_collectives must be a list of some of"),
    ("tp_sp_save_gathered_input", "yes", "tp_sp_save_gathered_input must be true or false"),
])
def test_bad_entries_name_the_entry(entry, value, needle):
    with pytest.raises(ConfigError, match=needle):
        profile_from_mapping({"name": "x", "base": "torchtitan", "entries": {entry: {"value": value, "source": "a test value"}}},
                             "x")


def test_cli_bad_entry_is_one_line_exit_2(tmp_path, capsys):
    f = tmp_path / "fw.yaml"
    f.write_text("name: bad\nbase: torchtitan\nentries:\n  fp8_tp_collectives: {value: [all_reduce], source: a test value}\n")
    code = main(["simulate", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--nodes", "1",
                 "--global-batch", "8", "--out", str(tmp_path), "--dp", "8", "--framework", str(f)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "fp8_tp_collectives" in err and len(err.splitlines()) == 1 and "Traceback" not in err
