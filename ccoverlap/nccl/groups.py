"""Overlap groups: collectives overlapped with computations, the unit whose NCCL configurations
are tuned together (lagom §3.1).

An overlap group is ``M`` computations serialized on the compute stream and ``N`` collectives
serialized on one communication stream, all issued together, each collective with its own
configuration ``s_j = (algorithm, protocol, NC, NT, C)``. Its makespan is eq. (1),
``Z = max(X, Y)`` with ``Y = sum_i y_i`` and ``X = sum_j x_j^{s_j}``, where every ``y_i``
and ``x_j`` already include the contention between the two streams (eqs. 4-6); the simulator
plays that contention through the cost model, so here a group is only data plus the
:class:`~ccoverlap.sim.graph.OpGraph` that the simulator runs.

A group comes from

* a file (:func:`load_overlap_group`, JSON / TOML / YAML; the schema is in
  :func:`overlap_group_from_mapping`), or
* a simulated training step (:func:`overlap_groups_from_step`,
  :func:`overlap_groups_from_workload`): the compute ops of one (phase, layer, micro-batch)
  and the collectives that run mostly beside them, e.g. one FSDP layer's backward GEMMs with
  the next layer's all-gather and the previous layer's reduce-scatter.

No torch here.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ccoverlap.catalog.hardware import ClusterSpec
from ccoverlap.config import check_keys, read_config_file, short
from ccoverlap.errors import ConfigError
from ccoverlap.predict.strategy import Planner
from ccoverlap.predict.workload import resolve_cluster
from ccoverlap.sim.graph import OpGraph
from ccoverlap.specs import COLLECTIVES, AttentionSpec, CollectiveSpec, CommConfig, GemmSpec, GroupSpec, MemorySpec

if TYPE_CHECKING:
    from ccoverlap.cost import CostModel
    from ccoverlap.predict.workload import Workload
    from ccoverlap.sim.simulator import SupportsDuration
    from ccoverlap.sim.timeline import Timeline
    from ccoverlap.specs import Collective, Transport

__all__ = [
    "Computation",
    "OverlapCollective",
    "OverlapGroup",
    "parse_bytes",
    "overlap_group_from_mapping",
    "load_overlap_group",
    "equivalent_spec",
    "overlap_groups_from_step",
    "overlap_groups_from_workload",
]

ComputeSpec = GemmSpec | AttentionSpec | MemorySpec

COMPUTE_STREAM = "compute"
COMM_STREAM = "comm"


@dataclass(frozen=True, kw_only=True)
class Computation:
    """One computation operator ``i`` of the group (its time is ``y_i`` in lagom eq. 1/4).

    Either ``spec`` (a GEMM, attention or memory-bound kernel the cost model times, and slows
    under contention by eqs. 4-6) or ``duration_s``: its time in seconds when it runs alone.
    A duration-only computation is turned by the profiler into an equivalent spec of that
    isolated duration (:func:`equivalent_spec`, a GEMM unless ``bound == "memory"``) so that
    contention slows it like a real kernel.
    """

    name: str
    spec: ComputeSpec | None = None
    duration_s: float | None = None
    bound: str = "compute"  # for duration-only computations: "compute" (GEMM-like) or "memory"

    def __post_init__(self) -> None:
        if (self.spec is None) == (self.duration_s is None):
            raise ConfigError(f"computation {self.name!r}: give exactly one of a spec (gemm/attention/memory) "
                              f"or a duration")
        if self.duration_s is not None and not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ConfigError(f"computation {self.name!r}: duration must be a positive number of seconds")
        if self.bound not in ("compute", "memory"):
            raise ConfigError(f"computation {self.name!r}: bound must be 'compute' or 'memory', got {self.bound!r}")


@dataclass(frozen=True, kw_only=True)
class OverlapCollective:
    """One collective ``j`` of the group; ``spec.config`` is the configuration it was given.
    ``stream``: the communication stream it is issued on (lagom §3.1 has one; a step taken
    from a framework may use several, e.g. FSDP's all-gather and reduce-scatter streams)."""

    name: str
    spec: CollectiveSpec
    stream: str = "comm"

    def __post_init__(self) -> None:
        if self.stream == "compute":
            raise ConfigError(f"collective {self.name!r}: stream 'compute' is the computations' stream")


@dataclass(frozen=True, kw_only=True)
class OverlapGroup:
    """M computations + N collectives overlapped on two streams (lagom §3.1, eq. 1).

    With no computations (M = 0) it is a communication-only group, whose makespan is X
    (eq. 2: each collective's own time is all that matters); files always give computations.
    ``cluster`` supplies the cost model and NCCL's default configurations; ``weight`` is how
    many times the group occurs in a training step (1 for a group from a file); ``source``
    says where it came from, for reports.
    """

    name: str
    computations: tuple[Computation, ...]
    collectives: tuple[OverlapCollective, ...]
    cluster: ClusterSpec
    weight: int = 1
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.collectives:
            raise ConfigError(f"overlap group {self.name!r}: needs at least one collective")
        names = [c.name for c in self.collectives]
        if len(set(names)) != len(names):
            raise ConfigError(f"overlap group {self.name!r}: collective names must be unique, got {names}")
        if self.weight < 1:
            raise ConfigError(f"overlap group {self.name!r}: weight must be >= 1")

    @property
    def n_collectives(self) -> int:
        """N, the number of collectives (lagom §3.1)."""
        return len(self.collectives)

    def given_configs(self) -> list[CommConfig]:
        """The configuration each collective was given (library defaults where a knob is None)."""
        return [c.spec.config for c in self.collectives]

    def graph(self, configs: Sequence[CommConfig], *,
              computation_specs: Sequence[ComputeSpec] | None = None) -> OpGraph:
        """The group as an OpGraph: computations in order on ``compute``, collectives in order on
        their streams (one ``comm`` stream unless given) with ``configs[j]``, no dependencies
        (all issued at t = 0, lagom §3.1).

        ``computation_specs`` replaces the computations' specs (the profiler passes the
        equivalent specs of duration-only computations); else a duration-only computation
        becomes an op of fixed duration, which contention does not slow.
        """
        if len(configs) != len(self.collectives):
            raise ConfigError(f"overlap group {self.name!r}: {len(configs)} configurations for "
                              f"{len(self.collectives)} collectives")
        g = OpGraph()
        g.meta["overlap_group"] = self.name
        for i, comp in enumerate(self.computations):
            spec = computation_specs[i] if computation_specs is not None else comp.spec
            g.add(comp.name, spec, stream=COMPUTE_STREAM, phase="overlap",
                  duration_s=None if spec is not None else comp.duration_s)
        for coll, cfg in zip(self.collectives, configs):
            g.add(coll.name, replace(coll.spec, config=cfg), stream=coll.stream, phase="overlap")
        return g

    def describe(self) -> str:
        """One line: name, M, N, each collective's type, size (MiB) and group, cluster."""
        colls = ", ".join(f"{c.spec.collective} {c.spec.bytes / 2**20:.1f} MiB on {c.spec.group.name}"
                          f"({c.spec.group.size})" for c in self.collectives)
        return (f"{self.name}: {len(self.computations)} computations, {len(self.collectives)} collectives "
                f"[{colls}] on {self.cluster.name}")


# ----------------------------------------------------------------------------- files

def require_group(group: Any, who: str) -> OverlapGroup:
    """``group`` when it is an :class:`OverlapGroup`; ConfigError naming ``who`` and what came
    instead otherwise (the check of every decider entry point that takes a group)."""
    if not isinstance(group, OverlapGroup):
        raise ConfigError(f"{who}: group must be an OverlapGroup (load_overlap_group(path) gives one), "
                          f"got {short(group)}")
    return group


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "k": 2**10, "m": 2**20, "g": 2**30}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: Any, where: str) -> float:
    """A byte count from a number or a string such as ``"32MiB"``, ``"2 MB"``, ``"684KiB"``.

    KB/MB/GB are powers of 10, KiB/MiB/GiB (and bare K/M/G, as NCCL's env variables read them)
    powers of 2. Returns bytes; ConfigError naming ``where`` otherwise.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a byte count, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or not math.isfinite(value):
            raise ConfigError(f"{where}: byte count must be a non-negative number, got {value!r}")
        return float(value)
    if isinstance(value, str):
        m = _BYTES_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return float(m.group(1)) * _UNITS[m.group(2).lower()]
    raise ConfigError(f"{where}: expected a byte count like 33554432, '32MiB' or '2MB', got {value!r}")


def _check_keys(data: Any, allowed: Iterable[str], where: str) -> dict:
    return check_keys(data, allowed, where)


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _duration(d: dict, where: str) -> float | None:
    keys = [k for k in ("duration_s", "duration_ms", "duration_us") if k in d]
    if not keys:
        return None
    if len(keys) > 1:
        raise ConfigError(f"{where}: give one of duration_s / duration_ms / duration_us, not {keys}")
    v = d[keys[0]]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError(f"{where}.{keys[0]}: expected a positive number, got {v!r}")
    return float(v) * {"duration_s": 1.0, "duration_ms": 1e-3, "duration_us": 1e-6}[keys[0]]


def _computation(d: Any, i: int, where: str) -> Computation:
    w = f"{where}.computations[{i}]"
    d = _check_keys(d, ("name", "gemm", "attention", "memory", "duration_s", "duration_ms", "duration_us",
                        "bound", "repeat"), w)
    name = str(d.get("name", f"comp{i}"))
    kinds = [k for k in ("gemm", "attention", "memory") if k in d]
    dur = _duration(d, w)
    if len(kinds) + (dur is not None) != 1:
        raise ConfigError(f"{w} ({name}): give exactly one of gemm: {{m, n, k}}, attention: {{flops, bytes}}, "
                          f"memory: {{bytes}} or duration_ms")
    spec: ComputeSpec | None = None
    if kinds:
        k = kinds[0]
        body = d[k]
        try:
            if k == "gemm":
                _check_keys(body, ("m", "n", "k", "batch", "dtype_bytes"), f"{w}.gemm")
                missing = [f for f in ("m", "n", "k") if f not in body]
                if missing:
                    raise ConfigError(f"{w}.gemm: missing {missing}")
                dims: dict[str, Any] = {f: _positive_int(v, f"{w}.gemm.{f}") for f, v in body.items()}
                spec = GemmSpec(**dims)
            elif k == "attention":
                _check_keys(body, ("flops", "bytes", "dtype_bytes"), f"{w}.attention")
                spec = AttentionSpec(flops=float(body.get("flops", 0.0)),
                                     bytes=parse_bytes(body.get("bytes", 0.0), f"{w}.attention.bytes"),
                                     dtype_bytes=int(body.get("dtype_bytes", 2)))
            else:
                _check_keys(body, ("bytes", "flops"), f"{w}.memory")
                if "bytes" not in body:
                    raise ConfigError(f"{w}.memory: missing 'bytes'")
                spec = MemorySpec(bytes=parse_bytes(body["bytes"], f"{w}.memory.bytes"),
                                  flops=float(body.get("flops", 0.0)))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{w}.{k}: {exc}") from None
    return Computation(name=name, spec=spec, duration_s=dur, bound=str(d.get("bound", "compute")))


def _group_spec(d: dict, cluster: ClusterSpec, w: str) -> GroupSpec:
    if "group" in d:
        g = _check_keys(d["group"], ("name", "size", "local_size"), f"{w}.group")
        size = _positive_int(g.get("size"), f"{w}.group.size")
        local = g.get("local_size")
        name = str(g.get("name", "group"))
    else:
        if "group_size" not in d:
            raise ConfigError(f"{w}: give the process group, as group_size: 8 or group: {{name, size, local_size}}")
        size = _positive_int(d["group_size"], f"{w}.group_size")
        local = d.get("local_size")
        name = str(d.get("group_name", "group"))
    if local is None:
        local = min(size, cluster.gpus_per_node)
    local = _positive_int(local, f"{w}.local_size")
    if size > cluster.world_size:
        raise ConfigError(f"{w}: group of {size} ranks is larger than the cluster ({cluster.world_size} GPUs)")
    return GroupSpec(name=name, size=size, local_size=local)


def _comm_config(d: Any, w: str) -> CommConfig:
    d = _check_keys(d, ("channels", "nc", "threads", "nt", "chunk_bytes", "chunk", "protocol", "algorithm"), w)
    vals: dict[str, Any] = {}
    for abbrev, full in (("nc", "channels"), ("nt", "threads")):
        for key in (abbrev, full):
            if key in d:
                vals[full] = _positive_int(d[key], f"{w}.{key}")
    for key in ("chunk", "chunk_bytes"):
        if key in d:
            vals["chunk_bytes"] = int(parse_bytes(d[key], f"{w}.{key}"))
    if "protocol" in d:
        vals["protocol"] = str(d["protocol"]).lower()
    if "algorithm" in d:
        vals["algorithm"] = str(d["algorithm"]).lower()
    return CommConfig(**vals)


def _collective(d: Any, i: int, cluster: ClusterSpec, where: str) -> OverlapCollective:
    w = f"{where}.collectives[{i}]"
    d = _check_keys(d, ("name", "collective", "type", "bytes", "group", "group_size", "group_name",
                        "local_size", "config", "transport", "stream"), w)
    kind = d.get("collective", d.get("type"))
    if kind is None:
        raise ConfigError(f"{w}: missing 'collective' (one of {', '.join(COLLECTIVES)})")
    kind = str(kind).lower().replace("-", "_")
    kind = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all"}.get(kind, kind)
    if kind not in COLLECTIVES:
        raise ConfigError(f"{w}: unknown collective {kind!r}; expected one of {', '.join(COLLECTIVES)}")
    if "bytes" not in d:
        raise ConfigError(f"{w}: missing 'bytes' (message size, e.g. 33554432 or '32MiB')")
    nbytes = parse_bytes(d["bytes"], f"{w}.bytes")
    group = _group_spec(d, cluster, w)
    config = _comm_config(d["config"], f"{w}.config") if "config" in d else CommConfig()
    name = str(d.get("name", f"{kind}{i}"))
    # kind is one of COLLECTIVES (checked above); the transport is checked by CollectiveSpec
    spec = CollectiveSpec(collective=cast("Collective", kind), bytes=nbytes, group=group, config=config,
                          transport=cast("Transport", str(d.get("transport", "sm"))))
    return OverlapCollective(name=name, spec=spec, stream=str(d.get("stream", COMM_STREAM)))


def overlap_group_from_mapping(data: dict, *, source: str = "overlap group",
                               cluster: ClusterSpec | None = None) -> OverlapGroup:
    """Validate a mapping into an :class:`OverlapGroup`. Schema (YAML shown)::

        name: fsdp-layer-bwd            # optional
        cluster: a40-pcie               # catalog name or mapping; optional (default a40-pcie,
        nodes: 1                        #   or the ``cluster`` argument, which wins)
        computations:                   # in stream order; each one of:
          - {name: dgrad, gemm: {m: 4096, n: 4096, k: 14336}}
          - {name: attn_bwd, attention: {flops: 1.1e12, bytes: 2GiB}}
          - {name: norm, memory: {bytes: 64MiB}}
          - {name: opaque, duration_ms: 1.5, bound: compute}   # isolated time only
          - {name: ffn, gemm: {...}, repeat: 4}                # the same kernel 4 times
        collectives:                    # in stream order
          - {name: ag, collective: all_gather, bytes: 400MiB, group_size: 8}
          - {name: rs, collective: reduce_scatter, bytes: 400MiB,
             group: {name: dp, size: 16, local_size: 8},
             config: {nc: 8, nt: 256, chunk: 2MiB, protocol: simple},  # as given; optional
             stream: rs}               # optional: its own comm stream (default "comm")

    Raises ConfigError naming ``source`` and the field on any problem.
    """

    _check_keys(data, ("name", "cluster", "nodes", "computations", "collectives", "weight"), source)
    if cluster is None:
        cluster = resolve_cluster(data.get("cluster", "a40-pcie"), data.get("nodes"))
    comps_raw = data.get("computations")
    colls_raw = data.get("collectives")
    if not isinstance(comps_raw, list) or not comps_raw:
        raise ConfigError(f"{source}: 'computations' must be a non-empty list")
    if not isinstance(colls_raw, list) or not colls_raw:
        raise ConfigError(f"{source}: 'collectives' must be a non-empty list")
    comps: list[Computation] = []
    for i, d in enumerate(comps_raw):
        c = _computation(d, i, source)
        repeat = _positive_int(d.get("repeat", 1), f"{source}.computations[{i}].repeat")
        comps.extend([c] if repeat == 1 else [replace(c, name=f"{c.name}#{r}") for r in range(repeat)])
    colls = [_collective(d, i, cluster, source) for i, d in enumerate(colls_raw)]
    return OverlapGroup(name=str(data.get("name", Path(source).stem)), computations=tuple(comps),
                        collectives=tuple(colls), cluster=cluster,
                        weight=_positive_int(data.get("weight", 1), f"{source}.weight"), source=source)


def load_overlap_group(path: str, *, cluster: ClusterSpec | None = None) -> OverlapGroup:
    """Read an overlap group from a JSON / TOML / YAML file (schema: :func:`overlap_group_from_mapping`)."""

    return overlap_group_from_mapping(read_config_file(path), source=str(path), cluster=cluster)


# ----------------------------------------------------------------------------- durations -> specs

def equivalent_spec(duration_s: float, cost: SupportsDuration, *, bound: str = "compute",
                    dtype_bytes: int = 2) -> ComputeSpec:
    """A kernel spec whose isolated duration under ``cost`` is ``duration_s`` (seconds).

    ``bound == "compute"``: a GEMM ``[m, m] x [m, k]`` with ``m`` = 8192 (halved until one
    k-step fits) and ``k`` found by bisection, so it is compute-bound where the cost model's
    roofline says so; ``"memory"``: a memory-bound kernel moving the bytes that take that long.
    Lets a group given as durations feel contention (eqs. 4-6) like the kernels it stands for.
    """
    def dur(spec: ComputeSpec) -> float:
        return float(cost.duration_s(spec, ()))

    if bound == "memory":
        lo, hi = 1.0, 1.0
        while dur(MemorySpec(bytes=hi)) < duration_s and hi < 1e15:
            hi *= 2
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if dur(MemorySpec(bytes=mid)) < duration_s:
                lo = mid
            else:
                hi = mid
        return MemorySpec(bytes=hi)
    # K in whole 16-byte vectors: an unaligned K runs the library's slow fallback kernel, so the
    # time is monotone in K only along aligned values
    step = max(16 // dtype_bytes, 1)
    m = 8192
    while m > 16 and dur(GemmSpec(m=m, n=m, k=step, dtype_bytes=dtype_bytes)) > duration_s:
        m //= 2
    lo, hi = 1, 1
    while dur(GemmSpec(m=m, n=m, k=hi * step, dtype_bytes=dtype_bytes)) < duration_s and hi < 2**40:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if dur(GemmSpec(m=m, n=m, k=mid * step, dtype_bytes=dtype_bytes)) < duration_s:
            lo = mid
        else:
            hi = mid
    return GemmSpec(m=m, n=m, k=hi * step, dtype_bytes=dtype_bytes)


# ----------------------------------------------------------------------------- from a training step

def _signature(comps: Sequence[Computation], colls: Sequence[OverlapCollective]) -> tuple:
    return (tuple(c.spec for c in comps),
            tuple((c.spec.collective, c.spec.bytes, c.spec.group, c.stream) for c in colls))


def overlap_groups_from_step(graph: OpGraph, timeline: Timeline, cluster: ClusterSpec, *, rank: int | None = None,
                             top: int = 2, min_overlap: float = 0.5, label: str = "") -> list[OverlapGroup]:
    """The main overlap groups of a simulated training step, largest total time first.

    For one simulated rank (``rank``; default: the rank with the most communication time),
    compute ops are grouped by their ``(phase, layer, microbatch)`` labels into windows
    ``[first start, last end]``; each collective off the compute stream joins the window its
    simulated interval overlaps most, if that covers at least ``min_overlap`` of it. Windows
    with identical computations and collectives are one group whose ``weight`` counts them;
    groups are ranked by weight x window length and the ``top`` first returned.

    ``timeline`` must be ``simulate(graph, ...)`` (its rows are the graph's ops, in order).
    Times in seconds. This is how a step is cut into lagom's overlap groups (§3.1, Fig. 2).
    """
    ops = graph.ops
    if len(timeline) != len(ops):
        raise ConfigError("overlap_groups_from_step: the timeline is not the simulation of this graph")
    starts, ends = timeline.start_s, timeline.end_s
    if rank is None:
        comm_time: dict[int, float] = {}
        for op in ops:
            if isinstance(op.spec, CollectiveSpec):
                comm_time[op.rank] = comm_time.get(op.rank, 0.0) + float(ends[op.op_id] - starts[op.op_id])
        if not comm_time:
            return []
        rank = max(sorted(comm_time), key=lambda r: comm_time[r])
    windows: OrderedDict[tuple, list[int]] = OrderedDict()
    colls: list[int] = []
    for op in ops:
        if op.rank != rank:
            continue
        if isinstance(op.spec, CollectiveSpec):
            if op.stream != COMPUTE_STREAM and op.spec.bytes > 0:
                colls.append(op.op_id)
        elif isinstance(op.spec, (GemmSpec, AttentionSpec, MemorySpec)) and op.layer >= 0:
            windows.setdefault((op.phase, op.layer, op.microbatch), []).append(op.op_id)
    if not windows or not colls:
        return []
    keys = list(windows)
    w_start = {k: min(float(starts[i]) for i in windows[k]) for k in keys}
    w_end = {k: max(float(ends[i]) for i in windows[k]) for k in keys}
    assigned: dict[tuple, list[int]] = {k: [] for k in keys}
    ws_arr = np.array([w_start[k] for k in keys])
    we_arr = np.array([w_end[k] for k in keys])
    for c in colls:
        cs, ce = float(starts[c]), float(ends[c])
        if ce <= cs:
            continue
        # the window it overlaps most (the first of equals), if it overlaps one at all
        ov = np.minimum(ce, we_arr) - np.maximum(cs, ws_arr)
        j = int(np.argmax(ov))
        best_ov = float(ov[j])
        if best_ov > 0.0 and best_ov >= min_overlap * (ce - cs):
            assigned[keys[j]].append(c)
    found: OrderedDict[tuple, dict] = OrderedDict()
    for k in keys:
        if not assigned[k]:
            continue
        # windows hold compute ops and colls collectives only (sorted by spec type above)
        comps = [Computation(name=ops[i].name, spec=cast(ComputeSpec, ops[i].spec)) for i in windows[k]]
        cl = [OverlapCollective(name=f"{ops[c].name}#{n}", spec=cast(CollectiveSpec, ops[c].spec), stream=ops[c].stream)
              for n, c in enumerate(assigned[k])]
        sig = _signature(comps, cl)
        entry = found.setdefault(sig, {"key": k, "comps": comps, "colls": cl, "count": 0, "span": 0.0})
        entry["count"] += 1
        entry["span"] += w_end[k] - w_start[k]
    ranked = sorted(found.values(), key=lambda e: -e["span"])[:top]
    out = []
    for e in ranked:
        phase, layer, mb = e["key"]
        name = f"{label + ' ' if label else ''}{phase or 'step'} layer {layer}" + (f" mb {mb}" if mb >= 0 else "")
        out.append(OverlapGroup(name=name, computations=tuple(e["comps"]), collectives=tuple(e["colls"]),
                                cluster=cluster, weight=e["count"], source="simulated step",
                                meta={"window_s": e["span"] / e["count"], "rank": rank}))
    return out


def overlap_groups_from_workload(w: Workload, cost: CostModel | None = None, *, top: int = 2,
                                 planner: Planner | None = None) -> list[OverlapGroup]:
    """The main overlap groups (see :func:`overlap_groups_from_step`) of workload ``w``'s step,
    simulated with its knobs as given through ``planner`` (default: a new
    :class:`~ccoverlap.predict.strategy.Planner` with ``cost``, default the workload's cost model)."""

    planner = planner if planner is not None else Planner(w, cost=cost)
    step, tl = planner.simulate(w)
    return overlap_groups_from_step(step.graph, tl, w.cluster, top=top, label=w.model.name)
