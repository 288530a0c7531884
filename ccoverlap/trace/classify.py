"""Classify trace events and build one rank's :class:`~ccoverlap.sim.timeline.Timeline`.

Device events (GPU kernels, memcpy/memset, syncs) are sorted into the Timeline kinds with
HolisticTraceAnalysis' name patterns (``hta/common/types.py``), so the overlap ratio is
computed over the same two sets of kernels as HTA's ``get_comm_comp_overlap``:

* ``comm``: names starting ``nccl`` / ``hccl`` / ``rccl``, or containing ``ncclKernel`` /
  ``ncclDevKernel`` (legacy ``ncclKernel_AllReduce_RING_LL_Sum_float``, current
  ``ncclDevKernel_AllGather_RING_LL``, ``ncclDevKernel_Generic``, RCCL's kernels);
* ``memcpy``: ``gpu_memcpy`` / ``gpu_memset`` events and names starting ``Memcpy`` /
  ``Memset`` / ``dma``;
* ``other``: syncs, ``Stream Wait Event``, launches and the other non-compute names HTA
  excludes from computation;
* ``compute``: every other device event.

A trace without device events but with gloo collectives (``gloo:all_reduce`` … run on the
gloo worker threads) is analysed on its CPU threads: ``gloo:*`` intervals are
communication, ``cpu_op`` events outside them are computation.

Collective type, bytes, process group and its size come from the args Kineto attaches
(``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``,
``Process Group Name``), on the kernel itself or on the ``record_param_comms`` op it is
joined to by External id or by its launch (correlation id) inside the op; failing that from
``nccl:all_reduce``-style op names and ``Input Dims``, and last from the kernel name.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import numpy.ma  # noqa: F401 - np.unique imports it at its first call; imported here, forked workers share it

from ccoverlap.sim.timeline import Timeline
from ccoverlap.trace.columns import DEVICE_CAT_LIST, KIND_CODES
from ccoverlap.trace.load import RawTrace
from ccoverlap.trace.sources import Source

_COMM_RE = re.compile(r"(nccl)|(rccl)|(hccl)|(.*ncclKernel)|(.*ncclDevKernel)|(.*rcclKernel)")
_MEM_RE = re.compile(r"((hip)?Memcpy)|((hip)?Memset)|(dma)")
# HTA's ComputeKernelGroupingPattern, inverted: names that are not computation
_NON_COMPUTE_RE = re.compile(
    r"(nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(.*Sync)|(Stream Wait Event)|(cuda.*LaunchKernel)"
    r"|(runFunction)|(hip)|(job_exe)|(packet)|(pe_exe)|(cpum_exe_subgraph)|(hccl)"
    r"|(collective_subgraph_execution)")
CPU_COMM_PREFIXES = ("gloo:", "mpi:", "ucc:")

DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "unsigned int": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "long long": 8, "uint64": 8,
    "half": 2, "float16": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "short": 2,
    "int16": 2, "uint16": 2,
    "char": 1, "byte": 1, "signed char": 1, "unsigned char": 1, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "complexfloat": 8, "complexdouble": 16,
}

# canonical collective names, most specific first (reducescatter contains "reduce")
_COLL_PATTERNS = (
    ("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"), ("allgather", "all_gather"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "p2p"), ("send", "send"),
    ("recv", "recv"), ("barrier", "barrier"), ("reduce", "reduce"), ("gather", "gather"),
    ("scatter", "scatter"), ("generic", "unknown"),
)


def canonical_collective(text: str) -> str:
    """``allreduce`` / ``nccl:all_reduce`` / ``ncclKernel_AllReduce_RING_LL`` … -> ``all_reduce``.

    One of all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send, recv,
    p2p, barrier, gather, scatter, or ``unknown``.
    """
    t = re.sub(r"[^a-z]", "", text.lower())
    for key, canon in _COLL_PATTERNS:
        if key in t:
            return canon
    return "unknown"


def _collective_from_kernel_name(name: str) -> str:
    m = re.search(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", name)
    if m:
        return canonical_collective(m.group(1))
    return canonical_collective(name)


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a Kineto/record_param_comms dtype name (``Float``, ``c10::BFloat16``…); 0 if unknown."""
    if not isinstance(dtype, str):
        return 0
    return DTYPE_BYTES.get(dtype.strip().lower(), 0)


def _nelems(dims: object) -> int:
    """Elements of the first tensor (or tensor list) in an ``Input Dims`` arg."""
    if not isinstance(dims, list) or not dims:
        return 0
    first = dims[0]
    if isinstance(first, list) and first and isinstance(first[0], list):  # TensorList
        return sum(_prod(d) for d in first if isinstance(d, list))
    return _prod(first) if isinstance(first, list) and first else 0


def _prod(dims: list[Any]) -> int:
    n = 1
    for d in dims:
        if not isinstance(d, (int, float)) or isinstance(d, bool):
            return 0
        n *= int(d)
    return max(n, 0)


def kernel_kind(name: str, cat: str = "kernel") -> str:
    """Timeline kind of a device event (HTA's patterns; see the module docstring)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy"
    if cat == "cuda_sync":
        return "other"
    if _COMM_RE.match(name):
        return "comm"
    if _MEM_RE.match(name):
        return "memcpy"
    if _NON_COMPUTE_RE.match(name):
        return "other"
    return "compute"


@dataclass
class CollInfo:
    """What is known about one communication row."""

    collective: str = "unknown"
    bytes: float = 0.0
    group: str = ""
    group_size: int = 0
    source: str = ""
    size_source: str = ""


def collective_info(infos: list[dict[str, Any]], op_names: list[str], kernel_name: str, pg_config: _PgConfig,
                    world_size: int | None) -> CollInfo:
    """Merge the args of the kernel and its enclosing comm ops into one :class:`CollInfo`.

    ``bytes`` follows nccl-tests' "size": the larger of the input and output buffers
    (all_gather: the gathered output, reduce_scatter: the full input).
    """
    out = CollInfo()
    out.collective, out.source = _collective_type(infos, op_names, kernel_name)
    for d in infos:
        g = d.get("Process Group Name")
        if g is not None and g != "" and not out.group:
            out.group = str(g)
        gs = d.get("Group size")
        if isinstance(gs, (int, float)) and not isinstance(gs, bool) and not out.group_size:
            out.group_size = _group_size(gs)
    if not out.group:
        out.group = "0" if len(pg_config) <= 1 else "?"
        if len(pg_config) == 1:
            out.group = next(iter(pg_config))
    if not out.group_size:
        out.group_size = _pg_size(pg_config, out.group)
    # sizes: the collective record's own in/out element counts, else the enclosing c10d op's
    # tensors (output and input: the larger is nccl-tests' size, their ratio the group size of
    # a gather/scatter), else the nccl:/gloo: op's input x the group size (all_gather)
    out.bytes = _record_bytes(infos, out) or _c10d_tensor_bytes(infos, op_names, out)
    if not out.group_size:
        out.group_size = _group_size(world_size or 0)
    if not out.bytes:
        out.bytes = _op_input_bytes(infos, out)
    return out


def _collective_type(infos: list[dict[str, Any]], op_names: list[str], kernel_name: str) -> tuple[str, str]:
    """(collective, where it was read): the collective record's ``Collective name``, else the
    ``nccl:`` / ``gloo:`` … op's name, else the ``c10d::`` op's, else the kernel's name."""
    coll, source = "", ""
    for d in infos:
        c = d.get("Collective name")
        if isinstance(c, str) and c:
            coll, source = canonical_collective(c), "args"
            break
    if not coll:
        for n in op_names:  # nccl:all_reduce / gloo:all_gather before c10d::allreduce_
            if n.startswith(("nccl:", "gloo:", "rccl:", "ucc:", "mpi:")):
                coll, source = canonical_collective(n.split(":", 1)[1]), "op name"
                break
    if not coll:
        for n in op_names:
            if n.startswith("c10d::"):
                coll, source = canonical_collective(n[6:]), "op name"
                break
    if not coll or coll == "unknown":
        kc = _collective_from_kernel_name(kernel_name)
        if kc != "unknown" or not coll:
            coll = kc
            source = source or "kernel name"
    return coll, source


def _record_bytes(infos: list[dict[str, Any]], out: CollInfo) -> float:
    """Bytes from a collective record's ``In`` / ``Out msg nelems`` × ``dtype`` (0.0: none); sets
    ``out.size_source`` and, for a gather/scatter without a stated group size, ``out.group_size``."""
    for d in infos:
        esize = dtype_bytes(d.get("dtype"))
        n_in, n_out = d.get("In msg nelems"), d.get("Out msg nelems")
        if esize and _is_num(n_in) and _is_num(n_out) and max(n_in, n_out) > 0:
            out.size_source = "collective record (In/Out msg nelems)"
            if not out.group_size and out.collective in _GATHER_SCATTER and min(n_in, n_out) > 0:
                out.group_size = _group_size(round(max(n_in, n_out) / min(n_in, n_out)))
            return max(float(n_in), float(n_out)) * esize
        if esize and _is_num(n_in) and n_in > 0:
            out.size_source = "collective record (In msg nelems)"
            return float(n_in) * esize
    return 0.0


def _c10d_tensor_bytes(infos: list[dict[str, Any]], op_names: list[str], out: CollInfo) -> float:
    """Bytes from the enclosing ``c10d::`` op's tensors (the larger one; 0.0: none); their ratio is
    a gather/scatter's group size when none is stated."""
    for d, name in zip(infos, op_names_for(infos, op_names)):
        if not name.startswith("c10d::"):
            continue
        per_arg = [x for x in tensor_arg_bytes(d.get("Input Dims"), d.get("Input type")) if x > 0]
        if per_arg:
            out.size_source = f"{name} tensors"
            if (not out.group_size and out.collective in _GATHER_SCATTER and len(per_arg) >= 2
                    and min(per_arg) > 0 and max(per_arg) % min(per_arg) == 0):
                out.group_size = _group_size(max(per_arg) // min(per_arg))
            return float(max(per_arg))
    return 0.0


def _op_input_bytes(infos: list[dict[str, Any]], out: CollInfo) -> float:
    """Bytes from an op's first input tensor (× the group size for an all-gather; 0.0: none)."""
    for d in infos:
        types = d.get("Input type")
        esize = dtype_bytes(types[0]) if isinstance(types, list) and types else 0
        n = _nelems(d.get("Input Dims"))
        if esize and n:
            if out.collective == "all_gather":
                out.size_source = "op input x group size"
                return float(n * esize) * max(out.group_size or 1, 1)
            out.size_source = "op input"
            return float(n * esize)
    return 0.0


_GATHER_SCATTER = ("all_gather", "reduce_scatter", "gather", "scatter")


def _is_num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def op_names_for(infos: list[dict[str, Any]], op_names: list[str]) -> list[str]:
    """The op name of each entry of ``infos`` (``infos`` may start with the kernel's own args)."""
    pad = len(infos) - len(op_names)
    return [""] * pad + list(op_names) if pad >= 0 else list(op_names)[: len(infos)]


def tensor_arg_bytes(dims: object, types: object) -> list[int]:
    """Bytes of each tensor (or tensor list, summed) argument of an op from its ``Input Dims`` /
    ``Input type`` args (record_shapes); 0 for scalars and unknown dtypes. A tensor list whose
    type is not a dtype (``TensorList``) takes the element size of the op's other tensors."""
    if not isinstance(dims, list):
        return []
    types = types if isinstance(types, list) else []
    sizes = [dtype_bytes(t) for t in types]
    fallback = next((x for x in sizes if x), 0)
    out: list[int] = []
    for a, d in enumerate(dims):
        esize = sizes[a] if a < len(sizes) and sizes[a] else 0
        n = _nelems_any(d)
        if n and not esize and isinstance(d, list) and d and isinstance(d[0], list):
            esize = fallback
        out.append(n * esize)
    return out


def _nelems_any(d: object, depth: int = 0) -> int:
    """Elements of a shape ``[a, b]`` or of a (nested) list of shapes, summed; 0 for ``[]`` (scalar)."""
    if not isinstance(d, list) or not d or depth > 4:
        return 0
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in d):
        return _prod(d)
    return sum(_nelems_any(x, depth + 1) for x in d if isinstance(x, list))


def _pg_size(pg_config: _PgConfig, group: str) -> int:
    entry = pg_config.get(group)
    return _group_size(entry["size"]) if entry and entry.get("size") else 0


#: Largest group size read from a trace (a larger stated one counts as not stated).
MAX_GROUP_SIZE = 2**31 - 1


def _group_size(v: Any) -> int:
    """``v`` as a group size 1 .. :data:`MAX_GROUP_SIZE`, else 0 (not stated): a trace's ``Group size``
    of 2**64 or 1e300 must not overflow the int64 columns."""
    try:
        n = int(v)
    except (OverflowError, ValueError):
        return 0
    return n if 0 < n <= MAX_GROUP_SIZE else 0


#: A trace's process groups: ``{pg_name: {"size": n, "desc": str, "ranks": [...]}}``.
_PgConfig = dict[str, dict[str, Any]]


def pg_config_of(meta: dict[str, Any]) -> _PgConfig:
    """``{pg_name: {"size": n, "desc": str, "ranks": [...]}}`` from ``distributedInfo.pg_config``."""
    info = meta.get("distributedInfo")
    out: _PgConfig = {}
    if not isinstance(info, dict) or not isinstance(info.get("pg_config"), list):
        return out
    for pg in info["pg_config"]:
        if isinstance(pg, dict) and "pg_name" in pg:
            size = pg.get("pg_size")
            out[str(pg["pg_name"])] = {"size": size if isinstance(size, int) else 0,
                                       "desc": str(pg.get("pg_desc", "")), "ranks": pg.get("ranks")}
    return out


@dataclass
class RankTrace:
    """One rank, ready for the metrics: its Timeline (seconds from the job's origin) plus the
    per-row facts the Timeline has no column for."""

    rank: int
    path: Source
    mode: str                    # "gpu" (device kernels) or "cpu" (gloo on CPU threads)
    timeline: Timeline
    launch_s: np.ndarray         # when the row's CPU launch happened (nan: unknown)
    group_size: np.ndarray
    leaf: np.ndarray             # usable for per-kernel contention (CPU mode: outermost compute ops)
    shape: np.ndarray            # launch-shape key (grid/block hash; 0 unknown) to compare like with like
    name_id: np.ndarray          # interned name of each row (same name <=> same id within a rank)
    steps: list[tuple[int, float, float]]   # CPU-side ProfilerStep#N (N, start_s, end_s)
    cutoff_s: float | None       # start of the last ProfilerStep annotation (HTA's window end)
    n_steps_names: set[int] = field(default_factory=set)
    meta: dict[str, Any] = field(default_factory=dict)
    size_source: np.ndarray | None = None     # where each comm row's byte count came from ("" unknown)


def origin_us(raws: list[RawTrace]) -> float:
    """Earliest timestamp over all traces (µs); every rank's seconds count from it (HTA aligns likewise)."""
    best = math.inf
    for r in raws:
        ts_min = getattr(r, "ts_min", None)
        if ts_min is not None:     # covers CPU ops dropped at load time
            best = min(best, ts_min)
        for a in (r.k_ts, r.c_ts, r.l_ts):
            if len(a):
                best = min(best, float(a.min()))
        for s in r.steps:
            best = min(best, s[1])
    return 0.0 if best == math.inf else best


def _first_launch(raw: RawTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each kernel: (index into l_* of its earliest launch or -1)."""
    n = len(raw.k_corr)
    idx = np.full(n, -1, dtype=np.int64)
    if n == 0 or len(raw.l_corr) == 0:
        return idx, raw.l_corr, raw.l_ts
    order = np.lexsort((raw.l_ts, raw.l_corr))
    corr_sorted = raw.l_corr[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = corr_sorted[1:] != corr_sorted[:-1]
    u_corr = corr_sorted[first]
    u_idx = order[first]
    pos = np.searchsorted(u_corr, raw.k_corr)
    pos_c = np.minimum(pos, len(u_corr) - 1)
    hit = (pos < len(u_corr)) & (u_corr[pos_c] == raw.k_corr) & (raw.k_corr >= 0)
    idx[hit] = u_idx[pos_c[hit]]
    return idx, raw.l_corr, raw.l_ts


def build_rank(raw: RawTrace, origin: float, *, hta_rounding: bool = False) -> RankTrace | None:
    """The :class:`RankTrace` of one loaded file, or None when it has nothing to measure
    (no device events and no CPU-side gloo collectives).

    ``hta_rounding``: round every event inward to whole µs (start up, end down) when the
    file has fractional timestamps, as HTA does for ns-resolution traces (not for the traces
    ``ccoverlap simulate`` writes, which are exact by construction).
    """
    rank = int(raw.rank if raw.rank is not None else 0)
    pg = pg_config_of(raw.meta)
    world = raw.world_size
    names = raw.names
    steps_all = [(n, (ts - origin) * 1e-6, (ts + dur - origin) * 1e-6, gpu) for n, ts, dur, gpu in raw.steps]
    cpu_steps = [(n, s, e) for n, s, e, gpu in steps_all if not gpu]
    cutoff = max((s for _, s, _, _ in steps_all), default=None)
    last_end = max((e for _, _, e, _ in steps_all), default=None)
    step_names = {n for n, *_ in steps_all}
    meta: dict[str, Any] = {"file": str(raw.path), "rank_source": raw.rank_source, "world_size": world,
            "displayTimeUnit": raw.meta.get("displayTimeUnit"), "events": raw.n_events,
            "malformed_events": raw.n_malformed, "pg_config": pg, "last_step_end_s": last_end}
    info = raw.meta.get("distributedInfo")
    if isinstance(info, dict):
        meta["backend"] = info.get("backend")
    devs = raw.meta.get("deviceProperties")
    if isinstance(devs, list) and devs and isinstance(devs[0], dict):
        meta["device"] = devs[0].get("name")
    # traces ccoverlap itself wrote (simulated) are exact by construction: never rounded
    simulated = str(raw.meta.get("traceName", "")).startswith("ccoverlap simulated")
    round_us = hta_rounding and raw.float_ts and not simulated
    meta["simulated"] = simulated

    facts = _RankFacts(rank=rank, origin=origin, pg=pg, world=world, names=names, cpu_steps=cpu_steps,
                       cutoff=cutoff, step_names=step_names, meta=meta, round_us=round_us)
    if raw.has_device_events:
        meta["mode"] = "gpu"
        return _build_gpu(raw, facts)
    comm_nids = {i for i, n in enumerate(names) if n.startswith(CPU_COMM_PREFIXES)}
    if not comm_nids or not np.isin(raw.c_nid, list(comm_nids)).any():
        return None
    meta["mode"] = "cpu"
    return _build_cpu(raw, facts, comm_nids)


@dataclass(frozen=True)
class _RankFacts:
    """What :func:`build_rank` reads once from a rank's file for both builders: its rank, the
    job's clock origin (µs), the process groups, the world size, the interned names, the CPU-side
    ProfilerStep windows (s from the origin), the start of the last step annotation (s), the step
    numbers seen, the report's meta of the rank, and whether to round events inward to whole µs."""

    rank: int
    origin: float
    pg: _PgConfig
    world: int | None
    names: list[str]
    cpu_steps: list[tuple[int, float, float]]
    cutoff: float | None
    step_names: set[int]
    meta: dict[str, Any]
    round_us: bool


def _times(ts: np.ndarray, dur: np.ndarray, origin: float, round_us: bool) -> tuple[np.ndarray, np.ndarray]:
    if round_us:
        start = np.ceil(ts)
        end = np.maximum(np.floor(ts + dur), start)
    else:
        start, end = ts, ts + dur
    return (start - origin) * 1e-6, (end - origin) * 1e-6


def _build_gpu(raw: RawTrace, facts: _RankFacts) -> RankTrace:
    """The rank's device events as its Timeline: kinds, streams, launches, collective facts."""
    rank, origin, pg, world, names = facts.rank, facts.origin, facts.pg, facts.world, facts.names
    n = len(raw.k_ts)
    pair = raw.k_nid * len(DEVICE_CAT_LIST) + raw.k_cat
    uniq, inv = _factorize(pair)
    ukinds = np.array([kernel_kind(names[int(u) // len(DEVICE_CAT_LIST)],
                                   DEVICE_CAT_LIST[int(u) % len(DEVICE_CAT_LIST)]) for u in uniq], dtype=object)
    kinds = ukinds[inv] if n else np.empty(0, dtype=object)
    override = raw.k_kind >= 0
    if override.any():
        kinds[override] = np.array(KIND_CODES, dtype=object)[raw.k_kind[override]]
    launch_idx, _, _ = _first_launch(raw)
    launch_s = np.full(n, np.nan)
    has = launch_idx >= 0
    launch_s[has] = (raw.l_ts[launch_idx[has]] - origin) * 1e-6
    start, end = _times(raw.k_ts, raw.k_dur, origin, facts.round_us)
    ds, sinv = _factorize_pairs(raw.k_device, raw.k_stream)
    multi_dev = len(np.unique(ds[0])) > 1
    labels = np.array([f"dev {d} stream {s}" if multi_dev else f"stream {s}" for d, s in ds.T], dtype=object)
    streams = labels[sinv] if n else np.empty(0, dtype=object)
    collective = np.full(n, "", dtype=object)
    group = np.full(n, "", dtype=object)
    nbytes = np.zeros(n)
    gsize = np.zeros(n, dtype=np.int64)
    size_source = np.full(n, "", dtype=object)
    comm_rows = np.flatnonzero(kinds == "comm")
    if len(comm_rows):
        _join_collectives(raw, comm_rows, launch_idx, pg, world, names, collective, group, nbytes, gsize,
                          size_source)
    tl = Timeline(rank=np.full(n, rank), stream=streams, kind=kinds,
                  name=np.array(names, dtype=object)[raw.k_nid] if n else np.empty(0, dtype=object),
                  start_s=start, end_s=end, bytes=nbytes, collective=collective, group=group,
                  meta={"rank": rank})
    return RankTrace(rank=rank, path=raw.path, mode="gpu", timeline=tl, launch_s=launch_s, group_size=gsize,
                     leaf=np.ones(n, dtype=bool), shape=raw.k_shape.copy(), name_id=raw.k_nid.copy(),
                     steps=facts.cpu_steps, cutoff_s=facts.cutoff, n_steps_names=facts.step_names,
                     meta=facts.meta, size_source=size_source)


def _factorize(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` (sorted distinct keys, each key's index among them)
    of a 1-D integer array: the distinct keys by hashing, the index by binary search among them,
    instead of sorting every key."""
    uniq = np.unique(keys)
    return uniq, np.searchsorted(uniq, keys)


_HALF = 1 << 30
#: Per thread id, its comm ops sorted by start: (rows, starts, ends, nesting parent of each).
_ByThread = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


def _factorize_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(np.stack([a, b]), axis=1, return_inverse=True)`` of two integer columns: the
    distinct (a, b) pairs as a 2 x k array in lexicographic order and each row's index among them."""
    if len(a) and -_HALF <= min(a.min(), b.min()) and max(a.max(), b.max()) < _HALF:
        uniq, inv = _factorize((a + _HALF) * (2 * _HALF) + (b + _HALF))   # order-preserving, fits int64
        return np.stack([uniq // (2 * _HALF) - _HALF, uniq % (2 * _HALF) - _HALF]), inv
    uniq, inv = np.unique(np.stack([a, b]), axis=1, return_inverse=True)
    return uniq, inv.reshape(-1)


def _enclosing_index(starts: Sequence[float], ends: Sequence[float]) -> np.ndarray:
    """Per-thread nesting of intervals sorted by start: ``parent[j]`` is the nearest earlier interval
    that contains interval ``j`` (-1: none), built in one linear pass with a stack."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    for j in range(len(starts)):
        s0 = starts[j]
        while stack and ends[stack[-1]] < s0:
            stack.pop()
        if stack:
            parent[j] = stack[-1]
        stack.append(j)
    return parent


def _comm_ops_by_thread(raw: RawTrace) -> tuple[dict[int, int], _ByThread]:
    """The comm ops of a rank: ``{External id: op row}`` and, per thread, the ops sorted by start
    with their nesting parents ``{tid: (rows, starts, ends, parent)}``."""
    comm_ops = np.flatnonzero(raw.c_info >= 0)
    ext_to_op: dict[int, int] = {}
    for j, e in zip(comm_ops.tolist(), raw.c_ext[comm_ops].tolist()):
        if e >= 0:
            ext_to_op.setdefault(e, j)
    by_tid: _ByThread = {}
    if len(comm_ops):
        order = comm_ops[np.lexsort((-(raw.c_ts[comm_ops] + raw.c_dur[comm_ops]), raw.c_ts[comm_ops],
                                     raw.c_tid[comm_ops]))]
        tids = raw.c_tid[order]
        cuts = np.flatnonzero(np.diff(tids)) + 1
        for seg in np.split(order, cuts):
            st = raw.c_ts[seg]
            en = st + raw.c_dur[seg]
            by_tid[int(raw.c_tid[seg[0]])] = (seg, st, en, _enclosing_index(st.tolist(), en.tolist()))
    return ext_to_op, by_tid


def _row_args(raw: RawTrace, i: int, li: int, by_tid: _ByThread, ext_to_op: dict[int, int],
              names: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The args dicts and op names behind communication row ``i`` (launched by launch ``li``):
    its own collective record, the comm ops enclosing its launch (innermost first), the op of its
    External id."""
    infos: list[dict[str, Any]] = []
    op_names: list[str] = []
    if raw.k_info[i] >= 0:
        infos.append(raw.infos[raw.k_info[i]])
    entry = by_tid.get(int(raw.l_tid[li])) if li >= 0 else None
    if entry is not None:
        seg, st, en, parent = entry
        t = raw.l_ts[li]
        p = int(np.searchsorted(st, t, side="right")) - 1
        while p >= 0 and en[p] < t:       # a sibling that ended: climb to its ancestors
            p = int(parent[p])
        while p >= 0:                     # innermost first
            j = int(seg[p])
            infos.append(raw.infos[raw.c_info[j]])
            op_names.append(names[raw.c_nid[j]])
            p = int(parent[p])
    jx = ext_to_op.get(int(raw.k_ext[i]))
    if jx is not None and names[raw.c_nid[jx]] not in op_names:
        infos.append(raw.infos[raw.c_info[jx]])
        op_names.append(names[raw.c_nid[jx]])
    return infos, op_names


def _join_collectives(raw: RawTrace, rows: np.ndarray, launch_idx: np.ndarray, pg: _PgConfig, world: int | None,
                      names: list[str], collective: np.ndarray, group: np.ndarray, nbytes: np.ndarray,
                      gsize: np.ndarray, size_source: np.ndarray | None = None) -> None:
    """Fill collective/group/bytes of the comm rows (kernel args > External id > launch enclosure > name).

    Linear time: the comm ops of each thread are sorted once and every launch finds the ops that
    enclose it by binary search plus a walk up the (shallow) nesting chain - never a scan of the
    thread's ops per kernel. :func:`collective_info` runs once per distinct (kernel name, args,
    op names): rows without any args (no record, no enclosing op, no External id match) are
    grouped by kernel name, the others keyed by the args' content.
    """
    ext_to_op, by_tid = _comm_ops_by_thread(raw)
    li = launch_idx[rows]
    has_thread = li >= 0
    if has_thread.any():
        has_thread[has_thread] = np.isin(raw.l_tid[li[has_thread]], list(by_tid))
    has_ext = np.isin(raw.k_ext[rows], list(ext_to_op)) if ext_to_op else np.zeros(len(rows), dtype=bool)
    plain = ~(has_thread | has_ext | (raw.k_info[rows] >= 0))
    out = (collective, group, nbytes, gsize, size_source)
    if plain.any():
        uniq, inv = np.unique(raw.k_nid[rows[plain]], return_inverse=True)
        found = [collective_info([], [], names[u], pg, world) for u in uniq.tolist()]
        _fill(out, rows[plain], [found[k] for k in inv.reshape(-1).tolist()])
    frozen: dict[int, str] = {}
    cache: dict[tuple[int, tuple[str, ...], tuple[str, ...]], CollInfo] = {}
    done: list[int] = []
    got: list[CollInfo] = []
    for i, lj in zip(rows[~plain].tolist(), li[~plain].tolist()):
        infos, op_names = _row_args(raw, i, lj, by_tid, ext_to_op, names)
        key = (int(raw.k_nid[i]), tuple(op_names), tuple(_frozen(d, frozen) for d in infos))
        ci = cache.get(key)
        if ci is None:
            ci = cache[key] = collective_info(infos, op_names, names[raw.k_nid[i]], pg, world)
        done.append(i)
        got.append(ci)
    _fill(out, np.asarray(done, dtype=np.int64), got)


def _frozen(d: dict[str, Any], memo: dict[int, str]) -> str:
    """The content of an args dict as text (equal text: equal args), memoised by identity."""
    v = memo.get(id(d))
    if v is None:
        v = memo[id(d)] = json.dumps(d, sort_keys=True)
    return v


def _fill(out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None], rows: np.ndarray,
          infos: list[CollInfo]) -> None:
    """Write each row's :class:`CollInfo` into the columns ``out`` = (collective, group, bytes,
    group size, size source or None)."""
    if not len(rows):
        return
    collective, group, nbytes, gsize, size_source = out
    collective[rows] = [c.collective for c in infos]
    group[rows] = [c.group for c in infos]
    nbytes[rows] = [c.bytes for c in infos]
    gsize[rows] = [c.group_size for c in infos]
    if size_source is not None:
        size_source[rows] = [c.size_source for c in infos]


def _build_cpu(raw: RawTrace, facts: _RankFacts, comm_nids: set[int]) -> RankTrace:
    """The rank's CPU ops as its Timeline (no device events): gloo collectives are communication."""
    rank, origin, pg, world, names = facts.rank, facts.origin, facts.pg, facts.world, facts.names
    nid = raw.c_nid
    is_comm = np.isin(nid, list(comm_nids))
    comm_prefixed = np.array([names[k].startswith(("record_param_comms", "nccl:", "c10d::", "rccl:"))
                              for k in range(len(names))], dtype=bool)
    n = len(nid)
    kinds = np.full(n, "compute", dtype=object)
    kinds[raw.c_annot] = "other"
    if len(comm_prefixed):
        kinds[comm_prefixed[nid]] = "other"
    kinds[is_comm] = "comm"
    start_us, end_us = raw.c_ts, raw.c_ts + raw.c_dur
    leaf = np.zeros(n, dtype=bool)
    # ops nested in a gloo collective on the same thread are part of the communication
    by_thread = np.lexsort((-end_us, start_us, raw.c_tid))     # one sort: threads, then time
    cuts = np.flatnonzero(np.diff(raw.c_tid[by_thread])) + 1
    for rows in (np.split(by_thread, cuts) if n else []):
        c = rows[is_comm[rows]]
        if len(c):
            cs, ce = start_us[c], end_us[c]
            order = np.argsort(cs)
            cs, ce = cs[order], np.maximum.accumulate(ce[order])
            pos = np.searchsorted(cs, start_us[rows], side="right") - 1
            nested = (pos >= 0) & (end_us[rows] <= ce[np.maximum(pos, 0)]) & ~is_comm[rows]
            kinds[rows[nested]] = "other"
        # outermost compute ops (aten::matmul, not the aten::mm inside it): the op a user called
        comp = rows[kinds[rows] == "compute"]
        if len(comp):
            prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(end_us[comp])[:-1]])
            leaf[comp] = start_us[comp] >= prev_end
    keep = (kinds == "compute") | (kinds == "comm")
    idx = np.flatnonzero(keep)
    start, end = _times(raw.c_ts[idx], raw.c_dur[idx], origin, facts.round_us)
    k = kinds[idx]
    m = len(idx)
    collective = np.full(m, "", dtype=object)
    group = np.full(m, "", dtype=object)
    nbytes = np.zeros(m)
    gsize = np.zeros(m, dtype=np.int64)
    size_source = np.full(m, "", dtype=object)
    for pos_i in np.flatnonzero(k == "comm"):
        j = idx[pos_i]
        infos = [raw.infos[raw.c_info[j]]] if raw.c_info[j] >= 0 else []
        ci = collective_info(infos, [names[nid[j]]], names[nid[j]], pg, world)
        collective[pos_i], group[pos_i], nbytes[pos_i], gsize[pos_i] = ci.collective, ci.group, ci.bytes, ci.group_size
        size_source[pos_i] = ci.size_source
    streams = np.array(raw.threads, dtype=object)[raw.c_tid[idx]] if m else np.empty(0, dtype=object)
    tl = Timeline(rank=np.full(m, rank), stream=streams, kind=k,
                  name=np.array(names, dtype=object)[nid[idx]] if m else np.empty(0, dtype=object),
                  start_s=start, end_s=end, bytes=nbytes, collective=collective, group=group,
                  meta={"rank": rank})
    return RankTrace(rank=rank, path=raw.path, mode="cpu", timeline=tl, launch_s=start.copy(), group_size=gsize,
                     leaf=leaf[idx] & (k == "compute"), shape=np.zeros(m, dtype=np.int64), name_id=nid[idx],
                     steps=facts.cpu_steps, cutoff_s=facts.cutoff,
                     n_steps_names=facts.step_names, meta=facts.meta, size_source=size_source)
