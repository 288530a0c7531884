"""Pipeline schedules: task orders, and bubble fractions measured on the simulated timeline
against the closed forms (zero-cost communication and memory-bound ops)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parallel_helpers import ToyCost, cluster, compute_busy_s

from ccoverlap.catalog.models import model_from_dict
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import BatchConfig, ParallelConfig, build_step
from ccoverlap.parallel.pp import in_flight, make_schedule
from ccoverlap.sim.simulator import simulate
from ccoverlap.sim.timeline import step_time_s
from ccoverlap.specs import P2PSpec

# 16 equal layers; a 64-token vocabulary makes the LM head negligible, so stages are uniform
TINY = model_from_dict({"hidden": 1024, "ffn_hidden": 4096, "heads": 16, "layers": 16, "vocab": 64,
                        "seq_len": 1024})
ZERO_COMM = ToyCost(flops_per_s=1e14, mem_bw=float("inf"), comm_bw=float("inf"))


def bubble(schedule: str, P: int, M: int, V: int = 1) -> float:
    """(step time − busiest rank's compute) / busiest rank's compute."""
    p = ParallelConfig(pp=P, pp_schedule=schedule, virtual_stages=V)
    sg = build_step(TINY, p, BatchConfig(global_batch=M, micro_batch=1, seq_len=1024), cluster(P))
    tl = simulate(sg.graph, ZERO_COMM)
    ideal = max(compute_busy_s(tl, r) for r in range(P))
    return step_time_s(tl) / ideal - 1.0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m(schedule, P, M):
    assert bubble(schedule, P, M) == pytest.approx((P - 1) / M, abs=0.004)


@pytest.mark.parametrize("P,M,V", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (4, 16, 2), (2, 8, 8)])
def test_interleaved_bubble_is_p_minus_1_over_mv(P, M, V):
    assert bubble("interleaved", P, M, V) == pytest.approx((P - 1) / (M * V), abs=0.004)


@pytest.mark.parametrize("P,M", [(4, 8), (4, 16), (8, 16)])
def test_dualpipe_runs_and_beats_1f1b(P, M):
    b = bubble("dualpipe", P, M)
    assert 0.0 < b < bubble("1f1b", P, M) - 0.05


def test_single_stage_has_no_bubble():
    assert bubble("1f1b", 1, 4) == pytest.approx(0.0, abs=1e-9)


def test_orders_are_complete_and_causal():
    for name, P, M, V in [("gpipe", 4, 6, 1), ("1f1b", 4, 3, 1), ("1f1b", 4, 9, 1), ("interleaved", 4, 8, 2),
                          ("dualpipe", 4, 8, 1), ("dualpipe", 8, 20, 1)]:
        s = make_schedule(name, P, M, V)
        chunks = 2 if name == "dualpipe" else V
        for r in range(P):
            order = s.orders[r]
            fs = [(m, c) for k, m, c in order if k == "F"]
            bs = [(m, c) for k, m, c in order if k == "B"]
            assert len(set(fs)) == len(fs) == len(bs) == len(set(bs))
            assert sorted(fs) == sorted(bs)
            if name == "dualpipe":
                assert len(fs) == M  # half the micro-batches per direction, both chunks
            else:
                assert len(fs) == M * chunks
            for t in bs:
                assert order.index(("F", *t)) < order.index(("B", *t))


def test_in_flight_microbatches():
    s = make_schedule("1f1b", 4, 8)
    assert [in_flight(s, r) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight(make_schedule("1f1b", 4, 2), 0) == 2
    assert in_flight(make_schedule("gpipe", 4, 8), 0) == 8
    assert in_flight(make_schedule("interleaved", 4, 8, 2), 0) == (4 - 1) * 2 + 4 + 1  # Megatron warm-up + 1
    assert in_flight(make_schedule("dualpipe", 8, 16), 0) == 8 + 1  # DeepSeek-V3 Table 2: PP + 1


def test_schedule_errors():
    with pytest.raises(ConfigError, match="multiple of pp=4"):
        make_schedule("interleaved", 4, 6, 2)
    with pytest.raises(ConfigError, match="even pp"):
        make_schedule("dualpipe", 3, 6)
    with pytest.raises(ConfigError, match="unknown pipeline schedule"):
        make_schedule("zb", 2, 2)


def test_p2p_streams_and_blocking_mode():
    from ccoverlap.parallel import OverlapKnobs

    p = ParallelConfig(pp=2)
    b = BatchConfig(global_batch=4, micro_batch=1, seq_len=1024)
    sg = build_step(TINY, p, b, cluster(2))
    p2p = [o for o in sg.graph.ops if isinstance(o.spec, P2PSpec)]
    assert {o.stream for o in p2p} == {"pp_send", "pp_recv"}
    assert len(p2p) == 4 * 2 * 2  # per micro-batch: fwd send+recv, bwd send+recv
    (recv,) = [o for o in p2p if o.name == "recv_fwd" and o.microbatch == 0]
    assert sg.graph.ops[recv.deps[0]].rank == 0 and recv.rank == 1  # cross-rank edge
    sg = build_step(TINY, p, b, cluster(2), OverlapKnobs(pp_p2p_overlap=False))
    assert {o.stream for o in sg.graph.ops if isinstance(o.spec, P2PSpec)} == {"compute"}


@settings(max_examples=25, deadline=None)
@given(P=st.sampled_from([1, 2, 4, 8]), k=st.integers(1, 4), V=st.sampled_from([1, 2]),
       name=st.sampled_from(["gpipe", "1f1b", "interleaved", "dualpipe"]))
def test_every_schedule_builds_and_simulates_without_deadlock(P, k, V, name):
    if name == "interleaved" and P == 1:
        name = "1f1b"
    M = P * k * (2 if name == "dualpipe" else 1)
    if name == "dualpipe":
        if P % 2:
            return
        M = max(M, 2 * P)
    V = V if name == "interleaved" else 1
    p = ParallelConfig(pp=P, pp_schedule=name, virtual_stages=V)
    sg = build_step(TINY, p, BatchConfig(global_batch=M, micro_batch=1, seq_len=1024), cluster(P))
    tl = simulate(sg.graph, ToyCost())
    assert len(tl) == len(sg.graph) and step_time_s(tl) > 0
    ideal = max(compute_busy_s(tl, r) for r in range(P))
    assert step_time_s(tl) >= ideal
