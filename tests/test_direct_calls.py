"""Bad input on direct Python calls: the functions users reach from ``import ccoverlap as cc``
and the docs pages (the memory estimate, the step builder, the catalog, the op specs, the cost
model, the simulator, the planner, the deciders and the API's keywords) end with one
ConfigError / TraceError that names the argument or field and the value, never a traceback
from inside the library or a silent wrong number.

Each case below was a ZeroDivisionError, AttributeError, TypeError, ValueError from deep in
the library, or a wrong answer (a negative or NaN time, a cluster with 2.5 nodes) before the
inputs were checked where they enter.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ccoverlap as cc
from ccoverlap.catalog.hardware import ClusterSpec, GPUSpec, LinkSpec, get_cluster, get_gpu
from ccoverlap.catalog.models import ModelSpec, get_model
from ccoverlap.config import read_config_file
from ccoverlap.cost import CostModel, collective_time_s, copy_time_s, default_comm_config, default_params, gemm_time_s
from ccoverlap.cost.compute import memory_time_s
from ccoverlap.deciders.centauri import decide as centauri
from ccoverlap.deciders.ficco import heuristic as ficco_heuristic
from ccoverlap.deciders.lagom.profiler import SimulatedProfiler
from ccoverlap.deciders.lagom.step import tune_step
from ccoverlap.deciders.lagom.tune import lagom_tune, tune_group
from ccoverlap.errors import CCOverlapError, ConfigError, TraceError
from ccoverlap.nccl.groups import load_overlap_group
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step, estimate_memory
from ccoverlap.parallel import layer_activation_bytes as lab
from ccoverlap.predict.strategy import Planner
from ccoverlap.predict.workload import with_knobs
from ccoverlap.sim.simulator import simulate
from ccoverlap.specs import CollectiveSpec, CommConfig, CopySpec, GemmSpec, GroupSpec, MemorySpec, P2PSpec

L8 = get_model("llama-3-8b")  # 32 layers, 32 heads, 8 KV heads
MIX = get_model("mixtral-8x7b")  # 8 experts
H100 = get_cluster("dgx-h100")  # 8 GPUs
GPU = get_gpu("H100-SXM")
B8 = BatchConfig(global_batch=8, seq_len=4096)
DP8 = GroupSpec(name="dp", size=8, local_size=8)
GROUP_FILE = "examples/overlap-group-fsdp-h100.yaml"
NAN, INF = float("nan"), float("inf")


def _group_and_profiler():
    group = load_overlap_group(GROUP_FILE)
    return group, SimulatedProfiler(group, CostModel(group.cluster))


def _small_workload():
    return cc.Workload(model="phi-2", cluster="a40-pcie", nodes=1, dp=8, global_batch=8, seq_len=512)


# (id, call, error type, words the one line must contain)
CASES = [
    # the memory estimate and the step builder (docs/planner.md, docs/api.md)
    ("estimate_memory ep > dp", lambda: estimate_memory(MIX, ParallelConfig(dp=2, ep=4), B8, H100), ConfigError,
     "ep=4 must divide dp=2"),
    ("estimate_memory pp > layers", lambda: estimate_memory(L8, ParallelConfig(pp=64), BatchConfig(global_batch=64),
                                                            H100), ConfigError, "pp=64 must divide the model's 32 layers"),
    ("estimate_memory tp not dividing the heads", lambda: estimate_memory(L8, ParallelConfig(tp=3), B8, H100),
     ConfigError, "tp=3 must divide the model's 32 attention heads"),
    ("estimate_memory a model name", lambda: estimate_memory("llama-3-8b", ParallelConfig(dp=8), B8, H100),
     ConfigError, "model must be a ModelSpec"),
    ("estimate_memory a cluster name", lambda: estimate_memory(L8, ParallelConfig(dp=8), B8, "dgx-h100"),
     ConfigError, "cluster must be a ClusterSpec"),
    ("estimate_memory a framework that is a number", lambda: estimate_memory(L8, ParallelConfig(dp=8), B8, H100,
                                                                             framework=123),
     ConfigError, "framework: expected a profile name or file, got int"),
    ("estimate_memory an unknown framework", lambda: estimate_memory(L8, ParallelConfig(dp=8), B8, H100,
                                                                     framework="torchtitan-2099"),
     ConfigError, "unknown profile 'torchtitan-2099'"),
    ("estimate_memory knobs as a mapping", lambda: estimate_memory(L8, ParallelConfig(dp=8), B8, H100,
                                                                   {"bucket_cap_mb": 3}),
     ConfigError, "knobs must be an OverlapKnobs"),
    ("build_step a batch mapping", lambda: build_step(L8, ParallelConfig(dp=8), {"global_batch": 8}, H100),
     ConfigError, "batch must be a BatchConfig"),
    ("layer_activation_bytes micro_batch -1", lambda: lab(L8, ParallelConfig(tp=2), -1, 4096, 0), ConfigError,
     "micro_batch must be an integer >= 1, got -1"),
    ("layer_activation_bytes seq_len NaN", lambda: lab(L8, ParallelConfig(tp=2), 1, NAN, 0), ConfigError,
     "seq_len must be an integer, got nan"),
    ("layer_activation_bytes layer 99", lambda: lab(L8, ParallelConfig(tp=2), 1, 4096, 99), ConfigError,
     "layer must be an integer from 0 to 31"),
    ("layer_activation_bytes tp 3", lambda: lab(L8, ParallelConfig(tp=3), 1, 4096, 0), ConfigError,
     "tp=3 must divide the model's 32 attention heads"),
    # configurations built in Python obey the rules a config file does
    ("ParallelConfig ep > dp", lambda: ParallelConfig(dp=2, ep=4), ConfigError, "ep=4 must divide dp=2"),
    ("ParallelConfig tp 2**40", lambda: ParallelConfig(tp=2**40), ConfigError, "tp must be an integer <= 1048576"),
    ("ParallelConfig dtype_bytes 3", lambda: ParallelConfig(dtype_bytes=3), ConfigError,
     "dtype_bytes must be one of [1, 2, 4, 8], got 3"),
    ("BatchConfig 10**18 sequences", lambda: BatchConfig(global_batch=10**18), ConfigError,
     "global_batch must be an integer <= 1073741824"),
    ("OverlapKnobs infinite bucket", lambda: OverlapKnobs(bucket_cap_mb=INF), ConfigError,
     "bucket_cap_mb must be a number <= 1048576.0, got inf"),
    ("OverlapKnobs 10**9 TP chunks", lambda: OverlapKnobs(tp_chunks=10**9), ConfigError,
     "tp_chunks must be an integer <= 1024"),
    ("OverlapKnobs comm_config mapping", lambda: OverlapKnobs(comm_config={"channels": 4}), ConfigError,
     "comm_config must be a CommConfig"),
    ("with_knobs unknown knob", lambda: with_knobs(_small_workload(), fsdp_prefech=2), ConfigError,
     "unknown knob 'fsdp_prefech' (did you mean 'fsdp_prefetch'?)"),
    # the catalog
    ("get_cluster 2.5 nodes", lambda: get_cluster("dgx-h100", nodes=2.5), ConfigError,
     "nodes must be an integer, got 2.5"),
    ("get_cluster NaN nodes", lambda: get_cluster("dgx-h100", nodes=NAN), ConfigError, "nodes must be an integer"),
    ("get_cluster no name", lambda: get_cluster(None), ConfigError, "cluster name must be a string"),
    ("get_gpu a number", lambda: get_gpu(3), ConfigError, "GPU name must be a string"),
    ("GPUSpec NaN bandwidth", lambda: GPUSpec(name="g", vendor="nvidia", sms=10, peak_flops={"bf16": 1e12,
                                                                                             "fp16": 1e12,
                                                                                             "fp32": 1e11},
                                              hbm_bytes_per_s=NAN, memory_bytes=1e9, l2_bytes=1e6, copy_engines=1),
     ConfigError, "GPU 'g': hbm_bytes_per_s must be a number > 0.0, got nan"),
    ("LinkSpec infinite bandwidth", lambda: LinkSpec(fabric="pcie", bandwidth_bytes_per_s=INF, latency_s=1e-6),
     ConfigError, "bandwidth_bytes_per_s must be a number <= 1e+30, got inf"),
    ("ClusterSpec a GPU name", lambda: ClusterSpec(name="c", gpu="H100", nodes=1, gpus_per_node=8, intra=H100.intra,
                                                   inter=H100.inter), ConfigError, "gpu must be a GPUSpec"),
    ("ModelSpec gated_mlp 'yes'", lambda: ModelSpec(name="m", hidden=64, ffn_hidden=256, heads=4, kv_heads=4,
                                                    layers=2, vocab=10, seq_len=8, gated_mlp="yes"),
     ConfigError, "gated_mlp must be true or false, got 'yes'"),
    # op specs and the cost model (docs/model.md)
    ("GemmSpec NaN rows", lambda: GemmSpec(m=NAN, n=8, k=8), ConfigError, "GEMM: m must be an integer, got nan"),
    ("GemmSpec text", lambda: GemmSpec(m="8", n=8, k=8), ConfigError, "GEMM: m must be an integer, got '8'"),
    ("MemorySpec NaN bytes", lambda: memory_time_s(MemorySpec(bytes=NAN), GPU), ConfigError,
     "bytes must be a number >= 0.0, got nan"),
    ("CollectiveSpec NaN bytes", lambda: CollectiveSpec(collective="all_reduce", bytes=NAN, group=DP8), ConfigError,
     "collective: bytes must be a number >= 0.0, got nan"),
    ("CollectiveSpec group mapping", lambda: CollectiveSpec(collective="all_reduce", bytes=1.0,
                                                            group={"name": "dp", "size": 8, "local_size": 8}),
     ConfigError, "group must be a GroupSpec"),
    ("GroupSpec 2.5 ranks", lambda: GroupSpec(name="dp", size=2.5, local_size=2.5), ConfigError,
     "size must be an integer, got 2.5"),
    ("CommConfig 2.5 channels", lambda: CommConfig(channels=2.5), ConfigError, "channels must be an integer, got 2.5"),
    ("CommConfig text threads", lambda: CommConfig(threads="512"), ConfigError, "threads must be an integer"),
    ("P2PSpec unknown transport", lambda: P2PSpec(bytes=1.0, inter_node=False, transport="rdma"), ConfigError,
     "transport must be one of ['sm', 'dma'], got 'rdma'"),
    ("copy_time_s negative bytes", lambda: copy_time_s(CopySpec(bytes=-1.0), H100), ConfigError,
     "bytes must be a number >= 0.0, got -1.0"),
    ("gemm_time_s a GPU name", lambda: gemm_time_s(GemmSpec(m=8, n=8, k=8), "H100-SXM"), ConfigError,
     "gemm_time_s: gpu must be a GPUSpec"),
    ("gemm_time_s NaN SMs", lambda: gemm_time_s(GemmSpec(m=8, n=8, k=8), GPU, sms_available=NAN), ConfigError,
     "sms_available must be a finite number, got nan"),
    ("collective_time_s a cluster name", lambda: collective_time_s(CollectiveSpec(collective="all_reduce", bytes=1.0,
                                                                                  group=DP8), "dgx-h100"),
     ConfigError, "collective_time_s: cluster must be a ClusterSpec"),
    ("default_comm_config unknown collective", lambda: default_comm_config("gather", DP8, H100), ConfigError,
     "unknown collective 'gather'"),
    ("CostModel params mapping", lambda: CostModel(H100, {"gemm_peak_fraction": 0.5}), ConfigError,
     "params must be a CostParams"),
    ("default_params a GPU name", lambda: default_params("H100-SXM"), ConfigError, "gpu must be a GPUSpec"),
    ("simulate no graph", lambda: simulate(None, CostModel(H100)), ConfigError, "simulate needs an OpGraph"),
    # the planner and the deciders' entry points (docs/planner.md, docs/deciders-*.md)
    ("Planner a model name", lambda: Planner("llama-3-8b"), ConfigError, "Planner needs a Workload"),
    ("Planner jobs text", lambda: Planner(_small_workload(), jobs="2"), ConfigError, "jobs must be an integer"),
    ("Planner.simulate a name", lambda: Planner(_small_workload(), jobs=1).simulate("phi-2"), ConfigError,
     "Planner needs a Workload (ccoverlap.Workload(...) or workload_from_mapping), got 'phi-2'"),
    ("centauri.decide no planner", lambda: centauri.decide("phi-2"), ConfigError,
     "centauri.decide: planner must be a Planner"),
    ("tune_step unknown method", lambda: tune_step(Planner(_small_workload(), jobs=1), None, "lagomm"), ConfigError,
     "unknown tuning method 'lagomm'"),
    ("lagom_tune no profiler", lambda: lagom_tune(load_overlap_group(GROUP_FILE), None), ConfigError,
     "lagom: profiler must have a profile(configs) method"),
    ("lagom_tune start text", lambda: lagom_tune(*_group_and_profiler(), start="x"), ConfigError,
     "lagom: start must be a list of CommConfig"),
    ("tune_group a file name", lambda: tune_group(GROUP_FILE), ConfigError, "tune_group: group must be an OverlapGroup"),
    ("SimulatedProfiler no cost model", lambda: SimulatedProfiler(load_overlap_group(GROUP_FILE), None), ConfigError,
     "cost must have a duration_s"),
    ("load_overlap_group None", lambda: load_overlap_group(None), ConfigError, "expected the path of a config file"),
    ("choose_schedule NaN rows", lambda: ficco_heuristic.choose_schedule(NAN, 8, 8, 8, 2, peak_flops=1e15,
                                                                         mem_bw_bytes_per_s=3e12),
     ConfigError, "gemm_stats: m must be a positive integer, got nan"),
    ("choose_schedule NaN peak", lambda: ficco_heuristic.choose_schedule(8192, 8192, 8192, 8, 2, peak_flops=NAN,
                                                                         mem_bw_bytes_per_s=3e12),
     ConfigError, "peak_flops must be a finite number > 0, got nan"),
    ("overlap_gain_ratio 0 ranks", lambda: ficco_heuristic.overlap_gain_ratio(8, 8, 8, 0, 2, peak_flops=1e15,
                                                                              link_bw_bytes_per_s=1e11),
     ConfigError, "world_size must be a positive integer, got 0"),
    # the API's keywords (docs/api.md)
    ("analyze no traces", lambda: cc.analyze(None), TraceError, "traces: expected a path or a list of paths"),
    ("analyze steps a number", lambda: cc.analyze("traces", steps=3), ConfigError, "--steps: expected 'hta'"),
    ("analyze jobs 0", lambda: cc.analyze("traces", jobs=0), ConfigError, "jobs must be an integer >= 1, got 0"),
    ("analyze groups a list", lambda: cc.analyze("traces", groups=["TP"]), ConfigError,
     "groups: expected a non-empty mapping"),
    ("simulate a misspelt keyword", lambda: cc.simulate(tpp=2), ConfigError,
     "unknown workload option 'tpp' (did you mean 'tp'?)"),
    ("Workload a misspelt keyword", lambda: cc.Workload(tpp=2), ConfigError,
     "unknown workload option 'tpp' (did you mean 'tp'?)"),
    ("plan exact a word", lambda: cc.plan(exact="yes"), ConfigError, "exact must be true or false, got 'yes'"),
    ("search NaN simulations", lambda: cc.search(max_simulations=NAN), ConfigError,
     "max_simulations must be an integer, got nan"),
    ("search unknown constraint", lambda: cc.search(constraints={"tpp": 2}), ConfigError,
     "constraints: unknown ParallelConfig field 'tpp' (did you mean 'tp'?)"),
    ("search constraints a list", lambda: cc.search(constraints=[("tp", 2)]), ConfigError,
     "constraints: expected a mapping"),
    ("validate a number", lambda: cc.validate(3), ConfigError, "expected the path of a runs file or 'published'"),
    ("validate jobs 0", lambda: cc.validate(only=["torchtitan-llama3.1-8b-fsdp-h100x8"], jobs=0), ConfigError,
     "jobs must be an integer >= 1, got 0"),
    ("validate unknown subset", lambda: cc.validate(subset="train"), ConfigError, "subset must be one of"),
    ("reproduce names as numbers", lambda: cc.reproduce([1, 2]), ConfigError,
     "papers: expected a name or a list of names"),
    ("read_config_file None", lambda: read_config_file(None), ConfigError, "expected the path of a config file"),
]


@pytest.mark.parametrize("call,error,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_on_a_direct_call_is_one_clear_error(call, error, words):
    with pytest.raises(CCOverlapError) as e:
        call()
    assert isinstance(e.value, error), (type(e.value).__name__, str(e.value))
    msg = str(e.value)
    assert words in msg, msg
    assert "\n" not in msg and len(msg) < 600, msg


def test_a_lone_name_is_a_list_of_one():
    """Where a list of names goes, one name is that name (not its letters)."""
    with pytest.raises(ConfigError, match=r"unknown paper\(s\) nope;"):
        cc.reproduce("nope")
    with pytest.raises(ConfigError, match=r"no run named 'nope'"):
        cc.validate(only="nope")


def test_numpy_scalars_are_numbers():
    """A degree or size read from an array is the number it holds."""
    p = ParallelConfig(tp=np.int64(2), dp=np.int64(4))
    assert p.world_size == 8
    assert CollectiveSpec(collective="all_reduce", bytes=np.float64(1e6), group=DP8).bytes == 1e6
    with pytest.raises(ConfigError, match="tp must be an integer, got np.float64"):
        ParallelConfig(tp=np.float64(2.5))


def test_the_checks_leave_good_calls_alone():
    """The same functions with good input give finite, positive answers."""
    mem = estimate_memory(MIX, ParallelConfig(tp=2, dp=4, ep=4, sequence_parallel=True), B8, H100)
    assert mem.total_bytes > 0 and math.isfinite(mem.total_bytes)
    assert lab(L8, ParallelConfig(tp=2), 1, 4096, 31) > 0
    assert gemm_time_s(GemmSpec(m=4096, n=4096, k=4096), GPU, sms_available=66) > 0
    assert collective_time_s(CollectiveSpec(collective="all_reduce", bytes=2**20, group=DP8), H100) > 0
    assert get_cluster("dgx-h100", nodes=2).world_size == 16
    assert ficco_heuristic.choose_schedule(8192, 8192, 8192, 8, 2, peak_flops=1e15, mem_bw_bytes_per_s=3e12)[0]
