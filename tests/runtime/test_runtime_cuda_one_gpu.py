"""The runtime's CUDA paths that one GPU can check: CUDA tensors through
every schedule and both engines with a one-rank NCCL group, and PyTorch's symmetric-memory
availability check on that group. What needs two GPUs (real transfers between ranks) is in
test_runtime_cuda.py and skipped on one GPU. Skipped without CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _one_rank_worker(rank, world, engine):
    from ccoverlap.runtime import ALL_SCHEDULES, all_gather_matmul, matmul_reduce_scatter

    dev = torch.device("cuda", rank)
    out = {}
    for sched in ALL_SCHEDULES:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(16, 32, generator=g)
        w = torch.randn(24, 32, generator=g)
        xd = x.to(dev).requires_grad_()
        wd = w.to(dev).requires_grad_()
        y = all_gather_matmul(xd, wd, schedule=sched, comm_engine=engine)
        (y * y).sum().backward()
        ref = x @ w.t()
        z = matmul_reduce_scatter(x.to(dev), w.to(dev), schedule=sched, comm_engine=engine)
        torch.cuda.synchronize(dev)
        out[sched] = (y.is_cuda and torch.allclose(y.cpu(), ref, rtol=1e-3, atol=1e-3),
                      torch.allclose(wd.grad.cpu(), 2 * (ref.t() @ x), rtol=1e-3, atol=1e-2),
                      z.is_cuda and torch.allclose(z.cpu(), ref, rtol=1e-3, atol=1e-3))
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", ["sm", "dma"])
def test_every_schedule_on_cuda_with_a_one_rank_nccl_group(engine):
    from ccoverlap.runtime.launch import spawn

    torch.backends.cuda.matmul.allow_tf32 = False
    (res,) = spawn(_one_rank_worker, 1, (engine,), backend="nccl", timeout_s=500)
    bad = {s: oks for s, oks in res.items() if not all(oks)}
    assert not bad, f"(fwd, dW, reduce-scatter) wrong for {bad}"


def _symm_worker(rank, world):
    from ccoverlap.runtime.cuda import dma_available

    try:
        import torch.distributed._symmetric_memory  # noqa: F401
        has = True
    except ImportError:
        has = False
    ok, why = dma_available(torch.zeros(4, device=torch.device("cuda", rank)), None)
    return {"has_symm_mem": has, "ok": ok, "why": why}


@pytest.mark.timeout(300)
def test_symmetric_memory_check_on_a_one_rank_nccl_group():
    from ccoverlap.runtime.launch import spawn

    (r,) = spawn(_symm_worker, 1, backend="nccl", timeout_s=240)
    print(f"symmetric memory: {r}")
    assert r["why"]
    # one rank on one node with one GPU: the only thing that can be missing is torch's support
    assert r["ok"] == r["has_symm_mem"], r
