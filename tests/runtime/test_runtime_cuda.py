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
