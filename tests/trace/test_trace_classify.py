"""Classification of kernels and collectives, and the joins that find a kernel's collective args."""

from __future__ import annotations

import pytest
from trace_synth import kernel, nccl, trace, write

from ccoverlap.trace.analyze import analyze
from ccoverlap.trace.classify import canonical_collective, collective_info, dtype_bytes, kernel_kind


@pytest.mark.parametrize("name,kind", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "comm"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("void rcclKernel_AllReduce(...)", "comm"),
    ("rccl_main_kernel", "comm"),
    ("Memcpy DtoD (Device -> Device)", "memcpy"),
    ("Memset (Device)", "memcpy"),
    ("hipMemcpyWithStream", "memcpy"),
    ("Stream Wait Event", "other"),
    ("Context Sync", "other"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(Params)", "compute"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "compute"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "compute"),
])
def test_kernel_kind(name, kind):
    assert kernel_kind(name) == kind


def test_memcpy_category_wins_over_name():
    assert kernel_kind("anything", "gpu_memset") == "memcpy"
    assert kernel_kind("anything", "cuda_sync") == "other"


@pytest.mark.parametrize("text,canon", [
    ("allreduce", "all_reduce"), ("nccl:all_reduce", "all_reduce"), ("AllReduce", "all_reduce"),
    ("_allgather_base", "all_gather"), ("all_gather_into_tensor_coalesced", "all_gather"),
    ("reduce_scatter_tensor", "reduce_scatter"), ("_reduce_scatter_base", "reduce_scatter"),
    ("ReduceScatter", "reduce_scatter"), ("alltoall_base", "all_to_all"), ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"), ("Reduce", "reduce"), ("SendRecv", "p2p"), ("send", "send"), ("recv", "recv"),
    ("barrier", "barrier"), ("Generic", "unknown"), ("whatever", "unknown"),
])
def test_canonical_collective(text, canon):
    assert canonical_collective(text) == canon


def test_dtype_bytes():
    assert dtype_bytes("Float") == 4 and dtype_bytes("c10::BFloat16") == 2 and dtype_bytes("BFloat16") == 2
    assert dtype_bytes("unsigned char") == 1 and dtype_bytes("Long") == 8 and dtype_bytes("nope") == 0


def test_collective_info_sizes_follow_nccl_tests():
    # all_gather: size = output; reduce_scatter: size = input
    ag = collective_info([{"Collective name": "_allgather_base", "In msg nelems": 1000, "Out msg nelems": 8000,
                           "dtype": "BFloat16", "Group size": 8, "Process Group Name": "3"}], [], "", {}, 8)
    assert (ag.collective, ag.bytes, ag.group, ag.group_size) == ("all_gather", 16000, "3", 8)
    rs = collective_info([{"Collective name": "reduce_scatter_tensor", "In msg nelems": 8000,
                           "Out msg nelems": 1000, "dtype": "Float"}], [], "", {"0": {"size": 8}}, 8)
    assert (rs.collective, rs.bytes, rs.group, rs.group_size) == ("reduce_scatter", 32000, "0", 8)
    # from the user annotation and Input Dims (older traces): all_gather input x group size
    old = collective_info([{"Input Dims": [[1024]], "Input type": ["float"]}], ["nccl:_all_gather_base"],
                          "ncclKernel_SendRecv_RING", {}, 4)
    assert (old.collective, old.bytes, old.group_size, old.source) == ("all_gather", 4 * 1024 * 4, 4, "op name")
    # nothing but the kernel name
    bare = collective_info([], [], "ncclKernel_Broadcast_RING_LL_Sum_int8_t", {}, 2)
    assert (bare.collective, bare.bytes, bare.source) == ("broadcast", 0, "kernel name")


def _ops_for(kind: str, launch_ts: float, ext: int):
    """record_param_comms + nccl:all_reduce around a launch (as PyTorch records them)."""
    rpc = {"name": "record_param_comms", "ts": launch_ts - 20, "dur": 60,
           "args": {"External id": ext, "Collective name": "allreduce", "In msg nelems": 1 << 20,
                    "Out msg nelems": 1 << 20, "dtype": "BFloat16", "Group size": 4,
                    "Process Group Name": "7"}}
    ann = {"name": "nccl:all_reduce", "cat": "user_annotation", "ts": launch_ts - 10, "dur": 30,
           "args": {"External id": ext + 1}}
    return [rpc, ann] if kind == "both" else [rpc]


def test_kernel_without_args_is_joined_to_record_param_comms_by_launch(tmp_path):
    k = nccl("all_reduce", 100, 50, launch=60, kernel_args=False)
    doc = trace([k, kernel("gemm", 0, 120)], rank=0, world=4, cpu_ops=_ops_for("both", 60, 500))
    a = analyze([write(doc, tmp_path / "r.json")])
    c = a.collectives[0]
    assert (c.collective, c.group, c.group_size, c.bytes_mean) == ("all_reduce", "7", 4, 2 * (1 << 20))


def test_kernel_joined_by_external_id(tmp_path):
    k = nccl("all_reduce", 100, 50, launch=False, kernel_args=False)
    k["args"]["External id"] = 900
    doc = trace([k], rank=0, world=4, cpu_ops=_ops_for("rpc", 10_000, 900))
    # the kernel's External id is overwritten by the builder; patch the event directly
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"]["External id"] = 900
    a = analyze([write(doc, tmp_path / "r.json")])
    assert a.collectives[0].group == "7" and a.collectives[0].bytes_mean == 2 * (1 << 20)


def test_kernel_args_take_precedence(tmp_path):
    doc = trace([nccl("reduce_scatter", 100, 50, nelems=4096, size=2, group="9", dtype="Float")], rank=0, world=2)
    a = analyze([write(doc, tmp_path / "r.json")])
    c = a.collectives[0]
    assert (c.collective, c.group, c.group_size, c.bytes_mean) == ("reduce_scatter", "9", 2, 4096 * 4)


def test_gloo_on_cpu_threads(tmp_path):
    """No GPU: gloo:* on the worker thread is communication, cpu_ops are compute, and ops
    nested inside a gloo collective on its thread belong to the collective."""
    ops = [
        {"name": "aten::mm", "ts": 0, "dur": 100, "tid": 1},
        {"name": "gloo:all_reduce", "cat": "user_annotation", "ts": 50, "dur": 100, "tid": 2,
         "args": {"Input Dims": [[256]], "Input type": ["float"]}},
        {"name": "aten::copy_", "ts": 60, "dur": 80, "tid": 2},           # inside the collective
        {"name": "c10d::allreduce_", "ts": 40, "dur": 5, "tid": 1},      # the enqueue, not compute
    ]
    doc = trace([], rank=0, world=2, cpu_ops=ops, extra_meta={"distributedInfo": {
        "backend": "gloo", "rank": 0, "world_size": 2,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]}})
    a = analyze([write(doc, tmp_path / "r.json")])
    m = a.metrics[0]
    assert a.ranks[0].mode == "cpu"
    assert m.compute_s == pytest.approx(100e-6) and m.comm_s == pytest.approx(100e-6)
    assert m.overlap_ratio == pytest.approx(0.5)
    c = a.collectives[0]
    assert (c.collective, c.group, c.group_size, c.bytes_mean) == ("all_reduce", "0", 2, 1024)
    assert any("no GPU events" in p for p in a.problems)
