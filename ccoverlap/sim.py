"""Discrete-event stream simulator: an :class:`~ccoverlap.graph.OpGraph` and a cost model -> Timeline.

Semantics (those of CUDA streams and events):

* ops on the same ``(rank, stream)`` run one after another in issue order;
* an op starts once it heads its stream and every op in its ``deps`` has finished;
* ops that run at the same time on the same rank slow each other down: whenever the set of
  running ops on a rank changes, each running op's speed is re-evaluated from the cost
  model given the others (processor sharing: an op progresses at ``1 / duration`` of its work
  per second, where ``duration`` is what it would take if the current mix lasted throughout).
  This is how Lagom's contention model (eqs. 4–6: fewer SMs, less memory bandwidth for the
  GEMM while a collective runs) acts on a whole step rather than on one pair of kernels.

Ranks never contend with each other; cross-rank edges (pipeline send -> receive) are plain
dependencies.
"""

from __future__ import annotations

import heapq
from typing import Callable, Protocol, Sequence

from ccoverlap.errors import ConfigError
from ccoverlap.graph import CollectiveSpec, Op, OpGraph, P2PSpec, Spec
from ccoverlap.timeline import Timeline, TimelineBuilder


class CostModel(Protocol):
    """What the simulator needs from a cost model."""

    def duration_s(self, spec: Spec, concurrent: Sequence[Spec]) -> float:
        """Seconds ``spec`` takes while the ``concurrent`` specs run beside it on the same GPU."""
        ...


ProgressFn = Callable[[int, int], None]


def simulate(graph: OpGraph, cost: CostModel, *, progress: ProgressFn | None = None) -> Timeline:
    """Play ``graph`` on its streams under ``cost``; return the Timeline of the step.

    Raises :class:`ConfigError` if the graph deadlocks (a dependency cycle through stream
    order), naming a stuck op.
    """
    ops = graph.ops
    n = len(ops)
    if n == 0:
        return TimelineBuilder().build(meta=dict(graph.meta))

    # per-stream FIFO queues and the position of each op in its queue
    queues: dict[tuple[int, str], list[int]] = {}
    for op in ops:
        queues.setdefault((op.rank, op.stream), []).append(op.op_id)
    head = {key: 0 for key in queues}
    stream_busy = {key: False for key in queues}

    waiting_deps = [len(op.deps) for op in ops]
    dependents: list[list[int]] = [[] for _ in range(n)]
    for op in ops:
        for d in op.deps:
            dependents[d].append(op.op_id)

    start = [0.0] * n
    end = [0.0] * n
    done = [False] * n
    # running state per rank: op_id -> [remaining_fraction, rate, last_update_time, version]
    running: dict[int, dict[int, list[float]]] = {}
    heap: list[tuple[float, int, int]] = []  # (finish_time, version, op_id)
    version = [0] * n
    duration_cache: dict[tuple, float] = {}

    def duration_of(op: Op, others: list[Op]) -> float:
        if op.duration_s is not None:
            return op.duration_s
        if op.spec is None:
            return 0.0
        concurrent = tuple(o.spec for o in others if o.spec is not None)
        key = (op.spec, concurrent)
        d = duration_cache.get(key)
        if d is None:
            d = float(cost.duration_s(op.spec, concurrent))
            if not d >= 0.0:
                raise ConfigError(f"cost model gave a negative or NaN duration for op {op.name!r}")
            duration_cache[key] = d
        return d

    def reschedule(rank: int, now: float) -> None:
        """Re-evaluate the speeds of every running op on ``rank`` at time ``now``."""
        run = running.get(rank)
        if not run:
            return
        members = [ops[i] for i in run]
        for op in members:
            state = run[op.op_id]
            remaining = state[0] - (now - state[2]) * state[1]
            others = [o for o in members if o.op_id is not op.op_id]
            d = duration_of(op, others)
            rate = float("inf") if d <= 0.0 else 1.0 / d
            state[0] = max(remaining, 0.0)
            state[1] = rate
            state[2] = now
            version[op.op_id] += 1
            finish = now if rate == float("inf") else now + state[0] / rate
            heapq.heappush(heap, (finish, version[op.op_id], op.op_id))

    def try_start(key: tuple[int, str], now: float, touched: set[int]) -> None:
        if stream_busy[key]:
            return
        q = queues[key]
        h = head[key]
        if h >= len(q):
            return
        op_id = q[h]
        if waiting_deps[op_id]:
            return
        stream_busy[key] = True
        start[op_id] = now
        running.setdefault(key[0], {})[op_id] = [1.0, 0.0, now]
        touched.add(key[0])

    now = 0.0
    touched: set[int] = set()
    for key in queues:
        try_start(key, now, touched)
    for rank in touched:
        reschedule(rank, now)

    finished = 0
    while heap:
        finish, ver, op_id = heapq.heappop(heap)
        if ver != version[op_id] or done[op_id]:
            continue
        now = finish
        # finish every op whose (valid) event is at this same instant before rescheduling
        batch = [op_id]
        while heap and heap[0][0] <= now:
            f2, v2, o2 = heapq.heappop(heap)
            if v2 == version[o2] and not done[o2]:
                batch.append(o2)
        touched = set()
        for oid in batch:
            op = ops[oid]
            done[oid] = True
            end[oid] = now
            finished += 1
            del running[op.rank][oid]
            key = (op.rank, op.stream)
            stream_busy[key] = False
            head[key] += 1
            touched.add(op.rank)
            for dep in dependents[oid]:
                waiting_deps[dep] -= 1
        # newly startable ops: next on each finished op's stream, and heads waiting on them
        candidates: set[tuple[int, str]] = set()
        for oid in batch:
            op = ops[oid]
            candidates.add((op.rank, op.stream))
            for dep in dependents[oid]:
                d = ops[dep]
                candidates.add((d.rank, d.stream))
        for key in candidates:
            try_start(key, now, touched)
        for rank in touched:
            reschedule(rank, now)
        if progress is not None and finished % 4096 == 0:
            progress(finished, n)

    if finished != n:
        stuck = next(op for op in ops if not done[op.op_id])
        raise ConfigError(
            f"the op graph deadlocks: op {stuck.name!r} on rank {stuck.rank} stream {stuck.stream!r} "
            f"never became ready (dependency cycle through stream order?)"
        )
    if progress is not None:
        progress(n, n)
    return _to_timeline(graph, start, end)


def _to_timeline(graph: OpGraph, start: list[float], end: list[float]) -> Timeline:
    b = TimelineBuilder()
    group_sizes: dict[str, int] = {}
    for op in graph.ops:
        spec = op.spec
        collective, group, nbytes, flops = "", "", 0.0, 0.0
        if isinstance(spec, CollectiveSpec):
            collective, group, nbytes = spec.collective, spec.group.name, float(spec.bytes)
            group_sizes[group] = spec.group.size
        elif isinstance(spec, P2PSpec):
            collective, group, nbytes = "p2p", "pp", float(spec.bytes)
            group_sizes.setdefault("pp", 2)
        elif spec is not None:
            nbytes = float(getattr(spec, "bytes", 0.0))
            flops = float(getattr(spec, "flops", 0.0))
        b.append(rank=op.rank, stream=op.stream, kind=op.kind, name=op.name,
                 start_s=start[op.op_id], end_s=end[op.op_id], bytes=nbytes, flops=flops,
                 collective=collective, group=group)
    meta = dict(graph.meta)
    meta["group_sizes"] = group_sizes
    return b.build(meta=meta)
