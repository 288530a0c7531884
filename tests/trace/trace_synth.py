"""Hand-made Kineto (torch.profiler) traces with known answers, for the analyser's tests.

``trace(...)`` returns the dict torch.profiler would write for one rank: GPU kernels on
``pid`` = device / ``tid`` = stream with ``stream`` / ``correlation`` / ``External id`` args,
one ``cudaLaunchKernel`` runtime event per kernel (same correlation), ``ProfilerStep#N``
user annotations, ``distributedInfo``. Times are microseconds, as in real traces.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def kernel(name: str, ts: float, dur: float, *, stream: int = 7, launch: float | None = None, **args) -> dict:
    """A kernel spec; ``launch`` = CPU launch time (default 5 µs before ``ts``; False: no launch event)."""
    return {"name": name, "ts": ts, "dur": dur, "stream": stream, "launch": ts - 5 if launch is None else launch,
            "args": args}


def nccl(coll: str, ts: float, dur: float, *, nelems: int = 1 << 20, group: str = "0", size: int = 2,
         stream: int = 20, launch: float | None = None, dtype: str = "Float", kernel_args: bool = True) -> dict:
    """An NCCL kernel (current naming) with the collective args Kineto attaches."""
    short = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
             "broadcast": "Broadcast", "all_to_all": "SendRecv"}[coll]
    args = {"Collective name": coll.replace("_", "") if coll != "all_to_all" else "all_to_all",
            "In msg nelems": nelems if coll != "all_gather" else nelems // size,
            "Out msg nelems": nelems if coll != "reduce_scatter" else nelems // size,
            "Group size": size, "dtype": dtype, "Process Group Name": group,
            "Process Group Description": "default_pg"} if kernel_args else {}
    return kernel(f"ncclDevKernel_{short}_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ts, dur, stream=stream,
                  launch=launch, **args)


def trace(kernels: list[dict], *, rank: int | None = 0, world: int | None = 2,
          steps: list[tuple[int, float, float]] = (), cpu_ops: list[dict] = (), memcpy: list[tuple] = (),
          display: str = "ms", extra_meta: dict | None = None, meta_after_events: bool = False) -> dict:
    """One rank's trace dict. ``steps``: (N, ts, dur) of ``ProfilerStep#N``; ``cpu_ops``: raw
    extra CPU events (pid 100, tid 100 unless given); ``memcpy``: (ts, dur) gpu_memcpy events."""
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "thread 100 (python)"}},
    ]
    for n, ts, dur in steps:
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 100, "tid": 100,
                       "ts": ts, "dur": dur, "args": {"External id": 1}})
    corr = 1000
    for k in kernels:
        corr += 1
        args = {"External id": corr, "device": 0, "stream": k["stream"], "correlation": corr}
        args.update(k["args"])
        events.append({"ph": "X", "cat": "kernel", "name": k["name"], "pid": 0, "tid": k["stream"], "ts": k["ts"],
                       "dur": k["dur"], "args": args})
        if k["launch"] is not False:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100,
                           "ts": k["launch"], "dur": 2, "args": {"External id": corr, "correlation": corr}})
    for i, (ts, dur) in enumerate(memcpy):
        corr += 1
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                       "tid": 7, "ts": ts, "dur": dur, "args": {"device": 0, "stream": 7, "correlation": corr}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 100, "tid": 100,
                       "ts": ts - 5, "dur": 2, "args": {"correlation": corr}})
    for op in cpu_ops:
        e = {"ph": "X", "cat": "cpu_op", "pid": 100, "tid": 100}
        e.update(op)
        events.append(e)
    meta: dict = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}]}
    if rank is not None:
        meta["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    if extra_meta:
        meta.update(extra_meta)
    tail = {"traceName": "synthetic", "displayTimeUnit": display}
    if meta_after_events:
        return {"traceEvents": events, **meta, **tail}
    return {**meta, "traceEvents": events, **tail}


def write(doc: dict, path: Path, *, gz: bool | None = None) -> Path:
    """Write ``doc`` as JSON (gzip when ``gz`` or the name ends in .gz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc).encode()
    if gz or (gz is None and path.name.endswith(".gz")):
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    return path
