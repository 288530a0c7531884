"""Cross-rank matching, stragglers, contention, bandwidths and the verdict on known inputs."""

from __future__ import annotations

import numpy as np
import pytest
from trace_synth import kernel, nccl, trace, write

from ccoverlap.sim.timeline import RankMetrics
from ccoverlap.trace.analyze import analyze
from ccoverlap.trace.collectives import busbw_factor
from ccoverlap.trace.contention import Contention, covered_length
from ccoverlap.trace.verdict import decide


def _job(tmp_path, lateness_us: dict[int, float], n_coll: int = 4, world: int = 3):
    for r in range(world):
        ks = []
        for i in range(n_coll):
            base = 1000 * i
            ks.append(kernel("gemm", base, 300, launch=base - 20))
            late = lateness_us.get(r, 0.0)
            ks.append(nccl("all_reduce", base + 400 + late, 300 - late, size=world, launch=base + 390))
        write(trace(ks, rank=r, world=world), tmp_path / f"rank-{r}.json")
    return analyze([tmp_path])


def test_skew_and_the_rank_everyone_waits_for(tmp_path):
    a = _job(tmp_path, {2: 100.0})
    (g,) = a.cross.groups
    assert g.matched == 4 and g.ranks == [0, 1, 2]
    assert g.mean_skew_s == pytest.approx(100e-6) and g.max_skew_s == pytest.approx(100e-6)
    top = a.cross.lateness[0]
    assert top.rank == 2 and top.times_latest == 4 and top.total_lateness_s == pytest.approx(400e-6)
    assert a.cross.stragglers == [2]


def test_no_straggler_when_everyone_is_on_time(tmp_path):
    a = _job(tmp_path, {})
    assert a.cross.stragglers == [] and a.cross.groups[0].max_skew_s == 0


def test_jitter_is_not_a_straggler(tmp_path):
    a = _job(tmp_path, {1: 1.0})   # 1 µs late on 300 µs collectives
    assert a.cross.stragglers == []


def test_slowest_rank_per_step(tmp_path):
    for r in (0, 1):
        ks = []
        for s in (1, 2, 3):
            base = s * 1000
            ks.append(kernel("gemm", base, 300 + (1200 if (r == 1 and s == 2) else 0), launch=base - 10))
            ks.append(nccl("all_reduce", base + 600, 100, launch=base + 500))
        write(trace(ks, rank=r, world=2, steps=[(s, s * 1000 - 50, 1000) for s in (1, 2, 3)]),
              tmp_path / f"rank-{r}.json")
    a = analyze([tmp_path], steps="1,2")
    assert a.cross.slowest_rank_per_step == {2: 1}   # step 1: a tie, no slowest rank


# ----------------------------------------------------------------------------- contention

def test_covered_length():
    s, e = np.array([0.0, 10.0]), np.array([5.0, 20.0])
    got = covered_length(s, e, np.array([0.0, 3.0, 6.0, 8.0, 25.0]), np.array([5.0, 12.0, 9.0, 30.0, 30.0]))
    assert got.tolist() == [5.0, 4.0, 0.0, 10.0, 0.0]


def test_contention_slowdown_and_time_lost(tmp_path):
    ks = []
    for i in range(3):     # alone: 100 µs each
        ks.append(kernel("gemm", i * 1000, 100))
    for i in range(3):     # overlapped by an all_reduce: 150 µs each
        base = 10_000 + i * 1000
        ks.append(kernel("gemm", base, 150))
        ks.append(nccl("all_reduce", base, 150))
    a = analyze([write(trace(ks, rank=0, world=1), tmp_path / "r.json")], min_samples=3)
    c = a.contention
    assert c.slowdown == pytest.approx(1.5)
    assert c.time_lost_s == pytest.approx(150e-6)
    assert c.coverage == pytest.approx(1.0)
    assert c.kernels[0].n_alone == 3 and c.kernels[0].n_overlapped == 3


def test_contention_compares_like_with_like_shapes(tmp_path):
    ks = [kernel("gemm", i * 1000, 100, grid=[8, 1, 1], block=[128, 1, 1]) for i in range(3)]
    for i in range(3):
        base = 10_000 + i * 1000
        ks.append(kernel("gemm", base, 300, grid=[64, 1, 1], block=[128, 1, 1]))   # a different launch
        ks.append(nccl("all_reduce", base, 300))
    a = analyze([write(trace(ks, rank=0, world=1), tmp_path / "r.json")])
    assert a.contention.kernels == [] and a.contention.slowdown == 1.0


# ----------------------------------------------------------------------------- bandwidth

def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert busbw_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert busbw_factor("all_to_all", 2) == pytest.approx(1 / 2)
    assert busbw_factor("broadcast", 8) == 1.0 and busbw_factor("reduce", 8) == 1.0
    assert busbw_factor("send", 2) == 1.0 and busbw_factor("unknown", 4) is None


def test_algbw_and_busbw(tmp_path):
    doc = trace([nccl("all_reduce", 0, 1000, nelems=1 << 20, size=4, dtype="Float")], rank=0, world=4)
    a = analyze([write(doc, tmp_path / "r.json")])
    (c,) = a.collectives
    assert c.algbw == pytest.approx(4 * (1 << 20) / 1e-3)
    assert c.busbw == pytest.approx(c.algbw * 1.5)
    assert c.exposed_s == pytest.approx(1e-3)


# ----------------------------------------------------------------------------- verdict

def _m(compute, comm, overlap, step):
    return RankMetrics(rank=0, step_time_s=step, compute_s=compute, comm_s=comm, memcpy_s=0.0, overlap_s=overlap,
                       overlap_ratio=overlap / comm if comm else 0.0, exposed_comm_s=comm - overlap,
                       compute_only_s=compute - overlap, idle_s=0.0, bubble_s=0.0,
                       compute_comm_ratio=compute / comm if comm else float("inf"))


_NO_CONT = Contention(slowdown=1.0, time_lost_s=0.0, coverage=0.0, kernels=[])


def test_verdict_communication_bound():
    v = decide([_m(compute=4, comm=10, overlap=4, step=10)], [], _NO_CONT)
    assert v.label == "communication-bound" and v.R == pytest.approx(0.4)


def test_verdict_overlap_limited():
    v = decide([_m(compute=10, comm=5, overlap=1, step=14)], [], _NO_CONT)
    assert v.label == "overlap-limited" and v.hideable_fraction == pytest.approx(4 / 14)


def test_verdict_contention_limited():
    cont = Contention(slowdown=1.3, time_lost_s=2.0, coverage=1.0, kernels=[])
    v = decide([_m(compute=10, comm=5, overlap=5, step=10)], [], cont)
    assert v.label == "contention-limited" and "NCCL" in v.try_next
    assert "core" in decide([_m(10, 5, 5, 10)], [], cont, mode="cpu").try_next


def test_verdict_fine():
    assert decide([_m(compute=10, comm=5, overlap=5, step=10)], [], _NO_CONT).label == "fine"
    assert decide([_m(compute=10, comm=0, overlap=0, step=10)], [], _NO_CONT).label == "fine"


def test_incomparable_clocks_are_said_not_measured(tmp_path):
    """Per-host monotonic clocks: ranks hours apart get no skew, and a warning."""
    write(trace([kernel("gemm", 0, 300), nccl("all_reduce", 100, 300)], rank=0, world=2), tmp_path / "rank-0.json")
    hours = 3 * 3600 * 1e6
    write(trace([kernel("gemm", hours, 300), nccl("all_reduce", hours + 100, 300)], rank=1, world=2),
          tmp_path / "rank-1.json")
    a = analyze([tmp_path])
    assert a.cross.groups == [] and a.cross.stragglers == []
    assert any("not comparable" in p for p in a.problems)
    assert [round(m.overlap_ratio, 6) for m in a.metrics] == [round(200 / 300, 6)] * 2
    from ccoverlap.trace.report import write_png

    assert write_png(a, tmp_path / "p.png").stat().st_size > 5000


def test_exposed_intervals_for_the_picture():
    from ccoverlap.trace.report import _subtract

    comm = (np.array([0.0, 10.0]), np.array([5.0, 20.0]))
    comp = (np.array([1.0, 12.0]), np.array([2.0, 30.0]))
    s, e = _subtract(comm, comp)
    assert s.tolist() == [0.0, 2.0, 10.0] and e.tolist() == [1.0, 5.0, 12.0]
