"""Timeline metrics on hand-made intervals with known answers, and Chrome-trace writing."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ccoverlap.sim.chrome_trace import write_chrome_traces
from ccoverlap.sim.timeline import (
    Timeline,
    TimelineBuilder,
    all_rank_metrics,
    intersection_length,
    merge_intervals,
    rank_metrics,
    union_length,
)


def _tl(rows):
    b = TimelineBuilder()
    for rank, stream, kind, s, e in rows:
        b.append(rank=rank, stream=stream, kind=kind, name=f"{kind}{s}", start_s=s, end_s=e)
    return b.build()


def test_merge_intervals_unions_overlaps_and_keeps_gaps():
    s, e = merge_intervals(np.array([5.0, 0.0, 1.0, 8.0]), np.array([6.0, 2.0, 3.0, 9.0]))
    assert list(s) == [0.0, 5.0, 8.0]
    assert list(e) == [3.0, 6.0, 9.0]


def test_overlap_ratio_uses_merged_intervals():
    # two comm kernels overlapping each other (union 0..4), compute 2..6
    tl = _tl([(0, "c1", "comm", 0.0, 3.0), (0, "c2", "comm", 1.0, 4.0), (0, "k", "compute", 2.0, 6.0)])
    m = rank_metrics(tl, 0)
    assert m.comm_s == pytest.approx(4.0)
    assert m.overlap_s == pytest.approx(2.0)
    assert m.overlap_ratio == pytest.approx(0.5)
    assert m.exposed_comm_s == pytest.approx(2.0)
    assert m.compute_only_s == pytest.approx(2.0)
    assert m.step_time_s == pytest.approx(6.0)


def test_idle_and_window():
    tl = _tl([(0, "k", "compute", 0.0, 1.0), (0, "k", "compute", 3.0, 4.0), (0, "c", "comm", 3.5, 5.0)])
    m = rank_metrics(tl, 0)
    assert m.idle_s == pytest.approx(2.0)
    w = rank_metrics(tl, 0, window=(0.5, 3.75))
    assert w.step_time_s == pytest.approx(3.25)
    assert w.compute_s == pytest.approx(1.25)
    assert w.comm_s == pytest.approx(0.25)


def test_touching_intervals_do_not_count_as_overlap():
    tl = _tl([(0, "k", "compute", 0.0, 1.0), (0, "c", "comm", 1.0, 2.0)])
    assert rank_metrics(tl, 0).overlap_s == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 10), st.booleans()), min_size=1, max_size=30))
def test_intersection_matches_brute_force(items):
    a = [(s, s + d) for s, d, is_a in items if is_a]
    b = [(s, s + d) for s, d, is_a in items if not is_a]

    def to_arr(iv):
        return merge_intervals(np.array([x for x, _ in iv], dtype=float), np.array([y for _, y in iv], dtype=float))

    got = intersection_length(to_arr(a), to_arr(b))
    # brute force on a fine grid of all boundaries
    pts = sorted({p for iv in a + b for p in iv})
    want = 0.0
    for lo, hi in zip(pts, pts[1:]):
        mid = (lo + hi) / 2
        if any(s <= mid < e for s, e in a) and any(s <= mid < e for s, e in b):
            want += hi - lo
    assert got == pytest.approx(want, abs=1e-9)
    assert union_length(np.array([x for x, _ in a] or [0.0]), np.array([y for _, y in a] or [0.0])) >= 0


def test_chrome_trace_has_kineto_layout(tmp_path):
    b = TimelineBuilder()
    b.append(rank=0, stream="compute", kind="compute", name="gemm", start_s=0.0, end_s=1e-3, flops=1e9)
    b.append(rank=0, stream="comm", kind="comm", name="ag", start_s=0.0, end_s=2e-3, bytes=4096,
             collective="all_gather", group="dp")
    b.append(rank=1, stream="compute", kind="compute", name="gemm", start_s=0.0, end_s=1e-3)
    paths = write_chrome_traces(b.build(meta={"group_sizes": {"dp": 2}}), tmp_path)
    assert [p.name for p in paths] == ["rank-0.json", "rank-1.json"]
    doc = json.loads(paths[0].read_text())
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 2}
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    comm = [k for k in kernels if k["name"].startswith("ncclDevKernel_AllGather")]
    assert len(comm) == 1 and comm[0]["dur"] == pytest.approx(2000.0)
    assert comm[0]["args"]["Collective name"] == "all_gather"
    assert comm[0]["args"]["Group size"] == 2
    assert any(e["name"].startswith("ProfilerStep#") for e in doc["traceEvents"])


def test_timeline_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        Timeline(rank=[0], stream=["s"], kind=["gpu"], name=["x"], start_s=[0.0], end_s=[1.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["compute", "comm", "memcpy"]),
                          st.floats(0.0, 10.0), st.floats(0.0, 3.0)), min_size=1, max_size=30),
       st.none() | st.tuples(st.floats(0.0, 5.0), st.floats(5.0, 12.0)))
def test_all_rank_metrics_equals_rank_metrics_of_each_rank(items, window):
    # ranks interleaved in row order: grouping the rows by rank must keep each rank's order
    tl = _tl([(r, "s", k, s, s + d) for r, k, s, d in items])
    want = [rank_metrics(tl, r, window=window) for r in tl.ranks()]
    assert all_rank_metrics(tl, window=window) == want
