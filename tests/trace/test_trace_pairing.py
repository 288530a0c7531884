"""Pairing collectives across ranks when a rank's trace misses calls (sampled or cut traces)."""

from __future__ import annotations

import pytest
from trace_synth import kernel, nccl, trace, write

from ccoverlap.cli import main
from ccoverlap.trace.analyze import analyze


def _rank(path, calls, rank, world=2):
    """``calls``: (collective, start µs, end µs) per call; a gemm before each."""
    ks = []
    for coll, t0, t1 in calls:
        ks.append(kernel("gemm", t0 - 400, 300, launch=t0 - 420))
        ks.append(nccl(coll, t0, t1 - t0, size=world, launch=t0 - 10))
    write(trace(ks, rank=rank, world=world), path / f"rank-{rank}.json")


def test_a_rank_missing_the_first_collective_is_not_a_straggler(tmp_path):
    # both ranks arrive on time at every call; rank 1's trace lacks the first all-to-all
    calls = [("all_to_all", 1000 + 2000 * i, 1800 + 2000 * i) for i in range(5)]
    _rank(tmp_path, calls, 0)
    _rank(tmp_path, calls[1:], 1)
    a = analyze([tmp_path])
    (g,) = a.cross.groups
    assert g.paired_by == "ends" and g.matched == 4 and g.unmatched == {0: 1}
    assert g.max_skew_s == pytest.approx(0.0) and a.cross.stragglers == []
    # pairing by call order alone would have put rank 1 2 ms late at every call
    assert all(x.total_lateness_s == pytest.approx(0.0) for x in a.cross.lateness)


def test_real_lateness_is_still_found_after_a_missing_call(tmp_path):
    calls = [("all_reduce", 1000 + 2000 * i, 1800 + 2000 * i) for i in range(6)]
    _rank(tmp_path, calls, 0)
    _rank(tmp_path, [(c, t0 + 300, t1) for c, t0, t1 in calls[1:]], 1)   # 300 µs late, same ends
    a = analyze([tmp_path])
    (g,) = a.cross.groups
    assert g.matched == 5 and g.unmatched == {0: 1}
    assert g.max_skew_s == pytest.approx(300e-6) and a.cross.stragglers == [1]


def test_equal_counts_and_types_but_different_calls_are_not_paired_by_order(tmp_path):
    # each rank misses a different call: same length, same types, but the ends do not line up
    calls = [("all_to_all", 1000 + 2000 * i, 1800 + 2000 * i) for i in range(6)]
    _rank(tmp_path, calls[:3] + calls[4:], 0)
    _rank(tmp_path, calls[1:], 1)
    a = analyze([tmp_path])
    (g,) = a.cross.groups
    assert g.paired_by == "ends" and g.matched == 4 and g.unmatched == {0: 1, 1: 1}
    assert g.max_skew_s == pytest.approx(0.0) and a.cross.stragglers == []


def test_no_reliable_pairing_is_said_not_claimed(tmp_path, capsys):
    # rank 1's calls never end with rank 0's: nothing pairs, so no skew and no straggler
    _rank(tmp_path, [("all_reduce", 1000 + 20000 * i, 1800 + 20000 * i) for i in range(4)], 0)
    _rank(tmp_path, [("all_reduce", 10000 + 20000 * i, 10500 + 20000 * i) for i in range(4)], 1)
    a = analyze([tmp_path])
    assert a.cross.stragglers == [] and not a.cross.groups[0].reliable
    assert "no reliable pairing" in a.cross.note
    assert main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no reliable pairing" in out and "Stragglers" not in out


def test_sampled_real_trace_claims_no_164_ms_skew(shared_traces, capsys):
    # trace_filter: rank 1's sampled trace lacks rank 0's first (3 KB) all-to-all; pairing by call
    # order put rank 1 62 ms late on average, up to 164 ms
    path = shared_traces / "trace_filter"
    a = analyze([path])
    (g,) = a.cross.groups
    assert g.paired_by == "ends" and g.matched == 3 and g.unmatched == {0: 2, 1: 2}
    assert g.max_skew_s < 0.005                     # 4.9 ms measured on calls whose ends line up
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "164" not in out and "312" not in out
    flat = " ".join(out.split())                   # the console wraps long lines
    assert "4 call(s) without a partner on another rank not compared" in flat
    # rank 1 is last in all 3 paired calls: 12.5% likely by chance, so not named a straggler
    assert a.cross.stragglers == [] and "too few to name a straggler" in flat


def test_complete_gloo_traces_stay_paired_by_call_order(fixtures_dir):
    # gloo's CPU ops end at different moments on each rank, so their ends do not line up; with
    # every call present on both ranks, call order pairs them all
    a = analyze([fixtures_dir / "gloo_2rank"])
    (g,) = a.cross.groups
    assert g.paired_by == "order" and g.matched == 6 and g.unmatched == {}
    assert a.cross.stragglers == [1]


def test_a_rank_last_in_3_of_3_calls_is_not_named_a_straggler(tmp_path):
    # 2 ranks, rank 1 300 µs late at each of 3 calls: 12.5% likely by chance, so said, not named
    calls = [("all_reduce", 1000 + 2000 * i, 1800 + 2000 * i) for i in range(3)]
    _rank(tmp_path, calls, 0)
    _rank(tmp_path, [(c, t0 + 300, t1) for c, t0, t1 in calls], 1)
    a = analyze([tmp_path])
    assert a.cross.stragglers == []
    assert "rank 1 was last in 3 of 3" in a.cross.too_few and "12% likely by chance" in a.cross.too_few


def test_the_chance_of_being_latest_is_the_binomial_tail():
    from ccoverlap.trace.ranks import chance_of_being_latest

    assert chance_of_being_latest(3, 3, 0.5) == pytest.approx(0.125)
    assert chance_of_being_latest(5, 5, 0.5) == pytest.approx(1 / 32)
    assert chance_of_being_latest(4, 4, 1 / 3) == pytest.approx(1 / 81)
    assert chance_of_being_latest(1, 4, 0.5) == pytest.approx(1 - 1 / 16)
    assert chance_of_being_latest(0, 4, 0.5) == 1.0


def test_the_chance_of_being_latest_over_thousands_of_calls():
    # C(3000, k) does not fit a float: the tail is summed from logarithms, and agrees with the
    # exact rational tail
    from fractions import Fraction
    from math import comb

    from ccoverlap.trace.ranks import chance_of_being_latest

    for latest, calls, p in ((1600, 3000, Fraction(1, 2)), (1010, 2000, Fraction(1, 2)), (700, 1500, Fraction(1, 3)),
                             (2990, 3000, Fraction(1, 2)), (1, 5000, Fraction(1, 4))):
        exact = sum(comb(calls, k) * p ** k * (1 - p) ** (calls - k) for k in range(latest, calls + 1))
        assert chance_of_being_latest(latest, calls, float(p)) == pytest.approx(float(exact), rel=1e-9, abs=1e-300)
