"""CUDA-only pieces: side streams, events, and a copy-engine (DMA) transport for the all-gather.

With NCCL, ``async_op=True`` collectives already run on NCCL's own streams and
``Work.wait()`` only makes the *current* stream wait, so the GEMMs that the schedules issue
on the compute stream overlap them without extra work. This module adds what NCCL does not
give: FiCCO's DMA offload (§II-B, §IV-B1) - peers' shards are read with ``Tensor.copy_``
from symmetric memory (``torch.distributed._symmetric_memory``), which CUDA executes as a
peer-to-peer ``cudaMemcpyAsync`` on a copy engine *when source and destination are
contiguous*, on a side stream, gated by events. No GPU cores drive the transfer, which is
what lowers contention (FiCCO §IV-D1).

Design points (each fixes a way the first version could go wrong):

* **Contiguous pulls only.** For the 2-D schedule (column blocks) the shard is written into
  the symmetric buffer block-major (block t = columns of piece t, ``[m, sz]`` contiguous),
  so every pull is one contiguous copy (FiCCO emulates 2-D copies with 1-D ones, §VI-C);
  a strided source would make ``copy_`` an SM kernel.
* **One buffer per (group, device), grown when needed** (:class:`BufferPool`), not one per
  shape kept forever. Growth is decided from shapes every rank agreed on, so the
  re-rendezvous it needs happens on every rank at once.
* **Double buffering, one device barrier per call.** Call n writes half ``n % 2``; the single
  barrier after the write makes every shard visible *and* proves every peer has finished
  call n-1 (whose reads of the other half were joined to the compute stream before it).
* **Agreed set-up.** :func:`dma_available` checks CUDA, NCCL, symmetric memory, one node
  and peer access; the op's cross-rank check then uses DMA only if every rank can. A failed
  rendezvous is caught, agreed with an all-reduce (MIN of an ok flag) and turns the key
  into a permanent c10d fallback on every rank, with a warning naming the error.
* **Streams of the tensor's device**, not of whatever device is current.
* **No barrier on the error path**: if a schedule raises on this rank, ``close(ok=False)``
  skips the device barrier (peers would never match it); the buffer is dropped.

Only the all-gather direction has a DMA transport: copy engines cannot add, so a
reduce-scatter stays on NCCL (FiCCO §IV-B2 leaves it out for the same reason).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, overload

import torch

from ccoverlap.runtime.comm import Handle

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed._symmetric_memory import _SymmetricMemory

    from ccoverlap.runtime.schedules import C10dTransport, Region

__all__ = ["side_stream", "SymmMemTransport", "dma_available", "BufferPool", "col_block_offsets"]

_streams: dict[tuple[int, str], torch.cuda.Stream] = {}
_lock = threading.Lock()


def side_stream(device: torch.device, name: str = "comm") -> torch.cuda.Stream:
    """A cached non-default CUDA stream per (device, name), for communication copies."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), name)
    with _lock:
        s = _streams.get(key)
        if s is None:
            s = _streams[key] = torch.cuda.Stream(device=key[0])
    return s


def dma_available(tensor: torch.Tensor, group: ProcessGroup | None) -> tuple[bool, str]:
    """Whether this rank can serve ``tensor`` on ``group`` with the copy-engine transport, and why not.

    Local answer only (the op's cross-rank check combines every rank's, see
    :func:`ccoverlap.runtime.ops.agreed_engine`): CUDA tensor, NCCL group, symmetric memory
    in this torch, every rank of the group on this node (``LOCAL_WORLD_SIZE`` covers the
    group, as torchrun sets it) and peer access from this GPU to every other visible GPU.
    """
    if tensor.device.type != "cuda":
        return False, "DMA transport needs CUDA tensors"
    import torch.distributed as dist

    if "nccl" not in str(dist.get_backend(group)).lower():
        return False, "DMA transport needs an NCCL process group"
    try:
        import torch.distributed._symmetric_memory as symm_mem  # noqa: F401
    except ImportError:
        return False, "this torch has no torch.distributed._symmetric_memory"
    p = dist.get_world_size(group)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if local and p > local:
        return False, f"the group spans {p} ranks but only {local} are on this node (copy engines are intra-node)"
    if p > torch.cuda.device_count():
        return False, f"the group has {p} ranks but this node has {torch.cuda.device_count()} GPUs"
    me = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    for j in range(torch.cuda.device_count()):
        if j != me and not torch.cuda.can_device_access_peer(me, j):
            return False, f"GPU {me} has no peer access to GPU {j}"
    return True, "symmetric memory available"


def col_block_offsets(m: int, k: int, p: int) -> list[tuple[int, int, int]]:
    """(column offset, width, flat element offset) of each K/P column block in the block-major layout.

    Block t holds columns ``off:off+sz`` of an ``[m, k]`` shard as a contiguous ``[m, sz]``
    array starting at flat element ``m*off`` (blocks in column order), so a peer pulls one
    block with one contiguous copy. Pieces follow ``torch.tensor_split`` like the schedules.
    """
    base, extra = divmod(k, p)
    out: list[tuple[int, int, int]] = []
    off = 0
    for t in range(p):
        sz = base + (1 if t < extra else 0)
        out.append((off, sz, m * off))
        off += sz
    return out


_Buf = TypeVar("_Buf")
_Hdl = TypeVar("_Hdl")


class BufferPool(Generic[_Buf, _Hdl]):
    """One growable byte buffer per key (group, device), with its rendezvous handle.

    ``get(key, nbytes)`` returns ``(buffer, handle)`` at least ``nbytes`` long, allocating
    through ``alloc(nbytes) -> (buffer, handle)`` only when the key is new or the size grows
    (then the old buffer is released). ``drop(key)`` forgets a key (after an error).
    ``failed`` remembers keys whose set-up failed, with the reason. The allocator is
    injected so the policy is testable without GPUs.
    """

    def __init__(self, alloc: Callable[[int], tuple[_Buf, _Hdl]]) -> None:
        self._alloc = alloc
        self._bufs: dict[tuple, tuple[_Buf, _Hdl, int]] = {}
        self.failed: dict[tuple, str] = {}
        self.allocations = 0

    def get(self, key: tuple, nbytes: int) -> tuple[_Buf, _Hdl]:
        """A buffer of at least ``nbytes`` bytes for ``key`` (allocated or grown as needed)."""
        have = self._bufs.get(key)
        if have is not None and have[2] >= nbytes:
            return have[0], have[1]
        self._bufs.pop(key, None)
        buf, hdl = self._alloc(nbytes)
        self.allocations += 1
        self._bufs[key] = (buf, hdl, nbytes)
        return buf, hdl

    def drop(self, key: tuple) -> None:
        """Forget ``key``'s buffer (it may be in an unknown state after an error)."""
        self._bufs.pop(key, None)

    def __len__(self) -> int:
        return len(self._bufs)


def _symm_alloc(group: ProcessGroup | None) -> Callable[[int], tuple[torch.Tensor, _SymmetricMemory]]:
    def alloc(nbytes: int) -> tuple[torch.Tensor, _SymmetricMemory]:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        pg = group or dist.group.WORLD
        assert pg is not None  # the default group exists: the op's check ran on it
        buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", torch.cuda.current_device()))
        return buf, symm_mem.rendezvous(buf, pg)

    return alloc


_pools: dict[int, BufferPool[torch.Tensor, _SymmetricMemory]] = {}
_calls: dict[tuple, int] = {}


class SymmMemTransport:
    """Copy-engine transport with the interface of :class:`~ccoverlap.runtime.schedules.C10dTransport`.

    Construct with :meth:`create` (it may hand back a c10d transport when the symmetric
    buffer cannot be set up on some rank). ``gather``/``fetch`` issue contiguous ``copy_``
    from peers' buffers on a side stream of the shard's device (which first waits for the
    compute stream, so destination buffers are ready) and return a handle whose ``wait()``
    makes the compute stream wait on an event recorded after the copies. Sends are no-ops:
    peers pull.
    """

    engine = "dma"
    wants_schedule = True

    @classmethod
    def create(
        cls, shard: torch.Tensor, group: ProcessGroup | None, schedule: str = "serial"
    ) -> SymmMemTransport | C10dTransport:
        """A DMA transport for ``shard``, or a c10d one on every rank if any rank's set-up failed."""
        import torch.distributed as dist

        from ccoverlap.runtime import comm
        from ccoverlap.runtime.schedules import C10dTransport

        pg = group or dist.group.WORLD
        assert pg is not None  # the default group exists: the op's check ran on it
        dev = shard.device
        key = (id(pg), dev.index)
        pool = _pools.setdefault(key[0], BufferPool(_symm_alloc(group)))
        if key in pool.failed:
            return C10dTransport(shard, group)
        need = 2 * shard.numel() * shard.element_size()  # two halves: double buffering
        ok, err = 1, ""
        with torch.cuda.device(dev):
            try:
                _enable_for_group(pg)
                buf, hdl = pool.get(key, need)
            except Exception as exc:  # noqa: BLE001 - agreed below, then reported
                ok, err = 0, f"{type(exc).__name__}: {exc}"
            flag = torch.tensor([ok], dtype=torch.int32, device=dev)
            comm.all_reduce(flag, group=group, op=dist.ReduceOp.MIN, async_op=False)
            if int(flag.item()) == 0:
                pool.drop(key)
                pool.failed[key] = err or "set-up failed on another rank"
                warnings.warn(
                    f"comm_engine='dma': symmetric-memory set-up failed ({pool.failed[key]}); every rank uses "
                    "the c10d transport for this group from now on", stacklevel=3,
                )  # fmt: skip
                return C10dTransport(shard, group)
        return cls(shard, group, buf, hdl, key, schedule)

    def __init__(
        self, shard: torch.Tensor, group: ProcessGroup | None, buf: torch.Tensor, hdl: _SymmetricMemory,
        key: tuple[int, int | None], schedule: str,
    ) -> None:
        self.shard, self.group, self.device, self.key = shard, group, shard.device, key
        self.hdl = hdl
        self.col_blocks = schedule == "uniform-fused-2d"
        n = _calls.get(key, 0)
        _calls[key] = n + 1
        self.half = n % 2
        self.numel = shard.numel()
        self.offset = self.half * self.numel  # elements of shard.dtype
        self.stream = side_stream(self.device)
        m, k = shard.shape
        p = hdl.world_size
        mine = buf[: 2 * self.numel * shard.element_size()].view(shard.dtype)[self.offset : self.offset + self.numel]
        with torch.cuda.device(self.device):
            if self.col_blocks:
                for off, sz, flat in col_block_offsets(m, k, p):
                    mine[flat : flat + m * sz].view(m, sz).copy_(shard[:, off : off + sz])
            else:
                mine.view(m, k).copy_(shard)
            # one barrier: every shard is in place, and every peer has finished the previous
            # call (its reads of the other half were joined to its compute stream before this)
            hdl.barrier()

    def _peer_region(self, rank: int, region: Region) -> torch.Tensor:
        rows, cols = region
        m, k = self.shard.shape
        flat = self.hdl.get_buffer(rank, (2 * self.numel,), self.shard.dtype)[self.offset : self.offset + self.numel]
        if self.col_blocks and cols != slice(None):
            off, stop = cols.start or 0, cols.stop if cols.stop is not None else k
            return flat[m * off : m * stop].view(m, stop - off)  # contiguous block
        full = flat.view(m, k)
        return full[rows]  # row slices of a row-major shard are contiguous

    def _copies(self, pairs: Sequence[tuple[int, Region, torch.Tensor]]) -> Handle:
        compute = torch.cuda.current_stream(self.device)
        start = torch.cuda.Event()
        start.record(compute)  # destinations were allocated on the tensor's compute stream
        done = torch.cuda.Event()
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self.stream.wait_event(start)
            for src, region, dst in pairs:
                dst.copy_(self._peer_region(src, region), non_blocking=True)
            done.record(self.stream)
        keep = tuple(d for _, _, d in pairs)
        for d in keep:
            d.record_stream(self.stream)
        return Handle(finalize=lambda: torch.cuda.current_stream(self.device).wait_event(done), keepalive=keep)

    def gather(self, region: Region, out: torch.Tensor) -> Handle:
        """Copy every rank's ``shard[region]`` (own included) into ``out`` (``[P, ...]``) on the copy stream."""
        p = self.hdl.world_size
        view = out.view(p, *self.shard[region].shape)
        return self._copies([(i, region, view[i]) for i in range(p)])

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
        """Copy ``shard[region]`` of each rank in ``srcs`` into ``outs``; ``dsts``/``tag`` unused (peers pull)."""
        if per_recv:
            hs = [self._copies([(s, region, o)]) for s, o in zip(srcs, outs)]
            return Handle(hs), hs
        return self._copies([(s, region, o) for s, o in zip(srcs, outs)])

    def close(self, ok: bool = True) -> None:
        """Join the copy stream to the compute stream; after an error, drop the buffer (no barrier)."""
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        if not ok:
            pool = _pools.get(self.key[0])
            if pool is not None:
                pool.drop(self.key)


def _enable_for_group(pg: ProcessGroup) -> None:
    """Older torch needs ``enable_symm_mem_for_group`` before a rendezvous; newer deprecates it.

    Called only where the torch build has it and reports the group as not yet enabled;
    errors propagate to :meth:`SymmMemTransport.create`, which agrees on them and falls back.
    """
    import torch.distributed._symmetric_memory as symm_mem

    enabled = getattr(symm_mem, "is_symm_mem_enabled_for_group", None)
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is None or enabled is None:
        return
    if not enabled(pg.group_name):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecation notice, not an error
            enable(pg.group_name)
