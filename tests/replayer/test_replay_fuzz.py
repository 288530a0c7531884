"""Random Kineto-like events through replay: it replays or raises TraceError, never anything else,
and whatever it replays reproduces the measured step times (the graph is consistent)."""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccoverlap.errors import TraceError
from ccoverlap.replayer.run import replay

NAMES = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaDeviceSynchronize", "cudaStreamSynchronize",
         "cudaEventRecord", "cudaStreamWaitEvent"]
KNAMES = ["gemm", "ncclDevKernel_AllReduce_RING_LL", "Memcpy DtoH", "elementwise"]


@st.composite
def events(draw):
    n = draw(st.integers(1, 25))
    ev = []
    t = 0.0
    for i in range(n):
        t += draw(st.floats(0, 50))
        corr = 1000 + i
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": draw(st.sampled_from(NAMES)), "pid": 1,
                   "tid": draw(st.sampled_from([1, 2])), "ts": t, "dur": draw(st.floats(0, 30)),
                   "args": {"correlation": corr}})
        if draw(st.booleans()):
            name = draw(st.sampled_from(KNAMES))
            args = {"device": 0, "stream": draw(st.sampled_from([7, 20])), "correlation": corr}
            if name.startswith("nccl"):
                args.update({"Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float",
                             "Group size": 2, "Process Group Name": "0"})
            ev.append({"ph": "X", "cat": draw(st.sampled_from(["kernel", "gpu_memcpy"])), "name": name,
                       "pid": 0, "tid": args["stream"], "ts": t + draw(st.floats(-5, 100)),
                       "dur": draw(st.floats(0, 200)), "args": args})
    if draw(st.booleans()):
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0,
                   "dur": t / 2 + 1})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1,
                   "ts": t / 2 + 1, "dur": t / 2 + 200})
    return ev


@settings(max_examples=int(os.environ.get("REPLAY_FUZZ_N", "60")), deadline=None,
          derandomize=not os.environ.get("REPLAY_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=events(), b=events())
def test_random_jobs(tmp_path, a, b):
    for r, ev in enumerate((a, b)):
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(
            {"distributedInfo": {"rank": r, "world_size": 2}, "traceEvents": ev}))
    try:
        res = replay([str(tmp_path)], whatifs=["all"])
    except TraceError:
        return
    bad = [row for row in res.fidelity if not (abs(row["error_pct"]) < 1e-6 or row["measured_s"] < 1e-9)]
    if bad and os.environ.get("REPLAY_FUZZ_DUMP"):   # write the failing job for a closer look
        open(os.environ["REPLAY_FUZZ_DUMP"], "w").write(json.dumps([a, b]))
    for row in res.fidelity:
        assert abs(row["error_pct"]) < 1e-6 or row["measured_s"] < 1e-9
