"""Differentiable overlapped ops: all-gather + GEMM and GEMM + reduce-scatter.

Convention (as ``torch.nn.Linear``): ``weight`` is ``[out_features, in_features]`` and the
GEMM is ``x @ weight.T``.

* :func:`all_gather_matmul` - ``y = AllGather_0(x_shard) @ weight.T``: the sequence-parallel
  input of a column-parallel linear (Megatron SP; FiCCO §II-B, Fig. 3).
* :func:`matmul_reduce_scatter` - ``y = ReduceScatter_0(x @ weight.T)``: the output of a
  row-parallel linear, reduce-scattered back to sequence-parallel shards.

Each is the other's backward, and both directions run the chosen overlap schedule
(:mod:`ccoverlap.runtime.schedules`):

* backward of all-gather + GEMM: ``dx_shard = ReduceScatter_0(dy @ W)`` (a GEMM +
  reduce-scatter) and ``dW = dy.T @ AllGather(x)`` (local; computed while the last
  reduce-scatter transfer is in flight; the gathered input is kept from the forward);
* backward of GEMM + reduce-scatter: ``dy_full = AllGather_0(dy)`` overlapped with
  ``dx = dy_full @ W`` (an all-gather + GEMM), then ``dW = dy_full.T @ x``.

``schedule="auto"`` and ``"tune"`` are resolved separately for the forward and the backward
GEMM (their shapes differ); see :mod:`ccoverlap.runtime.tuning`.

Legal shapes (checked across ranks, see :mod:`ccoverlap.runtime.checks`):
all-gather + GEMM needs the same ``x_shard`` shape on every rank (as ``all_gather`` does);
the weights may differ in ``out_features`` per rank unless the schedule is auto/tune.
GEMM + reduce-scatter needs the same ``x.shape[:-1]`` and ``out_features`` on every rank and
``x.shape[0]`` divisible by the number of ranks; ``in_features`` may differ per rank (an
uneven K split) unless the schedule is auto/tune. Row counts need not divide the number of
FiCCO pieces. Every rank must pass the same ``schedule``.
"""

from __future__ import annotations

import warnings

import torch

from ccoverlap.runtime import checks, comm
from ccoverlap.runtime.schedules import SCHEDULES, ag_matmul, matmul_rs
from ccoverlap.runtime.tuning import resolve

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "ALL_SCHEDULES", "COMM_ENGINES"]

#: Every accepted ``schedule=`` value.
ALL_SCHEDULES = (*SCHEDULES, "auto", "tune")
#: ``"sm"``: the c10d backend's own kernels/threads (NCCL, gloo); ``"dma"``: CUDA copy engines.
COMM_ENGINES = ("sm", "dma")

_warned: set[str] = set()


def _transport(comm_engine: str, tensor: torch.Tensor, group):
    if comm_engine not in COMM_ENGINES:
        raise ValueError(f"comm_engine must be one of {COMM_ENGINES}, got {comm_engine!r}")
    if comm_engine == "sm":
        return None
    from ccoverlap.runtime import cuda

    ok, why = cuda.dma_available(tensor, group)
    if not ok:
        if why not in _warned:
            _warned.add(why)
            warnings.warn(f"comm_engine='dma' unavailable ({why}); using the c10d transport", stacklevel=3)
        return None
    return cuda.SymmMemTransport


def _check_schedule(schedule: str) -> int:
    if schedule not in ALL_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {ALL_SCHEDULES}")
    return ALL_SCHEDULES.index(schedule)


def _local_linear_checks(t: checks.Table, r: int) -> str | None:
    xs, ws = t.shape("x", r), t.shape("weight", r)
    if len(xs) < 2:
        return f"x must have at least 2 dims [rows, ..., in_features], got shape {xs}"
    if len(ws) != 2:
        return f"weight must be 2-D [out_features, in_features], got shape {ws}"
    if xs[-1] != ws[1]:
        return f"x.shape[-1]={xs[-1]} (K) does not match weight.shape[1]={ws[1]} (in_features)"
    return None


_SAME_SCHEDULE = checks.per_rank(
    lambda t, r: None
    if t.ints("schedule")[r] == t.ints("schedule")[0]
    else f"schedule={ALL_SCHEDULES[t.ints('schedule')[r]]!r} but rank 0 has {ALL_SCHEDULES[t.ints('schedule')[0]]!r}"
)


def _weights_equal_if_adaptive(t: checks.Table) -> str | None:
    if ALL_SCHEDULES[t.ints("schedule")[0]] in ("auto", "tune"):
        return checks.same_across_ranks("weight", "weight shape (required by schedule auto/tune)")(t)
    return None


class _AllGatherMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, group, schedule, comm_engine):
        b = weight.t()
        decision = resolve("ag", x2d, b, group, schedule, comm_engine=comm_engine)
        tx = _transport(comm_engine, x2d, group)
        out, x_full = ag_matmul(x2d, b, group, decision.schedule, need_full=weight.requires_grad, transport=tx)
        ctx.save_for_backward(x_full, weight)
        ctx.group, ctx.schedule, ctx.comm_engine = group, schedule, comm_engine
        return out

    @staticmethod
    def backward(ctx, dy):
        x_full, weight = ctx.saved_tensors
        dy = dy.contiguous()
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dw = [None]

        def wgrad():
            if need_w:
                dw[0] = dy.t() @ x_full  # [n, P*m] @ [P*m, k]

        dx = None
        if need_x:
            decision = resolve("rs", dy, weight, ctx.group, ctx.schedule)
            dx = matmul_rs(dy, weight, ctx.group, decision.schedule, overlap=wgrad)
        else:
            wgrad()
        return dx, dw[0], None, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, group, schedule, comm_engine):
        b = weight.t()
        decision = resolve("rs", x2d, b, group, schedule, comm_engine=comm_engine)
        out = matmul_rs(x2d, b, group, decision.schedule)
        ctx.save_for_backward(x2d if weight.requires_grad else None, weight)
        ctx.group, ctx.schedule, ctx.comm_engine = group, schedule, comm_engine
        return out

    @staticmethod
    def backward(ctx, dy):
        x2d, weight = ctx.saved_tensors
        dy = dy.contiguous()
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = dw = None
        if need_x:
            decision = resolve("ag", dy, weight, ctx.group, ctx.schedule, comm_engine=ctx.comm_engine)
            tx = _transport(ctx.comm_engine, dy, ctx.group)
            dx, dy_full = ag_matmul(dy, weight, ctx.group, decision.schedule, need_full=need_w, transport=tx)
        elif need_w:
            p = comm.group_size(ctx.group)
            dy_full = torch.empty(p * dy.shape[0], dy.shape[1], dtype=dy.dtype, device=dy.device)
            comm.all_gather_into(dy_full, dy, group=ctx.group, async_op=False)
        if need_w:
            dw = dy_full.t() @ x2d  # [n, M] @ [M, k]
        return dx, dw, None, None, None


def all_gather_matmul(
    x_shard: torch.Tensor,
    weight: torch.Tensor,
    group=None,
    *,
    schedule: str = "auto",
    comm_engine: str = "sm",
    check_shapes: str | None = None,
) -> torch.Tensor:
    """All-gather ``x_shard`` along dim 0 over ``group``, then multiply by ``weight.T``; differentiable.

    ``x_shard``: ``[m, ..., K]`` (this rank's dim-0 shard; same shape on every rank);
    ``weight``: ``[N, K]`` (nn.Linear layout). Returns ``[P*m, ..., N]`` where rows
    ``r*m:(r+1)*m`` come from rank r's shard. Units: elements; no scaling.
    ``schedule``: one of :data:`ALL_SCHEDULES` (FiCCO §V-B schedules, shard-level ``ring`` as
    PyTorch async-TP, ``serial`` baseline, ``auto`` = FiCCO §V-C heuristic, ``tune`` = timed
    on the live backend). ``comm_engine``: ``"sm"`` (c10d) or ``"dma"`` (CUDA copy engines via
    symmetric memory, FiCCO §IV-B1; falls back to ``"sm"`` with a warning where unavailable).
    ``check_shapes``: ``"always"``/``"first"``/``"never"`` (default: the process policy).
    Backward: dx by GEMM + reduce-scatter under the same schedule, dW overlapped with it.
    """
    sched_id = _check_schedule(schedule)
    checks.agree(
        "all_gather_matmul",
        group,
        {"x": x_shard, "weight": weight},
        ints={"schedule": sched_id},
        rules=[
            _SAME_SCHEDULE,
            checks.per_rank(_local_linear_checks),
            checks.same_dtype("x", "weight"),
            checks.same_across_ranks("x", "x_shard shape (all-gather needs equal shards)"),
            _weights_equal_if_adaptive,
        ],
        mode=check_shapes,
    )
    k = x_shard.shape[-1]
    x2d = x_shard.reshape(-1, k)
    out = _AllGatherMatmul.apply(x2d, weight, group, schedule, comm_engine)
    p = comm.group_size(group)
    return out.view(p * x_shard.shape[0], *x_shard.shape[1:-1], weight.shape[0])


def matmul_reduce_scatter(
    x: torch.Tensor,
    weight: torch.Tensor,
    group=None,
    *,
    schedule: str = "auto",
    comm_engine: str = "sm",
    check_shapes: str | None = None,
) -> torch.Tensor:
    """Multiply ``x`` by ``weight.T``, then reduce-scatter the result along dim 0 over ``group``; differentiable.

    ``x``: ``[M, ..., K_r]`` (full rows, this rank's slice of the reduction dim);
    ``weight``: ``[N, K_r]``. Returns this rank's ``[M/P, ..., N]`` block of
    ``sum_ranks(x @ weight.T)``. ``M`` must be divisible by the number of ranks.
    ``schedule``/``comm_engine``/``check_shapes`` as in :func:`all_gather_matmul` (the DMA
    engine applies to the all-gather of the backward only: copy engines cannot reduce).
    """
    sched_id = _check_schedule(schedule)
    p = comm.group_size(group)
    checks.agree(
        "matmul_reduce_scatter",
        group,
        {"x": x, "weight": weight},
        ints={"schedule": sched_id},
        rules=[
            _SAME_SCHEDULE,
            checks.per_rank(_local_linear_checks),
            checks.same_dtype("x", "weight"),
            checks.same_across_ranks("x", "x.shape[:-1] (rows to reduce-scatter)", lambda s: s[:-1]),
            checks.same_across_ranks("weight", "weight.shape[0] (out_features)", lambda s: s[:1]),
            checks.per_rank(
                lambda t, r: None
                if t.shape("x", r)[0] % t.world_size == 0
                else f"x.shape[0]={t.shape('x', r)[0]} is not divisible by the {t.world_size} ranks "
                "(reduce-scatter gives every rank an equal block)"
            ),
            _weights_equal_if_adaptive,
        ],
        mode=check_shapes,
    )
    k = x.shape[-1]
    x2d = x.reshape(-1, k)
    out = _MatmulReduceScatter.apply(x2d, weight, group, schedule, comm_engine)
    return out.view(x.shape[0] // p, *x.shape[1:-1], weight.shape[0])
