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
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ccoverlap.errors import ConfigError
from ccoverlap.sim.graph import OpGraph, gc_paused
from ccoverlap.sim.tables import static_tables
from ccoverlap.sim.timeline import Timeline, TimelineBuilder
from ccoverlap.specs import COMPUTE, CollectiveSpec, P2PSpec, Spec, kind_of
from ccoverlap.types import ProgressFn


class SupportsDuration(Protocol):
    """What the simulator needs from a cost model (:class:`ccoverlap.cost.CostModel` is the
    package's; tests pass small stand-ins)."""

    def duration_s(self, spec: Spec, concurrent: Sequence[Spec]) -> float:
        """Seconds ``spec`` takes while the ``concurrent`` specs run beside it on the same GPU."""
        ...


inf = float("inf")


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


def simulate(graph: OpGraph, cost: SupportsDuration, *, progress: ProgressFn | None = None) -> Timeline:
    """Play ``graph`` on its streams under ``cost``; return the Timeline of the step.

    ``progress``, if given, is called as ``progress(ops done, ops, "ops")`` every 4096 ops
    and once at the end. Raises :class:`ConfigError` if the graph deadlocks (a dependency cycle through stream
    order), naming a stuck op, and when ``graph`` is not an OpGraph or ``cost`` has no
    ``duration_s`` method. (See :class:`EventLoop` for how it is made fast.)
    """
    if not isinstance(graph, OpGraph):
        raise ConfigError(f"simulate needs an OpGraph (a StepGraph's .graph), got {type(graph).__name__}")
    if not callable(getattr(cost, "duration_s", None)):
        raise ConfigError(f"simulate: cost must have a duration_s(spec, concurrent) method (a CostModel), "
                          f"got {type(cost).__name__}")
    if not graph.ops:
        return TimelineBuilder().build(meta=dict(graph.meta))
    with gc_paused():
        return EventLoop(graph, cost).run(progress)


class EventLoop:
    """:func:`simulate`'s event loop over one graph (the semantics are the module docstring's).

    Phases of one event (:meth:`run`): pop every op that ends at this instant
    (:meth:`finish_batch`: free its stream and communicator lane, count its dependents'
    waits down), start what became ready (:meth:`start_ready`: stream heads, or a
    communicator's queue via :meth:`enqueue` and :meth:`hand_out`), then re-evaluate the
    speeds of the ops running on every touched rank (:meth:`reschedule`: the contention
    update).

    Speed notes: specs are interned once (ops stamped from one template share one spec
    object), so durations are cached per (spec index, indices of the concurrent specs);
    streams are small integers; and a run of ops that follow each other alone on a rank is
    timed in one pass (:meth:`plan_span`), replayed into ordinary state (:meth:`open_span`) if
    anything else happens on that rank first. Hot methods bind the attributes they read to
    locals first.
    """

    def __init__(self, graph: OpGraph, cost: SupportsDuration) -> None:
        self.graph = graph
        self.cost = cost
        self.ops = ops = graph.ops
        self.n = n = len(ops)
        (self.names, self.op_rank, self.rank_arr, self.stream_names, self.op_stream, self.stream_rank, self.op_pos,
         self.queues, self.specs, self.op_spec, self.fixed, self.waiting_deps, self.dependents, self.simple,
         self.link) = static_tables(ops)
        n_streams = len(self.queues)
        self.head = [0] * n_streams  # position of each stream's next op in its queue
        self.busy = [False] * n_streams
        # communicators (module doc): a collective whose group's lane is held waits in the lane's
        # queue, ordered by (time it became ready, op id); ``freed`` lanes are handed out once an
        # event's batch has been processed
        self.lane, n_lanes = communicator_lanes(ops, self.op_spec, self.specs)
        self.lane_busy = [False] * n_lanes
        self.lane_queue: list[list[tuple[float, int]]] = [[] for _ in range(n_lanes)]
        self.queued = bytearray(n)
        self.rank_queued: dict[int, int] = {}
        self.freed: set[int] = set()
        self.alone: list[float | None] = [None] * len(self.specs)  # seconds of each spec on an idle GPU (lazily)
        self.shared: dict[tuple, float] = {}  # (spec index, concurrent spec indices) -> seconds
        self.together: dict[tuple, list] = {}  # spec indices running together -> each one's seconds
        # start and end times in C doubles (array.array): stores cost what list stores cost, but no
        # float object per op stays alive, and the Timeline's columns are a copy of the buffer
        # (a list of 10^5 scattered floats takes longer to convert than to fill)
        self.start = array("d", bytes(8 * n))
        self.end = array("d", [-1.0]) * n  # -1: not ended yet (every event of an ended op is stale: see ``version``)
        # running ops per rank, in start order: op_id -> [remaining_fraction, rate, last_update_time]
        self.running: dict[int, dict[int, list[float]]] = {}
        self.heap: list[tuple[float, int, int]] = []  # (finish_time, version, op_id)
        self.version = [0] * n  # bumped at every push: only the latest event of an op holds (none once it ended)
        # Quiet-rank spans: rank -> (op ids, their end times, state of the first op when planned,
        # forks, after) where forks maps the span index of a fork's first-ending op to the two fork
        # ops and their running states (in start order), and after maps the index of the fork's
        # other op to (its start, its state once the first one ended); both empty without forks.
        self.spans: dict[int, tuple] = {}
        self.finished = 0
        # the tables an event's methods read, likewise
        self.event_tables = (self.spans, self.op_rank, self.end, self.running, self.op_stream, self.busy, self.head,
                             self.lane, self.lane_busy, self.freed, self.dependents, self.waiting_deps, self.queues,
                             self.start, self.stream_rank)
        self.resched_tables = (self.running, self.version, self.heap, self.fixed, self.op_spec, self.together)
        # the tables the span walk reads, unpacked in one step by its methods (cheaper than one
        # attribute load each: they run once per op of a span)
        self.walk = (self.op_rank, self.op_stream, self.op_pos, self.head, self.waiting_deps, self.dependents,
                     self.queues, self.simple, self.fixed, self.alone, self.op_spec, self.link)

    # ------------------------------------------------------------------ durations
    def duration_of_spec(self, si: int, others: tuple) -> float:
        """Seconds of spec ``si`` beside the specs ``others`` (cached)."""
        key = (si, others)
        d = self.shared.get(key)
        if d is None:
            specs = self.specs
            d = float(self.cost.duration_s(specs[si], tuple(specs[j] for j in others)))
            if not d >= 0.0:
                raise ConfigError(f"cost model gave a negative or NaN duration for {type(specs[si]).__name__} "
                                  f"{specs[si]!r}")
            self.shared[key] = d
        return d

    def duration(self, i: int, others: tuple) -> float:
        """Seconds of op ``i`` beside the specs ``others`` (its override, else cached by spec)."""
        f = self.fixed[i]
        if f is not None:
            return f
        si = self.op_spec[i]
        if not others:
            d = self.alone[si]
            if d is not None:
                return d
        else:
            key = (si, others)
            d = self.shared.get(key)
            if d is not None:
                return d
        specs = self.specs
        d = float(self.cost.duration_s(specs[si], tuple(specs[j] for j in others)))
        if not d >= 0.0:
            raise ConfigError(f"cost model gave a negative or NaN duration for op {self.ops[i].name!r}")
        if others:
            self.shared[(si, others)] = d
        else:
            self.alone[si] = d
        return d

    # ------------------------------------------------------------------ quiet-rank spans
    def plan_span(self, rank: int, i0: int, state: list, f0: float) -> bool:
        """``i0`` runs alone on ``rank`` and ends at ``f0``. Follow the ops that will run one
        after the other, each alone on the rank, as long as each one's end starts exactly one
        op of this rank and nothing elsewhere: their times are then known now (each runs at
        its stand-alone speed), forks too (:meth:`span_fork`). Record them as a span with one
        heap event at its end. False (nothing planned) when the span would hold ``i0`` only."""
        if self.rank_queued.get(rank):
            return False  # a queued collective starts when a lane frees: not a quiet rank
        _, op_stream, op_pos, head, waiting_deps, dependents, queues, simple, fixed, alone, op_spec, link = self.walk
        duration = self.duration
        ids, ends = [i0], [f0]
        forks: dict = {}
        after: dict = {}
        lwait: dict[int, int] = {}  # the span's own view of dependency counts and stream heads
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
            if dependents[i]:
                nxt, nxt2 = self.span_successors(rank, i, pos, lwait, lhead)
            else:  # only the next op of i's stream can start
                q = queues[sid]
                nxt = q[pos] if pos < len(q) and not lwait.get(q[pos], waiting_deps[q[pos]]) else -1
                nxt2 = -1
            if nxt < 0:
                break
            if nxt2 >= 0:  # a fork: nxt and nxt2 start together, in this order
                fork = self.span_fork(rank, t, nxt, nxt2, lwait, lhead, ids, ends, forks, after)
                if fork is None:
                    break
                i, t = fork
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
        self.hold_span(rank, i0, t, (ids, ends, state, forks, after))
        return True

    def span_successors(self, rank: int, i: int, pos: int, lwait: dict, lhead: dict) -> tuple[int, int]:
        """``(nxt, nxt2)``: the ops of ``rank`` that start when ``i`` ends, in start order
        (``nxt2`` -1 when one does; both -1 when none, more than two, or any op of another rank
        waits on ``i``: the span ends there). ``pos``: ``i``'s stream head once it is done;
        ``lwait``/``lhead``: the span's own view of waits and stream heads, updated."""
        op_rank, op_stream, op_pos, head, waiting_deps, dependents, queues, _, _, _, _, _ = self.walk
        nxt = -1
        nxt2 = -1
        for c in dependents[i]:
            if op_rank[c] != rank:
                return -1, -1
            w = lwait.get(c, waiting_deps[c]) - 1
            lwait[c] = w
            if w == 0:
                csid = op_stream[c]
                if op_pos[c] == lhead.get(csid, head[csid]):
                    if nxt2 >= 0:
                        return -1, -1
                    if nxt >= 0:
                        nxt2 = c
                    else:
                        nxt = c
        q = queues[op_stream[i]]
        if pos < len(q):
            c = q[pos]
            if c != nxt and c != nxt2 and lwait.get(c, waiting_deps[c]) == 0:
                if nxt2 >= 0:
                    return -1, -1
                # the next op of i's stream is started first (the event loop tries i's
                # stream before its dependents' streams)
                if nxt >= 0:
                    nxt2 = nxt
                nxt = c
        if nxt2 >= 0 and (nxt != q[pos] if pos < len(q) else True):
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
        return nxt, nxt2

    def span_fork(self, rank: int, t: float, nxt: int, nxt2: int, lwait: dict, lhead: dict, ids: list, ends: list,
                  forks: dict, after: dict) -> tuple[int, float] | None:
        """A *fork*: an op whose end at ``t`` starts exactly two ops of this rank (a backward
        GEMM's weight-gradient beside its data-gradient all-reduce), followed when the one that
        ends first starts nothing. ``nxt`` and ``nxt2`` run together at their contended speeds until
        the first (``e1``) ends, then the other (``e2``) alone, with the event loop's arithmetic.
        Appends e1 and e2 to the span's ``ids``/``ends``, records both ops' running states in
        ``forks``/``after`` and returns ``(e2, e2's end)``; None (nothing recorded) where the
        span cannot follow it (an override, a shared lane, a tie, or e1's end starts something
        or touches another rank)."""
        fixed, lane, op_spec = self.fixed, self.lane, self.op_spec
        if fixed[nxt] is not None or fixed[nxt2] is not None or (lane[nxt] >= 0 and lane[nxt] == lane[nxt2]):
            return None
        sa, sb = op_spec[nxt], op_spec[nxt2]
        ds = self.together.get((sa, sb))
        if ds is None:
            ds = self.together[(sa, sb)] = [self.duration_of_spec(sa, (sb,)), self.duration_of_spec(sb, (sa,))]
        da, db = ds
        if da <= 0.0 or db <= 0.0:
            return None
        ra, rb = 1.0 / da, 1.0 / db
        fa, fb = t + 1.0 / ra, t + 1.0 / rb
        if fa == fb:
            return None
        if fa < fb:
            e1, e2, t1, r2 = nxt, nxt2, fa, rb
        else:
            e1, e2, t1, r2 = nxt2, nxt, fb, ra
        # e1's end must start nothing (e2 still runs) and touch no other rank
        op_rank, op_stream, op_pos, head, waiting_deps = self.op_rank, self.op_stream, self.op_pos, self.head, \
            self.waiting_deps
        sid1 = op_stream[e1]
        pos1 = op_pos[e1] + 1
        lhead[sid1] = pos1
        for c in self.dependents[e1]:
            if op_rank[c] != rank:
                return None
            w = lwait.get(c, waiting_deps[c]) - 1
            lwait[c] = w
            if w == 0:
                csid = op_stream[c]
                if op_pos[c] == lhead.get(csid, head[csid]):
                    return None
        q1 = self.queues[sid1]
        if pos1 < len(q1) and lwait.get(q1[pos1], waiting_deps[q1[pos1]]) == 0:
            return None
        rem = 1.0 - (t1 - t) * r2
        rem = rem if rem > 0.0 else 0.0
        d = self.duration(e2, ())
        rate2 = inf if d <= 0.0 else 1.0 / d
        f2 = t1 if rate2 == inf else t1 + rem / rate2
        forks[len(ids)] = (nxt, [1.0, ra, t], nxt2, [1.0, rb, t])
        after[len(ids) + 1] = (t, [rem, rate2, t1])
        ids.append(e1)
        ends.append(t1)
        ids.append(e2)
        ends.append(f2)
        return e2, f2

    def hold_span(self, rank: int, i0: int, t: float, span: tuple) -> None:
        """Take ``i0`` out of ``rank``'s running ops into the planned ``span`` (ending at
        ``t``), with one heap event at its end."""
        del self.running[rank][i0]
        lane, version = self.lane, self.version
        if lane[i0] >= 0:
            self.lane_busy[lane[i0]] = False  # the span holds its lanes until it is opened
        version[i0] += 1  # an event pushed for i0 while it had company no longer holds
        self.spans[rank] = span
        last = span[0][-1]
        version[last] += 1
        heapq.heappush(self.heap, (t, version[last], last))

    def open_span(self, rank: int, now: float, whole: bool) -> None:
        """Turn ``rank``'s span back into ordinary running state at ``now``: its ops that ended
        by then are booked, the one running becomes a running op again (``whole``: the span's
        end event is being handled, so every op but the last is booked and the last runs)."""
        ids, ends, state0, forks, after = self.spans.pop(rank)
        last = ids[-1]
        if not whole:
            self.version[last] += 1  # its end event no longer holds
        stop = len(ids) - 1
        if whole:
            k = stop
        else:
            k = bisect.bisect_right(ends, now, 0, stop)  # ops 0..k-1 ended by now
        self.book_span(ids, ends, k)
        cur = ids[k]
        run = self.running.get(rank)
        if run is None:
            run = self.running[rank] = {}
        start, busy, op_stream, lane, lane_busy = self.start, self.busy, self.op_stream, self.lane, self.lane_busy
        if forks:
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
            d = self.duration(cur, ())
            st = [1.0, inf if d <= 0.0 else 1.0 / d, ends[k - 1]]
        if lane[cur] >= 0:
            lane_busy[lane[cur]] = True
        run[cur] = st

    def book_span(self, ids: list, ends: list, k: int) -> None:
        """Book the ends of a span's first ``k`` ops (they had no effect outside the span)."""
        start, end, op_stream, busy, head = self.start, self.end, self.op_stream, self.busy, self.head
        dependents, waiting_deps = self.dependents, self.waiting_deps
        self.finished += k
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

    # ------------------------------------------------------------------ contention updates
    def reschedule(self, rank: int, now: float) -> None:
        """Re-evaluate the speeds of every running op on ``rank`` at time ``now``."""
        running, version, heap, fixed, op_spec, together = self.resched_tables
        run = running.get(rank)
        if not run:
            return
        if len(run) == 1:
            for oid, state in run.items():
                remaining = state[0] - (now - state[2]) * state[1]
                d = self.duration(oid, ())
                rate = inf if d <= 0.0 else 1.0 / d
                state[0] = remaining if remaining > 0.0 else 0.0
                state[1] = rate
                state[2] = now
                f = now if rate == inf else now + state[0] / rate
            if self.plan_span(rank, oid, state, f):
                return
            version[oid] += 1
            heapq.heappush(heap, (f, version[oid], oid))
            return
        cspec = tuple(map(op_spec.__getitem__, run))
        ds = together.get(cspec)
        if ds is None:  # each member's seconds beside the others (by spec; overrides below)
            duration_of_spec = self.duration_of_spec
            ds = together[cspec] = [
                None if s < 0 else duration_of_spec(s, tuple(x for j, x in enumerate(cspec) if j != k and x >= 0))
                for k, s in enumerate(cspec)]
        push = heapq.heappush
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

    # ------------------------------------------------------------------ ready queue and lanes
    def try_start(self, sid: int, now: float, touched: set) -> None:
        """Start the head of stream ``sid`` if it is idle and the head is ready (a collective
        of a shared communicator joins its lane's queue instead)."""
        if self.busy[sid]:
            return
        q = self.queues[sid]
        h = self.head[sid]
        if h >= len(q):
            return
        op_id = q[h]
        if self.waiting_deps[op_id]:
            return
        if self.lane[op_id] >= 0:
            self.enqueue(op_id, now)
            return
        self.begin(op_id, now, touched)

    def enqueue(self, op_id: int, now: float) -> None:
        """A ready collective joins its communicator's queue (once)."""
        if not self.queued[op_id]:
            self.queued[op_id] = 1
            rk = self.op_rank[op_id]
            self.rank_queued[rk] = self.rank_queued.get(rk, 0) + 1
            L = self.lane[op_id]
            heapq.heappush(self.lane_queue[L], (now, op_id))
            self.freed.add(L)

    def begin(self, op_id: int, now: float, touched: set) -> None:
        """Op ``op_id`` starts at ``now`` (its speed is set when its rank is rescheduled)."""
        self.busy[self.op_stream[op_id]] = True
        self.start[op_id] = now
        rank = self.op_rank[op_id]
        run = self.running.get(rank)
        if run is None:
            run = self.running[rank] = {}
        run[op_id] = [1.0, 0.0, now]
        touched.add(rank)

    def hand_out(self, now: float, touched: set) -> None:
        """Start the first queued collective of every free lane that has one."""
        lane_queue, lane_busy, rank_queued, op_rank = self.lane_queue, self.lane_busy, self.rank_queued, self.op_rank
        for L in self.freed:
            qL = lane_queue[L]
            if qL and not lane_busy[L]:
                op_id = heapq.heappop(qL)[1]
                lane_busy[L] = True
                rank_queued[op_rank[op_id]] -= 1
                self.begin(op_id, now, touched)
        self.freed.clear()

    # ------------------------------------------------------------------ the loop
    def run(self, progress: ProgressFn | None) -> Timeline:
        """Play the graph: one iteration per instant at which ops end."""
        now = 0.0
        touched: set[int] = set()
        for sid in range(len(self.queues)):
            self.try_start(sid, now, touched)
        if self.freed:
            self.hand_out(now, touched)
        reschedule, finish_batch, start_ready, hand_out = self.reschedule, self.finish_batch, self.start_ready, \
            self.hand_out
        for rank in touched:
            reschedule(rank, now)
        heap, version, n, freed = self.heap, self.version, self.n, self.freed
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
            touched = set()
            start_ready(finish_batch(batch, now, touched), now, touched)
            if freed:
                hand_out(now, touched)
            for rank in touched:
                reschedule(rank, now)
            if progress is not None and self.finished >= report_at:
                progress(self.finished, n, "ops")
                report_at = (self.finished // 4096 + 1) * 4096
        return self.timeline(progress)

    def finish_batch(self, batch: list[int], now: float, touched: set) -> dict[int, None]:
        """The ops of ``batch`` end at ``now``: free their streams and lanes and count their
        dependents' waits down (opening any span on a rank this touches). Returns the streams
        whose head may now start (in the order found)."""
        (spans, op_rank, end, running, op_stream, busy, head, lane, lane_busy, freed, dependents, waiting_deps,
         _, _, _) = self.event_tables
        if spans:
            for oid in batch:  # a span's end event: book its quiet ops, its last one ends now
                sp = spans.get(op_rank[oid])
                if sp is not None and sp[0][-1] == oid:
                    self.open_span(op_rank[oid], now, True)
        candidates: dict[int, None] = {}
        for oid in batch:
            end[oid] = now
            self.finished += 1
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
                        self.open_span(r2, now, False)
                        touched.add(r2)
        return candidates

    def start_ready(self, candidates: dict[int, None], now: float, touched: set) -> None:
        """Newly startable ops: the next on each finished op's stream, and heads waiting on
        them (:meth:`try_start`, inlined)."""
        (_, _, _, running, _, busy, head, lane, _, _, _, waiting_deps, queues, start,
         stream_rank) = self.event_tables
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
                self.enqueue(oid, now)
                continue
            busy[sid] = True
            start[oid] = now
            rank = stream_rank[sid]
            run = running.get(rank)
            if run is None:
                run = running[rank] = {}
            run[oid] = [1.0, 0.0, now]
            touched.add(rank)

    def timeline(self, progress: ProgressFn | None) -> Timeline:
        """The Timeline once the heap is empty; a :class:`ConfigError` naming a stuck op if
        some op never ran (a deadlock)."""
        n, end = self.n, self.end
        if self.finished != n:
            stuck = next(op for op in self.ops if end[op.op_id] < 0.0)
            raise ConfigError(
                f"the op graph deadlocks: op {stuck.name!r} on rank {stuck.rank} stream {stuck.stream!r} "
                f"never became ready (dependency cycle through stream order?)"
            )
        if progress is not None:
            progress(n, n, "ops")
        return _to_timeline(self.graph, np.frombuffer(self.start, dtype=np.float64).copy(),
                            np.frombuffer(end, dtype=np.float64).copy(), self.op_spec, self.specs,
                            (self.rank_arr, self.stream_names, self.names))


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
