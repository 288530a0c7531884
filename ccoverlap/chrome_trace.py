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

from ccoverlap.timeline import Timeline

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
    for i in order:
        kind = str(t.kind[i])
        args = {"device": rank, "stream": stream_ids[str(t.stream[i])], "ccoverlap_kind": kind,
                "ccoverlap_stream": str(t.stream[i])}
        if t.flops[i]:
            args["flops"] = float(t.flops[i])
        if kind == "comm":
            coll = str(t.collective[i])
            nelems = int(t.bytes[i] // dtype_bytes)
            args.update({
                "Collective name": coll or "p2p",
                "In msg nelems": nelems,
                "Out msg nelems": nelems,
                "Group size": int(t.meta.get("group_sizes", {}).get(str(t.group[i]), 0)),
                "dtype": "BFloat16" if dtype_bytes == 2 else "Float",
                "Process Group Name": str(t.group[i]),
                "Process Group Description": str(t.group[i]),
            })
        elif kind == "memcpy":
            args["bytes"] = float(t.bytes[i])
        events.append({
            "ph": "X",
            "cat": "gpu_memcpy" if kind == "memcpy" else "kernel",
            "name": kernel_name(kind, str(t.name[i]), str(t.collective[i])),
            "pid": rank,
            "tid": stream_ids[str(t.stream[i])],
            "ts": (float(t.start_s[i]) - t0) * 1e6,
            "dur": float(t.end_s[i] - t.start_s[i]) * 1e6,
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


def write_chrome_traces(tl: Timeline, out_dir: str | os.PathLike, *, world_size: int | None = None,
                        gpu_name: str = "", gzip_output: bool = False) -> list[Path]:
    """Write one ``rank-<r>.json`` (or ``.json.gz``) per rank of ``tl`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ranks = tl.ranks()
    world = world_size if world_size is not None else len(ranks)
    paths = []
    for r in ranks:
        doc = timeline_to_chrome(tl, r, world_size=world, gpu_name=gpu_name)
        path = out / (f"rank-{r}.json.gz" if gzip_output else f"rank-{r}.json")
        data = json.dumps(doc).encode()
        if gzip_output:
            with gzip.open(path, "wb") as fh:
                fh.write(data)
        else:
            path.write_bytes(data)
        paths.append(path)
    return paths
