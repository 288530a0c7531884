"""Join the ranks' graphs (collectives matched across ranks) and replay them.

The replay is a longest-path pass over the dependency DAG in topological order: a node
starts at ``max(release, max over in-edges of t[src] (+ dur[src]) + w)``. No resource is
shared beyond what the edges say (a stream is a chain of edges), so with the measured
durations the unedited graph gives back the measured times (the fidelity check), and a
what-if is an edit of ``dur`` / ``w`` / ``on`` (edge enabled) / ``xfer`` (collective transfer
times) re-run through :meth:`JobGraph.run`. This is the replay-specific event loop the
project's simulator (:mod:`ccoverlap.sim.engine`, cost-model durations, one shared schedule per
rank) does not offer; its output is the project's :class:`~ccoverlap.sim.timeline.Timeline`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ccoverlap.errors import TraceError
from ccoverlap.replay.graph import BARRIER, CEND, RankGraph
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
    order: list[int] = field(default_factory=list)
    in_ptr: np.ndarray | None = None
    in_idx: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)

    def run(self, *, dur=None, w=None, on=None, xfer: dict | None = None, extra=None) -> np.ndarray:
        """Start time (s) of every node under the given edits (defaults: as measured).

        ``xfer``: ``{collective index: [transfer time per member]}`` replaces the measured
        transfer times of those collectives (barrier -> end edges); ``extra``: ``(src, dst, w)``
        lists of added start-to-start edges (each must follow an existing path, so the order holds).
        """
        dur = self.dur if dur is None else dur
        w = self.w.copy() if w is None else w.copy()
        if xfer:
            for ci, xs in xfer.items():
                c = self.collectives[ci]
                for e_node, x in zip(c.ends, xs):
                    w[self._bar_edge[e_node]] = x
        on = np.ones(len(w), dtype=bool) if on is None else on
        # per-edge contribution precomputed where possible: t[src] + (dur[src] if from_end) + w
        add = (w + np.where(self.from_end, dur[self.src], 0.0)).tolist()
        onl = on.tolist()
        srcl = self.src.tolist()
        ptr = self.in_ptr.tolist()
        idx = self.in_idx.tolist()
        rel = self.release.tolist()
        t = [0.0] * len(rel)
        more: dict = {}
        if extra:
            for a, b, x in zip(*extra):
                more.setdefault(int(b), []).append((int(a), float(x)))
        for v in self.order:
            best = rel[v]
            if v in more:
                for a, x in more[v]:
                    if t[a] + x > best:
                        best = t[a] + x
            for q in range(ptr[v], ptr[v + 1]):
                e = idx[q]
                if onl[e]:
                    x = t[srcl[e]] + add[e]
                    if x > best:
                        best = x
            if best == -np.inf:      # every constraint removed by an edit: keep the measured start
                best = self.start[v]
            t[v] = best
        return np.asarray(t)

    def intervals(self, t: np.ndarray, dur=None) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of every node from :meth:`run`'s times (an end node's time is the end)."""
        dur = self.dur if dur is None else dur
        en = self.end_node
        end = np.where(en == np.arange(len(t)), t + dur, t[en])
        return t, end


def _match_collectives(ranks: list[RankGraph], offset: list[int], *, tol_s: float = 1e-3,
                       tol_frac: float = 0.02) -> list[tuple]:
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
    out = []
    for grp, by_rank in per_group.items():
        calls, _ = pair_calls(tls, by_rank, by_order=False, tol_s=tol_s, tol_frac=tol_frac)
        out.extend((grp, seq, members) for seq, members in enumerate(calls))
    return out


def join(ranks: list[RankGraph], *, match: bool = True) -> JobGraph:
    """One :class:`JobGraph` from the ranks' graphs, with collectives matched across ranks.

    If matching by call order closes a cycle (ranks issued one group's collectives in orders
    that cannot all hold - a mismatched pairing), the ranks are joined again without matching
    (each collective keeps its measured duration) and a note says so.
    """
    offset = []
    kind, dur, start, release = [], [], [], []
    src, dst, w, fe, ek, wn = [], [], [], [], [], []
    base = 0
    for g in ranks:
        offset.append(base)
        kind += g.kind; dur += g.dur; start += g.start
        release += [-np.inf if r is None else r for r in g.release]
        src += [s + base for s in g.src]; dst += [d + base for d in g.dst]
        w += g.w; fe += g.from_end; ek += g.ekind; wn += g.w_nom
        base += len(g.kind)
    n_nodes = base
    end_node = list(range(n_nodes))
    colls: list[Collective] = []
    notes = []
    matched = _match_collectives(ranks, offset) if match else []
    if matched:
        paired = {(ri, row) for _, _, mem in matched for ri, row in mem}
        in_groups = {grp for grp, _, _ in matched}
        alone = sum(1 for ri, g in enumerate(ranks) for row in np.flatnonzero(
            (g.rt.timeline.kind == "comm") & np.isin(g.rt.timeline.group, list(in_groups)))
            if (ri, int(row)) not in paired)
        if alone:
            notes.append(f"{alone} communication op(s) have no partner on the other ranks (same process group and "
                         f"type, ends within 1 ms + 2%: cut off by the profiling window, dropped by sampling, or "
                         f"clocks apart) - replayed with their measured durations")
    bar_edge: dict[int, int] = {}
    remap: dict[int, int] = {}
    for grp, seq, members in matched:
        nodes = [offset[ri] + row for ri, row in members]
        starts = [start[v] for v in nodes]
        ends = [start[v] + dur[v] for v in nodes]
        latest = max(starts)
        if min(ends) < latest - 1e-6:
            # a member finished before another one started: clocks apart or not the same call
            notes.append(f"{grp}#{seq}")
            continue
        b = len(kind)
        kind.append(BARRIER); dur.append(0.0); start.append(latest); release.append(-np.inf)
        for v in nodes:
            src.append(v); dst.append(b); w.append(0.0); fe.append(False); ek.append("coll")
        cends, xfers = [], []
        for v, e in zip(nodes, ends):
            c = len(kind)
            x = max(e - latest, 0.0)
            kind.append(CEND); dur.append(0.0); start.append(e); release.append(-np.inf)
            bar_edge[c] = len(src)
            src.append(b); dst.append(c); w.append(x); fe.append(False); ek.append("coll")
            # the op's own end still bounds it (start + 0): never before its start
            src.append(v); dst.append(c); w.append(0.0); fe.append(False); ek.append("coll")
            cends.append(c); xfers.append(x)
            remap[v] = c
            end_node.append(c)
        for v, c in zip(nodes, cends):
            end_node[v] = c
        ri0, row0 = members[0]
        tl0 = ranks[ri0].rt.timeline
        colls.append(Collective(group=grp, seq=seq, collective=str(tl0.collective[row0]), members=nodes,
                                ranks=[ranks[ri].rank for ri, _ in members], barrier=b, ends=cends, xfer=xfers,
                                bytes=float(tl0.bytes[row0]),
                                group_size=int(ranks[ri0].rt.group_size[row0])))
    # edges that leave a matched collective's end now leave its end node
    if remap:
        for i in range(len(src)):
            if fe[i] and src[i] in remap and ek[i] != "coll":
                src[i] = remap[src[i]]
                fe[i] = False
    wn += w[len(wn):]
    if len(end_node) < len(kind):
        end_node += list(range(len(end_node), len(kind)))
    jg = JobGraph(ranks=ranks, offset=offset, kind=np.asarray(kind), dur=np.asarray(dur, dtype=float),
                  start=np.asarray(start, dtype=float), release=np.asarray(release, dtype=float),
                  src=np.asarray(src, dtype=np.int64), dst=np.asarray(dst, dtype=np.int64),
                  w=np.asarray(w, dtype=float), w_nom=np.asarray(wn, dtype=float), from_end=np.asarray(fe, dtype=bool), ekind=np.asarray(ek),
                  collectives=colls, end_node=np.asarray(end_node, dtype=np.int64), notes=notes)
    jg._bar_edge = bar_edge
    try:
        _topo(jg)
    except TraceError:
        if not colls:
            raise
        jg = join(ranks, match=False)
        jg.notes.append(f"matching {len(colls)} collective(s) across ranks by call order made the dependency "
                        f"graph cyclic; replayed without cross-rank matching")
    return jg


def _topo(jg: JobGraph) -> None:
    """Kahn's order over the DAG; in-edge CSR for :meth:`JobGraph.run`."""
    n = len(jg.kind)
    order_e = np.argsort(jg.dst, kind="stable")
    counts = np.bincount(jg.dst, minlength=n)
    jg.in_ptr = np.concatenate([[0], np.cumsum(counts)])
    jg.in_idx = order_e
    out_order = np.argsort(jg.src, kind="stable")
    out_counts = np.bincount(jg.src, minlength=n)
    out_ptr = np.concatenate([[0], np.cumsum(out_counts)]).tolist()
    out_dst = jg.dst[out_order].tolist()
    indeg = counts.tolist()
    # seed in measured-start order so ties resolve like the trace
    roots = [v for v in np.argsort(jg.start, kind="stable").tolist() if indeg[v] == 0]
    q = deque(roots)
    order = []
    while q:
        v = q.popleft()
        order.append(v)
        for i in range(out_ptr[v], out_ptr[v + 1]):
            d = out_dst[i]
            indeg[d] -= 1
            if indeg[d] == 0:
                q.append(d)
    if len(order) != n:
        raise TraceError(f"the dependency graph has a cycle through {n - len(order)} node(s) - cannot replay "
                         f"(inconsistent timestamps across ranks or threads?)")
    jg.order = order
