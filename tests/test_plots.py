"""The timeline picture: bars closer than the picture can show are drawn as one."""

from __future__ import annotations

import numpy as np

from ccoverlap.sim.timeline import merge_intervals, union_length


def test_gaps_below_the_resolution_are_closed_and_larger_ones_kept():
    s = np.array([0.0, 1.05, 2.0, 5.0])
    e = np.array([1.0, 1.9, 2.5, 6.0])
    ms, me = merge_intervals(s, e, gap=0.1)
    assert ms.tolist() == [0.0, 5.0] and me.tolist() == [2.5, 6.0]
    ms, me = merge_intervals(s, e, gap=0.0)          # no gap closed: the plain union
    assert ms.tolist() == [0.0, 1.05, 2.0, 5.0] and me.tolist() == [1.0, 1.9, 2.5, 6.0]


def test_merging_never_loses_busy_time_and_adds_at_most_the_closed_gaps():
    rng = np.random.default_rng(0)
    s = np.sort(rng.uniform(0, 100, 5000))
    e = s + rng.uniform(0.001, 0.05, len(s))
    gap = 0.02
    ms, me = merge_intervals(s, e, gap)
    assert np.all(ms[1:] - me[:-1] > gap)                    # what is left apart is visibly apart
    for a, b in zip(s, e):                                   # every bar lies inside one drawn bar
        i = np.searchsorted(ms, a, side="right") - 1
        assert ms[i] <= a and b <= me[i]
    assert union_length(ms, me) - union_length(s, e) <= gap * len(s)
    assert len(ms) < len(s) / 2


def test_the_picture_of_a_large_step_is_drawn(tmp_path):
    from ccoverlap.plots import save_plan_figure
    from ccoverlap.sim.timeline import TimelineBuilder

    b = TimelineBuilder()
    for i in range(20000):                 # 20k back-to-back 99 µs kernels: one solid bar when drawn
        b.append(rank=0, stream="compute", kind="compute", name="gemm", start_s=i * 1e-4,
                 end_s=i * 1e-4 + 0.99e-4)
    out = save_plan_figure(tmp_path / "p.png", [("step", b.build())],
                           [{"name": "a", "compute_s": 1.0, "exposed_comm_s": 0.0, "step_time_s": 1.0}])
    assert out.endswith("p.png") and (tmp_path / "p.png").stat().st_size > 1000
