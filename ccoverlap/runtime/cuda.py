"""CUDA-only pieces: side streams, events, and a copy-engine (DMA) transport for the all-gather.

With NCCL, ``async_op=True`` collectives already run on NCCL's own streams and
``Work.wait()`` only makes the *current* stream wait, so the GEMMs that the schedules issue
on the compute stream overlap them without extra work. This module adds what NCCL does not
give: FiCCO's DMA offload (§II-B, §IV-B1) - peers' shards are read with ``Tensor.copy_``
from symmetric memory (``torch.distributed._symmetric_memory``), which CUDA executes as a
peer-to-peer ``cudaMemcpyAsync`` on a copy engine, on a side stream, gated by events. No
GPU cores drive the transfer, which is what lowers contention (FiCCO §IV-D1).

Only the all-gather direction has a DMA transport: copy engines cannot add, so a
reduce-scatter stays on NCCL (FiCCO §IV-B2 leaves it out for the same reason).
Everything here needs CUDA and at least two GPUs in one node (peer access); the ops fall
back to the NCCL transport with a one-line reason otherwise.
"""

from __future__ import annotations

import threading

import torch

from ccoverlap.runtime.comm import Handle

__all__ = ["side_stream", "SymmMemTransport", "dma_available"]

_streams: dict[tuple[int, str], torch.cuda.Stream] = {}
_lock = threading.Lock()
_buffers: dict[tuple, tuple[torch.Tensor, object]] = {}


def side_stream(device: torch.device, name: str = "comm") -> torch.cuda.Stream:
    """A cached non-default CUDA stream per (device, name), for communication copies."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), name)
    with _lock:
        s = _streams.get(key)
        if s is None:
            s = _streams[key] = torch.cuda.Stream(device=key[0])
    return s


def dma_available(tensor: torch.Tensor, group) -> tuple[bool, str]:
    """Whether the copy-engine transport can serve ``tensor`` on ``group``, with the reason if not."""
    if tensor.device.type != "cuda":
        return False, "DMA transport needs CUDA tensors"
    try:
        import torch.distributed._symmetric_memory as symm_mem  # noqa: F401
    except ImportError:
        return False, "this torch has no torch.distributed._symmetric_memory"
    return True, "symmetric memory available"


class SymmMemTransport:
    """Copy-engine transport with the same interface as :class:`~ccoverlap.runtime.schedules.C10dTransport`.

    On creation this rank's shard is copied into a symmetric buffer (cached per shape,
    dtype, device and group; one rendezvous per key), then a device-side barrier makes every
    rank's shard visible. ``gather``/``fetch`` issue ``copy_`` from peers' buffers on a side
    stream (which first waits for the compute stream, so destination buffers are ready) and
    return a handle whose ``wait()`` makes the current stream wait on an event recorded after
    the copies. ``close()`` runs a barrier so no peer still reads our buffer when the next
    call overwrites it. Sends are no-ops: peers pull.
    """

    engine = "dma"

    def __init__(self, shard: torch.Tensor, group) -> None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.shard = shard
        self.group = group
        self.device = shard.device
        pg = group or dist.group.WORLD
        key = (tuple(shard.shape), shard.dtype, shard.device.index, id(pg))
        with _lock:
            cached = _buffers.get(key)
        if cached is None:
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:
                try:
                    enable(pg.group_name)
                except Exception:  # noqa: BLE001 - already enabled, or not needed on this version
                    pass
            buf = symm_mem.empty(*shard.shape, dtype=shard.dtype, device=shard.device)
            hdl = symm_mem.rendezvous(buf, pg)
            cached = (buf, hdl)
            with _lock:
                _buffers[key] = cached
        self.buf, self.hdl = cached
        self.hdl.barrier()  # peers finished reading the previous contents
        self.buf.copy_(shard)
        self.hdl.barrier()  # every rank's shard is in place
        self.stream = side_stream(self.device)

    def _peer(self, rank: int) -> torch.Tensor:
        return self.hdl.get_buffer(rank, tuple(self.shard.shape), self.shard.dtype)

    def _copies(self, pairs) -> Handle:
        start = torch.cuda.Event()
        start.record()  # destinations were allocated on the compute stream
        done = torch.cuda.Event()
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(start)
            for src, region, dst in pairs:
                dst.copy_(self._peer(src)[region], non_blocking=True)
            done.record(self.stream)
        keep = [d for _, _, d in pairs]
        for d in keep:
            d.record_stream(self.stream)
        return Handle(finalize=lambda: torch.cuda.current_stream().wait_event(done), keepalive=keep)

    def gather(self, region, out: torch.Tensor) -> Handle:
        """Copy every rank's ``shard[region]`` (own included) into ``out`` (``[P, ...]``) on the copy stream."""
        p = self.hdl.world_size
        view = out.view(p, *self.shard[region].shape)
        return self._copies([(i, region, view[i]) for i in range(p)])

    def fetch(self, region, srcs, outs, dsts, tag: int, per_recv: bool = False):
        """Copy ``shard[region]`` of each rank in ``srcs`` into ``outs``; ``dsts``/``tag`` unused (peers pull)."""
        h = self._copies([(s, region, o) for s, o in zip(srcs, outs)])
        return (h, [h] * len(outs)) if per_recv else h

    def close(self) -> None:
        """Join the copy stream and barrier, so no peer still reads this rank's buffer."""
        torch.cuda.current_stream().wait_stream(self.stream)
        self.hdl.barrier()
