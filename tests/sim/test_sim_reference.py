"""The fast simulator (spec interning, quiet-rank spans) against a plain op-by-op reference.

``reference_simulate`` is the simulator's original op-by-op event loop (``ccoverlap.sim.simulator.simulate``
before spans and interning), kept
here verbatim in substance: every op is its own event and every change of a rank's running
set re-evaluates each running op's speed; collectives of one group on one rank take their
communicator one at a time, the one ready first (then the one added first) first. Random graphs with several ranks and streams,
cross-rank edges, zero-length ops and a cost that depends on what runs beside an op must give
the same start and end times (rel. 1e-9)."""

from __future__ import annotations

import heapq
import random

import pytest

from ccoverlap.sim.graph import OpGraph
from ccoverlap.sim.simulator import simulate
from ccoverlap.specs import CollectiveSpec, GemmSpec, GroupSpec, MemorySpec

TP = GroupSpec(name="tp", size=8, local_size=8)


def reference_simulate(graph, cost):
    """(start, end) lists of an op-by-op processor-sharing play of ``graph`` (no shortcuts)."""
    ops = graph.ops
    n = len(ops)
    queues: dict = {}
    for op in ops:
        queues.setdefault((op.rank, op.stream), []).append(op.op_id)
    head = {k: 0 for k in queues}
    busy = {k: False for k in queues}
    waiting = [len(op.deps) for op in ops]
    dependents = [[] for _ in range(n)]
    for op in ops:
        for d in op.deps:
            dependents[d].append(op.op_id)
    start, end, done, version = [0.0] * n, [0.0] * n, [False] * n, [0] * n
    running: dict = {}
    heap: list = []
    lane = [(op.rank, op.spec.group.name) if isinstance(op.spec, CollectiveSpec) and op.spec.group.size > 1
            else None for op in ops]
    holder: dict = {}  # lane -> op holding it
    waiting_for_lane: dict = {}  # lane -> [(ready time, op id)]

    def dur(op, others):
        if op.duration_s is not None:
            return op.duration_s
        if op.spec is None:
            return 0.0
        return cost.duration_s(op.spec, tuple(o.spec for o in others if o.spec is not None))

    def reschedule(rank, now):
        run = running.get(rank, {})
        members = [ops[i] for i in run]
        for op in members:
            st = run[op.op_id]
            rem = max(st[0] - (now - st[2]) * st[1], 0.0)
            d = dur(op, [o for o in members if o is not op])
            rate = float("inf") if d <= 0 else 1.0 / d
            st[:] = [rem, rate, now]
            version[op.op_id] += 1
            heapq.heappush(heap, (now if rate == float("inf") else now + rem / rate, version[op.op_id], op.op_id))

    def try_start(key, now, touched):
        if busy[key] or head[key] >= len(queues[key]):
            return
        i = queues[key][head[key]]
        if waiting[i]:
            return
        if lane[i] is not None:
            w = waiting_for_lane.setdefault(lane[i], [])
            if all(j != i for _, j in w):
                w.append((now, i))
            return
        begin(i, now, touched)

    def begin(i, now, touched):
        key = (ops[i].rank, ops[i].stream)
        busy[key] = True
        start[i] = now
        running.setdefault(key[0], {})[i] = [1.0, 0.0, now]
        touched.add(key[0])

    def give_lanes(now, touched):
        for ln, w in waiting_for_lane.items():
            if w and holder.get(ln) is None:
                w.sort()
                _, i = w.pop(0)
                holder[ln] = i
                begin(i, now, touched)

    touched: set = set()
    for key in queues:
        try_start(key, 0.0, touched)
    give_lanes(0.0, touched)
    for r in touched:
        reschedule(r, 0.0)
    while heap:
        t, v, i = heapq.heappop(heap)
        if v != version[i] or done[i]:
            continue
        batch = [i]
        while heap and heap[0][0] <= t:
            _, v2, i2 = heapq.heappop(heap)
            if v2 == version[i2] and not done[i2]:
                batch.append(i2)
        touched, cands = set(), []
        for j in batch:
            op = ops[j]
            done[j], end[j] = True, t
            del running[op.rank][j]
            key = (op.rank, op.stream)
            busy[key] = False
            head[key] += 1
            touched.add(op.rank)
            cands.append(key)
            if lane[j] is not None:
                holder[lane[j]] = None
            for d in dependents[j]:
                waiting[d] -= 1
                cands.append((ops[d].rank, ops[d].stream))
        for key in cands:
            try_start(key, t, touched)
        give_lanes(t, touched)
        for r in touched:
            reschedule(r, t)
    assert all(done)
    return start, end


class SharingCost:
    """GEMMs: flops at 1 TFLOP/s, 1.5x slower per other op beside them (2x beside a collective);
    memory ops: bytes at 1 TB/s, 1.2x per other op; collectives: bytes at 10 GB/s, 1.3x beside
    any compute."""

    def duration_s(self, spec, concurrent):
        k = len(concurrent)
        comm_beside = any(isinstance(c, CollectiveSpec) for c in concurrent)
        if isinstance(spec, GemmSpec):
            return spec.flops / 1e12 * (1.5 ** k) * (2.0 if comm_beside else 1.0)
        if isinstance(spec, MemorySpec):
            return spec.bytes / 1e12 * (1.2 ** k)
        return spec.bytes / 1e10 * (1.3 if len(concurrent) > sum(isinstance(c, CollectiveSpec)
                                                                    for c in concurrent) else 1.0)


def random_graph(seed: int) -> OpGraph:
    """Chains of compute with collectives on side streams, a few cross-rank edges, shared
    specs (as templates stamp them) and some zero-length and fixed-duration ops."""
    rnd = random.Random(seed)
    g = OpGraph()
    ranks = rnd.randint(1, 4)
    streams = ["compute", "compute", "compute", "tp_comm", "dp_comm", "pp_send"]
    shared = [GemmSpec(m=256 * rnd.randint(1, 8), n=512, k=512) for _ in range(3)] + \
             [MemorySpec(bytes=float(rnd.randint(1, 8) * 1e6)) for _ in range(2)] + \
             [CollectiveSpec(collective="all_reduce", bytes=float(rnd.randint(1, 8) * 1e5), group=TP)]
    last: dict = {}
    for _ in range(rnd.randint(20, 160)):
        rank = rnd.randrange(ranks)
        stream = rnd.choice(streams)
        spec = rnd.choice(shared) if rnd.random() < 0.8 else rnd.choice(
            [None, GemmSpec(m=128, n=128, k=rnd.randint(64, 4096)), MemorySpec(bytes=0.0)])
        if stream != "compute" and isinstance(spec, GemmSpec):
            spec = shared[-1]
        deps = []
        if rank in last and rnd.random() < 0.7:
            deps.append(last[rank])
        if len(g) and rnd.random() < 0.25:
            deps.append(rnd.randrange(len(g)))  # any earlier op, maybe on another rank
        dur = rnd.choice([None] * 9 + [rnd.random() * 1e-4])
        last[rank] = g.add("op", spec, rank=rank, stream=stream, deps=deps, duration_s=dur)
    return g


def comm_heavy_graph(seed: int) -> OpGraph:
    """Compute chains with collectives of two groups on four streams per rank (most of them
    queue for their communicator), some cross-rank edges and fixed-duration ops."""
    rnd = random.Random(1000 + seed)
    g = OpGraph()
    ranks = rnd.randint(1, 3)
    dp = GroupSpec(name="dp", size=16, local_size=8)
    colls = [CollectiveSpec(collective=c, bytes=float(rnd.randint(1, 8) * 1e5), group=grp)
             for c in ("all_gather", "reduce_scatter") for grp in (TP, dp)]
    gemms = [GemmSpec(m=256 * rnd.randint(1, 8), n=512, k=512) for _ in range(2)]
    last: dict = {}
    for _ in range(rnd.randint(30, 120)):
        rank = rnd.randrange(ranks)
        if rnd.random() < 0.5:
            stream, spec = "compute", rnd.choice(gemms)
        else:
            stream, spec = rnd.choice(["fsdp_ag", "fsdp_rs", "tp_comm", "dp_comm"]), rnd.choice(colls)
        deps = [last[rank]] if rank in last and rnd.random() < 0.6 else []
        if len(g) and rnd.random() < 0.2:
            deps.append(rnd.randrange(len(g)))
        op = g.add("op", spec, rank=rank, stream=stream, deps=deps,
                   duration_s=rnd.choice([None] * 9 + [rnd.random() * 1e-4]))
        if stream == "compute":
            last[rank] = op
    return g


def assert_equals_reference(g) -> None:
    """The simulator's start and end times of every op of ``g`` are the reference's (1e-9 relative)."""
    tl = simulate(g, SharingCost())
    start, end = reference_simulate(g, SharingCost())
    assert tl.start_s.tolist() == pytest.approx(start, rel=1e-9, abs=1e-15)
    assert tl.end_s.tolist() == pytest.approx(end, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("seed", range(40))
def test_fast_simulator_equals_reference_with_queued_collectives(seed):
    assert_equals_reference(comm_heavy_graph(seed))


@pytest.mark.parametrize("seed", range(60))
def test_fast_simulator_equals_op_by_op_reference(seed):
    assert_equals_reference(random_graph(seed))


def test_progress_reports_rise_to_the_op_count():
    """Ops booked in bulk by a span still advance the progress callback, which ends at (n, n)."""
    g = OpGraph()
    prev = None
    for i in range(10000):  # one long chain alone on a rank: nearly all of it in spans
        prev = g.add("op", MemorySpec(bytes=1e6), deps=[prev] if prev is not None else [])
    calls = []
    simulate(g, SharingCost(), progress=lambda done, total, what: calls.append((done, total)))
    assert calls[-1] == (len(g), len(g))
    assert len(calls) >= 2 and all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))
