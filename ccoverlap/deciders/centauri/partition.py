"""Centauri's partitions and orders as rewrites of a built step graph (Chen et al., ASPLOS '24).

What the step builders' knobs cannot say is expressed here on the
:class:`~ccoverlap.sim.graph.OpGraph` they build (:mod:`ccoverlap.sim.rewrite`):

* :func:`partition_allgathers` — §3.1.2 group partition and §3.1.3 workload partition of the
  FSDP forward weight all-gathers: each all-gather becomes the sub-collectives of
  :func:`~ccoverlap.deciders.centauri.rules.allgather_pieces` (even chunks, or inter-/intra-node
  sub-groups in either order), and its dependent computation chain (the unit's forward) is
  partitioned to match: every GEMM waits only for the piece holding its weight, a GEMM whose
  weight straddles two pieces is split along its output dimension (an "other dimension",
  OD, of Table 3, so no extra reduction).
* :func:`defer_reduce_scatters` — §3.2.3 cross-phase priority: at a micro-batch boundary the
  gradient reduce-scatters of the backward's last units wait for the next forward's first
  weight all-gathers (which its computation waits for) instead of sharing the links with them,
  and overlap that forward instead.
* :func:`backward_weight_first` — §3.2.2 order T2: in every backward unit, each weight-gradient
  GEMM runs before its activation-gradient GEMM and no longer waits for it, so weight
  gradients overlap the weight re-gather and the activation gradients overlap the gradient
  reduce-scatter (Fig. 6 c).

Op identification relies on the builders' names and labels (:mod:`ccoverlap.parallel`):
FSDP gathers are ``fsdp_ag_*`` on stream ``fsdp_ag`` with the unit's layer / micro-batch /
phase labels; backward GEMMs are ``<weight>_dgrad[i]`` and ``<weight>_wgrad``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ccoverlap.deciders.centauri.rules import OperationPlan, allgather_pieces
from ccoverlap.parallel.units import tensor_of
from ccoverlap.sim.graph import Op, OpGraph
from ccoverlap.sim.rewrite import GraphRewrite, Piece
from ccoverlap.specs import COMM, CollectiveSpec, GemmSpec

__all__ = [
    "fsdp_forward_allgathers",
    "consumer_chain",
    "partition_allgathers",
    "backward_units",
    "backward_weight_first",
    "defer_reduce_scatters",
    "weight_key",
]

def weight_key(name: str) -> str | None:
    """The weight tensor a GEMM op uses, from its builder name (``mlp_fc2_dgrad1`` -> ``fc2``,
    ``qkv0`` -> ``qkv``), or None for a GEMM without a weight (the attention's batched GEMMs):
    :func:`ccoverlap.parallel.units.tensor_of`."""
    return tensor_of(name)


def dependents_of(graph: OpGraph) -> list[list[int]]:
    """Per op id, the ids of the ops that depend on it (the reverse of ``deps``)."""
    out: list[list[int]] = [[] for _ in graph.ops]
    for op in graph.ops:
        for d in op.deps:
            out[d].append(op.op_id)
    return out


class _StreamSeqs(dict[tuple[int, str], list[int]]):
    """(rank, stream) -> op ids in stream order, with :meth:`position` (an op's index in its
    stream) from an index built on first use instead of a linear search per call."""

    _where: dict[int, int] | None = None

    def position(self, op_id: int) -> int:
        if self._where is None:
            self._where = {oid: i for seq in self.values() for i, oid in enumerate(seq)}
        return self._where[op_id]


def stream_sequences(graph: OpGraph) -> dict[tuple[int, str], list[int]]:
    """Per (rank, stream), its op ids in issue order."""
    seqs: dict[tuple[int, str], list[int]] = _StreamSeqs()
    for op in graph.ops:
        seqs.setdefault((op.rank, op.stream), []).append(op.op_id)
    return seqs


def fsdp_forward_allgathers(graph: OpGraph) -> list[int]:
    """Ids of the FSDP parameter all-gathers that feed a forward unit (``fsdp_ag_*``, phase fwd)."""
    return [op.op_id for op in graph.ops
            if op.name.startswith("fsdp_ag") and op.phase == "fwd" and isinstance(op.spec, CollectiveSpec)]


def consumer_chain(graph: OpGraph, ag_id: int, dependents: list[list[int]] | None = None,
                   seqs: dict[tuple[int, str], list[int]] | None = None) -> list[int]:
    """The dependent computation chain of a collective (§3.1.3): the first compute op that waits
    for it, and the ops after it on the same stream with the same layer / micro-batch / phase
    labels (the rest of the unit's execution), in stream order. Empty if nothing waits on it."""
    dependents = dependents if dependents is not None else dependents_of(graph)
    seqs = seqs if seqs is not None else stream_sequences(graph)
    cons = [graph.ops[i] for i in dependents[ag_id] if graph.ops[i].kind != COMM]
    if not cons:
        return []
    first = min(cons, key=lambda o: o.op_id)
    seq = seqs[(first.rank, first.stream)]
    pos = seqs.position(first.op_id) if isinstance(seqs, _StreamSeqs) else seq.index(first.op_id)
    label = (first.layer, first.microbatch, first.phase)
    chain = []
    for oid in seq[pos:]:
        o = graph.ops[oid]
        if (o.layer, o.microbatch, o.phase) != label:
            break
        chain.append(oid)
    return chain


@dataclass(frozen=True)
class _Weight:
    key: str
    start: float  # cumulative fraction of the chain's weight bytes before this weight
    end: float


def _chain_weights(graph: OpGraph, chain: list[int]) -> dict[str, _Weight]:
    """Weights the chain's GEMMs read, in first-use order, as fractions of their total size
    (a forward GEMM [T,k]x[k,n] reads a k x n weight; a dgrad reads the same one)."""
    sizes: dict[str, float] = {}
    for oid in chain:
        op = graph.ops[oid]
        spec = op.spec
        if not isinstance(spec, GemmSpec) or op.name.endswith("_wgrad"):
            continue
        key = weight_key(op.name)
        if key is not None:
            sizes.setdefault(key, float(spec.n) * spec.k)
    total = sum(sizes.values())
    out: dict[str, _Weight] = {}
    if total <= 0:
        return out
    acc = 0.0
    for k, v in sizes.items():
        out[k] = _Weight(k, acc / total, (acc + v) / total)
        acc += v
    return out


def _unlock_points(fractions: list[float]) -> list[tuple[float, int]]:
    """(cumulative fraction available, piece index) after each piece that unlocks data."""
    pts, acc = [], 0.0
    for i, f in enumerate(fractions):
        acc += f
        if f > 0:
            pts.append((acc, i))
    return pts


def _piece_for(frac: float, pts: list[tuple[float, int]]) -> int:
    for acc, i in pts:
        if acc >= frac - 1e-9:
            return i
    return pts[-1][1]


def partition_allgathers(rw: GraphRewrite, ags: list[int], plan_for: Callable[[Op], OperationPlan],
                         *, split_gemms: bool = True) -> int:
    """Partition each all-gather in ``ags`` (source ids in ``rw.src``) and its consumer chain as
    ``plan_for(op)`` says (Centauri §3.1.2-§3.1.3, §3.2.1). Returns how many were partitioned
    (plans with one chunk and no group order leave the op alone)."""
    g = rw.src
    deps = dependents_of(g)
    seqs = stream_sequences(g)
    done = 0
    for a in ags:
        op = g.ops[a]
        plan = plan_for(op)
        if plan.num_chunks <= 1 and plan.order in ("none", "even"):
            continue
        chain = consumer_chain(g, a, deps, seqs)
        if not chain:
            continue
        weights = _chain_weights(g, chain)
        if not weights:  # nothing in the chain reads a known part of the weights (embedding): keep whole
            continue
        assert isinstance(op.spec, CollectiveSpec)  # ags are all-gathers
        pieces = allgather_pieces(op.spec, plan)
        rw.replace(a, [Piece(name=f"{op.name}.{'ABCDEFGH'[i] if i < 8 else i}", spec=s) for i, (s, _) in
                       enumerate(pieces)])
        pts = _unlock_points([f for _, f in pieces])
        first_piece = pts[0][1]
        for oid in chain:
            c = g.ops[oid]
            need = first_piece
            key = weight_key(c.name) if isinstance(c.spec, GemmSpec) else None
            w = weights.get(key) if key is not None else None
            if w is not None:
                need = _piece_for(w.end, pts)
                lo = _piece_for(w.start + 1e-9, pts)
                if split_gemms and lo != need and c.phase == "fwd" and not c.name.endswith("_wgrad"):
                    _split_gemm(rw, c, a, w, pts)
                    continue
            if a in c.deps:
                rw.wait_for_pieces(oid, a, (need,))
            elif need != first_piece:
                rw.add_dep(oid, a)
                rw.wait_for_pieces(oid, a, (need,))
        done += 1
    return done


def _split_gemm(rw: GraphRewrite, op: Op, ag: int, w: _Weight, pts: list[tuple[float, int]]) -> None:
    """Split GEMM ``op`` along its output columns at the piece boundaries inside its weight."""
    spec = op.spec
    assert isinstance(spec, GemmSpec)  # called for GEMMs only
    bounds = [w.start] + [acc for acc, _ in pts if w.start + 1e-9 < acc < w.end - 1e-9] + [w.end]
    span = w.end - w.start
    pieces: list[Piece] = []
    given = 0
    for j in range(len(bounds) - 1):
        last = j == len(bounds) - 2
        n = spec.n - given if last else max(1, round(spec.n * (bounds[j + 1] - bounds[j]) / span))
        n = max(1, min(n, spec.n - given - (len(bounds) - 2 - j)))
        given += n
        idx = _piece_for(bounds[j + 1], pts)
        pieces.append(Piece(name=f"{op.name}.{j}", spec=GemmSpec(m=spec.m, n=n, k=spec.k, batch=spec.batch,
                                                                   dtype_bytes=spec.dtype_bytes),
                            on=((ag, idx),)))
    if ag in op.deps:
        rw.drop_dep(op.op_id, ag)
    rw.replace(op.op_id, pieces)


def backward_units(graph: OpGraph, stream: str = "compute") -> dict[tuple[int, int, int], list[int]]:
    """Backward unit executions on ``stream``: ``(rank, layer, micro-batch) -> op ids`` in stream
    order (contiguous runs with phase ``bwd``)."""
    out: dict[tuple[int, int, int], list[int]] = {}
    for op in graph.ops:
        if op.stream == stream and op.phase == "bwd":
            out.setdefault((op.rank, op.layer, op.microbatch), []).append(op.op_id)
    return out


def backward_weight_first(rw: GraphRewrite, stream: str = "compute") -> int:
    """Centauri §3.2.2 order T2 on every backward unit of ``rw.src``: each ``*_wgrad`` GEMM
    moves right before the first ``*_dgrad`` of the same weight and waits only for what that
    dgrad's input needed (its communication dependencies, e.g. the SP all-gather of dY), not for
    the dgrad. Returns the number of weight-gradient GEMMs moved."""
    g = rw.src
    seqs = stream_sequences(g)
    moved = 0
    for (rank, strm), seq in seqs.items():
        if strm != stream:
            continue
        # the dgrads of each (weight, layer, micro-batch), in stream order (one pass, not a scan
        # of the stream's prefix per wgrad)
        dgrads_of: dict[tuple, list[int]] = {}
        for oid in seq:
            op = g.ops[oid]
            if "_dgrad" in op.name:
                key = weight_key(op.name)
                if key is not None:
                    dgrads_of.setdefault((key, op.layer, op.microbatch), []).append(oid)
        pos = {oid: i for i, oid in enumerate(seq)}
        before: dict[int, list[int]] = {}  # dgrad -> the wgrads moved right before it, in order
        for oid in seq:
            op = g.ops[oid]
            if op.phase != "bwd" or not op.name.endswith("_wgrad") or not isinstance(op.spec, GemmSpec):
                continue
            key = weight_key(op.name)
            dgrads = [i for i in dgrads_of.get((key, op.layer, op.microbatch), ()) if pos[i] < pos[oid]] \
                if key is not None else []
            if not dgrads:
                continue
            first = dgrads[0]
            for d in op.deps:
                if d in dgrads:
                    rw.drop_dep(oid, d)
            for dg in dgrads:
                for d in g.ops[dg].deps:
                    if g.ops[d].kind == COMM and d not in op.deps:
                        rw.add_dep(oid, d)
            before.setdefault(first, []).append(oid)
            moved += 1
        if before:
            moving = {oid for ws in before.values() for oid in ws}
            new: list[int] = []
            for oid in seq:
                if oid in moving:
                    continue
                new.extend(before.get(oid, ()))
                new.append(oid)
            if new != seq:
                rw.reorder(rank, strm, new)
    return moved


def defer_reduce_scatters(rw: GraphRewrite, units: int) -> int:
    """Centauri §3.2.3 (overlap across phases) for FSDP: for every backward of micro-batch ``b``
    followed by a forward of ``b+1`` on the same rank, the reduce-scatters (``fsdp_rs_*``) of the
    last ``units`` backward units wait for the all-gathers of the first ``units`` forward units
    of ``b+1``. Returns the number of reduce-scatters deferred."""
    g = rw.src
    rs: dict[tuple[int, int], list[Op]] = {}
    ag: dict[tuple[int, int], list[Op]] = {}
    for op in g.ops:
        if op.name.startswith("fsdp_rs") and op.phase == "bwd":
            rs.setdefault((op.rank, op.microbatch), []).append(op)
        elif op.name.startswith("fsdp_ag") and op.phase == "fwd":
            ag.setdefault((op.rank, op.microbatch), []).append(op)
    moved = 0
    for (rank, mb), ops in rs.items():
        nxt = ag.get((rank, mb + 1))
        if not nxt:
            continue
        firsts = nxt[:units]
        for r in ops[-units:]:
            for a in firsts:
                rw.add_dep(r.op_id, a.op_id)
            moved += 1
    return moved
