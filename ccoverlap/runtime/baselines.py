"""PyTorch's own ways to run the same collective + GEMM, as baselines for ``ccoverlap bench``.

* :func:`dtensor_tp_baseline`: DTensor tensor parallelism, the way a torch TP user writes it:
  an ``nn.Linear`` parallelized by ``parallelize_module`` with ``ColwiseParallel`` (sequence
  sharded input, ``input_layouts=Shard(0)``: DTensor all-gathers, then one GEMM) for
  ``all_gather_matmul``, or ``RowwiseParallel(output_layouts=Shard(0))`` (GEMM, then DTensor
  reduce-scatters) for ``matmul_reduce_scatter``. No overlap: this is what ccoverlap's
  schedules must beat to be worth adopting.
* :func:`symm_mem_baseline`: on CUDA, PyTorch's symmetric-memory fused ops
  (``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, the
  async-TP kernels), where this torch build has them.

Each returns ``(callable, None)`` or ``(None, reason it cannot run here)``. The callables run
one call (forward, or forward + backward with ``backward=True``) on this rank; they are
collective, like the ops they stand for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["dtensor_tp_baseline", "symm_mem_baseline"]


def dtensor_tp_baseline(
    op: str, x: torch.Tensor, w: torch.Tensor, world: int, device: torch.device, *, backward: bool = False
) -> tuple[Callable[[], object] | None, str | None]:
    """DTensor TP doing what ``op`` does on ccoverlap's bench shapes (see module doc).

    ``x``/``w`` are the bench's per-rank tensors (``all_gather_matmul``: ``x`` ``[M/P, K]``,
    ``w`` ``[N, K]``; ``matmul_reduce_scatter``: ``x`` ``[M, K]``, ``w`` ``[N, K]`` = this
    rank's K slice). The local weight shard is the same tensor as ``w``.
    """
    try:
        from torch import nn
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    except ImportError as exc:  # pragma: no cover - old torch
        return None, f"this torch has no DTensor TP ({exc})"
    mesh = init_device_mesh(device.type, (world,))
    n, k = w.shape
    with torch.no_grad():
        if op == "all_gather_matmul":
            lin = nn.Linear(k, n * world, bias=False, device=device, dtype=w.dtype)
            parallelize_module(lin, mesh, ColwiseParallel(input_layouts=Shard(0)))
        elif op == "matmul_reduce_scatter":
            lin = nn.Linear(k * world, n, bias=False, device=device, dtype=w.dtype)
            parallelize_module(lin, mesh, RowwiseParallel(output_layouts=Shard(0)))
        else:
            return None, f"no DTensor TP equivalent of {op}"
        cast("DTensor", lin.weight).to_local().copy_(w.detach())  # parallelize_module made it a DTensor
    lin.weight.requires_grad_(backward)
    xin = x.detach().clone().requires_grad_(backward)

    def run() -> torch.Tensor:
        y = lin(xin)
        if backward:
            y.backward(torch.ones_like(y))
        return y

    return run, None


def symm_mem_baseline(
    op: str, x: torch.Tensor, w: torch.Tensor, world: int, device: torch.device, *, backward: bool = False
) -> tuple[Callable[[], object] | None, str | None]:
    """PyTorch's fused symmetric-memory all-gather-matmul / matmul-reduce-scatter (CUDA only).

    Forward only (the fused ops have no autograd); with ``backward=True`` it is not run.
    """
    if device.type != "cuda":
        return None, "needs CUDA"
    if backward:
        return None, "forward only (the fused symmetric-memory ops have no autograd)"
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as exc:
        return None, f"this torch has no symmetric memory ({exc})"
    ops = getattr(torch.ops, "symm_mem", None)
    name = "fused_all_gather_matmul" if op == "all_gather_matmul" else "fused_matmul_reduce_scatter"
    if ops is None or not hasattr(ops, name):
        return None, f"this torch has no torch.ops.symm_mem.{name}"
    world_group = dist.group.WORLD
    if world_group is None:
        return None, "no default process group"
    group_name = world_group.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        try:
            enable(group_name)
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed
            return None, f"enable_symm_mem_for_group failed: {exc}"
    xin, b = x.detach().contiguous(), w.detach().t()
    fn = getattr(ops, name)
    if op == "all_gather_matmul":
        return (lambda: fn(xin, [b], gather_dim=0, group_name=group_name)), None
    return (lambda: fn(xin, b, "sum", scatter_dim=0, group_name=group_name)), None
