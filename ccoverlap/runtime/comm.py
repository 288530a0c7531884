"""One collectives layer over torch.distributed, for torch 2.4+ and any backend.

Every function takes *group ranks* (not global ranks), returns a :class:`Handle` whose
``wait()`` finishes the operation (and any copy a fallback needs) and returns the result,
and never calls an operation the backend has shown it lacks:

* the tensor-in/tensor-out all-gather and reduce-scatter have three spellings across torch
  versions (``all_gather_single`` / ``all_gather_into_tensor`` / ``_all_gather_base``, and
  the same for reduce-scatter); the first that exists is used;
* when a backend answers "not supported" (older gloo has no ``reduce_scatter`` and no
  ``all_gather_into_tensor``), the op is remembered as unsupported for that backend and the
  fallback is used from then on: all-gather via the list ``all_gather``, reduce-scatter via
  the list ``reduce_scatter`` or else ``all_reduce`` + slice, all-to-all via point-to-point.
  Such an error is raised on every rank alike before any data moves, so all ranks take the
  same fallback. ``CCOVERLAP_COMM_FALLBACK=all_gather,reduce_scatter,all_to_all`` (or
  :func:`force_fallbacks`) forces the fallbacks, which is how the tests cover them on a
  backend that has the fast path.

Point-to-point exchanges (:func:`exchange`) use ``batch_isend_irecv`` (one NCCL group per
step, so pairwise exchanges cannot deadlock) and fall back to ``isend``/``irecv``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class _Waitable(Protocol):
    """What a handle waits on: a ``torch.distributed.Work``, a :class:`Handle` or a :class:`_Once`."""

    def wait(self) -> object: ...

    def is_completed(self) -> bool: ...

__all__ = [
    "Handle",
    "group_size",
    "group_rank",
    "backend_of",
    "comm_device",
    "global_rank",
    "all_gather_into",
    "reduce_scatter_into",
    "all_reduce",
    "broadcast",
    "reduce",
    "all_to_all_single",
    "exchange",
    "barrier",
    "force_fallbacks",
    "force_pairwise_p2p",
    "coalesces_p2p",
    "supports",
]

_LOCK = threading.Lock()
_UNSUPPORTED: set[tuple[str, str]] = set()  # (backend, op) that answered "not supported"
_FORCED: set[str] = {
    s.strip() for s in os.environ.get("CCOVERLAP_COMM_FALLBACK", "").split(",") if s.strip()
}
_KNOWN_FALLBACKS = {"all_gather", "reduce_scatter", "reduce_scatter_list", "all_to_all", "batch_p2p"}
_NOT_SUPPORTED_WORDS = ("not supported", "does not support", "unsupported", "not implemented")


class Handle:
    """A Work-like handle: ``wait()`` completes the operation and returns its result.

    On CUDA/NCCL ``wait()`` makes the *current stream* wait for the communication (it does
    not block the host), exactly like ``torch.distributed.Work.wait``; on gloo it blocks the
    calling thread until the data has arrived. ``finalize`` (a copy a fallback needs) runs
    once, after the works complete. ``keepalive`` holds send buffers until completion.
    """

    __slots__ = ("_works", "_result", "_finalize", "_keepalive", "_done")

    def __init__(
        self, works: Sequence[_Waitable | None] = (), result: object = None,
        finalize: Callable[[], object] | None = None, keepalive: tuple[object, ...] = (),
    ) -> None:  # fmt: skip
        self._works: list[_Waitable] = [w for w in works if w is not None]
        self._result = result
        self._finalize = finalize
        self._keepalive = keepalive
        self._done = False

    @classmethod
    def completed(cls, result: object = None) -> Handle:
        """A handle for something already done (synchronous call or nothing to move)."""
        h = cls(result=result)
        h._done = True
        return h

    def wait(self) -> object:
        """Block (gloo) or stream-wait (NCCL) until done; return the result tensor(s)."""
        if not self._done:
            for w in self._works:
                w.wait()
            if self._finalize is not None:
                out = self._finalize()
                if out is not None:
                    self._result = out
            self._works = []
            self._keepalive = ()
            self._done = True
        return self._result

    def is_completed(self) -> bool:
        """True once ``wait()`` has run or every underlying work reports completion."""
        return self._done or all(w.is_completed() for w in self._works)


class _Once:
    """Wraps a Work so that waiting twice is harmless (a gloo p2p work waited twice hangs)."""

    __slots__ = ("work", "done")

    def __init__(self, work: _Waitable) -> None:
        self.work, self.done = work, False

    def wait(self) -> None:
        if not self.done:
            self.work.wait()
            self.done = True

    def is_completed(self) -> bool:
        return self.done or self.work.is_completed()


# ---------------------------------------------------------------------------- group helpers
def group_size(group: ProcessGroup | None = None) -> int:
    """Number of ranks in ``group`` (the default group when None)."""
    return dist.get_world_size(group)


def group_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank inside ``group``."""
    return dist.get_rank(group)


def backend_of(group: ProcessGroup | None = None) -> str:
    """Backend name of ``group`` in lower case ("gloo", "nccl", ...)."""
    return str(dist.get_backend(group)).lower()


def comm_device(group: ProcessGroup | None = None) -> torch.device:
    """Device that small control tensors for ``group`` must live on (CUDA for NCCL)."""
    backend = backend_of(group)
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def global_rank(group: ProcessGroup | None, rank_in_group: int) -> int:
    """Global rank of group rank ``rank_in_group`` (identity for the default group)."""
    if group is None or group is dist.GroupMember.WORLD:
        return rank_in_group
    return dist.get_global_rank(group, rank_in_group)


# ------------------------------------------------------------------------ capability logic
def force_fallbacks(names: Sequence[str] | None = None) -> contextlib.AbstractContextManager[None]:
    """Context manager forcing the named fallbacks (all of them when ``names`` is None).

    Names: ``all_gather`` (list all-gather instead of tensor all-gather), ``reduce_scatter``
    (list reduce-scatter), ``reduce_scatter_list`` (all-reduce + slice instead of the list
    reduce-scatter too), ``all_to_all`` (point-to-point all-to-all), ``batch_p2p``
    (separate isend/irecv instead of batch_isend_irecv).
    """
    chosen = set(_KNOWN_FALLBACKS if names is None else names)
    unknown = chosen - _KNOWN_FALLBACKS
    if unknown:
        raise ValueError(f"force_fallbacks: unknown names {sorted(unknown)}; known: {sorted(_KNOWN_FALLBACKS)}")

    @contextlib.contextmanager
    def _ctx() -> Iterator[None]:
        with _LOCK:
            before = set(_FORCED)
            _FORCED.update(chosen)
        try:
            yield
        finally:
            with _LOCK:
                _FORCED.clear()
                _FORCED.update(before)

    return _ctx()


def supports(op: str, group: ProcessGroup | None = None) -> bool:
    """Whether ``op`` is used natively on ``group``'s backend (not forced or found missing)."""
    return op not in _FORCED and (backend_of(group), op) not in _UNSUPPORTED


def _is_not_supported(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, NotImplementedError, AttributeError)) and any(
        w in text for w in _NOT_SUPPORTED_WORDS
    )


def _try_native(op: str, group: ProcessGroup | None, call: Callable[[], Any]) -> _Waitable | None | _Missing:
    """Run ``call``; on a backend "not supported" error remember it and return the sentinel."""
    if not supports(op, group):
        return _MISSING
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - only "not supported" is swallowed
        if _is_not_supported(exc):
            with _LOCK:
                _UNSUPPORTED.add((backend_of(group), op))
            return _MISSING
        raise


class _Missing:
    """The type of :data:`_MISSING`: "the backend lacks this op" (a Work may itself be None)."""


_MISSING = _Missing()


def _first_attr(*names: str) -> Callable[..., Any] | None:  # torch.distributed functions, by name
    for n in names:
        fn = getattr(dist, n, None)
        if fn is not None:
            return fn
    return None


_AG_TENSOR = _first_attr("all_gather_single", "all_gather_into_tensor", "_all_gather_base")
_RS_TENSOR = _first_attr("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")


def _check_contiguous(name: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"{name}: tensors must be contiguous (got strides {tuple(t.stride())})")


# ------------------------------------------------------------------------------ collectives
def all_gather_into(out: torch.Tensor, inp: torch.Tensor, group: ProcessGroup | None = None, async_op: bool = True) -> Handle:
    """All-gather ``inp`` from every rank into ``out`` (concatenated along dim 0, rank order).

    ``out`` must hold ``group_size * inp.numel()`` elements; both contiguous. Every rank must
    pass the same ``inp`` shape (as ``torch.distributed`` requires). Returns a handle whose
    ``wait()`` returns ``out``.
    """
    _check_contiguous("all_gather_into", out, inp)
    p = group_size(group)
    if out.numel() != p * inp.numel():
        raise ValueError(f"all_gather_into: out has {out.numel()} elements, expected {p} x {inp.numel()}")
    if p == 1:
        out.view(-1).copy_(inp.view(-1))
        return Handle.completed(out)
    if _AG_TENSOR is not None:
        # flat views: the 1-D "concatenation" form is accepted by every backend and version
        flat_out, flat_in = out.view(-1), inp.view(-1)
        ag = _AG_TENSOR
        work = _try_native("all_gather", group, lambda: ag(flat_out, flat_in, group=group, async_op=True))
        if not isinstance(work, _Missing):
            return _sync_if(Handle([work], result=out), async_op)
    parts = [torch.empty_like(inp) for _ in range(p)]
    work = dist.all_gather(parts, inp, group=group, async_op=True)

    def _fin() -> torch.Tensor:
        out.view(p, -1).copy_(torch.stack([t.reshape(-1) for t in parts]))
        return out

    return _sync_if(Handle([work], result=out, finalize=_fin, keepalive=(inp,)), async_op)


def reduce_scatter_into(
    out: torch.Tensor, inp: torch.Tensor, group: ProcessGroup | None = None,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, async_op: bool = True,
) -> Handle:
    """Reduce ``inp`` over ranks and scatter dim-0 blocks: rank r gets block r in ``out``.

    ``inp`` must hold ``group_size * out.numel()`` elements; both contiguous. Fallbacks:
    list ``reduce_scatter``, then ``all_reduce`` of a copy followed by a slice.
    """
    _check_contiguous("reduce_scatter_into", out, inp)
    p = group_size(group)
    if inp.numel() != p * out.numel():
        raise ValueError(f"reduce_scatter_into: inp has {inp.numel()} elements, expected {p} x {out.numel()}")
    if p == 1:
        out.view(-1).copy_(inp.view(-1))
        return Handle.completed(out)
    if _RS_TENSOR is not None:
        flat_out, flat_in = out.view(-1), inp.view(-1)
        rs = _RS_TENSOR
        work = _try_native("reduce_scatter", group, lambda: rs(flat_out, flat_in, op=op, group=group, async_op=True))
        if not isinstance(work, _Missing):
            return _sync_if(Handle([work], result=out, keepalive=(inp,)), async_op)
    chunks = list(inp.view(p, -1).unbind(0))
    flat_out = out.view(-1)
    work = _try_native(
        "reduce_scatter_list",
        group,
        lambda: dist.reduce_scatter(flat_out, chunks, op=op, group=group, async_op=True),
    )
    if not isinstance(work, _Missing):
        return _sync_if(Handle([work], result=out, keepalive=(inp, chunks)), async_op)
    full = inp.clone()
    r = group_rank(group)
    work = dist.all_reduce(full, op=op, group=group, async_op=True)

    def _fin() -> torch.Tensor:
        out.view(-1).copy_(full.view(p, -1)[r])
        return out

    return _sync_if(Handle([work], result=out, finalize=_fin, keepalive=(full,)), async_op)


def all_reduce(t: torch.Tensor, group: ProcessGroup | None = None, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    async_op: bool = True) -> Handle:
    """In-place all-reduce of ``t`` over ``group``; ``wait()`` returns ``t``."""
    if group_size(group) == 1:
        return Handle.completed(t)
    return _sync_if(Handle([dist.all_reduce(t, op=op, group=group, async_op=True)], result=t), async_op)


def broadcast(t: torch.Tensor, src: int, group: ProcessGroup | None = None, async_op: bool = True) -> Handle:
    """Broadcast ``t`` from group rank ``src`` to every rank of ``group`` (in place)."""
    if group_size(group) == 1:
        return Handle.completed(t)
    work = dist.broadcast(t, src=global_rank(group, src), group=group, async_op=True)
    return _sync_if(Handle([work], result=t), async_op)


def reduce(t: torch.Tensor, dst: int, group: ProcessGroup | None = None, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    async_op: bool = True) -> Handle:
    """Reduce ``t`` onto group rank ``dst`` (in place there; other ranks' ``t`` is scratch)."""
    if group_size(group) == 1:
        return Handle.completed(t)
    work = dist.reduce(t, dst=global_rank(group, dst), op=op, group=group, async_op=True)
    return _sync_if(Handle([work], result=t), async_op)


def all_to_all_single(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_splits: Sequence[int] | None = None,
    in_splits: Sequence[int] | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = True,
) -> Handle:
    """All-to-all along dim 0: block ``j`` of ``inp`` goes to rank j, block ``i`` of ``out``
    comes from rank i. ``in_splits``/``out_splits`` are row counts per rank (equal blocks
    when None). Falls back to point-to-point when the backend lacks ``all_to_all_single``.
    """
    _check_contiguous("all_to_all_single", out, inp)
    p = group_size(group)
    in_s = _splits(inp.shape[0], p, in_splits, "in_splits")
    out_s = _splits(out.shape[0], p, out_splits, "out_splits")
    if p == 1:
        out.copy_(inp)
        return Handle.completed(out)
    work = _try_native(
        "all_to_all",
        group,
        lambda: dist.all_to_all_single(
            out, inp, output_split_sizes=list(out_s), input_split_sizes=list(in_s), group=group, async_op=True
        ),
    )
    if not isinstance(work, _Missing):
        return _sync_if(Handle([work], result=out, keepalive=(inp,)), async_op)
    r = group_rank(group)
    in_off = _offsets(in_s)
    out_off = _offsets(out_s)
    out[out_off[r] : out_off[r] + out_s[r]].copy_(inp[in_off[r] : in_off[r] + in_s[r]])
    sends = [(j, inp[in_off[j] : in_off[j] + in_s[j]]) for j in range(p) if j != r]
    recvs = [(i, out[out_off[i] : out_off[i] + out_s[i]]) for i in range(p) if i != r]
    h = exchange(sends, recvs, group=group)
    return _sync_if(Handle([h], result=out), async_op)


@overload
def exchange(
    sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]],
    group: ProcessGroup | None = None, tag: int = 0, *, per_recv: Literal[False] = False,
) -> Handle: ...


@overload
def exchange(
    sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]],
    group: ProcessGroup | None = None, tag: int = 0, *, per_recv: Literal[True],
) -> tuple[Handle, list[Handle]]: ...


@overload
def exchange(
    sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]],
    group: ProcessGroup | None = None, tag: int = 0, *, per_recv: bool = False,
) -> Handle | tuple[Handle, list[Handle]]: ...


def exchange(
    sends: Sequence[tuple[int, torch.Tensor]],
    recvs: Sequence[tuple[int, torch.Tensor]],
    group: ProcessGroup | None = None,
    tag: int = 0,
    *,
    per_recv: bool = False,
) -> Handle | tuple[Handle, list[Handle]]:
    """Post point-to-point sends and receives together (peers are *group* ranks).

    ``sends``: (peer, tensor) pairs; ``recvs``: (peer, contiguous destination) pairs. Empty
    tensors are skipped (both sides must agree on sizes, as with any p2p). Returns a
    :class:`Handle` for all of them; with ``per_recv=True`` returns ``(handle, recv_handles)``
    where ``recv_handles[i]`` completes ``recvs[i]`` (on backends that coalesce a batch into
    one work, every recv handle waits for the whole batch).
    """
    ops: list[_P2P] = []
    keep: list[torch.Tensor] = []
    for peer, t in sends:
        if t.numel() == 0:
            continue
        t = t.contiguous()
        keep.append(t)
        ops.append((dist.isend, t, global_rank(group, peer)))
    recv_pos: list[int | None] = []
    for peer, t in recvs:
        if t.numel() == 0:
            recv_pos.append(None)
            continue
        _check_contiguous("exchange (recv buffer)", t)
        recv_pos.append(len(ops))
        ops.append((dist.irecv, t, global_rank(group, peer)))
    use_batch = supports("batch_p2p", group) and hasattr(dist, "batch_isend_irecv")
    n_send = len(ops) - sum(1 for p_ in recv_pos if p_ is not None)
    if per_recv and ops and use_batch and coalesces_p2p(group):
        # NCCL turns one batch into one Work, so a wait on one piece would wait for all:
        # post one batch per (send i, recv i) pair instead. Every rank posts its pairs in
        # the same order (step j: send to r+j, recv from r-j), so the groups match up.
        return _exchange_pairwise(ops, recv_pos, n_send, group, tag, keep)
    works: list[_Waitable] = []
    if ops:
        if use_batch:
            p2p = [dist.P2POp(fn, t, peer, group, tag) for fn, t, peer in ops]
            works = list(dist.batch_isend_irecv(p2p) or [])
        else:
            works = [fn(t, peer, group=group, tag=tag) for fn, t, peer in ops]
        works = [_Once(w) for w in works]
    handle = Handle(works, keepalive=tuple(keep))
    if not per_recv:
        return handle
    per_op = len(works) == len(ops)
    recv_handles: list[Handle] = []
    for pos in recv_pos:
        if pos is None:
            recv_handles.append(Handle.completed())
        elif per_op:
            recv_handles.append(Handle([works[pos]]))
        else:
            recv_handles.append(Handle(works))
    return handle, recv_handles


#: One point-to-point op of :func:`exchange`: (``dist.isend`` or ``dist.irecv``, tensor, global peer rank).
_P2P = tuple[Callable[..., Any], torch.Tensor, int]

_COALESCING: set[str] = {"nccl"}
_FORCE_PAIRWISE = False


def coalesces_p2p(group: ProcessGroup | None = None) -> bool:
    """Whether ``batch_isend_irecv`` on ``group``'s backend returns one Work for the whole batch (NCCL)."""
    return _FORCE_PAIRWISE or any(b in backend_of(group) for b in _COALESCING)


@contextlib.contextmanager
def force_pairwise_p2p() -> Iterator[None]:
    """Test hook: treat every backend as coalescing, so the pairwise path runs on gloo too."""
    global _FORCE_PAIRWISE
    old, _FORCE_PAIRWISE = _FORCE_PAIRWISE, True
    try:
        yield
    finally:
        _FORCE_PAIRWISE = old


def _exchange_pairwise(
    ops: Sequence[_P2P], recv_pos: Sequence[int | None], n_send: int, group: ProcessGroup | None, tag: int,
    keep: Sequence[torch.Tensor],
) -> tuple[Handle, list[Handle]]:
    """One ``batch_isend_irecv`` per (i-th send, i-th recv) pair; recv i's handle waits for its pair only."""
    sends = ops[:n_send]
    recvs = [ops[p_] if p_ is not None else None for p_ in recv_pos]
    pairs = max(len(sends), len(recvs))
    all_works: list[_Waitable] = []
    recv_handles: list[Handle] = []
    for i in range(pairs):
        batch: list[_P2P] = []
        if i < len(sends):
            batch.append(sends[i])
        r = recvs[i] if i < len(recvs) else None
        if r is not None:
            batch.append(r)
        works = [_Once(w) for w in (dist.batch_isend_irecv(
            [dist.P2POp(fn, t, peer, group, tag) for fn, t, peer in batch]) or [])] if batch else []  # fmt: skip
        all_works += works
        if i < len(recvs):
            recv_handles.append(Handle(works) if r is not None else Handle.completed())
    return Handle(all_works, keepalive=tuple(keep)), recv_handles


def barrier(group: ProcessGroup | None = None) -> None:
    """Synchronise ``group`` with a one-element all-reduce on its communication device."""
    if group_size(group) == 1:
        return
    t = torch.zeros(1, device=comm_device(group))
    dist.all_reduce(t, group=group)
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


# -------------------------------------------------------------------------------- helpers
def _sync_if(handle: Handle, async_op: bool) -> Handle:
    if not async_op:
        handle.wait()
    return handle


def _splits(rows: int, p: int, splits: Sequence[int] | None, name: str) -> list[int]:
    if splits is None:
        if rows % p:
            raise ValueError(f"all_to_all_single: {rows} rows do not split evenly over {p} ranks; pass {name}")
        return [rows // p] * p
    s = [int(x) for x in splits]
    if len(s) != p or sum(s) != rows or min(s) < 0:
        raise ValueError(f"all_to_all_single: {name}={s} must be {p} non-negative counts summing to {rows}")
    return s


def _offsets(sizes: Sequence[int]) -> list[int]:
    off: list[int] = []
    acc = 0
    for s in sizes:
        off.append(acc)
        acc += s
    return off
