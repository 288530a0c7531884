"""Expert-parallel all-to-all + expert GEMM + all-to-all, chunked so transfers overlap GEMMs.

:func:`all_to_all_matmul` computes, for tokens already grouped by destination expert,
``y[i] = x[i] @ W_{e(i)}.T`` where expert ``e(i)`` may live on another rank: dispatch
(all-to-all), the expert GEMMs, combine (all-to-all back). With ``schedule="chunked"`` every
(source, expert) slice is cut into ``num_chunks`` pieces; chunk j+1's dispatch and chunk
j-1's combine are in flight while chunk j's GEMMs run (FiCCO §III-C, Fig. 5: finer pieces
also hide the uneven per-peer volumes of MoE routing). The default ``num_chunks`` is the
number of ranks, FiCCO's "one level deeper than the shard" granularity (§III-A).

The backward has the same shape: dispatch ``dy``, ``dx_e = dy_e @ W_e`` and
``dW_e += dy_e.T @ x_e`` per chunk, combine ``dx`` back - chunked the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ccoverlap.runtime import checks, comm
from ccoverlap.runtime.schedules import split_sizes

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["all_to_all_matmul", "A2A_SCHEDULES"]

A2A_SCHEDULES = ("serial", "chunked", "auto", "tune")


class _Plan:
    """Row bookkeeping for one call: which rows go where, chunk by chunk (all Python ints)."""

    def __init__(
        self, send_counts: list[int], recv_counts: list[int], p: int, e: int, chunks: int, device: torch.device
    ) -> None:
        self.p, self.e, self.chunks = p, e, chunks
        starts = [0]
        for c in send_counts:
            starts.append(starts[-1] + c)
        self.send_idx: list[torch.Tensor] = []  # per chunk: rows of x sent, in send order
        self.in_splits: list[list[int]] = []  # per chunk: rows sent to each rank
        self.out_splits: list[list[int]] = []  # per chunk: rows received from each rank
        self.expert_rows: list[list[torch.Tensor]] = []  # per chunk, per local expert: its received rows
        for j in range(chunks):
            idx: list[int] = []
            per_dst = [0] * p
            for g, c in enumerate(send_counts):
                sizes = split_sizes(c, chunks)
                off = sum(sizes[:j])
                idx.extend(range(starts[g] + off, starts[g] + off + sizes[j]))
                per_dst[g // e] += sizes[j]
            self.send_idx.append(torch.tensor(idx, dtype=torch.long, device=device))
            self.in_splits.append(per_dst)
            # received chunk j: by source s, then by local expert
            rows_of_expert: list[list[int]] = [[] for _ in range(e)]
            per_src = [0] * p
            pos = 0
            for s in range(p):
                for le in range(e):
                    sz = split_sizes(recv_counts[s * e + le], chunks)[j]
                    rows_of_expert[le].extend(range(pos, pos + sz))
                    pos += sz
                    per_src[s] += sz
            self.out_splits.append(per_src)
            self.expert_rows.append([torch.tensor(r, dtype=torch.long, device=device) for r in rows_of_expert])


def _run(
    inp: torch.Tensor, plan: _Plan, compute: Callable[[int, torch.Tensor], torch.Tensor], width: int,
    group: ProcessGroup | None, pipelined: bool,
) -> torch.Tensor:
    """Dispatch ``inp`` chunk by chunk, ``compute(j, recv_j) -> [rows, width]``, combine back."""
    y = torch.empty(inp.shape[0], width, dtype=inp.dtype, device=inp.device)

    def dispatch(j: int) -> tuple[torch.Tensor, comm.Handle]:
        send = inp.index_select(0, plan.send_idx[j])
        recv = torch.empty(sum(plan.out_splits[j]), inp.shape[1], dtype=inp.dtype, device=inp.device)
        return recv, comm.all_to_all_single(recv, send, plan.out_splits[j], plan.in_splits[j], group=group)

    combines: list[tuple[torch.Tensor, comm.Handle]] = []
    nxt = dispatch(0)
    for j in range(plan.chunks):
        recv, h = nxt
        if pipelined and j + 1 < plan.chunks:
            nxt = dispatch(j + 1)  # next chunk's tokens travel during this chunk's GEMMs
        h.wait()
        res = compute(j, recv)
        back = torch.empty(len(plan.send_idx[j]), width, dtype=inp.dtype, device=inp.device)
        hb = comm.all_to_all_single(back, res, plan.in_splits[j], plan.out_splits[j], group=group)
        combines.append((back, hb))
        if not pipelined:
            hb.wait()
            if j + 1 < plan.chunks:
                nxt = dispatch(j + 1)
    for j, (back, hb) in enumerate(combines):
        hb.wait()
        y.index_copy_(0, plan.send_idx[j], back)
    return y


class _AllToAllMatmul(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, plan: _Plan, group: ProcessGroup | None, pipelined: bool
    ) -> torch.Tensor:
        n = w.shape[1]
        kept: list[torch.Tensor] = []

        def compute(j: int, recv: torch.Tensor) -> torch.Tensor:
            kept.append(recv)
            res = torch.empty(recv.shape[0], n, dtype=recv.dtype, device=recv.device)
            for le, rows in enumerate(plan.expert_rows[j]):
                if rows.numel():
                    if plan.e == 1:
                        torch.mm(recv, w[le].t(), out=res)
                    else:
                        res.index_copy_(0, rows, recv.index_select(0, rows) @ w[le].t())
            return res

        y = _run(x, plan, compute, n, group, pipelined)
        ctx.save_for_backward(w, *kept)
        ctx.plan, ctx.group, ctx.pipelined = plan, group, pipelined
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        w, *kept = ctx.saved_tensors
        plan = ctx.plan
        k = w.shape[2]
        dw = torch.zeros_like(w) if ctx.needs_input_grad[1] else None

        def compute(j: int, g: torch.Tensor) -> torch.Tensor:
            xr = kept[j]
            res = torch.empty(g.shape[0], k, dtype=g.dtype, device=g.device)
            for le, rows in enumerate(plan.expert_rows[j]):
                if rows.numel():
                    gs = g if plan.e == 1 else g.index_select(0, rows)
                    xs = xr if plan.e == 1 else xr.index_select(0, rows)
                    if plan.e == 1:
                        torch.mm(gs, w[le], out=res)
                    else:
                        res.index_copy_(0, rows, gs @ w[le])
                    if dw is not None:
                        dw[le].addmm_(gs.t(), xs)
            return res

        dx = _run(dy.contiguous(), plan, compute, k, ctx.group, ctx.pipelined)
        return (dx if ctx.needs_input_grad[0] else None), dw, None, None, None


def all_to_all_matmul(
    x: torch.Tensor,
    expert_weight: torch.Tensor,
    splits: Sequence[int] | torch.Tensor,
    group: ProcessGroup | None = None,
    *,
    schedule: str = "auto",
    num_chunks: int | None = None,
    check_shapes: str | None = None,
) -> torch.Tensor:
    """Expert-parallel dispatch, expert GEMM and combine; differentiable.

    ``x``: ``[T, K]`` tokens of this rank, grouped by global expert id ``g = rank*E + e``
    (rows for expert 0 first, ...). ``expert_weight``: ``[E, N, K]``, this rank's E experts
    in nn.Linear layout (same shape on every rank). ``splits``: ``P*E`` non-negative row
    counts (list or 1-D tensor) summing to ``T``; ``T`` and the splits may differ per rank.
    Returns ``[T, N]`` with ``y[i] = x[i] @ W_{g(i)}.T`` in ``x``'s row order.
    ``schedule``: ``"serial"`` (one dispatch, GEMMs, one combine), ``"chunked"`` (pipelined
    in ``num_chunks`` pieces, default the number of ranks, FiCCO §III-A granularity) or
    ``"auto"`` (= chunked unless there is one rank) or ``"tune"`` (times ``serial`` and
    ``chunked`` with 2, P, 2P and 4P chunks on the live backend, rank 0 decides, cached per
    expert-weight shape, total tokens over ranks, dtype and group; see
    :mod:`ccoverlap.runtime.tuning`; ``num_chunks`` is then ignored). Communication: one small
    all-to-all of the counts, then per chunk one dispatch and one combine all-to-all.
    """
    if schedule not in A2A_SCHEDULES:
        raise ValueError(f"all_to_all_matmul: schedule must be one of {A2A_SCHEDULES}, got {schedule!r}")
    p = comm.group_size(group)
    counts = [int(c) for c in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    e = expert_weight.shape[0] if expert_weight.dim() == 3 else -1
    table = checks.agree(
        "all_to_all_matmul",
        group,
        {"x": x, "weight": expert_weight},
        ints={
            "schedule": A2A_SCHEDULES.index(schedule),
            "nsplits": len(counts),
            "sum_splits": sum(counts),
            "min_split": min(counts) if counts else 0,
            "chunks": num_chunks or 0,
        },
        rules=[
            checks.per_rank(lambda t, r: _local(t, r)),
            checks.same_dtype("x", "weight"),
            checks.same_across_ranks("weight", "expert_weight shape [E, N, K]"),
            checks.same_across_ranks("x", "x.shape[1] (K)", lambda s: s[1:]),
            checks.per_rank(
                lambda t, r: None
                if (t.ints("schedule")[r], t.ints("chunks")[r]) == (t.ints("schedule")[0], t.ints("chunks")[0])
                else "schedule/num_chunks differ from rank 0"
            ),
        ],
        mode=check_shapes,
    )
    if e < 1 or len(counts) != p * e:
        raise ValueError(f"all_to_all_matmul: need {p}*E splits for expert_weight [E, N, K]; got {len(counts)}")
    dev = comm.comm_device(group)
    send_t = torch.tensor(counts, dtype=torch.int64, device=dev)
    recv_t = torch.empty_like(send_t)
    comm.all_to_all_single(recv_t, send_t, [e] * p, [e] * p, group=group, async_op=False)
    recv_counts = recv_t.cpu().tolist()
    if schedule == "tune" and p > 1:
        schedule, num_chunks = _tuned(x, expert_weight, counts, group, table)
    pipelined = schedule != "serial" and p > 1
    chunks = 1 if not pipelined else int(num_chunks or p)
    if chunks < 1:
        raise ValueError("all_to_all_matmul: num_chunks must be >= 1")
    plan = _Plan(counts, recv_counts, p, e, chunks, x.device)
    return _AllToAllMatmul.apply(x.contiguous(), expert_weight, plan, group, pipelined)


def a2a_candidates(p: int) -> tuple[str, ...]:
    """``tune``'s candidates for the all-to-all op: ``serial`` and ``chunked:<c>`` for c in {2, P, 2P, 4P}."""
    return ("serial", *(f"chunked:{c}" for c in sorted({2, p, 2 * p, 4 * p})))


def _tuned(
    x: torch.Tensor, w: torch.Tensor, counts: list[int], group: ProcessGroup | None, table: checks.Table | None
) -> tuple[str, int | None]:
    """Resolve ``schedule="tune"`` for one call: (schedule, num_chunks), identical on every rank."""
    from ccoverlap.runtime.tuning import resolve

    p = comm.group_size(group)
    if table is not None:
        total = sum(s[0] for s in table.shapes("x"))
    else:  # the check was skipped: agree on the total token count here
        t = torch.tensor([x.shape[0]], dtype=torch.int64, device=comm.comm_device(group))
        comm.all_reduce(t, group=group, async_op=False)
        total = int(t.item())
    xc = x.detach().contiguous()
    wd = w.detach()

    def run_for(name: str) -> Callable[[], None]:
        # the public op, as a user's call (and ``ccoverlap bench``) runs it: the per-call check
        # and the counts exchange included, so tune times what will run (forward only)
        sched, chunks = ("serial", None) if name == "serial" else ("chunked", int(name.split(":")[1]))

        def call() -> None:
            with torch.no_grad():
                all_to_all_matmul(xc, wd, counts, group, schedule=sched, num_chunks=chunks)
        return call

    key_a = torch.empty(1, 1, dtype=x.dtype, device=x.device).expand(total, x.shape[1])  # shape-only key
    dec = resolve("a2a", key_a, wd, group, "tune", runner=run_for, candidates=a2a_candidates(p))
    if dec.schedule == "serial":
        return "serial", None
    return "chunked", int(dec.schedule.split(":")[1])


def _local(t: checks.Table, r: int) -> str | None:
    xs, ws = t.shape("x", r), t.shape("weight", r)
    if len(xs) != 2:
        return f"x must be 2-D [tokens, K], got shape {xs}"
    if len(ws) != 3:
        return f"expert_weight must be 3-D [E, N, K], got shape {ws}"
    if xs[1] != ws[2]:
        return f"x.shape[1]={xs[1]} (K) does not match expert_weight.shape[2]={ws[2]}"
    if t.ints("nsplits")[r] != t.world_size * ws[0]:
        return f"{t.ints('nsplits')[r]} splits given, expected world_size*E = {t.world_size * ws[0]}"
    if t.ints("min_split")[r] < 0:
        return "splits must be non-negative"
    if t.ints("sum_splits")[r] != xs[0]:
        return f"splits sum to {t.ints('sum_splits')[r]} but x has {xs[0]} rows"
    if t.ints("chunks")[r] < 0:
        return "num_chunks must be >= 1"
    return None
