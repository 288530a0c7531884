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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ccoverlap.errors import ConfigError
from ccoverlap.runtime import checks, comm
from ccoverlap.runtime.blocks import gathered_shape, gemm_operand, rank_blocks, weight_grad
from ccoverlap.runtime.schedules import SCHEDULES, ag_matmul, matmul_rs
from ccoverlap.runtime.tuning import decision_engine, is_decided, register_op, resolve

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from ccoverlap.runtime.cuda import SymmMemTransport

__all__ = [
    "all_gather_matmul", "matmul_reduce_scatter", "check_call", "check_schedule", "agreed_engine", "ALL_SCHEDULES",
    "COMM_ENGINES",
]  # fmt: skip

#: Every accepted ``schedule=`` value.
ALL_SCHEDULES = (*SCHEDULES, "auto", "tune")
#: ``"sm"``: the c10d backend's own kernels/threads (NCCL, gloo); ``"dma"``: CUDA copy engines.
COMM_ENGINES = ("sm", "dma")

_warned: set[str] = set()


def _transport(engine: str) -> type[SymmMemTransport] | None:
    """The transport class for an *agreed* engine (``"dma"`` only after :func:`agreed_engine`)."""
    if engine == "sm":
        return None
    from ccoverlap.runtime import cuda

    return cuda.SymmMemTransport


def _check_engine(comm_engine: str) -> int:
    if comm_engine not in COMM_ENGINES:
        raise ValueError(f"comm_engine must be one of {COMM_ENGINES}, got {comm_engine!r}")
    return COMM_ENGINES.index(comm_engine)


def _dma_ok(comm_engine: str, tensor: torch.Tensor, group: ProcessGroup | None) -> tuple[int, str]:
    """This rank's local answer to "can the copy-engine transport serve this call?" (1/0, reason)."""
    if comm_engine != "dma":
        return 0, "not requested"
    from ccoverlap.runtime import cuda

    ok, why = cuda.dma_available(tensor, group)
    return int(ok), why


def agreed_engine(requested: Sequence[int], available: Sequence[int]) -> tuple[str, str]:
    """The comm engine every rank uses, from every rank's request and local DMA availability.

    ``requested[r]`` is rank r's index into :data:`COMM_ENGINES` (the check has already
    made them equal), ``available[r]`` 1 when rank r can run the copy-engine transport.
    DMA is used only when *every* rank asked for it and can run it; otherwise every rank
    uses the c10d transport (a rank pulling from symmetric memory while its peer waits in
    NCCL would deadlock). Returns ``(engine, reason)``; pure function, the same on every rank.
    """
    if COMM_ENGINES[requested[0]] != "dma":
        return "sm", "requested"
    missing = [r for r, ok in enumerate(available) if not ok]
    if missing:
        return "sm", f"comm_engine='dma' unavailable on rank(s) {missing}; every rank uses the c10d transport"
    return "dma", "every rank can use the copy engines"


def _warn_once(why: str) -> None:
    if why not in _warned:
        _warned.add(why)
        warnings.warn(why, stacklevel=4)


def _local_engine(comm_engine: str, tensor: torch.Tensor, group: ProcessGroup | None) -> str:
    """Engine when the check is skipped (policy "never"/"first"): this rank's own answer."""
    ok, why = _dma_ok(comm_engine, tensor, group)
    if comm_engine == "dma" and not ok:
        _warn_once(f"comm_engine='dma' unavailable ({why}); using the c10d transport")
        return "sm"
    return comm_engine


def check_schedule(schedule: str) -> int:
    """The index of ``schedule`` in :data:`ALL_SCHEDULES` (what the cross-rank check sends).

    The one check of a ``schedule=`` argument: the ops, the tensor-parallel styles of
    :mod:`ccoverlap.runtime.tp` and the layers of :mod:`ccoverlap.runtime.layers` call it when
    they are given one. Raises :class:`~ccoverlap.errors.ConfigError` (a ``ValueError``)
    naming the accepted values otherwise.
    """
    if schedule not in ALL_SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(ALL_SCHEDULES)}; got {schedule!r}")
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


def _weights_equal_if_adaptive(t: checks.Table) -> str | None:
    if ALL_SCHEDULES[t.ints("schedule")[0]] in ("auto", "tune"):
        return checks.same_across_ranks("weight", "weight shape (required by schedule auto/tune)")(t)
    return None


_COMMON_RULES = [
    checks.same_int("schedule", lambda v: repr(ALL_SCHEDULES[v]) if 0 <= v < len(ALL_SCHEDULES) else v),
    checks.same_int("engine", lambda v: repr(COMM_ENGINES[v]) if 0 <= v < len(COMM_ENGINES) else v, "comm_engine"),
    checks.same_int("dim", what="sequence dim"),
]
#: Checked after every shape and dtype rule: a shape that differs on one rank also makes
#: "is this shape's auto/tune decision cached?" differ, and the shape is the real cause.
_CACHE_RULE = checks.same_int(
    "decided", lambda v: "cached" if v else "not cached",
    "auto/tune decision for this shape (call clear_tuning_cache on every rank or none)",
)  # fmt: skip


def check_call(
    op: str, x: torch.Tensor, weight: torch.Tensor, group: ProcessGroup | None, schedule: str, comm_engine: str,
    dim: int, mode: str | None,
) -> str:
    """Cross-rank check of one ``all_gather_matmul``/``matmul_reduce_scatter`` call; returns the agreed engine.

    Every rank all-gathers a 64-integer descriptor (op, shapes, dtypes, schedule, engine,
    sequence dim, local DMA availability, whether an auto/tune decision is cached) and runs
    the same rules on the same table, so either all ranks proceed or all raise
    :class:`~ccoverlap.runtime.checks.ShapeMismatchError` with one message. Collective
    (unless the policy skips it; then the engine is this rank's own answer).
    """
    return start_check(op, x, weight, group, schedule, comm_engine, dim, mode)()


def start_check(
    op: str, x: torch.Tensor, weight: torch.Tensor, group: ProcessGroup | None, schedule: str, comm_engine: str,
    dim: int, mode: str | None,
) -> Callable[[], str]:
    """:func:`check_call` in two halves: starts the check, returns ``finish()`` (waits, raises or returns the engine).

    Local work may run between the two; no other collective may start on ``group`` before
    ``finish()`` has returned, and every rank must call it.
    """
    sched_id = check_schedule(schedule)
    eng_id = _check_engine(comm_engine)
    dma_ok, _why = _dma_ok(comm_engine, x, group)
    kind = "ag" if op == "all_gather_matmul" else "rs"
    k = x.shape[-1] if x.dim() else 0
    rows = x.numel() // k if k else 0
    key_engine = decision_engine(kind, comm_engine)
    decided = int(schedule in ("auto", "tune") and weight.dim() == 2 and is_decided(
        kind, (rows, k), (weight.shape[1], weight.shape[0]), x.dtype, x.device, group, schedule, key_engine))
    rules = [*_COMMON_RULES, checks.per_rank(_local_linear_checks), checks.same_dtype("x", "weight")]
    if op == "all_gather_matmul":
        rules.append(checks.same_across_ranks("x", "x_shard shape (all-gather needs equal shards)"))
    else:
        rules += [
            checks.same_across_ranks("x", "x.shape[:-1] (rows to reduce-scatter)", lambda s: s[:-1]),
            checks.same_across_ranks("weight", "weight.shape[0] (out_features)", lambda s: s[:1]),
            checks.per_rank(
                lambda t, r: None
                if t.shape("x", r)[t.ints("dim")[r]] % t.world_size == 0
                else f"x.shape[{t.ints('dim')[r]}]={t.shape('x', r)[t.ints('dim')[r]]} is not divisible by the "
                f"{t.world_size} ranks (reduce-scatter gives every rank an equal block)"
            ),
        ]
    rules += [_weights_equal_if_adaptive, _CACHE_RULE]
    pending = checks.agree_start(
        op, group, {"x": x, "weight": weight},
        ints={"schedule": sched_id, "engine": eng_id, "dim": dim, "decided": decided, "dma_ok": dma_ok},
        rules=rules, mode=mode,
    )  # fmt: skip

    def finish() -> str:
        table = pending.result()
        if table is None:
            return _local_engine(comm_engine, x, group)
        engine, why = agreed_engine(table.ints("engine"), table.ints("dma_ok"))
        if comm_engine == "dma" and engine != "dma":
            _warn_once(why if "rank" in why else f"comm_engine='dma' unavailable ({_why}); using the c10d transport")
        return engine

    return finish


def _rs_locally_valid(x: torch.Tensor, weight: torch.Tensor, dim: int, p: int) -> bool:
    """Whether this rank's GEMM of a reduce-scatter call can run before the check has finished."""
    return (x.dim() >= 2 and weight.dim() == 2 and x.shape[-1] == weight.shape[1] and x.dtype == weight.dtype
            and x.device == weight.device and x.shape[dim] % p == 0)  # fmt: skip


def _norm_dim(x: torch.Tensor, dim: int, what: str) -> int:
    nd = x.dim()
    if not -nd <= dim < nd - 1 and nd >= 2:
        raise ValueError(f"{what}: dim={dim} must name a dimension other than the last (x has {nd} dims)")
    return dim % nd if nd else 0


def _concrete(
    kind: str, a: torch.Tensor, b: torch.Tensor, group: ProcessGroup | None, schedule: str, engine: str
) -> tuple[str, str]:
    """``(forward schedule, backward schedule)`` for a call: ``auto`` is one schedule for both
    directions (judged on forward + backward); ``tune`` times each direction's GEMM on its own,
    so the backward keeps ``"tune"`` and resolves with its own shapes."""
    if schedule not in ("auto", "tune"):
        return schedule, schedule
    fwd = resolve(kind, a, b, group, schedule, comm_engine=engine).schedule
    return fwd, (fwd if schedule == "auto" else "tune")


class _AllGatherMatmul(torch.autograd.Function):
    """``x_shard`` ``[..., m, ..., K]`` -> ``[..., P*m, ..., N]`` gathered along ``dim``; every GEMM writes and
    reads the batch-first blocks where they lie (:mod:`ccoverlap.runtime.blocks`)."""

    @staticmethod
    def forward(
        ctx: Any, x2d: torch.Tensor, weight: torch.Tensor, group: ProcessGroup | None, schedule: str,
        bwd_schedule: str, comm_engine: str, dim: int, shard_shape: torch.Size,
    ) -> torch.Tensor:
        p = comm.group_size(group)
        dt = torch.result_type(x2d, weight)
        y = torch.empty(gathered_shape(shard_shape, dim, p, weight.shape[0]), dtype=dt, device=x2d.device)
        out4 = rank_blocks(y, dim, p)  # [P, B, R, N]: rank j's rows of y, where they lie
        tx = _transport(comm_engine)
        _, x_full = ag_matmul(x2d, weight.t(), group, schedule, need_full=weight.requires_grad, transport=tx,
                              out=out4)  # fmt: skip
        ctx.save_for_backward(x_full, weight)
        ctx.group, ctx.schedule, ctx.dim, ctx.blocks = group, bwd_schedule, dim, out4.shape[:3]
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_full, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dy4 = gemm_operand(rank_blocks(dy, ctx.dim, comm.group_size(ctx.group)))  # [P, B, R, N]: rank j's rows of dy
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dw: list[torch.Tensor | None] = [None]

        def wgrad() -> None:
            if need_w:
                dw[0] = weight_grad(dy4, x_full.view(*ctx.blocks, x_full.shape[-1]))  # [n, P*m] @ [P*m, k]

        dx = None
        if need_x:
            sched = resolve("rs", dy.view(-1, dy.shape[-1]), weight, ctx.group, ctx.schedule).schedule
            dx = matmul_rs(dy4, weight, ctx.group, sched, overlap=wgrad)
        else:
            wgrad()
        return dx, dw[0], None, None, None, None, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    """``x`` ``[..., P*m, ..., K_r]`` -> this rank's ``[..., m, ..., N]`` of the sum, reduce-scattered along ``dim``;
    the GEMMs read and write the batch-first blocks where they lie (:mod:`ccoverlap.runtime.blocks`)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, group: ProcessGroup | None, schedule: str,
        bwd_schedule: str, gate: Callable[[], None] | None, engine: list[str | None], dim: int,
    ) -> torch.Tensor:
        p = comm.group_size(group)
        x4 = gemm_operand(rank_blocks(x, dim, p))  # [P, B, R, K_r]: rank j's rows of x (read twice: here and for dW)
        out = matmul_rs(x4, weight.t(), group, schedule, before_comm=gate)
        ctx.save_for_backward(x4 if weight.requires_grad else None, weight)
        ctx.group, ctx.schedule, ctx.comm_engine, ctx.dim = group, bwd_schedule, engine[0], dim
        ctx.x_shape = x.shape
        shard = list(x.shape[:-1]) + [weight.shape[0]]
        shard[dim] //= p
        return out.view(shard)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x4, weight = ctx.saved_tensors
        p = comm.group_size(ctx.group)
        dy2d = dy.contiguous().view(-1, dy.shape[-1])  # this rank's rows, in its own order
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx: torch.Tensor | None = None
        dw: torch.Tensor | None = None
        dy_full: torch.Tensor | None = None
        if need_x:
            sched = resolve("ag", dy2d, weight, ctx.group, ctx.schedule, comm_engine=ctx.comm_engine).schedule
            tx = _transport(ctx.comm_engine)
            dx = torch.empty(ctx.x_shape, dtype=torch.result_type(dy2d, weight), device=dy.device)
            _, dy_full = ag_matmul(dy2d, weight, ctx.group, sched, need_full=need_w, transport=tx,
                                   out=rank_blocks(dx, ctx.dim, p))  # fmt: skip
        elif need_w:
            dy_full = torch.empty(p * dy2d.shape[0], dy2d.shape[1], dtype=dy2d.dtype, device=dy2d.device)
            comm.all_gather_into(dy_full, dy2d, group=ctx.group, async_op=False)
        if need_w:
            assert dy_full is not None  # gathered above whenever need_w
            dw = weight_grad(dy_full.view(*x4.shape[:3], dy_full.shape[-1]), x4)  # [n, M] @ [M, k]
        return dx, dw, None, None, None, None, None, None


def all_gather_matmul(
    x_shard: torch.Tensor,
    weight: torch.Tensor,
    group: ProcessGroup | None = None,
    *,
    schedule: str = "auto",
    comm_engine: str = "sm",
    check_shapes: str | None = None,
    dim: int = 0,
) -> torch.Tensor:
    """All-gather ``x_shard`` along ``dim`` over ``group``, then multiply by ``weight.T``; differentiable.

    ``x_shard``: ``[m, ..., K]`` (this rank's shard along ``dim``, default 0; same shape on
    every rank); ``weight``: ``[N, K]`` (nn.Linear layout). Returns ``[P*m, ..., N]`` where rows
    ``r*m:(r+1)*m`` come from rank r's shard. ``dim=1`` takes batch-first ``[b, s/P, K]``
    and returns ``[b, s, N]``: each rank's block of rows is its shard in its own order (no
    copy before the collective), and with ``serial`` and ``ring`` every GEMM writes its rows
    straight into their place along ``dim`` (and the backward reads ``dy`` there), so the
    N-wide output is never permuted; the FiCCO schedules compute rank-major rows and copy
    them in. Units: elements; no scaling.
    ``schedule``: one of :data:`ALL_SCHEDULES` (FiCCO §V-B schedules, shard-level ``ring`` as
    PyTorch async-TP, ``serial`` baseline, ``auto`` = FiCCO §V-C heuristic, ``tune`` = timed
    on the live backend). ``comm_engine``: ``"sm"`` (c10d) or ``"dma"`` (CUDA copy engines via
    symmetric memory, FiCCO §IV-B1; every rank falls back to ``"sm"`` with a warning unless
    all ranks can use it). ``check_shapes``: ``"always"`` (default policy: every call is
    checked across ranks) / ``"first"`` / ``"never"``.
    Backward: dx by GEMM + reduce-scatter under the same schedule, dW overlapped with it.
    """
    dim = _norm_dim(x_shard, dim, "all_gather_matmul")
    engine = check_call("all_gather_matmul", x_shard, weight, group, schedule, comm_engine, dim, check_shapes)
    x2d = x_shard.reshape(-1, x_shard.shape[-1])  # this rank's block of rows, in its own order (no copy)
    fwd, bwd = _concrete("ag", x2d, weight.t(), group, schedule, engine)
    return _AllGatherMatmul.apply(x2d, weight, group, fwd, bwd, engine, dim, x_shard.shape)


def matmul_reduce_scatter(
    x: torch.Tensor,
    weight: torch.Tensor,
    group: ProcessGroup | None = None,
    *,
    schedule: str = "auto",
    comm_engine: str = "sm",
    check_shapes: str | None = None,
    dim: int = 0,
) -> torch.Tensor:
    """Multiply ``x`` by ``weight.T``, then reduce-scatter the result along ``dim`` over ``group``; differentiable.

    ``x``: ``[M, ..., K_r]`` (full rows, this rank's slice of the reduction dim);
    ``weight``: ``[N, K_r]``. Returns this rank's ``[M/P, ..., N]`` block of
    ``sum_ranks(x @ weight.T)``. ``x.shape[dim]`` must be divisible by the number of ranks;
    ``dim=1`` takes batch-first ``[b, s, K_r]`` and returns ``[b, s/P, N]``; ``serial`` and
    ``ring`` read each rank's rows of ``x`` where they lie (and write ``dx`` there in
    backward), the FiCCO schedules take a rank-major copy of ``x``.
    ``schedule``/``comm_engine``/``check_shapes`` as in :func:`all_gather_matmul` (the DMA
    engine applies to the all-gather of the backward only: copy engines cannot reduce).
    """
    dim = _norm_dim(x, dim, "matmul_reduce_scatter")
    finish = start_check("matmul_reduce_scatter", x, weight, group, schedule, comm_engine, dim, check_shapes)
    p = comm.group_size(group)
    engine: list[str | None] = [None]
    if not _rs_locally_valid(x, weight, dim, p):
        engine[0] = finish()  # raises on every rank (some rank's arguments are wrong); nothing local may run first
    x = x.contiguous()  # rank blocks are views of it (no copy when it is contiguous already)
    x2d = x.view(-1, x.shape[-1])  # the shape auto/tune decide on
    b = weight.t()
    if engine[0] is None and schedule in ("auto", "tune") and not is_decided(
        "rs", x2d.shape, b.shape, x2d.dtype, x2d.device, group, schedule
    ):
        engine[0] = finish()  # deciding auto/tune communicates: the check must be over first
    fwd, bwd = _concrete("rs", x2d, b, group, schedule, decision_engine("rs", comm_engine))

    def gate() -> None:  # otherwise the check ends after the first local GEMM, before the first collective
        engine[0] = finish()

    return _MatmulReduceScatter.apply(x, weight, group, fwd, bwd, gate if engine[0] is None else None, engine, dim)


# what ``auto`` and ``tune`` time (:mod:`ccoverlap.runtime.tuning` does not import this module)
register_op("ag", all_gather_matmul)
register_op("rs", matmul_reduce_scatter)
