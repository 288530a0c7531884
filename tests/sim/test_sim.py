"""The stream simulator: stream order, dependencies, contention, deadlock detection."""

import pytest

from ccoverlap.errors import ConfigError
from ccoverlap.sim.graph import OpGraph
from ccoverlap.sim.simulator import simulate
from ccoverlap.sim.timeline import rank_metrics
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, GroupSpec, MemorySpec

DP = GroupSpec(name="dp", size=8, local_size=8)


class ToyCost:
    """1 TFLOP/s compute, 1 GB/s comm; anything concurrent doubles compute time."""

    def __init__(self, slowdown: float = 2.0) -> None:
        self.slowdown = slowdown
        self.calls = 0

    def duration_s(self, spec, concurrent):
        self.calls += 1
        if isinstance(spec, GemmSpec):
            base = spec.flops / 1e12
            return base * (self.slowdown if concurrent else 1.0)
        return spec.bytes / 1e9


def _gemm(flops_ms: float) -> GemmSpec:
    # 2*m*n*k = flops_ms * 1e9 at 1 TFLOP/s -> flops_ms milliseconds
    return GemmSpec(m=1000, n=1000, k=int(flops_ms * 500))


def test_stream_order_is_fifo_and_respects_dependencies():
    g = OpGraph()
    a = g.add("a", _gemm(1.0))
    c = g.add("c", MemorySpec(bytes=2e6), stream="comm", deps=[a])
    b = g.add("b", _gemm(1.0))
    d = g.add("d", _gemm(1.0), deps=[c])
    tl = simulate(g, ToyCost(slowdown=1.0))
    rows = {r["name"]: r for r in tl.rows()}
    assert rows["a"]["end_s"] == pytest.approx(1e-3)
    assert rows["b"]["start_s"] == pytest.approx(rows["a"]["end_s"])  # FIFO on compute
    assert rows["c"]["start_s"] == pytest.approx(rows["a"]["end_s"])  # waits for its dependency
    assert rows["d"]["start_s"] >= rows["c"]["end_s"] - 1e-12  # cross-stream edge
    assert rows["d"]["start_s"] >= rows["b"]["end_s"] - 1e-12  # and stream order
    assert rows["d"]["end_s"] == pytest.approx(4e-3)


def test_contention_slows_only_the_overlapped_part():
    # a 2 ms GEMM with a 1 ms collective beside it for the first part: processor sharing
    g = OpGraph()
    g.add("gemm", _gemm(2.0))
    g.add("ar", CollectiveSpec(collective="all_reduce", bytes=1e6, group=DP), stream="comm")
    tl = simulate(g, ToyCost(slowdown=2.0))
    rows = {r["name"]: r for r in tl.rows()}
    # during the first 1 ms the GEMM runs at half speed (0.5 ms of work), then 1.5 ms alone
    assert rows["ar"]["end_s"] == pytest.approx(1e-3)
    assert rows["gemm"]["end_s"] == pytest.approx(2.5e-3)


def test_overlap_metrics_of_simulated_step():
    g = OpGraph()
    g.add("gemm", _gemm(2.0))
    g.add("ar", CollectiveSpec(collective="all_reduce", bytes=3e6, group=DP), stream="comm")
    tl = simulate(g, ToyCost(slowdown=1.0))
    m = rank_metrics(tl, 0)
    assert m.step_time_s == pytest.approx(3e-3)
    assert m.overlap_ratio == pytest.approx(2 / 3)
    assert m.exposed_comm_s == pytest.approx(1e-3)
    assert m.idle_s == pytest.approx(0.0, abs=1e-12)


def test_ranks_do_not_contend_and_cross_rank_edges_hold():
    g = OpGraph()
    a = g.add("fwd0", _gemm(1.0), rank=0)
    g.add("fwd1", _gemm(1.0), rank=1, deps=[a])
    g.add("other1", CopySpec(bytes=5e5), rank=1, stream="copy")
    tl = simulate(g, ToyCost(slowdown=3.0))
    rows = {r["name"]: r for r in tl.rows()}
    assert rows["fwd0"]["end_s"] == pytest.approx(1e-3)  # rank 1's copy does not slow rank 0
    assert rows["fwd1"]["start_s"] == pytest.approx(1e-3)


def test_cost_model_results_are_cached():
    g = OpGraph()
    for i in range(50):
        g.add(f"g{i}", _gemm(1.0))
    cost = ToyCost()
    simulate(g, cost)
    assert cost.calls == 1


def test_deadlock_is_reported_not_hung():
    g = OpGraph()
    # b waits for c, but c is queued behind b on the same stream
    a = g.add("a", _gemm(1.0))
    g.add("b", _gemm(1.0), stream="s", deps=[a])
    g.ops[1] = g.ops[1]._replace(deps=(2,))
    g.add("c", _gemm(1.0), stream="s")
    with pytest.raises(ConfigError, match="deadlock"):
        simulate(g, ToyCost())


def test_bad_dependency_is_rejected():
    g = OpGraph()
    with pytest.raises(ConfigError, match="dependency"):
        g.add("a", _gemm(1.0), deps=[3])
