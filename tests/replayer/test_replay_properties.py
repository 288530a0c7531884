"""What-ifs that cannot point the wrong way.

* On every trace we have (the shared real traces, the repository's fixtures) and every
  what-if: removing or hiding work never lengthens the replayed step nor moves any step's end
  later, a slower network never shortens it, ``lagom`` and ``centauri`` never report a slowdown,
  and no report prints a negative communication bound; and, as reported (in the measured step's
  time), no removal what-if exceeds the measured step, nor any step's measured end - also when
  the rebuilt step itself is off (an error injected by hand).
* On random jobs (hypothesis): any edit that only shortens durations or drops edges moves no
  node later; the two replay engines give the same times.
* The cause of the wrong sign once seen on a real trace, rebuilt by hand: the CPU no longer
  waits, the next step's first copy starts while this step's last kernel runs, and the two
  step windows overlap.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccoverlap.errors import TraceError
from ccoverlap.replayer import run as replay_run
from ccoverlap.replayer import whatif as W
from ccoverlap.replayer.core import load_job
from ccoverlap.replayer.run import recommendation, replay

from .conftest import FIXTURES, SHARED
from .synth import Rank, allreduce_args
from .test_replay_fuzz import events

US = 1e-6
REMOVING = ("no-comm", "comm-hidden", "no-contention", "copy-engine", "network-2x", "network-4x")
SLOWING = ("network-0.5x", "network-0.25x")
DECIDED = ("lagom", "centauri")


def _trace_dirs() -> list[Path]:
    dirs = sorted(p for p in FIXTURES.rglob("*") if p.is_dir() and any(p.glob("*.json*")))
    if SHARED.exists():
        dirs += sorted(p for p in SHARED.iterdir() if p.is_dir())
    return dirs


@functools.cache
def _replayed(trace: Path):
    """Every what-if of the tests below replayed once per trace (None: nothing replayable)."""
    try:
        return replay([str(trace)], whatifs=list(REMOVING + SLOWING + DECIDED))
    except TraceError as exc:          # CPU-only / GPU-less traces: one clear line, nothing replayed
        assert "nothing could be replayed" in str(exc) and "\n" not in str(exc)
        return None


@pytest.mark.parametrize("trace", _trace_dirs(), ids=lambda p: p.name)
def test_no_whatif_points_the_wrong_way(trace):
    res = _replayed(trace)
    if res is None:
        return
    base = res.replay
    tol = 1e-9 * max(base.step_time_s, 1e-6)
    for s in res.whatifs:
        raw = s.rebuilt_step_time_s
        if s.name in REMOVING:
            assert raw <= base.step_time_s + tol, (trace.name, s.name, s.gain_s)
            for r, b in s.measured.bounds.items():
                for step, end in b.ends.items():
                    assert end <= base.measured.bounds[r].ends[step] + tol, (trace.name, s.name, r, step)
        elif s.name in SLOWING:
            assert raw >= base.step_time_s - tol, (trace.name, s.name, s.gain_s)
        else:
            assert s.gain_s >= -tol, (trace.name, s.name, s.gain_s)
            if raw == base.step_time_s:
                assert s.step_time_s == res.measured.step_time_s and s.gain_s == 0
    assert "at most -" not in recommendation(res)


def _never_above_measured(res, names) -> list:
    """(what-if, step, reported, measured) wherever a what-if in ``names`` exceeds the measured
    step time or a step's measured end (s, from the window start)."""
    m = res.measured
    tol = 1e-9 * max(m.step_time_s, 1e-6)
    bad = []
    for s in res.whatifs:
        if s.name not in names:
            continue
        if s.step_time_s > m.step_time_s + tol:
            bad.append((s.name, "mean", s.step_time_s, m.step_time_s))
        for step, end in s.step_end_s.items():
            if end > m.step_end_s[step] + tol:
                bad.append((s.name, step, end, m.step_end_s[step]))
    return bad


NEVER_ABOVE = ("no-comm", "comm-hidden", "no-contention", "copy-engine", "network-2x", "network-4x") + DECIDED


@pytest.mark.parametrize("trace", _trace_dirs(), ids=lambda p: p.name)
def test_removal_whatifs_never_exceed_the_measured_step(trace):
    res = _replayed(trace)
    if res is not None:
        assert not _never_above_measured(res, NEVER_ABOVE), trace.name


def test_a_rebuilt_step_longer_than_measured_does_not_lengthen_the_what_ifs(tmp_path, monkeypatch):
    # every duration and gap of the graph 7 % longer: the rebuilt step is ~7 % off, as a graph that misses
    # a dependency may be; removing communication still cannot make the step longer than measured
    from .test_replay import _cpu_bound_job

    def off_by_7_percent(*a, **k):
        job = load_job(*a, **k)
        job.graph.dur, job.graph.w = job.graph.dur * 1.07, job.graph.w * 1.07
        return job

    monkeypatch.setattr(replay_run, "load_job", off_by_7_percent)
    res = replay([str(_cpu_bound_job(tmp_path))], whatifs=list(NEVER_ABOVE))
    assert res.replay.step_time_s > 1.05 * res.measured.step_time_s
    assert res.rebuilt_error_pct > 5
    assert not _never_above_measured(res, NEVER_ABOVE)
    nc = next(s for s in res.whatifs if s.name == "no-comm")
    assert nc.rebuilt_step_time_s > res.measured.step_time_s       # what it would have printed before
    assert nc.step_time_s == res.measured.step_time_s and nc.gain_s == 0


@pytest.mark.parametrize("trace", _trace_dirs(), ids=lambda p: p.name)
def test_both_engines_give_the_same_replay(trace):
    try:
        job = load_job([str(trace)])
    except TraceError:
        return
    jg = job.graph
    for e in (W.base_edit(jg, "base"), W.no_comm(jg), W.comm_hidden(jg)):
        jg.use_engine("levels")
        a = e.run(jg)
        jg.use_engine("nodes")
        b = e.run(jg)
        assert np.allclose(a, b, rtol=0, atol=1e-12), (trace.name, e.name, float(np.max(np.abs(a - b))))


def _cpu_ahead_job(d: Path) -> Path:
    """Step 1: K1 (stream 7, 10-1010), all-reduce C (stream 20, 20-1500), a stream sync that
    returns 2 µs after C, Klast (1510-1520) launched after it. Step 2: an H2D copy on stream 22
    (1540-1550), K2 (1560-2560), a sync on K2. Step 3 (dropped by --steps hta): K3 (2580-2600)."""
    k = Rank(0, 2)
    k.step(1, 0.0, 1530.0)
    k.launch("gemm_K1", 0.0, 7, 10.0, 1000.0)
    k.launch("ncclDevKernel_AllReduce_RING_LL", 1.0, 20, 20.0, 1480.0, **allreduce_args(2))
    k.call("cudaStreamSynchronize", 2.0, 1500.0)
    k.launch("gemm_Klast", 1505.0, 7, 1510.0, 10.0)
    k.step(2, 1530.0, 1040.0)
    c = k.call("cudaMemcpyAsync", 1535.0)
    k.kernel("Memcpy HtoD (Pinned -> Device)", c, 22, 1540.0, 10.0, cat="gpu_memcpy")
    k.launch("gemm_K2", 1555.0, 7, 1560.0, 1000.0)
    k.call("cudaStreamSynchronize", 1560.0, 1002.0)
    k.step(3, 2570.0, 130.0)
    k.launch("gemm_K3", 2575.0, 7, 2580.0, 20.0)
    return k.write(d / "rank-0.json")


def test_overlapping_step_windows_do_not_lengthen_the_step(tmp_path):
    res = replay([str(_cpu_ahead_job(tmp_path))], whatifs=["no-comm", "comm-hidden"])
    # measured: step 1 ends at 1540 (step 2's copy starts), step 2 at 2580 (K3 starts): (2580 - 10) / 2
    assert res.measured.step_time_s == pytest.approx(1285 * US)
    assert res.replay.step_time_s == pytest.approx(1285 * US)
    for s in res.whatifs:
        # without C the sync returns at 22 (C's end 20 + the measured 2 µs); Klast is launched at 25 but
        # waits for K1 (1010-1020); the CPU launches the copy at 55 (60-70) and K2 at 75, after Klast
        # (1020-2020); the sync returns at 2022, K3 runs at 2040: step 1 ends at 1020, step 2 at 2040
        # -> (2040 - 10) / 2
        assert s.step_time_s == pytest.approx(1015 * US), s.name
        w1, w2 = s.measured.steps[0][1], s.measured.steps[0][2]
        # the analyser's windows (first op to end) overlap: step 2's copy runs inside step 1's window
        # (no-comm: at 60; comm-hidden: the sync no longer waits at all, the copy runs at 50), so the
        # mean of the windows would be longer than the measured step
        copy_at = {"no-comm": 60, "comm-hidden": 50}[s.name]
        assert w2.step_time_s == pytest.approx((2040 - copy_at) * US)
        assert (w1.step_time_s + w2.step_time_s) / 2 > res.measured.step_time_s


def _random_removal(jg, data, base_edit: W.Edit) -> W.Edit:
    e = W.base_edit(jg, "random")
    n, m = len(jg.dur), len(jg.w)
    shrink = np.asarray(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    e.dur = jg.dur * shrink
    cut = np.asarray(data.draw(st.lists(st.booleans(), min_size=m, max_size=m)), dtype=bool)
    e.on = ~cut
    lower = np.asarray(data.draw(st.lists(st.floats(0, 1e-4), min_size=m, max_size=m)))
    e.w = jg.w - lower
    return e


@settings(max_examples=int(os.environ.get("REPLAY_FUZZ_N", "40")), deadline=None,
          derandomize=not os.environ.get("REPLAY_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(a=events(), b=events(), data=st.data())
def test_removing_work_never_moves_a_node_later(tmp_path, a, b, data):
    for r, ev in enumerate((a, b)):
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(
            {"distributedInfo": {"rank": r, "world_size": 2}, "traceEvents": ev}))
    try:
        job = load_job([str(tmp_path)], steps="all")
    except TraceError:
        return
    jg = job.graph
    base = jg.run()
    e = _random_removal(jg, data, W.base_edit(jg, "base"))
    times = {}
    for engine in ("levels", "nodes"):
        jg.use_engine(engine)
        times[engine] = e.run(jg)
        assert np.allclose(jg.run(), base, rtol=0, atol=1e-12)
    assert np.allclose(times["levels"], times["nodes"], rtol=0, atol=1e-12)
    # a node that lost every constraint keeps its measured start, which the base replay reproduces
    assert np.all(times["nodes"] <= base + 1e-12)
