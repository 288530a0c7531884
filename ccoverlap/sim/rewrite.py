"""Rewriting a built :class:`~ccoverlap.sim.graph.OpGraph`: split ops into pieces, add or drop
dependencies, reorder a stream. The deciders use it to express partitions and schedules that
the step builders' knobs cannot (Centauri §3.1 partitions, §3.2 orders; FiCCO schedules), and
the step builder to fetch ZeRO-3 parameters one tensor at a time (:mod:`ccoverlap.parallel.zero3`).

A rewrite never edits the source graph; :meth:`GraphRewrite.build` returns a new graph whose
ops are issued in an order where every dependency precedes its dependents and every stream
runs its ops in the requested order (a Kahn merge of the per-stream sequences). An old op's
*completion* in the new graph is the completion of all its pieces, so a dependent that is not
told otherwise waits for every piece.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ccoverlap.errors import ConfigError
from ccoverlap.sim.graph import Op, OpGraph, gc_paused
from ccoverlap.specs import Spec

__all__ = ["Piece", "GraphRewrite"]


@dataclass(frozen=True, kw_only=True)
class Piece:
    """One op replacing (part of) an old op.

    ``stream``: its stream (None: the old op's). ``inherit_deps``: depend on the old op's
    dependencies. ``after``: indices of earlier pieces of the same replacement it waits for.
    ``on``: ``(old op id, piece index)`` pairs of *other* replaced ops it waits for (piece
    index -1: all pieces of that op). ``duration_s`` as :class:`~ccoverlap.sim.graph.Op`.
    """

    name: str
    spec: Spec | None
    stream: str | None = None
    inherit_deps: bool = True
    after: tuple[int, ...] = ()
    on: tuple[tuple[int, int], ...] = ()
    duration_s: float | None = None


@dataclass
class GraphRewrite:
    """Edits to apply to ``src`` (ids are the source graph's op ids)."""

    src: OpGraph
    pieces: dict[int, list[Piece]] = field(default_factory=dict)
    extra_deps: dict[int, set[int]] = field(default_factory=dict)
    dropped_deps: set[tuple[int, int]] = field(default_factory=set)
    #: (consumer, producer) -> piece indices of the replaced producer the consumer waits for
    dep_pieces: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    #: (rank, stream) -> old op ids in the order the stream must run them (a permutation of them)
    stream_order: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    # edits -----------------------------------------------------------------------------
    def replace(self, op_id: int, pieces: Iterable[Piece]) -> None:
        """Replace op ``op_id`` by ``pieces`` (issued in place, in the given order)."""
        ps = list(pieces)
        if not ps:
            raise ConfigError(f"op {op_id}: a replacement needs at least one piece")
        self.pieces[op_id] = ps

    def add_dep(self, consumer: int, producer: int) -> None:
        """Make ``consumer`` wait for ``producer`` (both source ids)."""
        self.extra_deps.setdefault(consumer, set()).add(producer)

    def drop_dep(self, consumer: int, producer: int) -> None:
        """``consumer`` no longer waits for ``producer`` (both source ids)."""
        self.dropped_deps.add((consumer, producer))

    def wait_for_pieces(self, consumer: int, producer: int, indices: Iterable[int]) -> None:
        """``consumer`` waits only for the listed pieces of the replaced ``producer``."""
        self.dep_pieces[(consumer, producer)] = tuple(indices)

    def reorder(self, rank: int, stream: str, order: list[int]) -> None:
        """Run the ops of ``(rank, stream)`` in ``order`` (must list each of them exactly once)."""
        self.stream_order[(rank, stream)] = list(order)

    # build -----------------------------------------------------------------------------
    def build(self) -> OpGraph:
        """The rewritten graph. Raises ConfigError if the requested orders and dependencies
        cannot all hold (a cycle)."""
        with gc_paused():  # 10^5 new records, no cycles: as the step builder does
            return self._build()

    def _build(self) -> OpGraph:
        src = self.src
        ops = src.ops
        n = len(ops)
        # stream sequences (source ids), with replacement pieces counted on their own streams
        seqs: dict[tuple[int, str], list[int]] = {}
        for op in ops:
            seqs.setdefault((op.rank, op.stream), []).append(op.op_id)
        for key, order in self.stream_order.items():
            have = seqs.get(key, [])
            if sorted(have) != sorted(order):
                raise ConfigError(f"reorder of rank {key[0]} stream {key[1]!r} must list exactly its {len(have)} ops")
            seqs[key] = list(order)
        # ops no edit touches keep their dependency tuple and are emitted on a fast path
        touched = set(self.pieces) | set(self.extra_deps)
        touched.update(c for c, _ in self.dropped_deps)
        touched.update(c for c, _ in self.dep_pieces)
        deps = [self._deps(op) if op.op_id in touched else op.deps for op in ops]
        out = OpGraph()
        out.meta = dict(src.meta)
        out.meta.update(self.meta)
        # new ids per old op (each entry is replaced when its op is emitted, before it is read)
        new_ids: list[list[int]] = [[]] * n
        heads = {k: 0 for k in seqs}
        emitted = [False] * n
        pending = n
        keys = list(seqs)
        append = out.append_op
        while pending:
            progressed = False
            for key in keys:
                seq = seqs[key]
                h = heads[key]
                while h < len(seq):
                    oid = seq[h]
                    ds = deps[oid]
                    if not all(map(emitted.__getitem__, ds)):
                        break
                    op = ops[oid]
                    if oid in touched or op.duration_s is not None:
                        self._emit(out, op, ds, new_ids)
                    else:  # untouched: the new ids of its dependencies, sorted without repeats
                        if len(ds) == 1:
                            nd = tuple(new_ids[ds[0]])  # type: ignore[index]  # untouched: ds is op.deps, a tuple
                        else:
                            acc: list[int] = []
                            for d in ds:
                                acc.extend(new_ids[d])
                            nd = tuple(sorted(set(acc)))
                        new_ids[oid] = [append(op.name, op.spec, op.rank, op.stream, nd, op.layer,
                                               op.microbatch, op.phase)]
                    emitted[oid] = True
                    h += 1
                    pending -= 1
                    progressed = True
                heads[key] = h
            if not progressed:
                stuck = next(ops[seqs[k][heads[k]]] for k in keys if heads[k] < len(seqs[k]))
                raise ConfigError(f"graph rewrite: op {stuck.name!r} can never be issued (the requested "
                                  f"stream order contradicts a dependency)")
        return out

    def _deps(self, op: Op) -> set[int]:
        d = {x for x in op.deps if (op.op_id, x) not in self.dropped_deps}
        d |= self.extra_deps.get(op.op_id, set())
        for p in self.pieces.get(op.op_id, []):
            d |= {src for src, _ in p.on}
        d.discard(op.op_id)
        return d

    def _map_dep(self, consumer: int, producer: int, new_ids: list[list[int]]) -> list[int]:
        ids = new_ids[producer]
        idx = self.dep_pieces.get((consumer, producer))
        if idx is None:
            return ids
        return [ids[i] for i in idx]

    def _emit(self, out: OpGraph, op: Op, deps: Iterable[int], new_ids: list[list[int]]) -> None:
        inherited: list[int] = []
        extra = self.extra_deps.get(op.op_id, set())
        for d in sorted(deps):
            if d in extra or (d in op.deps and (op.op_id, d) not in self.dropped_deps):
                inherited.extend(self._map_dep(op.op_id, d, new_ids))
        label: dict[str, Any] = dict(layer=op.layer, microbatch=op.microbatch, phase=op.phase, rank=op.rank)
        pieces = self.pieces.get(op.op_id)
        if pieces is None:
            new_ids[op.op_id] = [out.add(op.name, op.spec, stream=op.stream, deps=inherited,
                                         duration_s=op.duration_s, **label)]
            return
        made: list[int] = []
        for p in pieces:
            pd: list[int] = list(inherited) if p.inherit_deps else []
            pd.extend(made[i] for i in p.after)
            for src_id, idx in p.on:
                ids = new_ids[src_id]
                pd.extend(ids if idx < 0 else [ids[idx]])
            if p.duration_s is None:  # ids of ops already emitted: clean once sorted
                made.append(out.append_op(p.name, p.spec, op.rank, p.stream or op.stream, tuple(sorted(set(pd))),
                                          op.layer, op.microbatch, op.phase))
            else:
                made.append(out.add(p.name, p.spec, stream=p.stream or op.stream, deps=pd,
                                    duration_s=p.duration_s, **label))
        new_ids[op.op_id] = made
