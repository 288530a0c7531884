"""Join the ranks' graphs (collectives matched across ranks) and replay them.

The replay is a longest-path pass over the dependency DAG: a node starts at
``max(release, max over in-edges of t[src] (+ dur[src]) + w)``. No resource is shared beyond
what the edges say (a stream is a chain of edges), so with the measured durations the unedited
graph gives back the measured times (the fidelity check), and a what-if is an edit of ``dur``
/ ``w`` / ``on`` (edge enabled) / ``xfer`` (collective transfer times) re-run through
:meth:`JobGraph.run`. The longest path is max-plus algebra, so shortening a duration or a
weight, or removing an edge, can only make every node start earlier or at the same time.

Two exact ways to compute it, chosen by size (:meth:`JobGraph.run`):

* **by levels** (numpy): the graph's edges are either *chain* edges (consecutive calls of a
  CPU thread, consecutive ops of a stream) or *cross* edges (launch, cross-stream, host sync,
  collective). A node's level is the largest number of cross edges on a path to it; within a
  level, the nodes of one chain form segments where ``t[i] = max(ext[i], t[i-1] + a[i])``, a
  max-plus prefix scan: ``t = A + cummax(ext - A)`` with ``A`` the prefix sum of the chain
  weights, run for every segment at once as one cumulative maximum over complex numbers
  (segment index, value) - numpy orders complex numbers lexicographically. Work: a few numpy
  calls per level plus linear work.
* **node by node** (Python) in topological order, for graphs with few nodes per level.

This is the replay-specific event loop the project's simulator (:mod:`ccoverlap.sim.simulator`,
cost-model durations, one shared schedule per rank) does not offer; its output is the
project's :class:`~ccoverlap.sim.timeline.Timeline`.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from ccoverlap.errors import TraceError
from ccoverlap.replayer.graph import BARRIER, CEND, E_COLL, E_CPU, E_STREAM, E_SYNC, GPU, WAIT, RankGraph
from ccoverlap.trace.match import comm_rows_by_group, pair_calls


@dataclass
class Collective:
    """One collective call matched across the ranks present (global node ids)."""

    group: str
    seq: int
    collective: str
    members: list[int]            # GPU node of each member
    ranks: list[int]
    barrier: int
    ends: list[int]               # CEND node of each member
    xfer: list[float]             # measured transfer time per member (s): end - latest start
    bytes: float = 0.0
    group_size: int = 0
    bar_edges: list[int] = field(default_factory=list)   # barrier -> end edge of each member


@dataclass
class Schedule:
    """The static plan of the level engine (positions = nodes sorted by level, chain, order)."""

    order: np.ndarray             # position -> node
    pos: np.ndarray               # node -> position
    level_ptr: np.ndarray         # positions of each level: [level_ptr[l], level_ptr[l + 1])
    chain_edge: np.ndarray        # per position: the chain in-edge from the same level, -1 if none
    static_start: np.ndarray      # per position: starts a segment whatever the edit
    x_edge: np.ndarray            # cross inputs (edges), sorted by destination position
    x_src: np.ndarray             # their sources' positions
    x_ptr: np.ndarray             # per level: [x_ptr[l], x_ptr[l + 1]) in x_edge
    x_first: list[np.ndarray]     # per level: reduceat starts (local to the level's edges)
    x_dst: list[np.ndarray]       # per level: destination positions (local to the level's nodes)
    has_chain: np.ndarray         # per position: chain_edge >= 0
    seg: np.ndarray               # per position: index of its static segment (float)
    first: np.ndarray             # per position: position where its static segment starts
    release: np.ndarray           # per position: the node's release (-inf: none)
    measured: np.ndarray          # per position: the node's measured start


@dataclass
class JobGraph:
    """All ranks in one graph: node and edge columns plus the per-rank offsets."""

    ranks: list[RankGraph]
    offset: list[int]
    kind: np.ndarray
    dur: np.ndarray
    start: np.ndarray
    release: np.ndarray            # -inf where none
    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    w_nom: np.ndarray
    from_end: np.ndarray
    ekind: np.ndarray
    collectives: list[Collective]
    end_node: np.ndarray           # node whose time (+dur when it is the node itself) ends each node
    notes: list[str] = field(default_factory=list)
    in_ptr: np.ndarray | None = None
    in_idx: np.ndarray | None = None
    sched: Schedule | None = None
    engine: str = ""

    def run(self, *, dur: np.ndarray | None = None, w: np.ndarray | None = None, on: np.ndarray | None = None,
            xfer: dict[int, list[float]] | None = None) -> np.ndarray:
        """Start time (s) of every node under the given edits (defaults: as measured).

        ``xfer``: ``{collective index: [transfer time per member]}`` replaces the measured
        transfer times of those collectives (barrier -> end edges). A node whose every
        constraint was removed by an edit keeps its measured start.
        """
        dur = self.dur if dur is None else dur
        add = dur[self.src]                  # each edge's t[src] + add: the source's duration if from its end
        add *= self.from_end
        add += self.w if w is None else w
        if xfer:
            for ci, xs in xfer.items():
                c = self.collectives[ci]
                add[c.bar_edges] = xs
        if on is not None:
            add[~on] = -np.inf
        if self.engine == "levels":
            return _run_levels(self, add)
        return _run_nodes(self, add)

    def use_engine(self, name: str) -> None:
        """Compute :meth:`run` ``"levels"`` (numpy, by level) or ``"nodes"`` (Python, node by
        node); both exact, chosen by size when the graph is built."""
        if name not in ("levels", "nodes"):
            raise ValueError(f"unknown engine {name!r}")
        self.engine = name
        if name == "nodes" and self.in_idx is None:
            _in_edges(self)
        if name == "levels":
            self.in_idx = self.in_ptr = None

    def intervals(self, t: np.ndarray, dur: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of every node from :meth:`run`'s times (an end node's time is the end)."""
        dur = self.dur if dur is None else dur
        en = self.end_node
        end = np.where(en == np.arange(len(t)), t + dur, t[en])
        return t, end

    def rank_of(self, node: int) -> int:
        """Index (into ``ranks``) of the rank a node belongs to (-1: a barrier of several ranks)."""
        gi = int(np.searchsorted(self.offset, node, side="right")) - 1
        return gi if node < self.offset[gi] + self.ranks[gi].n_nodes else -1


def _run_nodes(jg: JobGraph, add: np.ndarray) -> np.ndarray:
    """Longest path node by node in topological order (Python lists)."""
    assert jg.sched is not None and jg.in_ptr is not None and jg.in_idx is not None   # set by _topo
    addl = add.tolist()
    srcl = jg.src.tolist()
    ptr = jg.in_ptr.tolist()
    idx = jg.in_idx.tolist()
    rel = jg.release.tolist()
    start = jg.start
    t = [0.0] * len(rel)
    for v in jg.sched.order.tolist():
        best = rel[v]
        for q in range(ptr[v], ptr[v + 1]):
            e = idx[q]
            x = t[srcl[e]] + addl[e]
            if x > best:
                best = x
        if best == -np.inf:      # every constraint removed by an edit: keep the measured start
            best = float(start[v])
        t[v] = best
    return np.asarray(t)


def _run_levels(jg: JobGraph, add: np.ndarray) -> np.ndarray:
    """Longest path level by level: a segmented max-plus scan per level (see the module docstring)."""
    s = jg.sched
    assert s is not None        # set by _topo
    n = len(s.order)
    a = np.zeros(n)
    a[s.has_chain] = add[s.chain_edge[s.has_chain]]
    cut = a == -np.inf                       # a chain edge an edit removed starts a segment
    if cut.any():
        seg_start = s.static_start | cut
        seg = np.cumsum(seg_start).astype(np.float64)
        first = np.maximum.accumulate(np.where(seg_start, np.arange(n), 0))
    else:
        seg_start, seg, first = s.static_start, s.seg, s.first
    a[seg_start] = 0.0
    big_a = np.cumsum(a)
    big_a -= big_a[first]
    del a, cut
    x_add = add[s.x_edge]
    t = np.empty(n)
    for lv in range(len(s.level_ptr) - 1):
        p0, p1 = int(s.level_ptr[lv]), int(s.level_ptr[lv + 1])
        q0, q1 = int(s.x_ptr[lv]), int(s.x_ptr[lv + 1])
        ext = s.release[p0:p1].copy()
        if q1 > q0:
            red = np.maximum.reduceat(t[s.x_src[q0:q1]] + x_add[q0:q1], s.x_first[lv])
            d = s.x_dst[lv]
            ext[d] = np.maximum(ext[d], red)
        lost = seg_start[p0:p1] & (ext == -np.inf)
        if lost.any():
            ext[lost] = s.measured[p0:p1][lost]
        aa = big_a[p0:p1]
        z = np.empty(p1 - p0, dtype=np.complex128)
        z.real = seg[p0:p1]
        z.imag = ext - aa
        t[p0:p1] = aa + np.maximum.accumulate(z).imag
    out = np.empty(n)
    out[s.order] = t
    return out


#: A collective call matched across ranks: (group, call index in the group, [(rank index, local row)]).
_Matched = tuple[str, int, list[tuple[int, int]]]


class _NewParts(TypedDict):
    """The nodes and edges :func:`_collective_nodes` appends, and what it reads: node (kind, dur,
    start), edge (src, dst, w, from_end), the measured starts and durations, the edges before."""

    node: list[tuple[int, float, float]]
    edge: list[tuple[int, int, float, bool]]
    start0: np.ndarray
    dur0: np.ndarray
    n_edges: int


def _match_collectives(ranks: list[RankGraph], *, tol_s: float = 1e-3, tol_frac: float = 0.02) -> list[_Matched]:
    """(group, seq, [(rank index, local row)]) for the comm ops of groups seen on >= 2 ranks.

    Each group's calls are paired by :func:`ccoverlap.trace.match.pair_calls` with ends lined
    up (``by_order=False``: the replay needs every pair to be one call, so a call dropped by
    sampling or cut off by the profiling window is left unpaired rather than shifting the rest).
    """
    tls = {ri: g.rt.timeline for ri, g in enumerate(ranks)}
    per_group: dict[str, dict[int, np.ndarray]] = {}
    for ri, tl in tls.items():
        for grp, rows in comm_rows_by_group(tl).items():
            per_group.setdefault(grp, {})[ri] = rows
    out: list[_Matched] = []
    for grp, by_rank in per_group.items():
        calls, _ = pair_calls(tls, by_rank, by_order=False, tol_s=tol_s, tol_frac=tol_frac)
        out.extend((grp, seq, members) for seq, members in enumerate(calls))
    return out


def _unpaired_note(ranks: list[RankGraph], matched: list[_Matched]) -> str | None:
    paired = {(ri, row) for _, _, mem in matched for ri, row in mem}
    groups = list({grp for grp, _, _ in matched})
    alone = sum(1 for ri, g in enumerate(ranks) for row in np.flatnonzero(
        (g.rt.timeline.kind == "comm") & np.isin(g.rt.timeline.group, groups)) if (ri, int(row)) not in paired)
    if not alone:
        return None
    return (f"{alone} communication op(s) have no partner on the other ranks (same process group and type, ends "
            f"within 1 ms + 2%: cut off by the profiling window, dropped by sampling, or clocks apart) - replayed "
            f"with their measured durations")


def _collective_nodes(ranks: list[RankGraph], offset: list[int], matched: list[_Matched], base: int, cols: _NewParts,
                      notes: list[str]) -> list[Collective]:
    """A barrier and per-member end nodes for each matched call (appended to ``cols``)."""
    colls: list[Collective] = []
    start_all, dur_all = cols["start0"], cols["dur0"]
    n_edges = cols["n_edges"]
    for grp, seq, members in matched:
        nodes = [offset[ri] + row for ri, row in members]
        starts = [float(start_all[v]) for v in nodes]
        ends = [float(start_all[v] + dur_all[v]) for v in nodes]
        latest = max(starts)
        if min(ends) < latest - 1e-6:
            notes.append(f"{grp}#{seq}")      # a member ended before another started: clocks apart
            continue
        b = base
        base += 1
        cols["node"].append((BARRIER, 0.0, latest))
        cols["edge"] += [(v, b, 0.0, False) for v in nodes]
        cends: list[int] = []
        xfers: list[float] = []
        bar: list[int] = []
        for v, e in zip(nodes, ends):
            c = base
            base += 1
            x = max(e - latest, 0.0)
            cols["node"].append((CEND, 0.0, e))
            bar.append(n_edges + len(cols["edge"]))
            cols["edge"].append((b, c, x, False))
            cols["edge"].append((v, c, 0.0, False))   # the op's own start still bounds its end
            cends.append(c)
            xfers.append(x)
        ri0, row0 = members[0]
        tl0 = ranks[ri0].rt.timeline
        colls.append(Collective(group=grp, seq=seq, collective=str(tl0.collective[row0]), members=nodes,
                                ranks=[ranks[ri].rank for ri, _ in members], barrier=b, ends=cends, xfer=xfers,
                                bytes=float(tl0.bytes[row0]), group_size=int(ranks[ri0].rt.group_size[row0]),
                                bar_edges=bar))
    return colls


def _concat(ranks: list[RankGraph]) -> JobGraph:
    """The ranks' graphs side by side (no cross-rank edge); frees each rank's own columns."""
    offset = np.cumsum([0] + [g.n_nodes for g in ranks[:-1]]).tolist()
    cols: dict[str, np.ndarray] = {}
    for name in ("kind", "dur", "start", "release", "w", "w_nom", "from_end", "ekind"):
        cols[name] = np.concatenate([getattr(g, name) for g in ranks])
    idx = np.int32 if sum(g.n_nodes for g in ranks) < 2**31 - 2**20 else np.int64
    cols["src"] = np.concatenate([(g.src + o).astype(idx) for g, o in zip(ranks, offset)])
    cols["dst"] = np.concatenate([(g.dst + o).astype(idx) for g, o in zip(ranks, offset)])
    for g in ranks:
        g.drop_columns()
    return JobGraph(ranks=ranks, offset=offset, kind=cols["kind"], dur=cols["dur"], start=cols["start"],
                    release=cols["release"], src=cols["src"], dst=cols["dst"], w=cols["w"], w_nom=cols["w_nom"],
                    from_end=cols["from_end"], ekind=cols["ekind"], collectives=[],
                    end_node=np.arange(len(cols["kind"]), dtype=np.int64))


def _add_collectives(jg: JobGraph, matched: list[_Matched]) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Append the matched collectives' nodes and edges; returns what :func:`_drop_collectives`
    needs to undo it (node and edge counts before, moved edges and their old sources)."""
    n0, e0 = len(jg.kind), len(jg.src)
    cols: _NewParts = {"node": [], "edge": [], "start0": jg.start, "dur0": jg.dur, "n_edges": e0}
    jg.collectives = _collective_nodes(jg.ranks, jg.offset, matched, n0, cols, jg.notes)
    nk, ce = cols["node"], cols["edge"]
    cat = np.concatenate
    jg.kind = cat([jg.kind, np.array([x[0] for x in nk], dtype=np.int8)])
    jg.dur = cat([jg.dur, np.zeros(len(nk))])
    jg.start = cat([jg.start, np.array([x[2] for x in nk], dtype=np.float64)])
    jg.release = cat([jg.release, np.full(len(nk), -np.inf)])
    jg.src = cat([jg.src, np.array([x[0] for x in ce], dtype=jg.src.dtype)])
    jg.dst = cat([jg.dst, np.array([x[1] for x in ce], dtype=jg.dst.dtype)])
    jg.w = cat([jg.w, np.array([x[2] for x in ce], dtype=np.float64)])
    jg.w_nom = cat([jg.w_nom, np.array([x[2] for x in ce], dtype=np.float64)])
    jg.from_end = cat([jg.from_end, np.array([x[3] for x in ce], dtype=bool)])
    jg.ekind = cat([jg.ekind, np.full(len(ce), E_COLL, dtype=np.int8)])
    jg.end_node = np.arange(len(jg.kind), dtype=np.int64)
    # edges that leave a matched collective's end now leave its end node
    remap = np.arange(len(jg.kind), dtype=np.int64)
    for c in jg.collectives:
        remap[c.members] = c.ends
        jg.end_node[c.members] = c.ends
    moved = np.flatnonzero(jg.from_end & (remap[jg.src] != jg.src) & (jg.ekind != E_COLL))
    old_src = jg.src[moved].copy()
    jg.src[moved] = remap[old_src]
    jg.from_end[moved] = False
    return n0, e0, moved, old_src


def _drop_collectives(jg: JobGraph, undo: tuple[int, int, np.ndarray, np.ndarray]) -> None:
    """Undo :func:`_add_collectives` (every collective keeps its measured duration)."""
    n0, e0, moved, old_src = undo
    jg.src[moved] = old_src
    jg.from_end[moved] = True
    for name in ("kind", "dur", "start", "release"):
        setattr(jg, name, getattr(jg, name)[:n0].copy())
    for name in ("src", "dst", "w", "w_nom", "from_end", "ekind"):
        setattr(jg, name, getattr(jg, name)[:e0].copy())
    jg.end_node = np.arange(n0, dtype=np.int64)
    jg.collectives = []


def join(ranks: list[RankGraph]) -> JobGraph:
    """One :class:`JobGraph` from the ranks' graphs, with collectives matched across ranks (the
    ranks' own columns are freed: the job graph holds them).

    If matching closes a cycle (ranks issued one group's collectives in orders that cannot all
    hold - a mismatched pairing), the collectives are dropped again (each keeps its measured
    duration) and a note says so.
    """
    matched = _match_collectives(ranks)
    jg = _concat(ranks)
    note = _unpaired_note(ranks, matched) if matched else None
    if note:
        jg.notes.append(note)
    undo = _add_collectives(jg, matched)
    try:
        _topo(jg)
    except TraceError:
        if not jg.collectives:
            raise
        n = len(jg.collectives)
        _drop_collectives(jg, undo)
        _topo(jg)
        jg.notes.append(f"matching {n} collective(s) across ranks by call order made the dependency "
                        f"graph cyclic; replayed without cross-rank matching")
    return jg


def chain_edges(jg: JobGraph) -> np.ndarray:
    """Edges that continue a chain: CPU order, a call to its own wait node, stream order between
    two GPU ops. Each node has at most one chain in-edge and one chain out-edge."""
    k = jg.kind
    chain = (jg.ekind == E_CPU) | ((jg.ekind == E_SYNC) & (k[jg.dst] == WAIT) & (k[jg.src] != GPU)) | (
        (jg.ekind == E_STREAM) & (k[jg.src] == GPU) & (k[jg.dst] == GPU))
    for col in (jg.dst, jg.src):     # defensive: keep one per node, the rest count as cross edges
        idx = np.flatnonzero(chain)
        _, first = np.unique(col[idx], return_index=True)
        keep = np.zeros(len(chain), dtype=bool)
        keep[idx[first]] = True
        chain &= keep
    return chain


def _topo(jg: JobGraph) -> None:
    """Kahn's order over the DAG (a cycle is a TraceError), each node's level (cross edges on
    the longest path to it) and chain, the level engine's :class:`Schedule` (whose order is
    also a topological order), and the engine :meth:`JobGraph.run` uses."""
    n = len(jg.kind)
    chain = chain_edges(jg)
    out_order = np.argsort(jg.src, kind="stable")
    out_ptr = array("q", np.concatenate([[0], np.cumsum(np.bincount(jg.src, minlength=n))]).astype(np.int64).tobytes())
    out_dst = array("q", jg.dst[out_order].astype(np.int64).tobytes())
    out_cross = array("b", (~chain[out_order]).astype(np.int8).tobytes())
    del out_order
    counts = np.bincount(jg.dst, minlength=n)
    indeg = array("i", counts.astype(np.int32).tobytes())
    level = array("i", bytes(4 * n))
    chain_id = array("q", np.arange(n, dtype=np.int64).tobytes())
    # seed in measured-start order so ties resolve like the trace
    roots = np.argsort(jg.start, kind="stable")
    q = deque(roots[counts[roots] == 0].tolist())
    del roots, counts
    order = array("q")
    while q:
        v = q.popleft()
        order.append(v)
        lv = level[v]
        for i in range(out_ptr[v], out_ptr[v + 1]):
            d = out_dst[i]
            x = lv + out_cross[i]
            if x > level[d]:
                level[d] = x
            if not out_cross[i]:
                chain_id[d] = chain_id[v]
            indeg[d] -= 1
            if indeg[d] == 0:
                q.append(d)
    if len(order) != n:
        raise TraceError(f"the dependency graph has a cycle through {n - len(order)} node(s) - cannot replay "
                         f"(inconsistent timestamps across ranks or threads?)")
    del out_ptr, out_dst, out_cross, indeg
    lv = np.frombuffer(level, dtype=np.int32)
    n_levels = int(lv.max()) + 1 if n else 0
    jg.sched = _schedule(jg, lv, np.frombuffer(order, dtype=np.int64), np.frombuffer(chain_id, dtype=np.int64), chain)
    # a few numpy calls per level against ~0.3 us of Python per node and edge
    vec = n_levels * 40e-6 + (n + len(jg.src)) * 0.05e-6
    py = n * 0.25e-6 + len(jg.src) * 0.2e-6
    jg.use_engine("levels" if vec < py else "nodes")


def _schedule(jg: JobGraph, level: np.ndarray, topo: np.ndarray, chain_id: np.ndarray, chain: np.ndarray) -> Schedule:
    """The level engine's static plan (see :class:`Schedule`); index columns are int32."""
    n = len(jg.kind)
    topo_pos = np.empty(n, dtype=np.int32)
    topo_pos[topo] = np.arange(n, dtype=np.int32)
    order = np.lexsort((topo_pos, chain_id, level)).astype(np.int32)
    del topo_pos
    pos = np.empty(n, dtype=np.int32)
    pos[order] = np.arange(n, dtype=np.int32)
    ce_node = np.full(n, -1, dtype=np.int64)
    ci = np.flatnonzero(chain)
    ce_node[jg.dst[ci]] = ci
    same = chain & (level[jg.src] == level[jg.dst])
    chain_edge = np.where((ce_node >= 0) & same[np.maximum(ce_node, 0)], ce_node, -1)[order].astype(np.int32)
    del ce_node
    x = np.flatnonzero(~same).astype(np.int32)
    x = x[np.argsort(pos[jg.dst[x]], kind="stable")]
    x_lv = level[jg.dst[x]]
    n_levels = int(level.max()) + 1 if n else 0
    level_ptr = np.searchsorted(level[order], np.arange(n_levels + 1))
    x_ptr = np.searchsorted(x_lv, np.arange(n_levels + 1))
    dpos = pos[jg.dst[x]]
    x_first: list[np.ndarray] = []
    x_dst: list[np.ndarray] = []
    for lv in range(n_levels):
        d = dpos[x_ptr[lv]:x_ptr[lv + 1]] - level_ptr[lv]
        firsts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]]) if len(d) else np.empty(0, dtype=np.int64)
        x_first.append(firsts)
        x_dst.append(d[firsts])
    static = chain_edge < 0
    return Schedule(order=order, pos=pos, level_ptr=level_ptr, chain_edge=chain_edge, static_start=static,
                    x_edge=x, x_src=pos[jg.src[x]], x_ptr=x_ptr, x_first=x_first, x_dst=x_dst, has_chain=~static,
                    seg=np.cumsum(static).astype(np.float64),
                    first=np.maximum.accumulate(np.where(static, np.arange(n, dtype=np.int32), 0)),
                    release=jg.release[order], measured=jg.start[order])


def _in_edges(jg: JobGraph) -> None:
    """The in-edge CSR the node engine walks (int32)."""
    n = len(jg.kind)
    jg.in_idx = np.argsort(jg.dst, kind="stable").astype(np.int32)
    jg.in_ptr = np.concatenate([[0], np.cumsum(np.bincount(jg.dst, minlength=n))]).astype(np.int64)
