"""Discrete-event stream simulator: an :class:`~ccoverlap.sim.graph.OpGraph` and a cost model -> Timeline.

Semantics (those of CUDA streams and events):

* ops on the same ``(rank, stream)`` run one after another in issue order;
* an op starts once it heads its stream and every op in its ``deps`` has finished;
* ops that run at the same time on the same rank slow each other down: whenever the set of
  running ops on a rank changes, each running op's speed is re-evaluated from the cost
  model given the others (processor sharing: an op progresses at ``1 / duration`` of its work
  per second, where ``duration`` is what it would take if the current mix lasted throughout).
  This is how Lagom's contention model (eqs. 4–6: fewer SMs, less memory bandwidth for the
  GEMM while a collective runs) acts on a whole step rather than on one pair of kernels.

* collectives of one process group on one rank run one at a time, whichever streams issue
  them (:func:`communicator_lanes`): PyTorch's ``ProcessGroupNCCL`` enqueues every collective
  of a group on the group's one internal NCCL stream per device, so an all-gather issued on an
  FSDP "all-gather stream" after a reduce-scatter issued on the "reduce-scatter stream" waits
  for it. Among the collectives of a group that are ready, the one ready first starts first
  (ties: the one issued first, i.e. added to the graph first) — the CPU's issue order when it
  runs ahead of the GPU, as it issues each collective when the work it follows was launched.

Ranks never contend with each other; cross-rank edges (pipeline send -> receive) are plain
dependencies.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ccoverlap.errors import ConfigError
from ccoverlap.sim.graph import COMPUTE, CollectiveSpec, OpGraph, P2PSpec, Spec, gc_paused, kind_of
from ccoverlap.sim.tables import static_tables
from ccoverlap.sim.timeline import Timeline, TimelineBuilder


class CostModel(Protocol):
    """What the simulator needs from a cost model."""

    def duration_s(self, spec: Spec, concurrent: Sequence[Spec]) -> float:
        """Seconds ``spec`` takes while the ``concurrent`` specs run beside it on the same GPU."""
        ...


ProgressFn = Callable[[int, int], None]


def communicator_lanes(ops: Sequence, op_spec: Sequence[int], specs: Sequence) -> tuple[list[int], int]:
    """``(lane per op, number of lanes)``: the ops sharing a lane (one NCCL communicator) are
    the SM-driven collectives (``transport="sm"``) of one process group (``group.name``, size
    > 1) on one rank, where they are issued from more than one stream; every other op
    (compute, point-to-point, copy-engine transfers) gets -1.

    Source: PyTorch ``ProcessGroupNCCL`` runs all collectives of a process group on one NCCL
    stream per device (``ncclStreams_`` keyed by the device; ``syncStream`` makes it wait for
    the issuing stream), so they execute in issue order whatever user stream issued them;
    FSDP's all-gather and reduce-scatter, and DeepSpeed ZeRO-3's, share the data-parallel
    group. Centauri's group partition uses other groups (``dp_inter``, ``dp_intra``), hence
    other communicators."""
    names: dict[str, int] = {}
    gid = np.array([names.setdefault(s.group.name, len(names)) if isinstance(s, CollectiveSpec)
                    and s.transport == "sm" and s.group.size > 1 else -1 for s in specs] + [-1], dtype=np.int64)
    if not names:
        return [-1] * len(op_spec), 0
    g = gid[np.asarray(op_spec, dtype=np.int64)]  # -1 (no spec) picks the extra last entry
    idx = np.flatnonzero(g >= 0)
    lanes = [-1] * len(op_spec)
    if not len(idx):
        return lanes, 0
    codes: dict[str, int] = {}
    sel = [ops[i] for i in idx.tolist()]
    key = np.fromiter((op.rank for op in sel), dtype=np.int64, count=len(sel)) * len(names) + g[idx]
    stream = np.fromiter((codes.setdefault(op.stream, len(codes)) for op in sel), dtype=np.int64, count=len(sel))
    # a communicator used from one stream only needs no lane: the stream already runs its
    # collectives one at a time in issue order
    keys, n_streams = np.unique(np.unique(key * len(codes) + stream) // len(codes), return_counts=True)
    shared = keys[n_streams > 1]
    keep = np.isin(key, shared)
    for i, lane in zip(idx[keep].tolist(), np.searchsorted(shared, key[keep]).tolist()):
        lanes[i] = lane
    return lanes, len(shared)


def simulate(graph: OpGraph, cost: CostModel, *, progress: ProgressFn | None = None) -> Timeline:
    """Play ``graph`` on its streams under ``cost``; return the Timeline of the step.

    Raises :class:`ConfigError` if the graph deadlocks (a dependency cycle through stream
    order), naming a stuck op. (See :func:`_simulate` for how it is made fast.)
    """
    with gc_paused():
        return _simulate(graph, cost, progress)


def _simulate(graph: OpGraph, cost: CostModel, progress: ProgressFn | None) -> Timeline:
    """:func:`simulate`'s event loop. Speed notes (the semantics are the module docstring's):
    specs are interned once (ops stamped from one template share one spec object), so
    durations are cached per (spec index, indices of the concurrent specs); streams are small
    integers; and a run of ops that follow each other alone on a rank is timed in one pass
    (``plan_span``), replayed into ordinary state if anything else happens on that rank first.
    """
    ops = graph.ops
    n = len(ops)
    if n == 0:
        return TimelineBuilder().build(meta=dict(graph.meta))

    (names, op_rank, rank_arr, stream_names, op_stream, stream_rank, op_pos, queues, specs, op_spec, fixed,
     waiting_deps, dependents, simple, link) = static_tables(ops)
    n_streams = len(queues)
    head = [0] * n_streams
    busy = [False] * n_streams
    # communicators (module doc): a collective whose group's lane is held waits in the lane's
    # queue, ordered by (time it became ready, op id); ``freed`` lanes are handed out once an
    # event's batch has been processed
    lane, n_lanes = communicator_lanes(ops, op_spec, specs)
    lane_busy = [False] * n_lanes
    lane_queue: list[list[tuple[float, int]]] = [[] for _ in range(n_lanes)]
    queued = bytearray(n)
    rank_queued: dict[int, int] = {}
    freed: set[int] = set()

    alone: list = [None] * len(specs)  # seconds of each spec on an idle GPU (filled lazily)
    shared: dict[tuple, float] = {}  # (spec index, concurrent spec indices) -> seconds

    together: dict[tuple, list] = {}  # spec indices running together -> each one's seconds

    def duration_of_spec(si: int, others: tuple) -> float:
        """Seconds of spec ``si`` beside the specs ``others`` (cached)."""
        key = (si, others)
        d = shared.get(key)
        if d is None:
            d = float(cost.duration_s(specs[si], tuple(specs[j] for j in others)))
            if not d >= 0.0:
                raise ConfigError(f"cost model gave a negative or NaN duration for {type(specs[si]).__name__} "
                                  f"{specs[si]!r}")
            shared[key] = d
        return d

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

    # start and end times in C doubles (array.array): stores cost what list stores cost, but no
    # float object per op stays alive, and the Timeline's columns are a copy of the buffer
    # (a list of 10^5 scattered floats takes longer to convert than to fill)
    start = array("d", bytes(8 * n))
    end = array("d", [-1.0]) * n  # -1: not ended yet (every event of an ended op is stale: see ``version``)
    # running ops per rank, in start order: op_id -> [remaining_fraction, rate, last_update_time]
    running: dict[int, dict[int, list[float]]] = {}
    heap: list[tuple[float, int, int]] = []  # (finish_time, version, op_id)
    version = [0] * n  # bumped at every push: only the latest event of an op holds (none once it ended)
    inf = float("inf")
    push = heapq.heappush
    # Quiet-rank spans: rank -> (op ids, their end times, state of the first op when planned,
    # forks, after) where forks maps the span index of a fork's first-ending op to the two fork
    # ops and their running states (in start order), and after maps the index of the fork's
    # other op to (its start, its state once the first one ended); both None without forks.
    spans: dict[int, tuple] = {}
    finished = 0

    def plan_span(rank: int, i0: int, state: list, f0: float) -> bool:
        """``i0`` runs alone on ``rank`` and ends at ``f0``. Follow the ops that will run one
        after the other, each alone on the rank, as long as each one's end starts exactly one
        op of this rank and nothing elsewhere: their times are then known now (each runs at
        its stand-alone speed). Record them as a span with one heap event at its end. Returns
        False (and plans nothing) when the span would hold ``i0`` only.

        A *fork* is followed too: an op whose end starts exactly two ops of this rank (a
        backward GEMM's weight-gradient beside its data-gradient all-reduce) when the one that
        ends first starts nothing: both run together at their contended speeds until the first
        ends, then the other alone, with the event loop's arithmetic."""
        if rank_queued.get(rank):
            return False  # a queued collective starts when a lane frees: not a quiet rank
        ids = [i0]
        ends = [f0]
        forks = after = None
        lwait: dict[int, int] = {}
        lhead: dict[int, int] = {}
        i, t = i0, f0
        add_id, add_end = ids.append, ends.append
        while True:
            j = simple[i]
            while j >= 0:  # (j is next on i's stream: lhead is set once the chain of simple ops ends)
                d = fixed[j]
                if d is None:
                    d = alone[op_spec[j]]
                    if d is None:
                        d = duration(j, ())
                t = t + d
                add_id(j)
                add_end(t)
                i = j
                j = simple[i]
            sid = op_stream[i]
            pos = op_pos[i] + 1  # i heads its stream: the stream's head once i is done
            c = link[i]
            if c >= 0:  # its only dependent is on another stream: it alone starts if it heads
                # that stream and the next op of i's stream is not ready
                csid = op_stream[c]
                if op_pos[c] == lhead.get(csid, head[csid]):
                    q = queues[sid]
                    if pos >= len(q) or lwait.get(q[pos], waiting_deps[q[pos]]):
                        lhead[sid] = pos
                        d = fixed[c]
                        if d is None:
                            d = alone[op_spec[c]]
                            if d is None:
                                d = duration(c, ())
                        t = t + d
                        add_id(c)
                        add_end(t)
                        i = c
                        continue
            lhead[sid] = pos
            nxt = -1
            nxt2 = -1
            many = False
            for c in dependents[i]:
                if op_rank[c] != rank:
                    many = True
                    break
                w = lwait.get(c, waiting_deps[c]) - 1
                lwait[c] = w
                if w == 0:
                    csid = op_stream[c]
                    if op_pos[c] == lhead.get(csid, head[csid]):
                        if nxt2 >= 0:
                            many = True
                            break
                        if nxt >= 0:
                            nxt2 = c
                        else:
                            nxt = c
            if many:
                break
            q = queues[sid]
            if pos < len(q):
                c = q[pos]
                if c != nxt and c != nxt2 and lwait.get(c, waiting_deps[c]) == 0:
                    if nxt2 >= 0:
                        break
                    # the next op of i's stream is started first (the event loop tries i's
                    # stream before its dependents' streams)
                    if nxt >= 0:
                        nxt2 = nxt
                    nxt = c
            if nxt < 0:
                break
            if nxt2 >= 0:  # a fork: nxt and nxt2 start together, in this order
                if nxt != q[pos] if pos < len(q) else True:
                    # both are dependents: start order is the order their streams first appear
                    # among i's dependents
                    s1, s2 = op_stream[nxt], op_stream[nxt2]
                    for c in dependents[i]:
                        cs = op_stream[c]
                        if cs == s1:
                            break
                        if cs == s2:
                            nxt, nxt2 = nxt2, nxt
                            break
                if fixed[nxt] is not None or fixed[nxt2] is not None or (lane[nxt] >= 0 and lane[nxt] == lane[nxt2]):
                    break
                sa, sb = op_spec[nxt], op_spec[nxt2]
                ds = together.get((sa, sb))
                if ds is None:
                    ds = together[(sa, sb)] = [duration_of_spec(sa, (sb,)), duration_of_spec(sb, (sa,))]
                da, db = ds
                if da <= 0.0 or db <= 0.0:
                    break
                ra, rb = 1.0 / da, 1.0 / db
                fa, fb = t + 1.0 / ra, t + 1.0 / rb
                if fa == fb:
                    break
                if fa < fb:
                    e1, e2, t1, r2 = nxt, nxt2, fa, rb
                else:
                    e1, e2, t1, r2 = nxt2, nxt, fb, ra
                # e1's end must start nothing (e2 still runs) and touch no other rank
                sid1 = op_stream[e1]
                pos1 = op_pos[e1] + 1
                lhead[sid1] = pos1
                for c in dependents[e1]:
                    if op_rank[c] != rank:
                        many = True
                        break
                    w = lwait.get(c, waiting_deps[c]) - 1
                    lwait[c] = w
                    if w == 0:
                        csid = op_stream[c]
                        if op_pos[c] == lhead.get(csid, head[csid]):
                            many = True
                            break
                if many:
                    break
                q1 = queues[sid1]
                if pos1 < len(q1) and lwait.get(q1[pos1], waiting_deps[q1[pos1]]) == 0:
                    break
                rem = 1.0 - (t1 - t) * r2
                rem = rem if rem > 0.0 else 0.0
                d = duration(e2, ())
                rate2 = inf if d <= 0.0 else 1.0 / d
                f2 = t1 if rate2 == inf else t1 + rem / rate2
                if forks is None:
                    forks, after = {}, {}
                forks[len(ids)] = (nxt, [1.0, ra, t], nxt2, [1.0, rb, t])
                after[len(ids) + 1] = (t, [rem, rate2, t1])
                ids.append(e1)
                ends.append(t1)
                ids.append(e2)
                ends.append(f2)
                i, t = e2, f2
                continue
            d = fixed[nxt]
            if d is None:
                d = alone[op_spec[nxt]]
                if d is None:
                    d = duration(nxt, ())
            t = t + d
            add_id(nxt)
            add_end(t)
            i = nxt
        if len(ids) == 1:
            return False
        del running[rank][i0]
        if lane[i0] >= 0:
            lane_busy[lane[i0]] = False  # the span holds its lanes until it is opened
        version[i0] += 1  # an event pushed for i0 while it had company no longer holds
        spans[rank] = (ids, ends, state, forks, after)
        last = ids[-1]
        version[last] += 1
        push(heap, (t, version[last], last))
        return True

    def open_span(rank: int, now: float, whole: bool) -> None:
        """Turn ``rank``'s span back into ordinary running state at ``now``: its ops that ended
        by then are booked, the one running becomes a running op again (``whole``: the span's
        end event is being handled, so every op but the last is booked and the last runs)."""
        ids, ends, state0, forks, after = spans.pop(rank)
        last = ids[-1]
        if not whole:
            version[last] += 1  # its end event no longer holds
        stop = len(ids) - 1
        if whole:
            k = stop
        else:
            k = bisect.bisect_right(ends, now, 0, stop)  # ops 0..k-1 ended by now
        # book the ends of the span ops that had no effect outside the span
        nonlocal finished
        finished += k
        prev = -1.0
        for oid, t in zip(ids[:k], ends):
            if prev >= 0.0:
                start[oid] = prev
            prev = t
            end[oid] = t
            sid = op_stream[oid]
            busy[sid] = False
            head[sid] += 1
            for dep in dependents[oid]:
                waiting_deps[dep] -= 1
        cur = ids[k]
        run = running.get(rank)
        if run is None:
            run = running[rank] = {}
        if forks is not None:
            for kk, (s0, _) in after.items():  # a fork's second op started with the first
                if kk < k:
                    start[ids[kk]] = s0
            fk = forks.get(k)
            if fk is not None:  # both fork ops run now
                a, sa, b, sb = fk
                start[a] = start[b] = ends[k - 1]
                busy[op_stream[a]] = busy[op_stream[b]] = True
                for x in (a, b):
                    if lane[x] >= 0:
                        lane_busy[lane[x]] = True
                run[a] = sa
                run[b] = sb
                return
            af = after.get(k)
            if af is not None:  # the fork's second op runs alone
                start[cur] = af[0]
                busy[op_stream[cur]] = True
                if lane[cur] >= 0:
                    lane_busy[lane[cur]] = True
                run[cur] = af[1]
                return
        if k == 0:
            st = state0
        else:
            start[cur] = ends[k - 1]
            busy[op_stream[cur]] = True
            d = duration(cur, ())
            st = [1.0, inf if d <= 0.0 else 1.0 / d, ends[k - 1]]
        if lane[cur] >= 0:
            lane_busy[lane[cur]] = True
        run[cur] = st

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
                f = now if rate == inf else now + state[0] / rate
            if plan_span(rank, oid, state, f):
                return
            version[oid] += 1
            push(heap, (f, version[oid], oid))
            return
        cspec = tuple(map(op_spec.__getitem__, run))
        ds = together.get(cspec)
        if ds is None:  # each member's seconds beside the others (by spec; overrides below)
            ds = together[cspec] = [
                None if s < 0 else duration_of_spec(s, tuple(x for j, x in enumerate(cspec) if j != k and x >= 0))
                for k, s in enumerate(cspec)]
        for (oid, state), d in zip(run.items(), ds):
            remaining = state[0] - (now - state[2]) * state[1]
            f = fixed[oid]
            if f is not None:
                d = f
            rate = inf if d <= 0.0 else 1.0 / d
            state[0] = remaining = remaining if remaining > 0.0 else 0.0
            state[1] = rate
            state[2] = now
            v = version[oid] = version[oid] + 1
            push(heap, (now if rate == inf else now + remaining / rate, v, oid))

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
        if lane[op_id] >= 0:
            enqueue(op_id, now)
            return
        begin(op_id, now, touched)

    def enqueue(op_id: int, now: float) -> None:
        """A ready collective joins its communicator's queue (once)."""
        if not queued[op_id]:
            queued[op_id] = 1
            rk = op_rank[op_id]
            rank_queued[rk] = rank_queued.get(rk, 0) + 1
            L = lane[op_id]
            heapq.heappush(lane_queue[L], (now, op_id))
            freed.add(L)

    def begin(op_id: int, now: float, touched: set) -> None:
        busy[op_stream[op_id]] = True
        start[op_id] = now
        rank = op_rank[op_id]
        run = running.get(rank)
        if run is None:
            run = running[rank] = {}
        run[op_id] = [1.0, 0.0, now]
        touched.add(rank)

    def hand_out(now: float, touched: set) -> None:
        """Start the first queued collective of every free lane that has one."""
        for L in freed:
            qL = lane_queue[L]
            if qL and not lane_busy[L]:
                op_id = heapq.heappop(qL)[1]
                lane_busy[L] = True
                rank_queued[op_rank[op_id]] -= 1
                begin(op_id, now, touched)
        freed.clear()

    now = 0.0
    touched: set[int] = set()
    for sid in range(n_streams):
        try_start(sid, now, touched)
    if freed:
        hand_out(now, touched)
    for rank in touched:
        reschedule(rank, now)

    pop = heapq.heappop
    report_at = 4096
    while heap:
        finish, ver, op_id = pop(heap)
        if ver != version[op_id]:
            continue
        now = finish
        # finish every op whose (valid) event is at this same instant before rescheduling
        batch = [op_id]
        while heap and heap[0][0] <= now:
            f2, v2, o2 = pop(heap)
            if v2 == version[o2]:
                batch.append(o2)
        if spans:
            for oid in batch:  # a span's end event: book its quiet ops, its last one ends now
                sp = spans.get(op_rank[oid])
                if sp is not None and sp[0][-1] == oid:
                    open_span(op_rank[oid], now, True)
        touched = set()
        candidates: dict[int, None] = {}
        for oid in batch:
            end[oid] = now
            finished += 1
            rank = op_rank[oid]
            del running[rank][oid]
            sid = op_stream[oid]
            busy[sid] = False
            head[sid] += 1
            touched.add(rank)
            candidates[sid] = None
            if lane[oid] >= 0:
                lane_busy[lane[oid]] = False
                freed.add(lane[oid])
            for dep in dependents[oid]:
                waiting_deps[dep] -= 1
                candidates[op_stream[dep]] = None
                if spans:
                    r2 = op_rank[dep]
                    if r2 in spans:  # something outside a span changed on its rank: replay it
                        open_span(r2, now, False)
                        touched.add(r2)
        # newly startable ops: next on each finished op's stream, and heads waiting on them
        # (try_start, inlined)
        for sid in candidates:
            if busy[sid]:
                continue
            q = queues[sid]
            h = head[sid]
            if h >= len(q):
                continue
            oid = q[h]
            if waiting_deps[oid]:
                continue
            if lane[oid] >= 0:
                enqueue(oid, now)
                continue
            busy[sid] = True
            start[oid] = now
            rank = stream_rank[sid]
            run = running.get(rank)
            if run is None:
                run = running[rank] = {}
            run[oid] = [1.0, 0.0, now]
            touched.add(rank)
        if freed:
            hand_out(now, touched)
        for rank in touched:
            reschedule(rank, now)
        if progress is not None and finished >= report_at:
            progress(finished, n)
            report_at = (finished // 4096 + 1) * 4096

    if finished != n:
        stuck = next(op for op in ops if end[op.op_id] < 0.0)
        raise ConfigError(
            f"the op graph deadlocks: op {stuck.name!r} on rank {stuck.rank} stream {stuck.stream!r} "
            f"never became ready (dependency cycle through stream order?)"
        )
    if progress is not None:
        progress(n, n)
    return _to_timeline(graph, np.frombuffer(start, dtype=np.float64).copy(),
                        np.frombuffer(end, dtype=np.float64).copy(), op_spec, specs, (rank_arr, stream_names, names))


def _to_timeline(graph: OpGraph, start: np.ndarray, end: np.ndarray, op_spec: list[int],
                 specs: list, labels: tuple) -> Timeline:
    """The columnar Timeline of the played graph (one row per op, in op order). The per-spec
    columns (kind, bytes, FLOPs, collective, group) are worked out once per interned spec
    (``op_spec[i]`` indexes ``specs``; -1, no spec, picks the extra last row); ``labels`` =
    the ops' (ranks, streams, names)."""
    group_sizes: dict[str, int] = {}
    rows = []
    for spec in specs + [None]:
        c, g, b, f = "", "", 0.0, 0.0
        if isinstance(spec, CollectiveSpec):
            c, g, b = spec.collective, spec.group.name, float(spec.bytes)
            group_sizes[g] = spec.group.size
        elif isinstance(spec, P2PSpec):
            c, g, b = "p2p", spec.group, float(spec.bytes)
            group_sizes.setdefault(g, 2)
        elif spec is not None:
            b = float(getattr(spec, "bytes", 0.0))
            f = float(getattr(spec, "flops", 0.0))
        rows.append((COMPUTE if spec is None else kind_of(spec), c, g, b, f))
    idx = np.asarray(op_spec, dtype=np.int64)
    kind, collective, group = (np.array([r[k] for r in rows], dtype=object)[idx] for k in range(3))
    nbytes, flops = (np.array([r[k] for r in rows], dtype=np.float64)[idx] for k in (3, 4))
    meta = dict(graph.meta)
    meta["group_sizes"] = group_sizes
    rank, stream, name = labels
    return Timeline(rank=rank, stream=stream, kind=kind, name=name, start_s=start, end_s=end, bytes=nbytes, flops=flops,
                    collective=collective, group=group, meta=meta)
