"""``graph.gc_paused``: the collector is off inside, back on after, objects made inside are
handed to the oldest generation without a young pass, and a caller's own frozen set is left
alone."""

from __future__ import annotations

import gc
import weakref

from ccoverlap.sim.graph import gc_paused


class _Node:
    pass


def test_collector_paused_inside_and_restored_after():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off before: stays off
    finally:
        gc.enable()


def test_no_young_pass_on_exit_and_cycles_made_inside_still_collected():
    young_before = gc.get_stats()[0]["collections"]
    with gc_paused():
        junk = [[i] for i in range(5000)]
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        probe = weakref.ref(a)
    young_after = gc.get_stats()[0]["collections"]
    assert young_after == young_before  # no young pass over the 5000 new lists on exit
    assert gc.get_count()[0] < 100
    assert gc.get_freeze_count() == 0
    del a, b, junk
    gc.collect()
    assert probe() is None


def test_a_callers_frozen_objects_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_paused():
            _ = [[i] for i in range(100)]
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
