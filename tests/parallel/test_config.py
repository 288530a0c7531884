"""Validation of ParallelConfig / BatchConfig / OverlapKnobs: every bad input is a ConfigError
whose message names the field and what was expected."""

from __future__ import annotations

import pytest
from parallel_helpers import cluster

from ccoverlap.catalog.models import get_model
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, config_problems, validate
from ccoverlap.specs import CommConfig

L8 = get_model("Llama-3-8B")  # 32 heads, 8 KV heads, 32 layers
MIX = get_model("Mixtral-8x7B")  # 8 experts


def problems(p, model=L8, gpus=None, batch=None):
    return config_problems(p, model, cluster(gpus) if gpus else None, batch)


@pytest.mark.parametrize("field,value,words", [
    ("tp", 0, "tp must be an integer >= 1, got 0"), ("pp", -1, "pp must be an integer >= 1, got -1"),
    ("dp", 0, "dp must be an integer >= 1, got 0"), ("ep", -2, "ep must be an integer >= 1, got -2"),
    ("virtual_stages", 0, "virtual_stages must be an integer >= 1, got 0"),
    ("dtype_bytes", 0, "dtype_bytes must be one of [1, 2, 4, 8], got 0"),
    ("dtype_bytes", 3, "dtype_bytes must be one of [1, 2, 4, 8], got 3"),
    ("tp", 1.5, "tp must be an integer, got 1.5"), ("dp", True, "dp must be an integer, got True"),
    ("tp", float("nan"), "tp must be an integer, got nan"), ("tp", 2**40, "tp must be an integer <= 1048576"),
    ("cp", "2", "cp must be an integer, got '2'")])
def test_non_positive_or_non_integer_sizes(field, value, words):
    """Built in Python, a configuration obeys its annotations as a config file's does, with the
    same message."""
    with pytest.raises(ConfigError) as e:
        ParallelConfig(**{field: value})
    assert words in str(e.value)


@pytest.mark.parametrize("field,value,word", [("data_parallel", "zero2", "data_parallel"),
                                              ("pp_schedule", "zb-h1", "pp_schedule"),
                                              ("recompute", "some", "recompute")])
def test_unknown_choices(field, value, word):
    with pytest.raises(ConfigError, match=word):
        ParallelConfig(**{field: value})


def test_virtual_stages_need_interleaved():
    with pytest.raises(ConfigError, match="virtual_stages=2 needs pp_schedule='interleaved'"):
        ParallelConfig(pp=2, virtual_stages=2)


def test_tp_must_divide_heads():
    msg = problems(ParallelConfig(tp=3, dp=1))
    assert any("tp=3 must divide the model's 32 attention heads" in m for m in msg)


def test_tp_must_divide_kv_heads_megatron_rule():
    # 16 divides 32 heads but not 8 KV heads: Megatron-LM splits query groups across TP
    msg = problems(ParallelConfig(tp=16))
    assert msg == [m for m in msg if "KV heads" in m] and len(msg) == 1
    assert "tp=16 must divide the model's 8 KV heads" in msg[0]


def test_degrees_must_multiply_to_world_size():
    with pytest.raises(ConfigError, match=r"tp x pp x dp = 2 x 2 x 2 = 8 must equal the cluster's 16 GPUs"):
        ParallelConfig(tp=2, pp=2, dp=2).validate(L8, cluster(16))
    ParallelConfig(tp=2, pp=2, dp=4).validate(L8, cluster(16))  # fine


def test_pp_must_divide_layers_and_interleaved_chunks():
    assert any("pp=3 must divide the model's 32 layers" in m for m in problems(ParallelConfig(pp=3)))
    msg = problems(ParallelConfig(pp=4, pp_schedule="interleaved", virtual_stages=3))
    assert any("pp x virtual_stages = 12 must divide the model's 32 layers" in m for m in msg)
    assert problems(ParallelConfig(pp=4, pp_schedule="interleaved", virtual_stages=2)) == []


def test_dualpipe_needs_even_pp():
    assert any("DualPipe needs an even pp" in m for m in problems(ParallelConfig(pp=1, pp_schedule="dualpipe")))


def test_expert_parallel_rules():
    assert any("needs a mixture-of-experts model" in m for m in problems(ParallelConfig(dp=2, ep=2)))
    with pytest.raises(ConfigError, match=r"ep=3 must divide dp=4 \(expert parallelism is carved out"):
        ParallelConfig(dp=4, ep=3)  # impossible whatever the model: refused where it is built
    assert any("ep=16 must divide the model's 8 experts" in m for m in problems(ParallelConfig(dp=16, ep=16), MIX))
    assert any("needs sequence_parallel=True" in m for m in problems(ParallelConfig(tp=2, dp=2, ep=2), MIX))
    assert problems(ParallelConfig(tp=2, dp=4, ep=4, sequence_parallel=True), MIX, gpus=8) == []


def test_every_problem_is_reported_in_one_error():
    with pytest.raises(ConfigError) as e:
        validate(L8, ParallelConfig(tp=3, pp=3), None, cluster(8))
    text = str(e.value)
    assert "attention heads" in text and "32 layers" in text and "must equal the cluster's 8 GPUs" in text
    assert text.count("; ") >= 2


def test_batch_rules():
    with pytest.raises(ConfigError, match="global_batch must be an integer >= 1, got 0"):
        BatchConfig(global_batch=0)
    with pytest.raises(ConfigError, match="micro_batch must be an integer >= 1, got -1"):
        BatchConfig(global_batch=8, micro_batch=-1)
    with pytest.raises(ConfigError, match="seq_len must be an integer <= 1073741824"):
        BatchConfig(global_batch=8, seq_len=2**31)
    b = BatchConfig(global_batch=10, micro_batch=2, seq_len=1024)
    with pytest.raises(ConfigError, match=r"global_batch=10 must be a multiple of dp x micro_batch = 4 x 2 = 8"):
        b.microbatches(4)
    assert BatchConfig(global_batch=64, micro_batch=2).microbatches(4) == 8
    p = ParallelConfig(pp=4, pp_schedule="interleaved", virtual_stages=2)
    assert any("multiple of pp=4" in m for m in problems(p, batch=BatchConfig(global_batch=6)))
    p = ParallelConfig(pp=4, pp_schedule="dualpipe")
    assert any("DualPipe needs an even number of micro-batches >= 2 x pp = 8" in m
               for m in problems(p, batch=BatchConfig(global_batch=6)))
    p = ParallelConfig(tp=8, sequence_parallel=True)
    assert any("seq_len (1020) divisible by tp=8" in m
               for m in problems(p, batch=BatchConfig(global_batch=8, seq_len=1020)))


def test_knobs_checks_and_hashability():
    for kw, word in [({"bucket_cap_mb": 0}, "bucket_cap_mb"), ({"fsdp_prefetch": -1}, "fsdp_prefetch"),
                     ({"fsdp_limit_all_gathers": 0}, "fsdp_limit_all_gathers"), ({"tp_overlap": "yes"}, "tp_overlap"),
                     ({"tp_chunks": 0}, "tp_chunks"), ({"comm_transport": "rdma"}, "comm_transport"),
                     ({"comm_config_overrides": {"dp": 3}}, r"comm_config_overrides\['dp'\]")]:
        with pytest.raises(ConfigError, match=word):
            OverlapKnobs(**kw)
    k = OverlapKnobs(comm_config_overrides={"dp": CommConfig(channels=4), "tp": CommConfig(protocol="ll128")})
    assert hash(k) == hash(OverlapKnobs(comm_config_overrides={"tp": CommConfig(protocol="ll128"),
                                                               "dp": CommConfig(channels=4)}))
    assert k.config_for("dp").channels == 4 and k.config_for("ep") == CommConfig()
    d = k.to_dict()
    assert d["comm_config_overrides"]["dp"]["channels"] == 4
    assert OverlapKnobs.from_dict(d) == k
    with pytest.raises(ConfigError, match="unknown field"):
        OverlapKnobs.from_dict({"overlapp": True})


def test_to_dict_round_trip():
    p = ParallelConfig(tp=2, pp=4, dp=8, sequence_parallel=True, pp_schedule="interleaved", virtual_stages=2)
    assert ParallelConfig(**p.to_dict()) == p
    b = BatchConfig(global_batch=64, micro_batch=2, seq_len=4096)
    assert BatchConfig(**b.to_dict()) == b and b.tokens == 64 * 4096


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 3, 4, 8, 16]), pp=st.sampled_from([1, 2, 3, 4, 8]),
       dp=st.sampled_from([1, 2, 4, 6]), gpus=st.sampled_from([8, 16, 32, 64]))
def test_validation_accepts_exactly_the_valid_degrees(tp, pp, dp, gpus):
    ok = 32 % tp == 0 and 8 % tp == 0 and 32 % pp == 0 and tp * pp * dp == gpus
    msgs = problems(ParallelConfig(tp=tp, pp=pp, dp=dp), gpus=gpus)
    assert (msgs == []) == ok
    assert all(m and "; " not in m for m in msgs)  # one sentence each


def test_model_parallel_group_counts_stages_sharing_a_node():
    """TP2 x DP2 x PP2 on one 8-GPU node: the model-parallel group {0,1,4,5} is on one node."""
    from ccoverlap.parallel.config import ParallelConfig
    from ccoverlap.parallel.layout import Layout

    layout = Layout.build(ParallelConfig(tp=2, pp=2, dp=2), 8)
    assert layout.mp.size == 4 and layout.mp.nodes == 1
    wide = Layout.build(ParallelConfig(tp=8, pp=2, dp=2), 8)
    assert wide.mp.local_size == 8 and wide.mp.nodes == 2


def test_parallel_config_predicates_and_data_parallel_fill():
    from ccoverlap.parallel.config import ParallelConfig as PC

    p = PC(tp=8, pp=2, dp=2, data_parallel="fsdp", sequence_parallel=True)
    assert (p.tp_enabled, p.sp_enabled, p.pp_enabled, p.dp_enabled, p.fsdp_enabled, p.ddp_enabled, p.ep_enabled,
            p.cp_enabled) == (True, True, True, True, True, False, False, False)
    q = PC(dp=1, sequence_parallel=True)
    assert not q.sp_enabled and not q.fsdp_enabled and not q.ddp_enabled and not q.dp_enabled
    assert PC(dp=4).ddp_enabled
    assert PC.data_parallel_for(32, tp=8, pp=2) == 2
    assert PC.data_parallel_for(32, tp=8, pp=2, cp=2) == 1
    assert PC.data_parallel_for(24, tp=8, pp=2) is None
