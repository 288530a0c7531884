"""Metrics with known answers, step windows (HTA's semantics), and the simulator round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trace_synth import kernel, nccl, trace, write

from ccoverlap.errors import ConfigError
from ccoverlap.sim.chrome_trace import write_chrome_traces
from ccoverlap.sim.timeline import TimelineBuilder, rank_metrics
from ccoverlap.trace.analyze import analyze
from ccoverlap.trace.steps import parse_steps


def test_overlap_exactly_half(fixtures_dir):
    a = analyze([fixtures_dir / "synthetic" / "overlap50"])
    m = a.metrics[0]
    assert m.overlap_ratio == pytest.approx(0.5, abs=1e-12)
    assert m.comm_s == pytest.approx(100e-6) and m.compute_s == pytest.approx(100e-6)
    assert m.exposed_comm_s == pytest.approx(50e-6) and m.compute_only_s == pytest.approx(50e-6)
    assert m.idle_s == pytest.approx(0, abs=1e-12) and m.compute_comm_ratio == pytest.approx(1.0)


def test_merged_intervals_like_hta(tmp_path):
    """Two comm kernels overlapping each other count once; compute on two streams counts once."""
    ks = [nccl("all_reduce", 0, 100, stream=20), nccl("all_gather", 50, 100, stream=21),   # comm union 150
          kernel("gemm", 100, 100, stream=7), kernel("gemm2", 120, 30, stream=8),           # comp union 100
          kernel("late", 400, 100, stream=7)]
    a = analyze([write(trace(ks, rank=0, world=1), tmp_path / "r.json")])
    m = a.metrics[0]
    assert m.comm_s == pytest.approx(150e-6) and m.compute_s == pytest.approx(200e-6)
    assert m.overlap_s == pytest.approx(50e-6) and m.overlap_ratio == pytest.approx(50 / 150)
    assert m.idle_s == pytest.approx(200e-6)   # span 500, busy 300
    assert m.step_time_s == pytest.approx(500e-6)


def test_memcpy_is_neither_compute_nor_comm(tmp_path):
    doc = trace([nccl("all_reduce", 0, 100)], rank=0, world=1, memcpy=[(0, 100)])
    m = analyze([write(doc, tmp_path / "r.json")]).metrics[0]
    assert m.memcpy_s == pytest.approx(100e-6) and m.overlap_ratio == 0.0 and m.exposed_comm_s == pytest.approx(100e-6)


# ----------------------------------------------------------------------------- steps

def _stepped(tmp_path, rank=0, world=1):
    """Steps 1,2,3 at 0/1000/2000 µs; one gemm + one all_reduce launched in each; plus a kernel
    launched before step 1 and one whose launch is missing from the trace."""
    ks = []
    for s in (1, 2, 3):
        base = s * 1000
        ks.append(kernel(f"gemm_s{s}", base + 100, 300, launch=base + 10))
        ks.append(nccl("all_reduce", base + 200, 100 * s, launch=base + 20))
    ks.append(kernel("before_steps", 500, 50, launch=400))
    ks.append(kernel("orphan", 1500, 50, launch=False))
    doc = trace(ks, rank=rank, world=world, steps=[(s, s * 1000, 1000) for s in (1, 2, 3)])
    return write(doc, tmp_path / f"rank-{rank}.json")


def test_default_window_is_htas(tmp_path):
    a = analyze([_stepped(tmp_path)])
    names = set(a.ranks[0].analysed_names)
    assert "before_steps" in names and "gemm_s1" in names and "gemm_s2" in names
    assert "gemm_s3" not in names          # the last step is dropped
    assert "orphan" not in names           # no launch event -> HTA drops it
    assert a.analysed_steps == [1, 2]
    assert a.available_steps == [1, 2, 3]


def test_steps_all_and_explicit(tmp_path):
    path = _stepped(tmp_path)
    everything = analyze([path], steps="all")
    assert {"gemm_s3", "before_steps"} <= set(everything.ranks[0].analysed_names)
    only2 = analyze([path], steps="2")
    assert set(only2.ranks[0].analysed_names) == {"gemm_s2", nccl("all_reduce", 0, 1)["name"]}
    assert only2.metrics[0].comm_s == pytest.approx(200e-6)
    assert analyze([path], steps="2-3").analysed_steps == [2, 3]


def test_per_step_metrics_and_windows(tmp_path):
    a = analyze([_stepped(tmp_path)], steps="all")
    s2 = a.step_metrics[2][0]
    # rows of step 2: gemm [2100, 2400), comm [2200, 2400); window runs to step 3's first row (3100)
    assert s2.step_time_s == pytest.approx(1000e-6)
    assert s2.comm_s == pytest.approx(200e-6) and s2.overlap_ratio == pytest.approx(1.0)
    assert s2.idle_s == pytest.approx(700e-6)


def test_single_profiler_step_keeps_everything(tmp_path):
    ks = [kernel("a", 0, 10, launch=-100), kernel("b", 5000, 10, launch=4000)]
    doc = trace(ks, rank=0, world=1, steps=[(7, 0, 100)])
    a = analyze([write(doc, tmp_path / "r.json")])
    assert a.ranks[0].rows == 2


def test_parse_steps():
    assert parse_steps(None) == "hta" and parse_steps("HTA") == "hta" and parse_steps("all") == "all"
    assert parse_steps("3,4") == [3, 4] and parse_steps("5-7, 9") == [5, 6, 7, 9]
    for bad in ("x", "4-2", ",", "1-x"):
        with pytest.raises(ConfigError):
            parse_steps(bad)


def test_unknown_step_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such profiler step"):
        analyze([_stepped(tmp_path)], steps="99")


# ----------------------------------------------------------------------------- round trip

def _random_timeline(draw_rows):
    b = TimelineBuilder()
    for rank, stream, kind, start, dur, coll in draw_rows:
        b.append(rank=rank, stream=stream, kind=kind, name=f"{kind}_{stream}", start_s=start, end_s=start + dur,
                 bytes=4096.0 if kind == "comm" else 0.0, collective=coll if kind == "comm" else "",
                 group="dp" if kind == "comm" else "")
    return b.build(meta={"group_sizes": {"dp": 2}})


_row = st.tuples(st.integers(0, 1), st.sampled_from(["compute", "comm", "copy"]),
                 st.sampled_from(["compute", "comm", "memcpy", "other"]),
                 st.floats(0, 5e-3, allow_nan=False), st.floats(1e-6, 2e-3, allow_nan=False),
                 st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, min_size=1, max_size=25))
def test_round_trip_simulated_timeline(tmp_path_factory, rows):
    """Simulated Timeline -> chrome_trace.write_chrome_traces -> analyze -> the same metrics."""
    tl = _random_timeline(rows)
    out = tmp_path_factory.mktemp("rt")
    write_chrome_traces(tl, out, world_size=2)
    a = analyze([out])     # default resolution: ccoverlap's own traces are never rounded
    got = {m.rank: m for m in a.metrics}
    for r in tl.ranks():
        want = rank_metrics(tl, r)
        m = got[r]
        for key in ("step_time_s", "compute_s", "comm_s", "memcpy_s", "overlap_s", "exposed_comm_s", "idle_s"):
            assert getattr(m, key) == pytest.approx(getattr(want, key), abs=1e-9), key
        assert m.overlap_ratio == pytest.approx(want.overlap_ratio, abs=1e-9)


def test_round_trip_keeps_collectives(tmp_path):
    tl = _random_timeline([(0, "comm", "comm", 0.0, 1e-3, "all_gather"), (1, "comm", "comm", 2e-4, 1e-3, "all_gather"),
                           (0, "compute", "compute", 0.0, 5e-4, ""), (1, "compute", "compute", 0.0, 5e-4, "")])
    write_chrome_traces(tl, tmp_path, world_size=2, gzip_output=True)
    a = analyze([tmp_path], time_resolution="exact")
    (c,) = a.collectives
    assert (c.collective, c.group, c.group_size, c.count) == ("all_gather", "dp", 2, 2)
    assert c.bytes_mean == pytest.approx(4096)
    assert c.busbw == pytest.approx(4096 / 1e-3 * 0.5)
    assert np.isfinite(a.metrics[0].compute_comm_ratio)


def test_parallel_loading_gives_the_same_answer(fixtures_dir, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    one = analyze([fixtures_dir / "synthetic" / "two_steps", bad], jobs=1)
    two = analyze([fixtures_dir / "synthetic" / "two_steps", bad], jobs=2)
    assert [m.to_dict() for m in one.metrics] == [m.to_dict() for m in two.metrics]
    assert any("broken.json" in p for p in two.problems)
