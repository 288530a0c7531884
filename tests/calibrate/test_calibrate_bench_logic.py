"""The timing logic of ``ccoverlap calibrate``'s Bench and of its ``sustained`` section, run on a
stand-in for ``torch.cuda`` whose events read a virtual clock that each launched call advances
(no GPU needed): per-call medians, loop sizing, and a clock that settles lower after a while."""

import contextlib
import types

import pytest

from ccoverlap.calibrate import grids
from ccoverlap.calibrate import microbench as mb
from ccoverlap.calibrate import sustained as S


class VirtualGPU:
    """A fake ``torch`` whose CUDA events record a virtual time that ``call()`` advances."""

    def __init__(self, cost_s, slow_after_s=None, slow_factor=1.0):
        self.t, self.cost, self.slow_after, self.slow = 0.0, cost_s, slow_after_s, slow_factor
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                self.at = None

            def record(self):
                self.at = gpu.t

            def synchronize(self):
                pass

            def elapsed_time(self, other):  # milliseconds, as torch.cuda.Event
                return (other.at - self.at) * 1e3

        self.cuda = types.SimpleNamespace(Event=Event, stream=lambda s: contextlib.nullcontext(),
                                          clock_rate=lambda dev: 1980 if gpu.t < (slow_after_s or 1e9) else 1584,
                                          empty_cache=lambda: None, OutOfMemoryError=MemoryError)

    def call(self):
        hot = self.slow_after is not None and self.t >= self.slow_after
        self.t += self.cost * (self.slow if hot else 1.0)


def bench_on(gpu, quick=True):
    b = object.__new__(mb.Bench)  # skip __init__: it would bind the real CUDA runtime
    b.torch, b.dev, b.grid, b.log, b.main = gpu, "cuda:0", grids.make_grid(quick), (lambda s: None), None
    return b


def test_time_loop_reports_seconds_per_call_and_sizes_loops_to_the_window():
    gpu = VirtualGPU(2e-4)
    b = bench_on(gpu)
    assert b.timed_calls(gpu.call, 10) == pytest.approx(2e-3)
    n = b.iters_for(gpu.call)
    assert n * 2e-4 >= b.grid.min_window_s and (n // 2) * 2e-4 < b.grid.min_window_s * 1.5
    r = b.time_loop(gpu.call)
    assert r["time_s"] == pytest.approx(2e-4) and len(r["samples_s"]) == b.grid.reps


def test_sustained_section_sees_the_clock_settle(monkeypatch):
    # 1 ms per call for the first 2 s of GPU time, then 25% slower: the fraction is 0.8
    gpu = VirtualGPU(1e-3, slow_after_s=2.0, slow_factor=1.25)
    monkeypatch.setattr(mb, "make_gemm", lambda bench, dtype, m, n, k: gpu.call)
    notes = []
    (rec,) = S.sustained_section(bench_on(gpu), notes, seconds=0.5)
    assert notes == [] and rec["iters_per_window"] * 1e-3 >= S.WINDOW_S
    assert len(rec["window_time_s"]) >= S.MIN_WINDOWS
    info, _ = S.sustained_fraction([rec])
    assert info["sustained_clock_fraction"] == pytest.approx(0.8, abs=0.01)
    assert (info["clock_early_mhz"], info["clock_late_mhz"]) == (1980, 1584)


def test_time_kernels_falls_back_to_an_eager_loop_that_says_why_when_capture_is_refused():
    gpu = VirtualGPU(2e-4)

    class Refused:
        def __init__(self):
            raise RuntimeError("operation not permitted when stream is capturing\nmore")

    gpu.cuda.CUDAGraph = Refused
    gpu.cuda.Stream = lambda dev: types.SimpleNamespace(wait_stream=lambda s: None)
    gpu.cuda.current_stream = lambda dev: types.SimpleNamespace(wait_stream=lambda s: None)
    gpu.cuda.synchronize = lambda dev=None: None
    b = bench_on(gpu)
    r = b.time_kernels(gpu.call)
    assert r["timing"] == "eager" and r["time_s"] == pytest.approx(2e-4)
    assert r["note"] == "graph timing failed: RuntimeError: operation not permitted when stream is capturing"


def test_time_graph_divides_a_replay_by_the_calls_captured():
    gpu = VirtualGPU(2e-4)

    class Graph:  # replays what was "captured": the calls made inside torch.cuda.graph(g)
        def __init__(self):
            self.n = 0

        def replay(self):
            for _ in range(self.n):
                gpu.call()

    captured = {}

    @contextlib.contextmanager
    def graph(g):
        before = gpu.t
        yield
        g.n = round((gpu.t - before) / 2e-4)
        gpu.t = before  # capturing runs nothing
        captured["n"] = g.n

    gpu.cuda.CUDAGraph, gpu.cuda.graph = Graph, graph
    gpu.cuda.Stream = lambda dev: types.SimpleNamespace(wait_stream=lambda s: None)
    gpu.cuda.current_stream = lambda dev: types.SimpleNamespace(wait_stream=lambda s: None)
    gpu.cuda.synchronize = lambda dev=None: None
    b = bench_on(gpu)
    r = b.time_kernels(gpu.call)
    assert r["timing"] == "graph" and r["iters"] == captured["n"] >= 1
    assert r["time_s"] == pytest.approx(2e-4)
