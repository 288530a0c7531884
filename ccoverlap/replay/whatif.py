"""What-ifs: each one an edit of the replay graph, re-run by :meth:`JobGraph.run`.

An edit returns ``(dur, w, on, xfer, note)`` for :meth:`~ccoverlap.replay.engine.JobGraph.run`:

* ``no-comm`` - the bound: every communication op takes 0 s (matched collectives' transfer
  times 0, and nobody waits for a peer);
* ``comm-hidden`` - communication perfectly hidden: collectives still run (same durations),
  but no compute, memcpy or CPU call waits for one (their out-edges to anything but the next
  communication op of the same stream are removed);
* ``no-contention`` - compute kernels that ran overlapped with communication (>= half their
  time) take their measured alone duration: the median of the same kernel name and launch
  shape run with no communication beside it (>= 3 alone samples, >= 10 µs), exactly the
  pairs ``analyze``'s contention section compares (Lagom §3.2, FiCCO §IV-D);
* ``copy-engine`` - communication on copy engines (FiCCO §IV-B): no SM contention (as
  ``no-contention``) and every non-reducing intra-node collective (all-gather, all-to-all,
  broadcast, send/recv) scaled by the cost model's DMA time / SM (NCCL) time for its size and
  group (:func:`ccoverlap.cost.comm.collective_profile`); reductions stay on SMs;
* ``centauri`` - Centauri's workload partitioning (Centauri §4.2) of the ``top`` most exposed
  collectives into ``k`` chunks pipelined with the op that consumes them: the consumer may
  start after the first chunk (``x / k`` after the collective starts) and ends no earlier
  than ``c / k`` after the collective ends (``c`` its duration); each extra chunk costs one
  launch latency of the rank;
* ``network-<F>x`` - the inter-node network ``F`` times faster (``F`` < 1: slower): the
  transfer time of every collective whose group spans nodes (group size > 8, or the named
  cluster's GPUs per node) divided by ``F`` (bandwidth-bound); with ``--cluster`` named, scaled
  instead by the cost model's time with ``F`` x that cluster's inter-node bandwidth / its time
  with the cluster's own (hierarchical algorithms keep their intra-node part, latencies and
  per-channel limits stay), ``1 / F`` where the model cannot time it (unknown size or type).

* ``lagom`` - NCCL resources (channels, threads, chunk, protocol, algorithm) retuned by Lagom
  (lagom §3.4) for the overlap groups found in the trace (a collective and the compute that
  ran >= half beside it); the collective's transfer time and those compute kernels' durations
  are scaled by the cost model's ratio of the tuned to the default configuration (the trace
  does not say which configuration ran: NCCL's defaults are assumed). The compute is one
  duration-only computation (:func:`ccoverlap.deciders.overlap_group.equivalent_spec`: a GEMM of
  that isolated duration), as the trace records no GEMM shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ccoverlap.errors import ConfigError
from ccoverlap.replay.engine import JobGraph
from ccoverlap.replay.graph import GPU

DEFAULT_WHATIFS = ("no-comm", "comm-hidden", "no-contention", "copy-engine", "lagom", "centauri", "network-2x",
                   "network-0.5x")
_NET = re.compile(r"^network-([0-9]*\.?[0-9]+)x$")


@dataclass
class Edit:
    """A graph edit: arrays for :meth:`JobGraph.run` and a note on what changed."""

    name: str
    dur: np.ndarray
    w: np.ndarray
    on: np.ndarray
    xfer: dict
    note: str
    extra: tuple | None = None

    def run(self, jg: JobGraph) -> np.ndarray:
        """Node start times under this edit (s)."""
        return jg.run(dur=self.dur, w=self.w, on=self.on, xfer=self.xfer, extra=self.extra)


def check_names(names: list[str]) -> list[str]:
    """Validate ``--whatif`` names (ConfigError naming the bad one)."""
    out = []
    for n in names:
        if n == "all":
            out.extend(DEFAULT_WHATIFS)
            continue
        if n not in DEFAULT_WHATIFS and not _NET.match(n) and n not in ("none",):
            raise ConfigError(f"--whatif: unknown what-if {n!r}; choose from {', '.join(DEFAULT_WHATIFS)}, "
                              f"network-<F>x, all, none")
        if n != "none":
            out.append(n)
    return list(dict.fromkeys(out))


def _gpu_rows(jg: JobGraph):
    """Per rank: (global node ids of its GPU rows, its timeline)."""
    for gi, g in enumerate(jg.ranks):
        off = jg.offset[gi]
        yield np.arange(off, off + g.n_gpu), g.rt


def _comm_nodes(jg: JobGraph) -> np.ndarray:
    out = [nodes[rt.timeline.kind == "comm"] for nodes, rt in _gpu_rows(jg)]
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def _base(jg: JobGraph, name: str) -> Edit:
    return Edit(name, jg.dur.copy(), jg.w.copy(), np.ones(len(jg.w), dtype=bool), {}, "")


def no_comm(jg: JobGraph) -> Edit:
    """Every communication op 0 s long, no cross-rank waiting (the bound)."""
    e = _base(jg, "no-comm")
    e.dur[_comm_nodes(jg)] = 0.0
    e.xfer = {i: [0.0] * len(c.ends) for i, c in enumerate(jg.collectives)}
    # nobody waits for the latest member either: each end follows only its own start
    bar = np.isin(jg.src, [c.barrier for c in jg.collectives])
    e.on[bar & np.isin(jg.dst, [x for c in jg.collectives for x in c.ends])] = False
    e.note = f"{len(_comm_nodes(jg))} communication op(s) set to 0 s"
    return e


def comm_hidden(jg: JobGraph) -> Edit:
    """Collectives run as measured, but nothing except the next communication op waits for them."""
    e = _base(jg, "comm-hidden")
    comm = _comm_nodes(jg)
    is_comm = np.zeros(len(jg.kind), dtype=bool)
    is_comm[comm] = True
    ends = [x for c in jg.collectives for x in c.ends]
    is_src = is_comm.copy()
    is_src[ends] = True
    dst_comm = is_comm[jg.dst] | np.isin(jg.dst, ends) | np.isin(jg.dst, [c.barrier for c in jg.collectives])
    cut = is_src[jg.src] & ~dst_comm & (jg.ekind != "launch")
    e.on[cut] = False
    e.note = f"{int(cut.sum())} dependency edge(s) on communication removed"
    return e


def alone_durations(jg: JobGraph, min_samples: int = 3, min_alone_s: float = 10e-6) -> tuple[np.ndarray, np.ndarray]:
    """(global GPU nodes, alone duration) of compute ops overlapped >= 50 % with communication
    whose (name, launch shape) also ran alone >= ``min_samples`` times (analyze's contention rule)."""
    from ccoverlap.trace.contention import _samples

    keys_all, d_all, alone_all, over_all, node_all = [], [], [], [], []
    for nodes, rt in _gpu_rows(jg):
        mask = np.ones(len(rt.timeline), dtype=bool)
        keys, d, alone, over = _samples(rt, mask, 0.5)
        comp = np.flatnonzero(mask & (rt.timeline.kind == "compute") & rt.leaf)
        keys_all.append(keys); d_all.append(d); alone_all.append(alone); over_all.append(over)
        node_all.append(nodes[comp])
    if not keys_all:
        return np.empty(0, dtype=np.int64), np.empty(0)
    keys = np.concatenate(keys_all); d = np.concatenate(d_all)
    alone = np.concatenate(alone_all); over = np.concatenate(over_all); nodes = np.concatenate(node_all)
    med: dict = {}
    if alone.any():
        ka, da = keys[alone], d[alone]
        for k in np.unique(ka):
            x = da[ka == k]
            if len(x) >= min_samples and np.median(x) >= min_alone_s:
                med[k] = float(np.median(x))
    sel = [i for i in np.flatnonzero(over) if keys[i] in med]
    return nodes[sel], np.array([min(d[i], med[keys[i]]) for i in sel])


def no_contention(jg: JobGraph) -> Edit:
    """Overlapped compute kernels at their measured alone durations."""
    e = _base(jg, "no-contention")
    nodes, alone = alone_durations(jg)
    saved = float(np.sum(e.dur[nodes] - alone)) if len(nodes) else 0.0
    e.dur[nodes] = alone
    e.note = (f"{len(nodes)} overlapped compute kernel(s) at their alone duration ({saved * 1e3:.3f} ms of "
              f"kernel time less)" if len(nodes) else
              "no compute kernel ran both alone and overlapped >= 3 times: nothing to remove")
    return e


def _scale_comm(jg: JobGraph, e: Edit, factor_of) -> int:
    """Scale each communication op (solo: its duration; matched: its transfer times) by
    ``factor_of(collective, bytes, group_size)`` (None: unchanged). Returns how many changed."""
    changed = 0
    in_coll = set()
    for ci, c in enumerate(jg.collectives):
        f = factor_of(c.collective, c.bytes, c.group_size)
        in_coll.update(c.members)
        if f is None:
            continue
        e.xfer[ci] = [x * f for x in c.xfer]
        changed += 1
    for nodes, rt in _gpu_rows(jg):
        tl = rt.timeline
        for i in np.flatnonzero(tl.kind == "comm"):
            v = int(nodes[i])
            if v in in_coll:
                continue
            f = factor_of(str(tl.collective[i]), float(tl.bytes[i]), int(rt.group_size[i]))
            if f is not None:
                e.dur[v] = jg.dur[v] * f
                changed += 1
    return changed


def network_ratio(collective: str, nbytes: float, group_size: int, factor: float, cluster) -> float | None:
    """Cost-model time of one inter-node collective with the inter-node bandwidth times
    ``factor`` / with the cluster's own (:func:`ccoverlap.cost.comm.collective_profile`:
    hierarchical algorithms keep their intra-node part, latency terms stay); None when the
    model cannot time it (unknown type or size, a group that does not tile whole nodes)."""
    from dataclasses import replace

    from ccoverlap.cost.comm import collective_profile
    from ccoverlap.sim.graph import COLLECTIVES, CollectiveSpec, GroupSpec

    gpn = cluster.gpus_per_node
    if collective not in COLLECTIVES or nbytes <= 0 or group_size <= gpn or group_size % gpn:
        return None
    try:
        base = cluster.with_nodes(group_size // gpn)
        fast = replace(base, inter=replace(base.inter, bandwidth_bytes_per_s=base.inter.bandwidth_bytes_per_s * factor))
        spec = CollectiveSpec(collective=collective, bytes=nbytes,
                              group=GroupSpec(name="replay", size=group_size, local_size=gpn))
        t0 = collective_profile(spec, base).time_s
        t1 = collective_profile(spec, fast).time_s
    except (ConfigError, TypeError, ValueError):
        return None
    return t1 / t0 if t0 > 0 else None


def network(jg: JobGraph, factor: float, cluster=None, gpus_per_node: int | None = None) -> Edit:
    """Inter-node collectives' transfer times scaled for an inter-node bandwidth ``factor``
    times the measured one: by the cost model's ratio (:func:`network_ratio`) when ``cluster``
    is given and can time the collective, else by ``1 / factor`` (bandwidth-bound)."""
    if factor <= 0:
        raise ConfigError(f"network factor must be > 0, got {factor}")
    gpn = gpus_per_node or (cluster.gpus_per_node if cluster is not None else 8)
    e = _base(jg, f"network-{factor:g}x")
    how = {"model": 0, "1/F": 0}

    def f(coll, b, gs):
        if gs <= gpn:
            return None
        r = network_ratio(coll, b, gs, factor, cluster) if cluster is not None else None
        how["model" if r is not None else "1/F"] += 1
        return r if r is not None else 1.0 / factor

    n = _scale_comm(jg, e, f)
    src = f"{cluster.name} cost model" if cluster is not None else "no cluster"
    e.note = (f"{n} inter-node collective(s) (group > {gpn} GPUs) with {factor:g}x inter-node bandwidth: "
              f"{how['model']} scaled by the {src}'s time ratio, {how['1/F']} by 1/{factor:g} (size or type unknown)"
              if n else f"no collective spans nodes (every group <= {gpn} GPUs): nothing changes")
    return e


_NON_REDUCING = ("all_gather", "all_to_all", "broadcast", "send", "recv", "p2p")


def dma_ratio(collective: str, nbytes: float, group_size: int, cluster) -> float | None:
    """Cost model DMA (copy-engine) time / SM (NCCL) time of one intra-node collective, or None
    when it cannot run on copy engines (reductions, inter-node groups, unknown size)."""
    from ccoverlap.cost.comm import collective_profile
    from ccoverlap.sim.graph import CollectiveSpec, GroupSpec

    coll = {"send": "all_to_all", "recv": "all_to_all", "p2p": "all_to_all"}.get(collective, collective)
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


def copy_engine(jg: JobGraph, cluster) -> Edit:
    """No SM contention, and non-reducing intra-node collectives at the cost model's DMA/SM ratio."""
    e = no_contention(jg)
    e.name = "copy-engine"
    note_c = e.note
    n = _scale_comm(jg, e, lambda coll, b, gs: dma_ratio(coll, b, gs, cluster))
    e.note = f"{n} collective(s) moved to copy engines ({cluster.name} cost model); {note_c}"
    return e


def _exposed(jg: JobGraph, t: np.ndarray) -> list[tuple[float, int]]:
    """(exposed seconds, global node) of every communication op: the part of it no compute covers."""
    from ccoverlap.sim.timeline import merge_intervals
    from ccoverlap.trace.contention import covered_length

    start, end = jg.intervals(t)
    out = []
    for nodes, rt in _gpu_rows(jg):
        kind = rt.timeline.kind
        comp = nodes[kind == "compute"]
        cs, ce = merge_intervals(start[comp], end[comp])
        comm = nodes[kind == "comm"]
        if not len(comm):
            continue
        cov = covered_length(cs, ce, start[comm], end[comm])
        for v, x in zip(comm.tolist(), (end[comm] - start[comm] - cov).tolist()):
            out.append((x, v))
    out.sort(reverse=True)
    return out


def centauri(jg: JobGraph, t: np.ndarray, *, k: int = 4, top: int = 5) -> Edit:
    """Partition the ``top`` most exposed collectives into ``k`` chunks pipelined with their consumers."""
    e = _base(jg, "centauri")
    done = 0
    coll_of = {m: (ci, j) for ci, c in enumerate(jg.collectives) for j, m in enumerate(c.members)}
    seen = set()
    new_src, new_dst, new_w = [], [], []
    for x, v in _exposed(jg, t):
        if done >= top or x <= 0:
            break
        if v in coll_of:
            ci, j = coll_of[v]
            if ci in seen:
                continue
            seen.add(ci)
            c = jg.collectives[ci]
            pairs = [(c.members[i], c.ends[i], c.barrier, c.xfer[i]) for i in range(len(c.members))]
        else:
            pairs = [(v, v, v, float(jg.dur[v]))]
        for op, endn, startn, xf in pairs:
            lat = _launch_latency(jg, op)
            out_e = np.flatnonzero((jg.src == endn) & e.on & (jg.ekind != "coll"))
            for ei in out_e:
                d = int(jg.dst[ei])
                if jg.kind[d] != GPU:
                    continue
                cdur = float(jg.dur[d])
                e.on[ei] = False
                # consumer after the first chunk, and its last chunk after the collective's end
                new_src += [startn, endn]
                new_dst += [d, d]
                new_w += [xf / k + (k - 1) * lat, -cdur * (k - 1) / k + (k - 1) * lat]
            if op == endn:
                e.dur[op] = jg.dur[op] + (k - 1) * lat
            else:
                ci2 = coll_of[op][0]
                xs = e.xfer.get(ci2, list(jg.collectives[ci2].xfer))
                xs[coll_of[op][1]] = xf + (k - 1) * lat
                e.xfer[ci2] = xs
        done += 1
    e.extra = (new_src, new_dst, new_w)
    e.note = f"{done} most exposed collective(s) split into {k} chunks pipelined with their consumer"
    return e


def _launch_latency(jg: JobGraph, node: int) -> float:
    for gi, g in enumerate(jg.ranks):
        off = jg.offset[gi]
        if off <= node < off + len(g.kind):
            return float(g.inferred.get("launch_latency_us", 0.0)) * 1e-6
    return 0.0


def lagom_ratios(collective: str, nbytes: float, group_size: int, compute_s: float, cluster, cost=None):
    """Lagom (lagom §3.4, :func:`ccoverlap.deciders.lagom.lagom_tune`) on the overlap group
    "this collective beside ``compute_s`` seconds of computation" under the cost model.

    Returns ``(comm ratio, compute ratio, note)``: the collective's and the computation's
    times with Lagom's configuration / with NCCL's defaults (the configuration the measured
    job ran, assumed), or None when the group cannot be built (unknown size, a collective the
    cost model does not have, a group size that does not tile the nodes)."""
    from ccoverlap.cost import CostModel
    from ccoverlap.cost.params import default_params
    from ccoverlap.deciders.lagom import lagom_tune
    from ccoverlap.deciders.nccl_tuning import nccl_default_configs
    from ccoverlap.deciders.overlap_group import Computation, OverlapCollective, OverlapGroup
    from ccoverlap.deciders.profiler import SimulatedProfiler
    from ccoverlap.sim.graph import COLLECTIVES, CollectiveSpec, GroupSpec

    if collective not in COLLECTIVES or nbytes <= 0 or group_size < 2 or compute_s <= 0:
        return None
    gpn = cluster.gpus_per_node
    local = group_size if group_size <= gpn else gpn
    if group_size % local:
        return None
    try:
        cl = cluster.with_nodes(max(1, group_size // local)) if group_size > gpn else cluster
        cost = cost or CostModel(cl, default_params(cl.gpu))
        spec = CollectiveSpec(collective=collective, bytes=nbytes, group=GroupSpec(name="replay", size=group_size,
                                                                                 local_size=local))
        group = OverlapGroup(name="replay", computations=(Computation(name="overlapped compute",
                                                                      duration_s=compute_s),),
                             collectives=(OverlapCollective(name="c", spec=spec),), cluster=cl)
        prof = SimulatedProfiler(group, cost)
        defaults = nccl_default_configs(group)
        base = prof.profile(defaults)
        tuned = lagom_tune(group, prof, start=defaults).result
    except (ConfigError, ValueError, ZeroDivisionError):
        return None
    if base.comm_times_s[0] <= 0 or base.compute_time_s <= 0:
        return None
    return tuned.comm_times_s[0] / base.comm_times_s[0], tuned.compute_time_s / base.compute_time_s


def lagom(jg: JobGraph, t: np.ndarray, cluster, *, max_groups: int = 6) -> Edit:
    """NCCL resources retuned by Lagom for the overlap groups of the trace: each collective with
    the compute kernels that ran >= half beside it; its transfer time and those kernels'
    durations scaled by Lagom's tuned / default ratios from the cost model (one tuning per
    distinct (collective, bytes, group size), the largest ``max_groups``)."""
    e = _base(jg, "lagom")
    start, end = jg.intervals(t)
    coll_of = {m: (ci, j) for ci, c in enumerate(jg.collectives) for j, m in enumerate(c.members)}
    groups: dict[tuple, list] = {}
    for nodes, rt in _gpu_rows(jg):
        kind = rt.timeline.kind
        comp = nodes[kind == "compute"]
        cs, ce = start[comp], end[comp]
        cd = ce - cs
        for i in np.flatnonzero(kind == "comm"):
            v = int(nodes[i])
            a, b = start[v], end[v]
            ov = np.clip(np.minimum(ce, b) - np.maximum(cs, a), 0, None)
            beside = comp[(cd > 0) & (ov >= 0.5 * cd)]
            if not len(beside):
                continue
            key = (str(rt.timeline.collective[i]), float(rt.timeline.bytes[i]), int(rt.group_size[i]))
            groups.setdefault(key, []).append((v, beside))
    tuned = 0
    cache = {}
    for key in sorted(groups, key=lambda k: -sum(float(end[v] - start[v]) for v, _ in groups[k]))[:max_groups]:
        v0, beside0 = max(groups[key], key=lambda x: float(end[x[0]] - start[x[0]]))
        r = lagom_ratios(*key, float(np.sum(jg.dur[beside0])), cluster)
        if r is None:
            continue
        cache[key] = r
        rx, ry = r
        for v, beside in groups[key]:
            e.dur[beside] = e.dur[beside] * ry
            if v in coll_of:
                ci, j = coll_of[v]
                xs = e.xfer.get(ci, list(jg.collectives[ci].xfer))
                xs[j] = jg.collectives[ci].xfer[j] * rx
                e.xfer[ci] = xs
            else:
                e.dur[v] = jg.dur[v] * rx
        tuned += 1
    desc = ", ".join(f"{k[0]} {k[1] / 2**20:.1f} MiB x{k[2]}: comm x{v[0]:.2f}, compute x{v[1]:.2f}"
                     for k, v in cache.items())
    e.note = (f"{tuned} overlap group(s) retuned ({cluster.name} cost model; {desc})" if tuned else
              "no overlap group the cost model can tune (no compute beside a sized collective)")
    return e
