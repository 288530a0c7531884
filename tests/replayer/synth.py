"""Hand-made Kineto traces with known answers for the replay tests (times in µs)."""

from __future__ import annotations

import json
from pathlib import Path


class Rank:
    """Builder of one rank's trace: CPU runtime calls on thread 1, device events on streams."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.ev: list[dict] = []
        self.corr = 100

    def call(self, name: str, ts: float, dur: float = 2.0) -> int:
        self.corr += 1
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                        "args": {"correlation": self.corr}})
        return self.corr

    def kernel(self, name: str, corr: int, stream: int, ts: float, dur: float, cat: str = "kernel", **args):
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                        "args": dict({"device": 0, "stream": stream, "correlation": corr}, **args)})

    def launch(self, name: str, ts: float, stream: int, k_ts: float, k_dur: float, **args) -> int:
        c = self.call("cudaLaunchKernel", ts)
        self.kernel(name, c, stream, k_ts, k_dur, **args)
        return c

    def step(self, n: int, ts: float, dur: float):
        self.ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                        "ts": ts, "dur": dur})

    def write(self, path: Path) -> Path:
        doc = {"distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
               "traceEvents": self.ev}
        path.write_text(json.dumps(doc))
        return path


def allreduce_args(group_size: int = 2) -> dict:
    return {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
            "dtype": "Float", "Group size": group_size, "Process Group Name": "0"}


def two_rank_job(d: Path, *, group_size: int = 2) -> list[Path]:
    """A (compute, stream 7) -> all-reduce C (stream 20, waits for A: cross-stream, inferred) ->
    B (stream 7, waits for C) -> cudaDeviceSynchronize (blocking) -> D in step 2.

    Rank 0: A 10-1010; rank 1: A 10-1510. C starts when A ends; it ends at 1910 on both ranks
    (transfer 400 µs after the later member, rank 1, arrived). B 1910-2910, sync returns 2915,
    next launch 10 µs later (2925), D 2935-3035 (launch latency 10 µs).
    """
    paths = []
    for r, a_dur in ((0, 1000.0), (1, 1500.0)):
        k = Rank(r, 2)
        k.step(1, 0.0, 2920.0)
        k.launch("gemm_A", 0.0, 7, 10.0, a_dur)
        c_start = 10.0 + a_dur
        k.launch("ncclDevKernel_AllReduce_RING_LL", 5.0, 20, c_start, 1910.0 - c_start,
                 **allreduce_args(group_size))
        k.launch("gemm_B", 8.0, 7, 1910.0, 1000.0)
        k.call("cudaDeviceSynchronize", 30.0, 2915.0 - 30.0)
        k.step(2, 2920.0, 180.0)
        k.launch("gemm_D", 2925.0, 7, 2935.0, 100.0)
        paths.append(k.write(d / f"rank-{r}.json"))
    return paths
