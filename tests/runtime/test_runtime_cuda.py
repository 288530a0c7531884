"""CUDA paths: NCCL schedules, the copy-engine (symmetric-memory) transport, the device table.

Skipped without CUDA; the multi-rank tests also need two GPUs (one rank per GPU).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)


@needs_cuda
@pytest.mark.gpu
def test_machine_table_knows_this_gpu_or_says_so():
    from ccoverlap.runtime.machine import GPU_TABLE, UNKNOWN_GPU, machine_for

    spec = machine_for(torch.device("cuda", 0))
    name = torch.cuda.get_device_name(0)
    known = any(k.lower() in name.lower() for k in GPU_TABLE)
    assert spec is not UNKNOWN_GPU or not known
    assert spec.peak_flops(torch.bfloat16) >= spec.peak_flops(torch.float32) > 0
    assert spec.mem_bw_bytes_per_s > 1e11


def _nccl_worker(rank, world, engine):
    from ccoverlap.runtime import ALL_SCHEDULES, all_gather_matmul, matmul_reduce_scatter

    dev = torch.device("cuda", rank)
    out = {}
    for sched in ALL_SCHEDULES:
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(6, 16, generator=g) for _ in range(world)]
        w = torch.randn(12, 16, generator=g)
        x = xs[rank].to(dev).requires_grad_()
        wd = w.to(dev).requires_grad_()
        y = all_gather_matmul(x, wd, schedule=sched, comm_engine=engine)
        ref = torch.cat(xs) @ w.t()
        (y * y).sum().backward()
        ok_fwd = torch.allclose(y.cpu(), ref, rtol=1e-3, atol=1e-3)
        ref_dw = 2 * (ref.t() @ torch.cat(xs))
        ok_dw = torch.allclose(wd.grad.cpu(), ref_dw, rtol=1e-3, atol=1e-2)
        xr = torch.cat(xs).to(dev)
        z = matmul_reduce_scatter(xr, wd.detach(), schedule=sched, comm_engine=engine)
        ok_rs = torch.allclose(z.cpu(), (world * (torch.cat(xs) @ w.t()))[rank * 6 : rank * 6 + 6], rtol=1e-3, atol=1e-3)
        out[sched] = (ok_fwd, ok_dw, ok_rs)
    return out


@needs_two_gpus
@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", ["sm", "dma"])
def test_nccl_schedules_match_reference(engine):
    from ccoverlap.runtime.launch import spawn

    torch.backends.cuda.matmul.allow_tf32 = False
    res = spawn(_nccl_worker, 2, (engine,), backend="nccl", timeout_s=500)
    for rank, r in enumerate(res):
        for sched, oks in r.items():
            assert all(oks), f"rank {rank} schedule {sched} engine {engine}: (fwd, dW, rs) = {oks}"


@needs_cuda
@pytest.mark.gpu
def test_side_stream_is_cached_and_not_current():
    from ccoverlap.runtime.cuda import side_stream

    dev = torch.device("cuda", 0)
    s1, s2 = side_stream(dev), side_stream(dev)
    assert s1 is s2
    assert s1 != torch.cuda.current_stream(dev)


def _dma_fixes_worker(rank, world):
    """Runs on 2 GPUs: pool reuse across shapes, contiguous 2-D pulls, per-piece NCCL works, agreed engine."""
    from ccoverlap.runtime import all_gather_matmul, comm, cuda

    dev = torch.device("cuda", rank)
    out = {}
    ok = True
    for m in (8, 4, 8, 6):  # several shapes: one pool entry per (group, device), grown at most as needed
        g = torch.Generator().manual_seed(m)
        xs = [torch.randn(m, 12, generator=g) for _ in range(world)]
        w = torch.randn(5, 12, generator=g)
        for sched in ("uniform-fused-2d", "hetero-unfused-1d"):
            y = all_gather_matmul(xs[rank].to(dev), w.to(dev), schedule=sched, comm_engine="dma")
            ok &= bool(torch.allclose(y.cpu(), torch.cat(xs) @ w.t(), rtol=1e-3, atol=1e-3))
    out["correct"] = ok
    out["pool_entries"] = sum(len(p) for p in cuda._pools.values())
    out["pool_allocations"] = sum(p.allocations for p in cuda._pools.values())
    # a 2-D transport pulls contiguous blocks (so copy_ is a copy-engine memcpy, not an SM kernel)
    shard = torch.randn(4, 6, device=dev)
    tx = cuda.SymmMemTransport.create(shard, None, "uniform-fused-2d")
    out["blocks_contiguous"] = all(
        tx._peer_region(1 - rank, (slice(None), slice(off, off + sz))).is_contiguous()
        for off, sz, _ in cuda.col_block_offsets(4, 6, world)
    )
    tx.close()
    # NCCL coalesces a batch into one Work: per-recv exchanges must give one work per piece
    a = torch.full((3,), float(rank), device=dev)
    b = torch.empty(3, device=dev)
    _h, per = comm.exchange([(1 - rank, a)], [(1 - rank, b)], per_recv=True)
    for h in per:
        h.wait()
    torch.cuda.synchronize(dev)
    out["p2p_value_ok"] = bool(torch.all(b.cpu() == float(1 - rank)))
    return out


@needs_two_gpus
@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_dma_transport_fixes_on_two_gpus():
    from ccoverlap.runtime.launch import spawn

    torch.backends.cuda.matmul.allow_tf32 = False
    for rank, r in enumerate(spawn(_dma_fixes_worker, 2, backend="nccl", timeout_s=500)):
        assert r["correct"], r
        assert r["pool_entries"] == 1 and r["pool_allocations"] <= 2, r  # grown once at most, never per shape
        assert r["blocks_contiguous"], r
        assert r["p2p_value_ok"], r


@needs_cuda
@pytest.mark.gpu
def test_dma_needs_nccl_group():
    import torch.distributed as dist

    from ccoverlap.runtime.cuda import dma_available
    from ccoverlap.runtime.launch import free_port

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ok, why = dma_available(torch.zeros(2, device="cuda"), None)
        assert not ok and "NCCL" in why
    finally:
        dist.destroy_process_group()


@needs_two_gpus
@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_bench_symmetric_memory_and_dtensor_rows_on_gpus(capsys):
    import json

    from ccoverlap.cli import main

    code = main(["bench", "--m", "1024", "--n", "256", "--k", "512", "--iters", "3", "--warmup", "1", "--json",
                 "--nproc", "2", "--schedules", "ring,tune"])
    out = capsys.readouterr().out
    assert code == 0
    res = json.loads(out)
    names = {r["schedule"] for r in res["results"]}
    assert "(DTensor TP)" in names
    assert "(symm-mem fused)" in names or "(symm-mem fused)" in res["skipped_rows"]


@needs_two_gpus
@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_plan_bench_on_gpus_has_torch_ours_and_async_tp_rows():
    """The plan benchmark on NCCL: torch's styles, ours (bf16) and PyTorch's async TP (or the reason it cannot run)."""
    from ccoverlap.runtime.plan_bench import PlanBenchConfig, PlanShape, bench

    cfg = PlanBenchConfig(workload="block", reps=3, warmup=1, dtype="bfloat16", dims=PlanShape(2, 256, 256, 8, 1024),
                          rows=("torch", "ccoverlap", "async-tp"))
    res = bench(cfg, 2, backend="nccl")
    rows = {r["row"]: r for r in res["rows"]}
    assert res["backend"] == "nccl" and {"torch", "ccoverlap"} <= set(rows)
    assert "async-tp" in rows or res["skipped_rows"]["async-tp"]
    for r in rows.values():
        assert r["first_step_value"] == pytest.approx(rows["torch"]["first_step_value"], rel=2e-2)


def test_plan_bench_async_tp_row_is_skipped_with_a_reason_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    from ccoverlap.runtime.plan_bench import PlanBenchConfig, PlanShape, _async_tp_row

    class _CpuMesh:
        device_type = "cpu"

    mod, why = _async_tp_row(PlanBenchConfig(dims=PlanShape(1, 4, 8, 2, 8)), None, _CpuMesh(), {})
    assert mod is None and "CUDA" in why
