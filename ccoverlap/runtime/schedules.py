"""Overlap schedules for all-gather + GEMM and GEMM + reduce-scatter (forward kernels, no autograd).

Notation: ``P`` ranks, this rank ``r``; an all-gather + GEMM computes
``C = AllGather_0(A) @ B`` with ``A`` this rank's shard ``[m, k]`` (every rank the same
``m``), ``B`` ``[k, n]``, ``C`` ``[P*m, n]``; a GEMM + reduce-scatter computes
``C = ReduceScatter_0(A @ B)`` with ``A`` ``[P*m, k]`` and ``C`` this rank's ``[m, n]``
block of the sum. The two are each other's backward (see :mod:`ccoverlap.runtime.ops`).

Schedules (``SCHEDULES``):

``serial``            the whole collective, then one GEMM (or GEMM, then the collective).
``ring``              shard-level, one peer per step (PyTorch async-TP style, FiCCO §II-B,
                      Fig. 3(c)): at step i exchange whole shards with ranks ``r+i``/``r-i``
                      while computing the shard that arrived at step i-1; P GEMMs of m rows.
``uniform-fused-1d``  FiCCO §V-B: each shard is cut into P row pieces (1/N of a shard); step t
                      moves piece t of every shard all-to-all (an all-gather of piece t), then
                      one fused GEMM on the gathered ``[P*m/P, k]`` rows (local + remote, so
                      every step is the same size), and the rows are scattered to their final
                      places. The first transfer is exposed.
``hetero-fused-1d``   FiCCO §V-B: step 0 computes the local shard (no waiting), then each step
                      runs one fused GEMM on the P-1 remote pieces it received (+ scatter).
``hetero-unfused-1d`` FiCCO §V-B: like hetero-fused, but one GEMM per received piece, each
                      started as soon as that peer's piece has arrived and written straight
                      into its rows of the output (no gather/scatter copies).
``uniform-fused-2d``  FiCCO §V-B: pieces are column blocks (K/P columns of every shard); step t
                      all-gathers block t into ``[P*m, K/P]`` and accumulates
                      ``C += A_t @ B_t`` (the accumulative GEMM of §IV-C1). FiCCO emulates
                      2-D DMA copies with 1-D copies (§VI-C); here the block is made
                      contiguous before it is sent.

For GEMM + reduce-scatter the same names mean the mirrored dataflow: ``ring`` computes the
partial for peer ``r+i`` and sends it while the next one is computed; the 1-D FiCCO
schedules compute piece t of every destination block (fused: one GEMM over rows gathered
from all P blocks; unfused: one GEMM per destination) and reduce it all-to-all; "hetero"
computes the local block (which needs no communication) *last*, hiding the last transfer,
as "hetero" hides the first one in the all-gather direction; ``uniform-fused-2d`` computes
column blocks ``A @ B[:, t]`` of the output and reduce-scatters each one.

Uneven sizes: pieces follow ``torch.tensor_split`` (the first ``m % P`` pieces get one row
more); all ranks cut the same way because their shard shapes agree. Empty pieces are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, overload

import torch

from ccoverlap.runtime import comm
from ccoverlap.runtime.blocks import mm_blocks, mm_into
from ccoverlap.runtime.comm import Handle

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "SCHEDULES",
    "FICCO_SCHEDULES",
    "split_sizes",
    "C10dTransport",
    "ag_matmul",
    "matmul_rs",
]

FICCO_SCHEDULES = ("uniform-fused-1d", "hetero-fused-1d", "hetero-unfused-1d", "uniform-fused-2d")
SCHEDULES = ("serial", "ring", *FICCO_SCHEDULES)


def split_sizes(total: int, parts: int) -> list[int]:
    """Sizes of ``torch.tensor_split(range(total), parts)``: the first ``total % parts`` get one more."""
    base, extra = divmod(int(total), int(parts))
    return [base + 1 if i < extra else base for i in range(parts)]


def _pieces(total: int, parts: int) -> list[tuple[int, int]]:
    """(offset, size) of each non-empty piece of ``split_sizes(total, parts)``."""
    out: list[tuple[int, int]] = []
    off = 0
    for s in split_sizes(total, parts):
        if s:
            out.append((off, s))
        off += s
    return out


# ------------------------------------------------------------------------------ transport
#: A region of a shard: ``(row_slice, col_slice)``.
Region = tuple[slice, slice]


class Transport(Protocol):
    """What the all-gather schedules move shard regions with (:class:`C10dTransport`, or the
    copy-engine transport of :mod:`ccoverlap.runtime.cuda`)."""

    engine: str

    def gather(self, region: Region, out: torch.Tensor) -> Handle: ...

    @overload
    def fetch(
        self, region: Region, srcs: Sequence[int], outs: Sequence[torch.Tensor], dsts: Sequence[int], tag: int,
        per_recv: Literal[False] = False,
    ) -> Handle: ...

    @overload
    def fetch(
        self, region: Region, srcs: Sequence[int], outs: Sequence[torch.Tensor], dsts: Sequence[int], tag: int,
        per_recv: Literal[True],
    ) -> tuple[Handle, list[Handle]]: ...

    def close(self, ok: bool = True) -> None: ...


class TransportFactory(Protocol):
    """A transport class: ``create(shard, group, schedule)`` builds one for a call (a copy-engine
    transport lays its buffer out for the schedule: column blocks for the 2-D one)."""

    def create(self, shard: torch.Tensor, group: ProcessGroup | None, schedule: str) -> Transport: ...


class C10dTransport:
    """Moves regions of this rank's shard with torch.distributed (NCCL or gloo: ``"sm"``).

    ``gather(region, out)``: every rank's ``shard[region]`` into ``out`` (``[P, ...]``).
    ``fetch(region, srcs, outs, dsts, tag)``: receive ``shard[region]`` of each rank in
    ``srcs`` into ``outs`` while sending ours to every rank in ``dsts`` (the pattern is
    symmetric, so both sides agree). Regions are ``(row_slice, col_slice)``.
    A copy-engine transport with the same methods lives in :mod:`ccoverlap.runtime.cuda`.
    """

    engine = "sm"

    def __init__(self, shard: torch.Tensor, group: ProcessGroup | None) -> None:
        self.shard = shard
        self.group = group

    @classmethod
    def create(cls, shard: torch.Tensor, group: ProcessGroup | None, schedule: str = "serial") -> C10dTransport:
        """A c10d transport for ``shard`` (every schedule moves the same row-major shard)."""
        return cls(shard, group)

    def gather(self, region: Region, out: torch.Tensor) -> Handle:
        """All-gather every rank's ``shard[region]`` into ``out`` (``[P, ...]``, contiguous)."""
        piece = self.shard[region].contiguous()
        return comm.all_gather_into(out, piece, group=self.group)

    @overload
    def fetch(
        self, region: Region, srcs: Sequence[int], outs: Sequence[torch.Tensor], dsts: Sequence[int], tag: int,
        per_recv: Literal[False] = False,
    ) -> Handle: ...

    @overload
    def fetch(
        self, region: Region, srcs: Sequence[int], outs: Sequence[torch.Tensor], dsts: Sequence[int], tag: int,
        per_recv: Literal[True],
    ) -> tuple[Handle, list[Handle]]: ...

    def fetch(
        self, region: Region, srcs: Sequence[int], outs: Sequence[torch.Tensor], dsts: Sequence[int], tag: int,
        per_recv: bool = False,
    ) -> Handle | tuple[Handle, list[Handle]]:
        """Receive ``shard[region]`` from ``srcs`` into ``outs``, send ours to ``dsts`` (one p2p batch)."""
        piece = self.shard[region]
        sends = [(d, piece) for d in dsts]
        return comm.exchange(sends, list(zip(srcs, outs)), group=self.group, tag=tag, per_recv=per_recv)

    def close(self, ok: bool = True) -> None:
        """Nothing to release (c10d owns its buffers)."""


# --------------------------------------------------------------------- all-gather + GEMM
def ag_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    group: ProcessGroup | None,
    schedule: str,
    *,
    need_full: bool = False,
    transport: TransportFactory | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``AllGather_0(a) @ b`` with the named overlap schedule (see module doc, FiCCO §V-B).

    ``a``: this rank's contiguous shard ``[m, k]``; ``b``: ``[k, n]`` (any strides).
    Returns ``(c, a_full)``: ``c`` ``[P*m, n]`` and, when ``need_full``, the gathered
    ``[P*m, k]`` input (rank-major; kept by autograd for the weight gradient), else None.
    ``out``: optional ``[P, B, R, n]`` view (``B*R == m``, e.g. :func:`~ccoverlap.runtime.blocks.rank_blocks`
    of a batch-first output) that receives rank j's rows at ``out[j]`` (shard rows in order,
    as ``a.view(B, R, k)``) and is returned as ``c``: ``serial`` and ``ring`` write it in
    place, the FiCCO schedules compute rank-major rows and copy them in.
    """
    p, r = comm.group_size(group), comm.group_rank(group)
    m, k = a.shape
    n = b.shape[1]
    res = torch.empty(p, 1, m, n, dtype=torch.result_type(a, b), device=a.device) if out is None else out
    if p == 1:
        torch.mm(a, b, out=res.view(m, n))
        return (res.view(m, n) if out is None else out), (a if need_full else None)
    a = a.contiguous()
    try:
        fn = _AG[schedule]
    except KeyError:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}") from None
    factory: TransportFactory = transport or C10dTransport
    # a copy-engine transport lays its buffer out for the schedule (column blocks for 2-D)
    tx = factory.create(a, group, schedule)
    if schedule in _BLOCKWISE:
        dst = res
    else:  # the FiCCO schedules write rank-major rows
        dst = res.view(p * m, n) if res.is_contiguous() else torch.empty(p * m, n, dtype=res.dtype, device=a.device)
    ok = False
    try:
        a_full = fn(a, b, dst, tx, p, r, m, k, need_full)
        ok = True
    finally:
        tx.close(ok)  # on an error: no device barrier that peers could never match
    if dst.data_ptr() != res.data_ptr():
        res.copy_(dst.view(res.shape))
    return (res.view(p * m, n) if out is None else out), (a_full if need_full else None)


def _ag_serial(
    a: torch.Tensor, b: torch.Tensor, out4: torch.Tensor, tx: Transport, p: int, r: int, m: int, k: int,
    need_full: bool,
) -> torch.Tensor | None:
    full = torch.empty(p * m, k, dtype=a.dtype, device=a.device)
    tx.gather((slice(None), slice(None)), full).wait()
    mm_blocks(full.view(p, *out4.shape[1:3], k), b, out4)
    return full


def _ag_ring(
    a: torch.Tensor, b: torch.Tensor, out4: torch.Tensor, tx: Transport, p: int, r: int, m: int, k: int,
    need_full: bool,
) -> torch.Tensor | None:
    full = torch.empty(p * m, k, dtype=a.dtype, device=a.device)
    full4 = full.view(p, *out4.shape[1:3], k)
    whole = (slice(None), slice(None))

    def start(i: int) -> Handle:  # step i: receive shard r-i, send ours to r+i (one peer per step)
        src = (r - i) % p
        return tx.fetch(whole, [src], [full[src * m : (src + 1) * m]], [(r + i) % p], tag=i)

    pending = start(1)
    mm_into(a.view(full4.shape[1:]), b, out4[r])  # local shard while shard r-1 is in flight
    if need_full:
        full[r * m : (r + 1) * m].copy_(a)
    for i in range(1, p):
        src = (r - i) % p
        pending.wait()
        if i + 1 < p:
            pending = start(i + 1)
        mm_into(full4[src], b, out4[src])
    return full


def _ag_uniform_fused_1d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tx: Transport, p: int, r: int, m: int, k: int,
    need_full: bool,
) -> torch.Tensor | None:
    pieces = _pieces(m, p)
    full = torch.empty(p * m, k, dtype=a.dtype, device=a.device) if need_full else None
    out3 = out.view(p, m, -1)

    def start(t: int) -> tuple[torch.Tensor, Handle]:
        off, sz = pieces[t]
        buf = torch.empty(p, sz, k, dtype=a.dtype, device=a.device)
        return buf, tx.gather((slice(off, off + sz), slice(None)), buf)

    nxt = start(0)  # uniform: the first step needs remote rows, so this transfer is exposed
    for t, (off, sz) in enumerate(pieces):
        buf, h = nxt
        h.wait()
        if t + 1 < len(pieces):
            nxt = start(t + 1)
        res = torch.mm(buf.view(p * sz, k), b)  # one fused GEMM on local + remote pieces
        out3[:, off : off + sz].copy_(res.view(p, sz, -1))  # scatter to final rows
        if full is not None:
            full.view(p, m, k)[:, off : off + sz].copy_(buf)
    return full


def _ag_hetero_fused_1d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tx: Transport, p: int, r: int, m: int, k: int,
    need_full: bool,
) -> torch.Tensor | None:
    pieces = _pieces(m, p)
    peers = [(r + j) % p for j in range(1, p)]
    senders = [(r - j) % p for j in range(1, p)]
    full = torch.empty(p * m, k, dtype=a.dtype, device=a.device) if need_full else None
    out3 = out.view(p, m, -1)
    idx = torch.tensor(senders, device=a.device)

    def start(t: int) -> tuple[torch.Tensor, Handle]:
        off, sz = pieces[t]
        buf = torch.empty(p - 1, sz, k, dtype=a.dtype, device=a.device)
        h = tx.fetch((slice(off, off + sz), slice(None)), senders, list(buf.unbind(0)), peers, tag=t + 1)
        return buf, h

    nxt = start(0)
    torch.mm(a, b, out=out[r * m : (r + 1) * m])  # hetero: local shard first, nothing to wait for
    if full is not None:
        full[r * m : (r + 1) * m].copy_(a)
    for t, (off, sz) in enumerate(pieces):
        buf, h = nxt
        h.wait()
        if t + 1 < len(pieces):
            nxt = start(t + 1)
        res = torch.mm(buf.view((p - 1) * sz, k), b)  # one fused GEMM on the remote pieces
        out3[:, off : off + sz].index_copy_(0, idx, res.view(p - 1, sz, -1))
        if full is not None:
            full.view(p, m, k)[:, off : off + sz].index_copy_(0, idx, buf)
    return full


def _ag_hetero_unfused_1d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tx: Transport, p: int, r: int, m: int, k: int,
    need_full: bool,
) -> torch.Tensor | None:
    pieces = _pieces(m, p)
    peers = [(r + j) % p for j in range(1, p)]
    senders = [(r - j) % p for j in range(1, p)]
    full = torch.empty(p * m, k, dtype=a.dtype, device=a.device)  # receive straight into place

    def start(t: int) -> tuple[Handle, list[Handle]]:
        off, sz = pieces[t]
        dst = [full[s * m + off : s * m + off + sz] for s in senders]
        return tx.fetch((slice(off, off + sz), slice(None)), senders, dst, peers, tag=t + 1, per_recv=True)

    nxt = start(0)
    torch.mm(a, b, out=out[r * m : (r + 1) * m])
    if need_full:
        full[r * m : (r + 1) * m].copy_(a)
    for t, (off, sz) in enumerate(pieces):
        whole, per = nxt
        if t + 1 < len(pieces):
            nxt = start(t + 1)
        for s, h in zip(senders, per):  # one GEMM per piece, as soon as that piece is here
            h.wait()
            rows = slice(s * m + off, s * m + off + sz)
            torch.mm(full[rows], b, out=out[rows])
        whole.wait()  # our sends of this step are done too
    return full


def _ag_uniform_fused_2d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tx: Transport, p: int, r: int, m: int, k: int,
    need_full: bool,
) -> torch.Tensor | None:
    cols = _pieces(k, p)
    full = torch.empty(p * m, k, dtype=a.dtype, device=a.device) if need_full else None

    def start(t: int) -> tuple[torch.Tensor, Handle]:
        off, sz = cols[t]
        buf = torch.empty(p * m, sz, dtype=a.dtype, device=a.device)  # [P, m, sz] = [P*m, sz]
        return buf, tx.gather((slice(None), slice(off, off + sz)), buf)

    nxt = start(0)
    for t, (off, sz) in enumerate(cols):
        buf, h = nxt
        h.wait()
        if t + 1 < len(cols):
            nxt = start(t + 1)
        if t == 0:
            torch.mm(buf, b[off : off + sz], out=out)
        else:
            out.addmm_(buf, b[off : off + sz])  # accumulative GEMM, C += A_t B_t (§IV-C1)
        if full is not None:
            full[:, off : off + sz].copy_(buf)
    if not cols:  # k == 0
        out.zero_()
    return full


#: The schedules that take their output as ``[P, B, R, n]`` rank blocks (any layout); the others write rank-major rows.
_BLOCKWISE = ("serial", "ring")

_AG = {
    "serial": _ag_serial,
    "ring": _ag_ring,
    "uniform-fused-1d": _ag_uniform_fused_1d,
    "hetero-fused-1d": _ag_hetero_fused_1d,
    "hetero-unfused-1d": _ag_hetero_unfused_1d,
    "uniform-fused-2d": _ag_uniform_fused_2d,
}


# ----------------------------------------------------------------- GEMM + reduce-scatter
def matmul_rs(
    a: torch.Tensor,
    b: torch.Tensor,
    group: ProcessGroup | None,
    schedule: str,
    *,
    overlap: Callable[[], None] | None = None,
    before_comm: Callable[[], object] | None = None,
) -> torch.Tensor:
    """``ReduceScatter_0(a @ b)`` with the named overlap schedule (see module doc).

    ``a``: ``[P*m, k]`` (every rank the same ``P*m``), or ``[P, B, R, k]`` rank blocks of
    any layout (:func:`~ccoverlap.runtime.blocks.rank_blocks`, ``B*R == m``: block j holds
    the rows reduced onto rank j), which ``serial`` and ``ring`` read where they lie (the
    FiCCO schedules take a rank-major copy); ``b``: ``[k, n]``. Returns this rank's summed
    block ``[m, n]``. ``overlap``, if given, is independent work (e.g. a weight gradient)
    run while the last communication is in flight; it runs exactly once. ``before_comm``,
    if given, runs once before the first collective is issued (after the first local GEMM):
    the cross-rank check finishes there, hidden behind that GEMM.
    """
    p, r = comm.group_size(group), comm.group_rank(group)
    if a.dim() == 2:
        if a.shape[0] % p:
            raise ValueError(f"matmul_rs: {a.shape[0]} rows do not split over {p} ranks")
        a = a.contiguous().view(p, 1, a.shape[0] // p, a.shape[1])
    m, n = a.shape[1] * a.shape[2], b.shape[1]
    gate = _once(before_comm)
    if p == 1:
        out = a.reshape(m, a.shape[3]) @ b
        gate()
        if overlap is not None:
            overlap()
        return out
    try:
        fn = _RS[schedule]
    except KeyError:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}") from None
    out = torch.empty(m, n, dtype=torch.result_type(a, b), device=a.device)
    ran = [False]

    def hook() -> None:
        if overlap is not None and not ran[0]:
            ran[0] = True
            overlap()

    fn(a if schedule in _BLOCKWISE else a.reshape(p * m, a.shape[3]), b, out, group, p, r, m, hook, gate)
    gate()
    hook()
    return out


def _once(fn: Callable[[], object] | None) -> Callable[[], None]:
    done = [fn is None]

    def run() -> None:
        if fn is not None and not done[0]:
            done[0] = True
            fn()

    return run


def _rs_serial(
    a4: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group: ProcessGroup | None, p: int, r: int, m: int,
    hook: Callable[[], None], gate: Callable[[], None],
) -> None:
    part = torch.empty(*a4.shape[:3], b.shape[1], dtype=out.dtype, device=out.device)  # rank-major, for the collective
    mm_blocks(a4, b, part)
    gate()
    h = comm.reduce_scatter_into(out, part, group=group)
    hook()
    h.wait()


def _rs_ring(
    a4: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group: ProcessGroup | None, p: int, r: int, m: int,
    hook: Callable[[], None], gate: Callable[[], None],
) -> None:
    n = b.shape[1]
    pending: list[tuple[Handle, torch.Tensor]] = []
    acc: torch.Tensor | None = None

    def block_mm(j: int) -> torch.Tensor:  # [m, n] partial of rank j's block (read where it lies)
        res = torch.empty(*a4.shape[1:3], n, dtype=out.dtype, device=out.device)
        mm_into(a4[j], b, res)
        return res.view(m, n)

    for i in range(1, p):
        dst, src = (r + i) % p, (r - i) % p
        part = block_mm(dst)  # partial for peer r+i
        rbuf = torch.empty(m, n, dtype=out.dtype, device=out.device)
        gate()
        h = comm.exchange([(dst, part)], [(src, rbuf)], group=group, tag=i)
        pending.append((h, rbuf))
        if len(pending) > 1:  # accumulate the previous step while this one is in flight
            h_prev, buf_prev = pending.pop(0)
            h_prev.wait()
            acc = buf_prev if acc is None else acc.add_(buf_prev)
    own = block_mm(r)  # local block last: hides the last transfer
    hook()
    for h, buf in pending:
        h.wait()
        acc = buf if acc is None else acc.add_(buf)
    assert acc is not None  # p > 1 ranks: p - 1 partials arrived
    torch.add(own, acc, out=out)


def _rs_uniform_fused_1d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group: ProcessGroup | None, p: int, r: int, m: int,
    hook: Callable[[], None], gate: Callable[[], None],
) -> None:
    k = a.shape[1]
    pieces = _pieces(m, p)
    a3 = a.view(p, m, k)
    pending: Handle | None = None
    for t, (off, sz) in enumerate(pieces):
        rows = a3[:, off : off + sz].reshape(p * sz, k)  # gather piece t of every block
        part = torch.mm(rows, b)  # overlaps the reduce-scatter of piece t-1
        gate()
        if pending is not None:
            pending.wait()
        pending = comm.reduce_scatter_into(out[off : off + sz], part, group=group)
    hook()
    if pending is not None:
        pending.wait()


def _rs_hetero(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group: ProcessGroup | None, p: int, r: int, m: int,
    hook: Callable[[], None], gate: Callable[[], None], fused: bool,
) -> None:
    k, n = a.shape[1], b.shape[1]
    pieces = _pieces(m, p)
    peers = [(r + j) % p for j in range(1, p)]  # destinations
    senders = [(r - j) % p for j in range(1, p)]
    a3 = a.view(p, m, k)
    idx = torch.tensor(peers, device=a.device)
    inflight: list[tuple[Handle, torch.Tensor, int, int]] = []
    for t, (off, sz) in enumerate(pieces):
        if fused:  # one GEMM over piece t of every remote destination block
            parts = torch.mm(a3[:, off : off + sz].index_select(0, idx).reshape((p - 1) * sz, k), b)
            sends = list(zip(peers, parts.view(p - 1, sz, n).unbind(0)))
        else:  # one GEMM per destination
            sends = [(d, torch.mm(a[d * m + off : d * m + off + sz], b)) for d in peers]
        rbuf = torch.empty(p - 1, sz, n, dtype=out.dtype, device=out.device)
        gate()
        h = comm.exchange(sends, list(zip(senders, rbuf.unbind(0))), group=group, tag=t + 1)
        inflight.append((h, rbuf, off, sz))
    torch.mm(a[r * m : (r + 1) * m], b, out=out)  # hetero: local block last, hides the tail
    hook()
    for h, rbuf, off, sz in inflight:
        h.wait()
        out[off : off + sz].add_(rbuf.sum(0))


def _rs_hetero_fused_1d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group: ProcessGroup | None, p: int, r: int, m: int,
    hook: Callable[[], None], gate: Callable[[], None],
) -> None:
    _rs_hetero(a, b, out, group, p, r, m, hook, gate, fused=True)


def _rs_hetero_unfused_1d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group: ProcessGroup | None, p: int, r: int, m: int,
    hook: Callable[[], None], gate: Callable[[], None],
) -> None:
    _rs_hetero(a, b, out, group, p, r, m, hook, gate, fused=False)


def _rs_uniform_fused_2d(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group: ProcessGroup | None, p: int, r: int, m: int,
    hook: Callable[[], None], gate: Callable[[], None],
) -> None:
    n = b.shape[1]
    cols = _pieces(n, p)
    pending: tuple[Handle, torch.Tensor, int, int] | None = None
    for t, (off, sz) in enumerate(cols):
        part = torch.mm(a, b[:, off : off + sz])  # column block of the output, [P*m, sz]
        tmp = torch.empty(m, sz, dtype=out.dtype, device=out.device)
        gate()
        h = comm.reduce_scatter_into(tmp, part, group=group)
        if pending is not None:
            ph, ptmp, poff, psz = pending
            ph.wait()
            out[:, poff : poff + psz].copy_(ptmp)  # scatter into the final columns
        pending = (h, tmp, off, sz)
    hook()
    if pending is not None:
        ph, ptmp, poff, psz = pending
        ph.wait()
        out[:, poff : poff + psz].copy_(ptmp)
    if not cols:
        out.zero_()


_RS = {
    "serial": _rs_serial,
    "ring": _rs_ring,
    "uniform-fused-1d": _rs_uniform_fused_1d,
    "hetero-fused-1d": _rs_hetero_fused_1d,
    "hetero-unfused-1d": _rs_hetero_unfused_1d,
    "uniform-fused-2d": _rs_uniform_fused_2d,
}
