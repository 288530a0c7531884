"""The ``lagom`` and ``centauri`` what-ifs: the deciders' choices applied to the replay graph.

Each decider proposes *units* of change - Lagom a retuned NCCL configuration per overlap group,
Centauri a partition per exposed collective - from its own model, through its public entry
points (:func:`ccoverlap.deciders.lagom.tune.lagom_tune`,
:func:`ccoverlap.deciders.centauri.rules.operation_level`). A unit the decider's own model does
not find faster than the given configuration is not proposed. The replay then keeps the given
configuration unless a choice replays faster (:func:`keep_faster`): all units together if that
is faster, else the units that each replay faster, added one by one while the step keeps
getting shorter. So these what-ifs never report a slowdown; the note says what was kept and
why the rest was not (a collective the change slows is waited on, for example).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from ccoverlap.catalog.hardware import ClusterSpec
from ccoverlap.deciders.centauri.rules import operation_level
from ccoverlap.deciders.lagom.profiler import SimulatedProfiler
from ccoverlap.deciders.lagom.space import nccl_default_configs
from ccoverlap.deciders.lagom.tune import lagom_tune
from ccoverlap.errors import ConfigError
from ccoverlap.nccl.groups import Computation, OverlapCollective, OverlapGroup
from ccoverlap.predict.evaluate import cost_model_for_cluster
from ccoverlap.replayer.graph import E_COLL, GPU
from ccoverlap.replayer.job import JobGraph
from ccoverlap.replayer.whatif import Edit, base_edit, gpu_rows, group_ranks_of, spans_nodes, world_size
from ccoverlap.sim.timeline import merge_intervals
from ccoverlap.specs import COLLECTIVES, Collective, CollectiveSpec, GroupSpec
from ccoverlap.trace.classify import RankTrace
from ccoverlap.trace.contention import covered_length


@dataclass
class Unit:
    """One decider choice: a label and a function that applies it to an :class:`Edit` in place."""

    label: str
    apply: Callable[[Edit], None]


def keep_faster(jg: JobGraph, name: str, units: list[Unit], step_time: Callable[[Edit], float],
                base_s: float, *, rel_tol: float = 1e-9) -> tuple[Edit, list[str], list[str]]:
    """The edit with the units that replay faster than the given configuration (see the module
    docstring); returns (edit, kept labels, rejected labels). ``step_time`` replays an edit."""
    def build(chosen: list[Unit]) -> Edit:
        e = base_edit(jg, name)
        for u in chosen:
            u.apply(e)
        return e

    tol = rel_tol * max(base_s, 1e-12)
    if not units:
        return build([]), [], []
    everything = build(units)
    if step_time(everything) < base_s - tol:
        return everything, [u.label for u in units], []
    if len(units) == 1:
        return build([]), [], [units[0].label]
    alone = sorted(((step_time(build([u])), i) for i, u in enumerate(units)))
    chosen: list[Unit] = []
    best = base_s
    for s, i in alone:
        if s >= base_s - tol:
            break
        trial = chosen + [units[i]]
        st = s if not chosen else step_time(build(trial))
        if st < best - tol:
            chosen, best = trial, st
    kept = {u.label for u in chosen}
    return build(chosen), [u.label for u in chosen], [u.label for u in units if u.label not in kept]


# ----------------------------------------------------------------------------- Lagom

def lagom_ratios(collective: str, nbytes: float, group_size: int, nodes: int, compute_s: float,
                 cluster: ClusterSpec) -> tuple[float, float, float] | None:
    """Lagom (lagom §3.4, :func:`ccoverlap.deciders.lagom.tune.lagom_tune`) on the overlap group
    "this collective beside ``compute_s`` seconds of computation" under the cost model.

    Returns ``(comm ratio, compute ratio, makespan ratio)``: the collective's, the computation's
    and the group's times with Lagom's configuration / with NCCL's defaults (the configuration
    the measured job ran, assumed), or None when the group cannot be built (unknown size, a
    collective the cost model does not have, ranks not spread evenly over ``nodes``)."""

    if collective not in COLLECTIVES or nbytes <= 0 or group_size < 2 or compute_s <= 0 or group_size % nodes:
        return None
    try:
        cl = cluster.with_nodes(nodes) if nodes > 1 else cluster
        spec = CollectiveSpec(collective=cast(Collective, collective), bytes=nbytes,     # in COLLECTIVES
                              group=GroupSpec(name="replay", size=group_size, local_size=group_size // nodes))
        group = OverlapGroup(name="replay", computations=(Computation(name="overlapped compute",
                                                                      duration_s=compute_s),),
                             collectives=(OverlapCollective(name="c", spec=spec),), cluster=cl)
        prof = SimulatedProfiler(group, cost_model_for_cluster(cl))
        defaults = nccl_default_configs(group)
        base = prof.profile(defaults)
        tuned = lagom_tune(group, prof, start=defaults).result
    except (ConfigError, ValueError, ZeroDivisionError):
        return None
    if base.comm_times_s[0] <= 0 or base.compute_time_s <= 0 or base.makespan_s <= 0:
        return None
    return (tuned.comm_times_s[0] / base.comm_times_s[0], tuned.compute_time_s / base.compute_time_s,
            tuned.makespan_s / base.makespan_s)


#: An overlap group's key: (collective, bytes, group size, process group).
_GroupKey = tuple[str, float, int, str]
#: Its members: (comm node, compute nodes that ran >= half beside it, the rank's trace).
_Member = tuple[int, np.ndarray, RankTrace]


def overlap_groups(jg: JobGraph, t: np.ndarray) -> dict[_GroupKey, list[_Member]]:
    """Per (collective, bytes, group size): [(comm node, compute nodes that ran >= half beside it)]."""
    start, end = jg.intervals(t)
    groups: dict[_GroupKey, list[_Member]] = {}
    for nodes, rt in gpu_rows(jg):
        kind = rt.timeline.kind
        comp = nodes[kind == "compute"]
        cs, ce = start[comp], end[comp]
        cd = ce - cs
        for i in np.flatnonzero(kind == "comm"):
            v = int(nodes[i])
            ov = np.clip(np.minimum(ce, end[v]) - np.maximum(cs, start[v]), 0, None)
            beside = comp[(cd > 0) & (ov >= 0.5 * cd)]
            if len(beside):
                key = (str(rt.timeline.collective[i]), float(rt.timeline.bytes[i]), int(rt.group_size[i]),
                       str(rt.timeline.group[i]))
                groups.setdefault(key, []).append((v, beside, rt))
    return groups


def lagom_units(jg: JobGraph, t: np.ndarray, cluster: ClusterSpec, *,
                max_groups: int = 6) -> tuple[list[Unit], list[str]]:
    """One unit per overlap group (the ``max_groups`` with the most communication time) whose
    Lagom configuration is faster than NCCL's defaults in Lagom's own model; notes on the rest."""
    start, end = jg.intervals(t)
    coll_of = {m: (ci, j) for ci, c in enumerate(jg.collectives) for j, m in enumerate(c.members)}
    groups = overlap_groups(jg, t)
    world, gpn = world_size(jg), cluster.gpus_per_node
    units: list[Unit] = []
    notes: list[str] = []
    for key in sorted(groups, key=lambda k: -sum(float(end[v] - start[v]) for v, _, _ in groups[k]))[:max_groups]:
        coll, nbytes, gs, grp = key
        v0, beside0, rt0 = max(groups[key], key=lambda x: float(end[x[0]] - start[x[0]]))
        ranks = group_ranks_of(rt0, grp)
        span = spans_nodes(ranks, gs, world, gpn)
        nodes = (len({r // gpn for r in ranks}) if ranks else -(-gs // gpn)) if span else 1
        r = lagom_ratios(coll, nbytes, gs, nodes, float(np.sum(jg.dur[beside0])), cluster)
        label = f"{coll} {nbytes / 2**20:.1f} MiB x{gs}"
        if r is None:
            notes.append(f"{label}: not tunable in the cost model")
            continue
        rx, ry, rz = r
        if rz >= 1.0 - 1e-9:
            notes.append(f"{label}: Lagom keeps NCCL's defaults (nothing faster in its model)")
            continue
        units.append(Unit(f"{label}: comm x{rx:.2f}, compute x{ry:.2f}",
                          _lagom_apply(jg, groups[key], coll_of, rx, ry)))
    return units, notes


def _lagom_apply(jg: JobGraph, members: list[_Member], coll_of: dict[int, tuple[int, int]], rx: float,
                 ry: float) -> Callable[[Edit], None]:
    """Scale the group's collectives by ``rx`` and the compute beside them by ``ry`` (a kernel
    beside collectives of two groups keeps the first group's ratio)."""
    def apply(e: Edit) -> None:
        done = e.marks.setdefault("lagom compute", set())
        for v, beside, _ in members:
            fresh = np.array([b for b in beside.tolist() if b not in done], dtype=np.int64)
            done.update(fresh.tolist())
            e.dur[fresh] = jg.dur[fresh] * ry
            if v in coll_of:
                ci, j = coll_of[v]
                xs = list(e.xfer.get(ci, jg.collectives[ci].xfer))
                xs[j] = jg.collectives[ci].xfer[j] * rx
                e.xfer[ci] = xs
            else:
                e.dur[v] = jg.dur[v] * rx
    return apply


# ----------------------------------------------------------------------------- Centauri

def exposed_ops(jg: JobGraph, t: np.ndarray) -> list[tuple[float, float, int]]:
    """(exposed s, covered s, global node) of every communication op, most exposed first: the
    part of it no compute of its rank covers, and the part that is covered."""
    start, end = jg.intervals(t)
    out: list[tuple[float, float, int]] = []
    for nodes, rt in gpu_rows(jg):
        kind = rt.timeline.kind
        comm = nodes[kind == "comm"]
        if not len(comm):
            continue
        comp = nodes[kind == "compute"]
        cs, ce = merge_intervals(start[comp], end[comp])
        cov = covered_length(cs, ce, start[comm], end[comm])
        for v, x, c in zip(comm.tolist(), (end[comm] - start[comm] - cov).tolist(), cov.tolist()):
            out.append((x, c, v))
    out.sort(reverse=True)
    return out


def centauri_units(jg: JobGraph, t: np.ndarray, *, top: int = 8) -> tuple[list[Unit], list[str]]:
    """One unit per exposed collective (the ``top`` most exposed) that Centauri's Algorithm 1
    (:func:`ccoverlap.deciders.centauri.rules.operation_level`) partitions: its transfer cut into
    the chunks the rule chooses, pipelined with the GPU ops that consume it."""

    coll_of = {m: ci for ci, c in enumerate(jg.collectives) for m in c.members}
    units: list[Unit] = []
    notes: list[str] = []
    seen: set[int | None] = set()
    for x, covered, v in exposed_ops(jg, t):
        if len(units) + len(notes) >= top or x <= 0:
            break
        ci = coll_of.get(v)
        if ci is not None and ci in seen:
            continue
        seen.add(ci)
        pairs = _consumers(jg, v, ci)
        if not pairs:
            continue
        xfer = max(jg.collectives[ci].xfer) if ci is not None else float(jg.dur[v])
        consumer = max(float(jg.dur[d]) for _, d, _ in pairs)
        plan = operation_level(comp_cost=consumer, comm_cost=xfer, cost_inter=0.0, cost_intra=0.0, inter_size=1,
                               intra_size=1, in_cost=covered, group_partitioned=False)
        label = f"{jg.ranks[jg.rank_of(v)].rt.timeline.collective[v - jg.offset[jg.rank_of(v)]]} " \
                f"({x * 1e3:.3f} ms exposed)"
        if plan.num_chunks <= 1:
            notes.append(f"{label}: {plan.reason}")
            continue
        units.append(Unit(f"{label} in {plan.num_chunks} chunks", _centauri_apply(jg, v, ci, pairs, plan.num_chunks)))
    return units, notes


def _consumers(jg: JobGraph, v: int, ci: int | None) -> list[tuple[int, int, int]]:
    """(edge, consumer GPU op, member) of every GPU op that waits for the end of op ``v``'s call."""
    c = jg.collectives[ci] if ci is not None else None
    ends = list(zip(c.ends, c.members)) if c is not None else [(v, v)]
    out: list[tuple[int, int, int]] = []
    for endn, member in ends:
        for e in np.flatnonzero(jg.src == endn).tolist():
            d = int(jg.dst[e])
            if jg.kind[d] == GPU and d != member and jg.ekind[e] != E_COLL:
                out.append((e, d, member))
    return out


def _centauri_apply(jg: JobGraph, v: int, ci: int | None, pairs: list[tuple[int, int, int]],
                    k: int) -> Callable[[Edit], None]:
    """Chunked transfer (each extra chunk one launch latency) and consumers that may start after
    the first chunk and end no earlier than 1/k of their time after the last (Centauri §3.1)."""
    def apply(e: Edit) -> None:
        for edge, d, member in pairs:
            lat = float(jg.ranks[jg.rank_of(member)].inferred.get("launch_latency_us", 0.0)) * 1e-6
            if ci is not None:
                c = jg.collectives[ci]
                j = c.members.index(member)
                xf = c.xfer[j]
                xs = list(e.xfer.get(ci, c.xfer))
                xs[j] = xf + (k - 1) * lat
                e.xfer[ci] = xs
            else:
                xf = float(jg.dur[member])
                e.dur[member] = xf + (k - 1) * lat
            cdur = float(jg.dur[d])
            gain = max(-xf * (k - 1) / k, -cdur * (k - 1) / k + (k - 1) * lat)
            e.w[edge] = jg.w[edge] + gain
    return apply
