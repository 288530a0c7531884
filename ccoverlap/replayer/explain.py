"""Why ``analyze`` and ``replay`` can disagree about what communication costs.

``analyze`` counts *exposed* communication: time a collective runs with no compute beside it.
``replay``'s ``no-comm`` what-if removes communication and replays the dependencies: the step
gets shorter only by the communication that lies on its **critical path** - the chain of
binding constraints from the end of the analysed window back to its start. When the GPU
waits for the CPU to launch the next work (a CPU-bound window), exposed communication fits in
time the GPU would idle anyway; when a collective waits for its slowest member, or compute
waits for a collective that ran beside other compute, removing it gains more than was exposed.

:func:`critical_path` walks the replay of the unedited graph back from the end of the slowest
rank's analysed window and splits the window into what the path runs through (GPU compute,
communication, other GPU work, host code - CPU calls, the CPU work between them and launch
latency - and waits on another stream or a host sync); :func:`explain` turns it into one
sentence when the two numbers differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ccoverlap.replayer.core import Job, Measured
from ccoverlap.replayer.graph import CPU, E_COLL, E_CPU, E_LAUNCH, E_STREAM, E_SYNC, E_XSTREAM
from ccoverlap.replayer.job import JobGraph

CATEGORIES = ("compute", "communication", "other GPU", "host", "waits")


@dataclass
class PathSummary:
    """Seconds of one rank's analysed window by what its critical path runs through."""

    rank: int
    window_s: float
    seconds: dict = field(default_factory=dict)
    other_ranks_s: float = 0.0        # part of the path on another rank (reached through a collective)

    def share(self, cat: str) -> float:
        """Fraction of the window in ``cat``."""
        return self.seconds.get(cat, 0.0) / self.window_s if self.window_s > 0 else 0.0


def binding_edges(jg: JobGraph, t: np.ndarray, add: np.ndarray) -> np.ndarray:
    """Per node, the in-edge that sets its time (the largest ``t[src] + add``), -1 where its
    release (a root's measured start) does or it has none."""
    val = t[jg.src] + add
    order = np.lexsort((val, jg.dst))
    last = np.r_[jg.dst[order][1:] != jg.dst[order][:-1], True]
    best = np.full(len(t), -1, dtype=np.int64)
    e = order[last]
    ok = val[e] >= jg.release[jg.dst[e]]
    best[jg.dst[e][ok]] = e[ok]
    return best


def _node_categories(jg: JobGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per node: its category (index into CATEGORIES) and its rank index (-1: a collective's node)."""
    cat = np.full(len(jg.kind), CATEGORIES.index("waits"), dtype=np.int8)
    cat[jg.kind == CPU] = CATEGORIES.index("host")
    rank = np.full(len(jg.kind), -1, dtype=np.int32)
    codes = {"compute": CATEGORIES.index("compute"), "comm": CATEGORIES.index("communication")}
    for gi, (off, g) in enumerate(zip(jg.offset, jg.ranks)):
        rank[off:off + g.n_nodes] = gi
        cat[off:off + g.n_gpu] = [codes.get(k, CATEGORIES.index("other GPU")) for k in g.rt.timeline.kind.tolist()]
    return cat, rank


_EDGE_CAT = {E_CPU: "host", E_LAUNCH: "host", E_STREAM: "waits", E_XSTREAM: "waits", E_SYNC: "waits",
             E_COLL: "communication"}


def _step_back(jg: JobGraph, t: np.ndarray, bind: np.ndarray, v: int,
               start_s: float) -> tuple[float, int, tuple[int, bool] | None]:
    """From the start of node ``v``: (time the binding constraint starts, its category, the next
    (node, entered at its end) or None at a root)."""
    b = int(bind[v])
    if b < 0:   # a root: a thread's first call or an op with nothing before it, at its measured time
        return start_s, CATEGORIES.index("host" if jg.kind[v] == CPU else "waits"), None
    u = int(jg.src[b])
    fe = bool(jg.from_end[b])
    lo = float(t[u] + jg.dur[u]) if fe else float(t[u])
    return lo, CATEGORIES.index(_EDGE_CAT.get(int(jg.ekind[b]), "waits")), (u, fe)


def critical_path(jg: JobGraph, t: np.ndarray, gi: int, start_s: float, end_s: float) -> PathSummary:
    """The critical path of rank ``jg.ranks[gi]`` over ``[start_s, end_s]`` of the replay ``t``
    of the unedited graph (see the module docstring): walked back from the op that ends the
    window along each node's binding constraint; a node's own duration counts in its category,
    the gap of its constraint in the edge's (CPU order and launch: host; stream, cross-stream,
    sync: waits; a collective's transfer: communication)."""
    g, off = jg.ranks[gi], jg.offset[gi]
    bind = binding_edges(jg, t, jg.w + np.where(jg.from_end, jg.dur[jg.src], 0.0))
    node_cat, node_rank = _node_categories(jg)
    s, e = jg.intervals(t)
    rows = np.arange(off, off + g.n_gpu)
    at_end = np.flatnonzero(np.isclose(e[rows], end_s, rtol=0, atol=1e-12))
    v, ending = (int(rows[at_end[0]]), True) if len(at_end) else (int(rows[np.argmin(np.abs(s[rows] - end_s))]), False)
    acc = [0.0] * len(CATEGORIES)
    other, hi = 0.0, end_s
    nxt: tuple[int, bool] | None
    while hi > start_s:
        if ending and jg.end_node[v] != v:        # a matched collective ends at its end node
            v, ending = int(jg.end_node[v]), False
            continue
        if ending:
            lo, c, nxt = float(t[v]), int(node_cat[v]), (v, False)
        else:
            lo, c, nxt = _step_back(jg, t, bind, v, start_s)
        span = hi - max(lo, start_s)
        if span > 0:
            acc[c] += span
            if node_rank[v] not in (gi, -1):
                other += span
        hi = lo
        if nxt is None:
            break
        v, ending = nxt
    return PathSummary(rank=g.rank, window_s=end_s - start_s, seconds=dict(zip(CATEGORIES, acc)), other_ranks_s=other)


class _Scenario(Protocol):
    """What this module reads of a replayed scenario (:class:`ccoverlap.replayer.run.Scenario`)."""

    @property
    def name(self) -> str: ...
    @property
    def measured(self) -> Measured: ...
    @property
    def step_time_s(self) -> float: ...
    @property
    def exposed_comm_s(self) -> float: ...
    @property
    def gain_s(self) -> float: ...
    @property
    def times(self) -> np.ndarray | None: ...


class _Result(Protocol):
    """What this module reads of a replay (:class:`ccoverlap.replayer.run.ReplayResult`, which
    imports this module: typed by its shape, not imported)."""

    @property
    def job(self) -> Job: ...
    @property
    def replay(self) -> _Scenario: ...
    @property
    def whatifs(self) -> Sequence[_Scenario]: ...


def slowest_path(res: _Result) -> PathSummary | None:
    """The critical path of the slowest rank's analysed window in the replay of the unedited graph."""
    m = res.replay.measured
    if res.replay.times is None or not m.bounds:
        return None
    jg = res.job.graph
    r = max(m.bounds, key=lambda k: (m.bounds[k].end_s - m.bounds[k].start_s) / m.bounds[k].n_steps)
    gi = next(i for i, g in enumerate(jg.ranks) if g.rank == r)
    b = m.bounds[r]
    return critical_path(jg, res.replay.times, gi, b.start_s, b.end_s)


def explain(res: _Result) -> str:
    """One sentence on why the replay's communication bound differs from ``analyze``'s exposed
    communication, or "" when they agree (within 5 % of the exposed time and 1 % of the step)."""
    bound = next((s for s in res.whatifs if s.name == "no-comm"), None)
    if bound is None:
        return ""
    step = res.replay.step_time_s
    exposed = res.replay.exposed_comm_s
    gain = max(bound.gain_s, 0.0)
    if abs(exposed - gain) <= max(0.05 * exposed, 0.01 * step):
        return ""
    path = slowest_path(res)
    if path is None:
        return ""
    n = res.replay.measured.bounds[path.rank].n_steps
    per = {k: v / n for k, v in path.seconds.items()}
    ms = lambda x: f"{x * 1e3:.2f} ms"   # noqa: E731
    head = (f"analyze counts {ms(exposed)} of exposed communication per step (no compute beside it), removing "
            f"all communication shortens the replayed step by {ms(gain)}: ")
    where = (f" (rank {path.rank}'s critical path per step: host code {ms(per['host'])}, GPU compute "
             f"{ms(per['compute'])}, communication {ms(per['communication'])}, waits on other streams or syncs "
             f"{ms(per['waits'])}, other GPU work {ms(per['other GPU'])})")
    if gain > exposed:
        peers = f", {ms(path.other_ranks_s / n)} of the path on other ranks" if path.other_ranks_s > 0 else ""
        return (head + "more than is exposed - compute waits for collectives that ran beside other compute, or "
                "collectives wait for their slowest member (dependencies)" + peers + where + ".")
    if path.share("host") >= 0.5:
        why = ("the step is CPU-bound: the GPU waits for the CPU to launch the next work, so exposed communication "
               "runs in time the GPU would idle anyway")
    elif per["communication"] < exposed:
        why = ("most exposed communication is off the critical path: what follows it does not wait for it "
               "(dependencies)")
    else:
        why = ("communication is on the critical path, but another path nearly as long (compute or host work on "
               "other streams and threads) sets the step once it is gone")
    return head + why + where + "."
