"""What-ifs: each one an edit of the replay graph, re-run by :meth:`JobGraph.run`.

An edit is ``(dur, w, on, xfer, note)`` for :meth:`~ccoverlap.replayer.job.JobGraph.run`.
Those that remove or shorten work (``no-comm``, ``comm-hidden``, ``no-contention``,
``copy-engine``, ``network-<F>x`` with F >= 1) only lower durations and weights or drop edges,
so no node can start later (max-plus); ``network-<F>x`` with F < 1 only raises them.

* ``no-comm`` - the bound: every communication op takes 0 s (matched collectives' transfer
  times 0, and nobody waits for a peer);
* ``comm-hidden`` - communication perfectly hidden: collectives still run (same durations),
  but nothing except the next communication op waits for one;
* ``no-contention`` - compute kernels that ran overlapped with communication (>= half their
  time) take their measured alone duration: the median of the same kernel name and launch
  shape run with no communication beside it (>= 3 alone samples, >= 10 µs), the pairs
  ``analyze``'s contention section compares (Lagom §3.2, FiCCO §IV-D); never longer than measured;
* ``copy-engine`` - FiCCO §IV-B: every non-reducing intra-node collective (all-gather,
  all-to-all, broadcast, send/recv) that the cost model times faster on copy engines (DMA)
  than on SMs (:func:`ccoverlap.cost.comm.collective_profile`) runs at that DMA/SM ratio, and
  the compute kernels beside it lose their contention (as ``no-contention``); the others stay;
* ``network-<F>x`` - the inter-node network ``F`` times faster (``F`` < 1: slower): every
  collective whose group spans nodes (:func:`spans_nodes`: the group's ranks from the trace's
  ``distributedInfo``, else its size, the world size and the cluster's GPUs per node) at
  ``1 / F`` of its transfer time (bandwidth-bound); with a cluster named, at the cost model's
  time with ``F`` x the cluster's inter-node bandwidth / with its own (hierarchical algorithms
  keep their intra-node part; latency stays), ``1 / F`` where the model cannot time it;
* ``lagom`` and ``centauri`` - the deciders' choices, built in :mod:`.decide`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from ccoverlap.catalog.hardware import ClusterSpec
from ccoverlap.config import short
from ccoverlap.cost.comm import collective_profile
from ccoverlap.errors import ConfigError
from ccoverlap.replayer.graph import E_COLL
from ccoverlap.replayer.job import JobGraph
from ccoverlap.sim.timeline import merge_intervals
from ccoverlap.specs import COLLECTIVES, Collective, CollectiveSpec, GroupSpec
from ccoverlap.trace.classify import RankTrace
from ccoverlap.trace.contention import covered_length

DEFAULT_WHATIFS = ("no-comm", "comm-hidden", "no-contention", "copy-engine", "lagom", "centauri", "network-2x",
                   "network-0.5x")
NET = re.compile(r"^network-([0-9]*\.?[0-9]+)x$")


@dataclass
class Edit:
    """A graph edit: arrays for :meth:`JobGraph.run` (node durations, edge weights, edges
    enabled, collectives' transfer times per member) and a note on what changed."""

    name: str
    dur: np.ndarray
    w: np.ndarray
    on: np.ndarray
    xfer: dict[int, list[float]]
    note: str
    marks: dict[str, set[Any]] = field(default_factory=dict)    # what composed changes already touched

    def run(self, jg: JobGraph) -> np.ndarray:
        """Node start times under this edit (s)."""
        return jg.run(dur=self.dur, w=self.w, on=self.on, xfer=self.xfer)


def check_names(names: list[str]) -> list[str]:
    """Validate what-if names (ConfigError naming the bad one); ``all`` expands, ``none`` is dropped."""
    out: list[str] = []
    for n in names:
        if n == "all":
            out.extend(DEFAULT_WHATIFS)
            continue
        if n not in DEFAULT_WHATIFS and not NET.match(n) and n != "none":
            raise ConfigError(f"--whatif: unknown what-if {short(n)}; choose from {', '.join(DEFAULT_WHATIFS)}, "
                              f"network-<F>x, all, none")
        m = NET.match(n)
        if m and float(m.group(1)) <= 0:
            raise ConfigError(f"--whatif {n}: the network factor must be > 0")
        if n != "none":
            out.append(n)
    return list(dict.fromkeys(out))


def base_edit(jg: JobGraph, name: str) -> Edit:
    """The unedited graph as an :class:`Edit` (copies, ready to change)."""
    return Edit(name, jg.dur.copy(), jg.w.copy(), np.ones(len(jg.w), dtype=bool), {}, "")


#: ``factor_of(collective, bytes, group_size, group, rank trace)`` of :func:`scale_comm`: the
#: factor a communication op's time is scaled by, or None to leave it.
FactorOf = Callable[[str, float, int, str, RankTrace], "float | None"]


def gpu_rows(jg: JobGraph) -> Iterator[tuple[np.ndarray, RankTrace]]:
    """Per rank: (global node ids of its GPU rows, its RankTrace)."""
    for off, g in zip(jg.offset, jg.ranks):
        yield np.arange(off, off + g.n_gpu), g.rt


def comm_nodes(jg: JobGraph) -> np.ndarray:
    """Global node ids of every communication op."""
    out = [nodes[rt.timeline.kind == "comm"] for nodes, rt in gpu_rows(jg)]
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def no_comm(jg: JobGraph) -> Edit:
    """Every communication op 0 s long, no cross-rank waiting (the bound)."""
    e = base_edit(jg, "no-comm")
    comm = comm_nodes(jg)
    e.dur[comm] = 0.0
    e.xfer = {i: [0.0] * len(c.ends) for i, c in enumerate(jg.collectives)}
    for c in jg.collectives:       # nobody waits for the latest member: each end follows its own start
        e.on[c.bar_edges] = False
    e.note = f"{len(comm)} communication op(s) set to 0 s"
    return e


def comm_hidden(jg: JobGraph) -> Edit:
    """Collectives run as measured, but nothing except the next communication op waits for them."""
    e = base_edit(jg, "comm-hidden")
    is_comm = np.zeros(len(jg.kind), dtype=bool)
    is_comm[comm_nodes(jg)] = True
    is_end = np.zeros(len(jg.kind), dtype=bool)
    for c in jg.collectives:
        is_end[c.ends] = True
        is_end[c.barrier] = True
    cut = (is_comm | is_end)[jg.src] & ~(is_comm | is_end)[jg.dst] & (jg.ekind != E_COLL)
    e.on[cut] = False
    e.note = f"{int(cut.sum())} dependency edge(s) on communication removed"
    return e


def contention_samples(rt: RankTrace, beside: np.ndarray, overlapped_fraction: float = 0.5
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per compute leaf row of ``rt``: (rows, key (name, launch shape), duration, ran alone,
    ran >= ``overlapped_fraction`` beside the communication rows ``beside``) - the rule of
    ``analyze``'s contention section."""
    tl = rt.timeline
    all_comm = tl.kind == "comm"
    comp = np.flatnonzero((tl.kind == "compute") & rt.leaf)
    a, b = tl.start_s[comp], tl.end_s[comp]
    d = b - a
    cs, ce = merge_intervals(tl.start_s[all_comm], tl.end_s[all_comm])
    alone = (covered_length(cs, ce, a, b) == 0) & (d > 0)
    bs, be = merge_intervals(tl.start_s[beside], tl.end_s[beside])
    cov = covered_length(bs, be, a, b)
    over = (cov >= overlapped_fraction * d) & (d > 0)
    keys = (rt.name_id[comp].astype(np.int64) << 32) ^ (rt.shape[comp].astype(np.int64) & 0xFFFFFFFF)
    return comp, keys, d, alone, over


def alone_durations(jg: JobGraph, beside: Mapping[int, Sequence[int]] | None = None, min_samples: int = 3,
                    min_alone_s: float = 10e-6) -> tuple[np.ndarray, np.ndarray]:
    """(global GPU nodes, alone duration) of compute ops overlapped >= 50 % with communication
    (``beside``: per rank, only those communication rows) whose (name, launch shape) also ran
    alone >= ``min_samples`` times; never longer than the measured duration."""
    nodes_out: list[np.ndarray] = []
    alone_out: list[np.ndarray] = []
    for nodes, rt in gpu_rows(jg):
        comm = np.flatnonzero(rt.timeline.kind == "comm") if beside is None else beside.get(rt.rank, [])
        comp, keys, d, alone, over = contention_samples(rt, np.asarray(comm, dtype=np.int64))
        med: dict[int, float] = {}
        for k in np.unique(keys[alone]):
            x = d[alone & (keys == k)]
            if len(x) >= min_samples and np.median(x) >= min_alone_s:
                med[int(k)] = float(np.median(x))
        sel = [i for i in np.flatnonzero(over) if int(keys[i]) in med]
        nodes_out.append(nodes[comp[sel]])
        alone_out.append(np.array([min(d[i], med[int(keys[i])]) for i in sel]))
    if not nodes_out:
        return np.empty(0, dtype=np.int64), np.empty(0)
    return np.concatenate(nodes_out).astype(np.int64), np.concatenate(alone_out)


def no_contention(jg: JobGraph, beside: Mapping[int, Sequence[int]] | None = None,
                  name: str = "no-contention") -> Edit:
    """Overlapped compute kernels at their measured alone durations."""
    e = base_edit(jg, name)
    nodes, alone = alone_durations(jg, beside)
    saved = float(np.sum(e.dur[nodes] - alone)) if len(nodes) else 0.0
    e.dur[nodes] = np.minimum(e.dur[nodes], alone)
    e.note = (f"{len(nodes)} overlapped compute kernel(s) at their alone duration ({saved * 1e3:.3f} ms of "
              f"kernel time less)" if len(nodes) else
              "no compute kernel ran both alone and overlapped >= 3 times: nothing to remove")
    return e


def scale_comm(jg: JobGraph, e: Edit, factor_of: FactorOf) -> list[int]:
    """Scale each communication op (matched: its members' transfer times, solo: its duration)
    by ``factor_of(collective, bytes, group_size, group, rank)`` (None: unchanged). Returns the
    global nodes of the ops changed."""
    changed: list[int] = []
    in_coll: set[int] = set()
    for ci, c in enumerate(jg.collectives):
        in_coll.update(c.members)
        g0 = jg.ranks[jg.rank_of(c.members[0])].rt
        row0 = c.members[0] - jg.offset[jg.rank_of(c.members[0])]
        f = factor_of(c.collective, c.bytes, c.group_size, str(g0.timeline.group[row0]), g0)
        if f is None:
            continue
        e.xfer[ci] = [x * f for x in e.xfer.get(ci, c.xfer)]
        changed.extend(c.members)
    for nodes, rt in gpu_rows(jg):
        tl = rt.timeline
        for i in np.flatnonzero(tl.kind == "comm"):
            v = int(nodes[i])
            if v in in_coll:
                continue
            f = factor_of(str(tl.collective[i]), float(tl.bytes[i]), int(rt.group_size[i]), str(tl.group[i]), rt)
            if f is not None:
                e.dur[v] = e.dur[v] * f
                changed.append(v)
    return changed


def spans_nodes(group_ranks: object, group_size: int, world: int, gpus_per_node: int) -> bool | None:
    """Whether a process group spans more than one node: from its global ranks when the trace
    lists them (ranks ``r`` and ``s`` share a node when ``r // gpus_per_node == s //
    gpus_per_node``, the usual placement), else True when it has more GPUs than a node, False
    when the whole job fits one node, None when the trace cannot tell (a group of at most one
    node's GPUs in a larger job, ranks not listed)."""
    if isinstance(group_ranks, (list, tuple)) and group_ranks and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in group_ranks):
        return len({r // gpus_per_node for r in group_ranks}) > 1
    if group_size > gpus_per_node:
        return True
    if 0 < world <= gpus_per_node:
        return False
    return None


def group_ranks_of(rt: RankTrace, group: str) -> Any:
    """The global ranks of process group ``group`` from the trace's ``distributedInfo`` (or None; as
    written in the trace, so unchecked: :func:`spans_nodes` checks them)."""
    entry = (rt.meta.get("pg_config") or {}).get(group)
    return entry.get("ranks") if isinstance(entry, dict) else None


def world_size(jg: JobGraph) -> int:
    """The job's world size: the largest ``distributedInfo.world_size``, at least the ranks loaded."""
    ws = [int(g.rt.meta.get("world_size") or 0) for g in jg.ranks]
    return max(ws + [len(jg.ranks)])


def network_ratio(collective: str, nbytes: float, group_size: int, nodes: int, factor: float,
                  cluster: ClusterSpec) -> float | None:
    """Cost-model time of one collective over ``nodes`` nodes with the inter-node bandwidth
    times ``factor`` / with the cluster's own (:func:`ccoverlap.cost.comm.collective_profile`:
    hierarchical algorithms keep their intra-node part, latency terms stay); None when the
    model cannot time it (unknown type or size, ranks not spread evenly over the nodes)."""

    if collective not in COLLECTIVES or nbytes <= 0 or nodes < 2 or group_size % nodes:
        return None
    try:
        base = cluster.with_nodes(nodes)
        fast = replace(base, inter=replace(base.inter, bandwidth_bytes_per_s=base.inter.bandwidth_bytes_per_s * factor))
        spec = CollectiveSpec(collective=cast(Collective, collective), bytes=nbytes,     # in COLLECTIVES
                              group=GroupSpec(name="replay", size=group_size, local_size=group_size // nodes))
        t0 = collective_profile(spec, base).time_s
        t1 = collective_profile(spec, fast).time_s
    except (ConfigError, TypeError, ValueError, ZeroDivisionError):
        return None
    return t1 / t0 if t0 > 0 else None


def network(jg: JobGraph, factor: float, cluster: ClusterSpec, *, model: bool = False,
            cluster_note: str = "") -> Edit:
    """Inter-node collectives' transfer times scaled for an inter-node bandwidth ``factor`` times
    the measured one: by ``1 / factor`` (bandwidth-bound: the measured time says how fast the
    network was, the trace does not name it), or with ``model`` by the cost model's time ratio
    on ``cluster`` (:func:`network_ratio`). Which groups span nodes: :func:`spans_nodes` with
    the cluster's GPUs per node."""
    if factor <= 0:
        raise ConfigError(f"network factor must be > 0, got {factor}")
    gpn = cluster.gpus_per_node
    world = world_size(jg)
    e = base_edit(jg, f"network-{factor:g}x")
    how = {"model": 0, "1/F": 0, "unknown": 0}
    cache: dict[tuple[str, float, int, int], float | None] = {}

    def f(coll: str, b: float, gs: int, group: str, rt: RankTrace) -> float | None:
        ranks = group_ranks_of(rt, group)
        span = spans_nodes(ranks, gs, world, gpn)
        if span is None:
            how["unknown"] += 1
        if not span:
            return None
        nodes = len({r // gpn for r in ranks}) if ranks else -(-gs // gpn)
        key = (coll, b, gs, nodes)
        if key not in cache:
            cache[key] = network_ratio(coll, b, gs, nodes, factor, cluster) if model else None
        r = cache[key]
        how["model" if r is not None else "1/F"] += 1
        return r if r is not None else 1.0 / factor

    n = len(scale_comm(jg, e, f))
    if n:
        parts = [f"{n} inter-node collective op(s) with {factor:g}x inter-node bandwidth"
                 + (f": {how['model']} at the {cluster.name} cost model's time ratio, {how['1/F']} at 1/{factor:g}"
                    if model else f" at 1/{factor:g} of their transfer time (bandwidth-bound)")]
    else:
        parts = [f"no collective spans nodes ({world} rank(s), {gpn} GPUs per node): nothing changes"]
    if how["unknown"]:
        parts.append(f"{how['unknown']} op(s) of groups of <= {gpn} GPUs whose ranks the trace does not list "
                     f"assumed within one node")
    if cluster_note:
        parts.append(cluster_note)
    e.note = "; ".join(parts)
    return e


_NON_REDUCING = ("all_gather", "all_to_all", "broadcast", "send", "recv", "p2p")


def dma_ratio(collective: str, nbytes: float, group_size: int, cluster: ClusterSpec) -> float | None:
    """Cost model DMA (copy-engine) time / SM (NCCL) time of one intra-node collective, or None
    when it cannot run on copy engines (reductions, inter-node groups, unknown size)."""

    # a non-reducing collective (checked below): every one of them is in COLLECTIVES
    coll = cast(Collective, {"send": "all_to_all", "recv": "all_to_all", "p2p": "all_to_all"}.get(collective, collective))
    if collective not in _NON_REDUCING or nbytes <= 0 or group_size < 2 or group_size > cluster.gpus_per_node:
        return None
    grp = GroupSpec(name="replay", size=group_size, local_size=group_size)
    try:
        sm = collective_profile(CollectiveSpec(collective=coll, bytes=nbytes, group=grp), cluster).time_s
        dma = collective_profile(CollectiveSpec(collective=coll, bytes=nbytes, group=grp, transport="dma"),
                                 cluster).time_s
    except (ConfigError, TypeError, ValueError):
        return None
    return dma / sm if sm > 0 else None


def copy_engine(jg: JobGraph, cluster: ClusterSpec, cluster_note: str = "") -> Edit:
    """Non-reducing intra-node collectives that run faster on copy engines moved there, and the
    compute beside them without contention (see the module docstring)."""
    world = world_size(jg)
    gpn = cluster.gpus_per_node
    e = base_edit(jg, "copy-engine")
    slower: list[float] = []

    def f(coll: str, b: float, gs: int, group: str, rt: RankTrace) -> float | None:
        if spans_nodes(group_ranks_of(rt, group), gs, world, gpn):
            return None
        r = dma_ratio(coll, b, gs, cluster)
        if r is not None and r >= 1.0:
            slower.append(r)
        return r if r is not None and r < 1.0 else None

    moved = scale_comm(jg, e, f)
    beside: dict[int, list[int]] = {}
    for v in moved:
        gi = jg.rank_of(v)
        beside.setdefault(jg.ranks[gi].rank, []).append(v - jg.offset[gi])
    if beside:
        c = no_contention(jg, beside)
        e.dur = np.minimum(e.dur, c.dur)
        note_c = c.note
    else:
        note_c = "no compute beside them to relieve"
    e.note = (f"{len(moved)} collective op(s) moved to copy engines ({cluster.name} cost model); {note_c}"
              + (f"; {len(slower)} kept on SMs (slower on copy engines)" if slower else "")
              + (f"; {cluster_note}" if cluster_note else ""))
    return e
