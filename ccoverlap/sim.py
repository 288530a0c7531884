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
from ccoverlap.graph import COMPUTE, CollectiveSpec, OpGraph, P2PSpec, Spec, kind_of
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

    Implementation notes (speed; the semantics are those of the module docstring): specs are
    interned once (ops stamped from one template share one spec object), so durations are
    cached per (spec index, indices of the concurrent specs) and an op alone on its rank costs
    one list look-up; streams are small integers.
    """
    ops = graph.ops
    n = len(ops)
    if n == 0:
        return TimelineBuilder().build(meta=dict(graph.meta))

    # ---- static tables: streams, specs, dependencies
    stream_ids: dict[tuple[int, str], int] = {}
    queues: list[list[int]] = []
    stream_rank: list[int] = []
    op_stream = [0] * n
    op_rank = [0] * n
    spec_of_id: dict[int, int] = {}
    spec_of_value: dict = {}
    specs: list = []
    op_spec = [-1] * n  # interned spec index, -1 without a spec
    fixed: list = [None] * n  # duration override (seconds), else None
    waiting_deps = [0] * n
    dependents: list[list[int]] = [[] for _ in range(n)]
    for op in ops:
        i = op.op_id
        key = (op.rank, op.stream)
        sid = stream_ids.get(key)
        if sid is None:
            sid = stream_ids[key] = len(queues)
            queues.append([])
            stream_rank.append(op.rank)
        queues[sid].append(i)
        op_stream[i] = sid
        op_rank[i] = op.rank
        spec = op.spec
        if spec is not None:
            si = spec_of_id.get(id(spec))
            if si is None:
                si = spec_of_value.get(spec)
                if si is None:
                    si = spec_of_value[spec] = len(specs)
                    specs.append(spec)
                spec_of_id[id(spec)] = si
            op_spec[i] = si
        if op.duration_s is not None:
            fixed[i] = op.duration_s
        elif spec is None:
            fixed[i] = 0.0
        deps = op.deps
        if deps:
            waiting_deps[i] = len(deps)
            for d in deps:
                dependents[d].append(i)
    n_streams = len(queues)
    head = [0] * n_streams
    busy = [False] * n_streams

    alone: list = [None] * len(specs)  # seconds of each spec on an idle GPU (filled lazily)
    shared: dict[tuple, float] = {}  # (spec index, concurrent spec indices) -> seconds

    def duration(i: int, others: tuple) -> float:
        f = fixed[i]
        if f is not None:
            return f
        si = op_spec[i]
        if not others:
            d = alone[si]
            if d is not None:
                return d
        else:
            key = (si, others)
            d = shared.get(key)
            if d is not None:
                return d
        d = float(cost.duration_s(specs[si], tuple(specs[j] for j in others)))
        if not d >= 0.0:
            raise ConfigError(f"cost model gave a negative or NaN duration for op {ops[i].name!r}")
        if others:
            shared[(si, others)] = d
        else:
            alone[si] = d
        return d

    start = [0.0] * n
    end = [0.0] * n
    done = [False] * n
    # running ops per rank, in start order: op_id -> [remaining_fraction, rate, last_update_time]
    running: dict[int, dict[int, list[float]]] = {}
    heap: list[tuple[float, int, int]] = []  # (finish_time, version, op_id)
    version = [0] * n
    inf = float("inf")
    push = heapq.heappush

    def reschedule(rank: int, now: float) -> None:
        """Re-evaluate the speeds of every running op on ``rank`` at time ``now``."""
        run = running.get(rank)
        if not run:
            return
        if len(run) == 1:
            for oid, state in run.items():
                remaining = state[0] - (now - state[2]) * state[1]
                d = duration(oid, ())
                rate = inf if d <= 0.0 else 1.0 / d
                state[0] = remaining if remaining > 0.0 else 0.0
                state[1] = rate
                state[2] = now
                version[oid] += 1
                push(heap, (now if rate == inf else now + state[0] / rate, version[oid], oid))
            return
        members = list(run)
        cspec = [op_spec[m] for m in members]
        for k, oid in enumerate(members):
            state = run[oid]
            remaining = state[0] - (now - state[2]) * state[1]
            others = tuple(s for j, s in enumerate(cspec) if j != k and s >= 0)
            d = duration(oid, others)
            rate = inf if d <= 0.0 else 1.0 / d
            state[0] = remaining if remaining > 0.0 else 0.0
            state[1] = rate
            state[2] = now
            version[oid] += 1
            push(heap, (now if rate == inf else now + state[0] / rate, version[oid], oid))

    def try_start(sid: int, now: float, touched: set) -> None:
        if busy[sid]:
            return
        q = queues[sid]
        h = head[sid]
        if h >= len(q):
            return
        op_id = q[h]
        if waiting_deps[op_id]:
            return
        busy[sid] = True
        start[op_id] = now
        rank = stream_rank[sid]
        run = running.get(rank)
        if run is None:
            run = running[rank] = {}
        run[op_id] = [1.0, 0.0, now]
        touched.add(rank)

    now = 0.0
    touched: set[int] = set()
    for sid in range(n_streams):
        try_start(sid, now, touched)
    for rank in touched:
        reschedule(rank, now)

    finished = 0
    pop = heapq.heappop
    while heap:
        finish, ver, op_id = pop(heap)
        if ver != version[op_id] or done[op_id]:
            continue
        now = finish
        # finish every op whose (valid) event is at this same instant before rescheduling
        batch = [op_id]
        while heap and heap[0][0] <= now:
            f2, v2, o2 = pop(heap)
            if v2 == version[o2] and not done[o2]:
                batch.append(o2)
        touched = set()
        candidates: dict[int, None] = {}
        for oid in batch:
            done[oid] = True
            end[oid] = now
            finished += 1
            rank = op_rank[oid]
            del running[rank][oid]
            sid = op_stream[oid]
            busy[sid] = False
            head[sid] += 1
            touched.add(rank)
            candidates[sid] = None
            for dep in dependents[oid]:
                waiting_deps[dep] -= 1
                candidates[op_stream[dep]] = None
        # newly startable ops: next on each finished op's stream, and heads waiting on them
        for sid in candidates:
            try_start(sid, now, touched)
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
    """The columnar Timeline of the played graph (one row per op, in op order). The per-spec
    columns (kind, bytes, FLOPs, collective, group) are worked out once per spec object."""
    group_sizes: dict[str, int] = {}
    per_spec: dict[int, tuple] = {}
    ops = graph.ops
    n = len(ops)
    kind = [""] * n
    nbytes = [0.0] * n
    flops = [0.0] * n
    collective = [""] * n
    group = [""] * n
    for i, op in enumerate(ops):
        spec = op.spec
        row = per_spec.get(id(spec))
        if row is None:
            c, g, b, f = "", "", 0.0, 0.0
            if isinstance(spec, CollectiveSpec):
                c, g, b = spec.collective, spec.group.name, float(spec.bytes)
                group_sizes[g] = spec.group.size
            elif isinstance(spec, P2PSpec):
                c, g, b = "p2p", "pp", float(spec.bytes)
                group_sizes.setdefault("pp", 2)
            elif spec is not None:
                b = float(getattr(spec, "bytes", 0.0))
                f = float(getattr(spec, "flops", 0.0))
            row = per_spec[id(spec)] = (COMPUTE if spec is None else kind_of(spec), c, g, b, f)
        kind[i], collective[i], group[i], nbytes[i], flops[i] = row
    meta = dict(graph.meta)
    meta["group_sizes"] = group_sizes
    return Timeline(rank=[op.rank for op in ops], stream=[op.stream for op in ops], kind=kind,
                    name=[op.name for op in ops], start_s=start, end_s=end, bytes=nbytes, flops=flops,
                    collective=collective, group=group, meta=meta)
