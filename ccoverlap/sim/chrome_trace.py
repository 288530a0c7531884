"""Write a Timeline as Chrome-trace JSON in the layout torch.profiler (Kineto) writes.

One file per rank: GPU kernels as complete (``"ph": "X"``) events with ``cat: "kernel"`` on
``pid`` = device, ``tid`` = stream id, times in microseconds; a ``ProfilerStep#N`` CPU
annotation around the step; ``distributedInfo`` with rank and world size; collective
kernels named as NCCL names them (``ncclDevKernel_AllGather_RING_LL(...)``) with the
``Collective name`` / ``In msg nelems`` / ``Group size`` / ``Process Group Name`` args that
Kineto attaches. So a simulated step opens in Perfetto and is read back by
``ccoverlap analyze`` exactly like a measured one.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np

from ccoverlap.outputs import write_files
from ccoverlap.sim.timeline import Timeline

_NCCL_NAMES = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "all_to_all": "SendRecv",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "send": "SendRecv",
    "recv": "SendRecv",
    "p2p": "SendRecv",
}
_FIRST_STREAM_ID = 7  # CUDA's default stream shows up as 7 in Kineto traces


def kernel_name(kind: str, name: str, collective: str) -> str:
    """The kernel name a profiler would show for this row (NCCL naming for collectives)."""
    if kind == "comm":
        coll = _NCCL_NAMES.get(collective, "SendRecv")
        algo = "RING_LL" if coll not in ("SendRecv",) else ""
        suffix = f"_{algo}" if algo else ""
        return f"ncclDevKernel_{coll}{suffix}(ncclDevKernelArgsStorage<4096ul>) [{name}]"
    if kind == "memcpy":
        return f"Memcpy DtoD (Device -> Device) [{name}]"
    return name


def timeline_to_chrome(tl: Timeline, rank: int, *, world_size: int, gpu_name: str = "",
                       step: int = 1, dtype_bytes: int = 2) -> dict:
    """The Chrome-trace dict of one rank of ``tl`` (times shifted so the step starts at 0 µs)."""
    t = tl.for_rank(rank)
    t0 = float(t.start_s.min()) if len(t) else 0.0
    t1 = float(t.end_s.max()) if len(t) else 0.0
    streams = list(dict.fromkeys(str(s) for s in t.stream))
    stream_ids = {s: _FIRST_STREAM_ID + i for i, s in enumerate(streams)}
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"GPU {rank}"}},
        {"ph": "M", "name": "process_name", "pid": 100000 + rank, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 100000 + rank,
         "tid": 1, "ts": 0.0, "dur": (t1 - t0) * 1e6, "args": {}},
    ]
    for s, sid in stream_ids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": sid,
                       "args": {"name": f"stream {sid} ({s})"}})
    order = np.argsort(t.start_s, kind="stable")
    # columns as Python lists once (indexing numpy arrays element by element was most of the time)
    kinds = t.kind[order].tolist()
    strs = [str(x) for x in t.stream[order].tolist()]
    names = t.name[order].tolist()
    colls = t.collective[order].tolist()
    groups = [str(g) for g in t.group[order].tolist()]
    flops = t.flops[order].tolist()
    nbytes = t.bytes[order].tolist()
    ts = ((t.start_s[order] - t0) * 1e6).tolist()
    durs = ((t.end_s[order] - t.start_s[order]) * 1e6).tolist()
    group_sizes = t.meta.get("group_sizes", {})
    dtype_name = "BFloat16" if dtype_bytes == 2 else "Float"
    for kind, stream, name, coll, group, fl, nb, start, dur in zip(kinds, strs, names, colls, groups, flops,
                                                                    nbytes, ts, durs):
        kind = str(kind)
        sid = stream_ids[stream]
        args = {"device": rank, "stream": sid, "ccoverlap_kind": kind, "ccoverlap_stream": stream}
        if fl:
            args["flops"] = float(fl)
        if kind == "comm":
            coll = str(coll)
            nelems = int(nb // dtype_bytes)
            args.update({
                "Collective name": coll or "p2p",
                "In msg nelems": nelems,
                "Out msg nelems": nelems,
                "Group size": int(group_sizes.get(group, 0)),
                "dtype": dtype_name,
                "Process Group Name": group,
                "Process Group Description": group,
            })
        elif kind == "memcpy":
            args["bytes"] = float(nb)
        events.append({
            "ph": "X",
            "cat": "gpu_memcpy" if kind == "memcpy" else "kernel",
            "name": kernel_name(kind, str(name), str(coll)),
            "pid": rank,
            "tid": sid,
            "ts": start,
            "dur": dur,
            "args": args,
        })
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": rank, "name": gpu_name}] if gpu_name else [],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        "displayTimeUnit": "ms",
        "traceName": f"ccoverlap simulated rank {rank}",
        "traceEvents": events,
    }


def _encode(doc: dict) -> bytes:
    """JSON bytes of ``doc``: msgspec's encoder where installed (several times faster on the
    hundreds of thousands of events of a large step), else the standard library's."""
    try:
        import msgspec
    except ImportError:
        return json.dumps(doc).encode()
    return msgspec.json.encode(doc)


def write_chrome_traces(tl: Timeline, out_dir: str | os.PathLike, *, world_size: int | None = None,
                        gpu_name: str = "", gzip_output: bool = False) -> list[Path]:
    """Write one ``rank-<r>.json`` (or ``.json.gz``) per rank of ``tl`` into ``out_dir``."""
    ranks = tl.ranks()
    world = world_size if world_size is not None else len(ranks)
    files: dict[str, bytes | str] = {}
    for r in ranks:
        doc = timeline_to_chrome(tl, r, world_size=world, gpu_name=gpu_name)
        data = _encode(doc)
        files[f"rank-{r}.json.gz" if gzip_output else f"rank-{r}.json"] = gzip.compress(data) if gzip_output else data
    return write_files(out_dir, files)  # the set, all or none
