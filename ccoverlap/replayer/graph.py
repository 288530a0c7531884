"""The dependency graph of a measured step, rebuilt from one Kineto trace per rank.

Nodes (times in seconds from the job's origin, as :mod:`ccoverlap.trace.classify` sets it):

* every **device event** of the rank (kernel, memcpy, memset, sync) - a GPU op with its
  measured duration;
* the **CUDA runtime / driver calls** that carry a correlation id and matter to the GPU: the
  ones that launch a device op (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...), the blocking
  ones, and the first call of each thread - a CPU call on its thread with its measured
  duration. A call that does neither (``cudaGetDevice``, an event query, ...) is folded into
  the fixed time between its neighbours: it moves exactly as the call before it, and its
  replayed time is recomputed from that call when a trace is written;
* per blocking call (``cudaDeviceSynchronize`` / ``cudaStreamSynchronize`` /
  ``cudaEventSynchronize``, and a memcpy call that returned only after its copy ended) a
  zero-length *wait* node: the call returns at ``max(start + own cost, target end + return
  latency)``.

Per collective matched across ranks, :mod:`.engine` adds a *barrier* (the latest member
start) and per member an *end* node (barrier + the member's measured transfer time).

Edges ``t[dst] >= t[src] (+ dur[src] when from_end) + w`` (the usual longest-path rule):

* **CPU order**: consecutive calls of one thread, separated by the measured gap (the CPU
  operator work between two calls is a fixed time);
* **launch**: a call to its device op (correlation id), latency = the rank's median
  launch-to-start latency of ops launched onto an idle stream (``flow``: the id Kineto's
  ``ac2g`` flow arrows carry, the same correlation id);
* **stream order**: consecutive ops of one (device, stream);
* **cross-stream**: from ``cuda_sync`` events' ``wait_on_stream`` /
  ``wait_on_cuda_event_record_corr_id`` when Kineto wrote them (recent PyTorch with
  ``enable_cuda_sync_events``); otherwise *inferred from timing*: an op that started later
  than its launch, its stream and its known dependencies allow (by more than ``tol_s``)
  depends on the op of another stream of the device that ended last before it started;
* **host sync**: target op(s) to a blocking call's wait node (device sync: the last op of
  every stream launched before the call; stream / event sync without args: the op launched
  before the call that ended last before it returned - timing inference);
* **launch queue**: a launch / memcpy / memset call that took > 50 µs and > 10x its name's
  median and returned within 10 µs after an op (launched before it) ended waited for a slot in
  CUDA's launch queue (the GPU was behind the CPU): it returns when that op ends.

The weight of the binding constraint of each node (the one with the latest measured time) is
set so the unedited graph reproduces the measured start; the other constraints keep their
nominal weight (0 gap, median launch latency), so an edit that moves a predecessor moves its
successors as far as the structure says. This is trace-driven replay as in Lumos (Liang et al.,
MLSys 2025); the implementation is ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
from numpy.typing import ArrayLike

from ccoverlap.trace.classify import RankTrace
from ccoverlap.trace.columns import DEVICE_CAT_LIST
from ccoverlap.trace.load import RawTrace

# node kinds
GPU, CPU, WAIT, BARRIER, CEND = 0, 1, 2, 3, 4
# edge kinds
E_CPU, E_LAUNCH, E_STREAM, E_XSTREAM, E_SYNC, E_COLL = 0, 1, 2, 3, 4, 5
EDGE_KINDS = ("cpu", "launch", "stream", "xstream", "sync", "coll")
_SYNC_CAT = DEVICE_CAT_LIST.index("cuda_sync")
_SYNC_NAMES = ("Synchronize",)
_DEVICE_SYNC = ("cudaDeviceSynchronize", "hipDeviceSynchronize", "cudaCtxSynchronize", "cuCtxSynchronize")


class Edges:
    """Edge columns collected in chunks (numpy arrays or short lists), joined by :meth:`arrays`."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, src: ArrayLike, dst: ArrayLike, w: ArrayLike, from_end: ArrayLike, kind: int,
            w_nom: ArrayLike | None = None) -> None:
        """Append edges (scalars or equal-length arrays); ``w_nom`` defaults to ``w``."""
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        n = len(src)
        if not n:
            return
        w = np.broadcast_to(np.asarray(w, dtype=np.float64), (n,))
        wn = w if w_nom is None else np.broadcast_to(np.asarray(w_nom, dtype=np.float64), (n,))
        self.parts.append((src, np.broadcast_to(np.asarray(dst, dtype=np.int64), (n,)), w, wn,
                           np.broadcast_to(np.asarray(from_end, dtype=bool), (n,)), np.full(n, kind, dtype=np.int8)))

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(src, dst, w, w_nom, from_end, kind) as contiguous arrays."""
        if not self.parts:
            return (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0),
                    np.empty(0, bool), np.empty(0, np.int8))
        return tuple(np.concatenate([p[i] for p in self.parts]) for i in range(6))


@dataclass
class RankGraph:
    """One rank's part of the graph (local node ids: GPU ops, kept CPU calls, wait nodes)."""

    rank: int
    rt: RankTrace
    n_gpu: int
    n_cpu: int                       # kept CPU calls (nodes n_gpu .. n_gpu + n_cpu)
    kind: np.ndarray
    dur: np.ndarray
    start: np.ndarray                # measured start (s)
    release: np.ndarray              # earliest start of a root (-inf: none)
    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    w_nom: np.ndarray                # nominal weight (before fitting the binding gap)
    from_end: np.ndarray
    ekind: np.ndarray                # index into EDGE_KINDS
    launch_of: np.ndarray            # GPU row -> local CPU node or -1
    exit_of: np.ndarray              # kept CPU node - n_gpu -> its exit node (itself or its wait node)
    calls: Calls | None
    device: DeviceCols
    inferred: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    n_nodes: int = 0

    def __post_init__(self) -> None:
        self.n_nodes = len(self.kind)

    def drop_columns(self) -> None:
        """Free the node and edge columns once :func:`~ccoverlap.replayer.job.join` copied them."""
        empty_f, empty_i = np.empty(0), np.empty(0, dtype=np.int64)
        self.dur = self.start = self.release = self.w = self.w_nom = empty_f
        self.src = self.dst = empty_i
        self.kind = self.ekind = np.empty(0, dtype=np.int8)
        self.from_end = np.empty(0, dtype=bool)


@dataclass
class Calls:
    """Every runtime call of the rank (kept or folded), for writing replayed traces (s)."""

    start: np.ndarray
    end: np.ndarray
    tid: np.ndarray
    corr: np.ndarray
    names: list[str]
    node: np.ndarray                 # local node of a kept call, -1 if folded
    anchor: np.ndarray               # kept call (index into calls) whose exit a folded call follows
    thread_labels: list[str] = field(default_factory=list)


@dataclass
class DeviceCols:
    """The device events' raw columns a replayed Chrome trace writes back."""

    cat: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    corr: np.ndarray


def _launch_rows(raw: RawTrace, n: int) -> np.ndarray:
    """Index of the (earliest) launch call of every device op by correlation id, -1 if none."""
    launch = np.full(n, -1, dtype=np.int64)
    if n and len(raw.l_ts):
        order = np.lexsort((raw.l_ts, raw.l_corr))
        cs = raw.l_corr[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = cs[1:] != cs[:-1]
        uc, ui = cs[first], order[first]
        pos = np.minimum(np.searchsorted(uc, raw.k_corr), len(uc) - 1)
        hit = (uc[pos] == raw.k_corr) & (raw.k_corr >= 0)
        launch[hit] = ui[pos[hit]]
    return launch


def _stream_prev(ks: np.ndarray, dev_stream: np.ndarray, ops: np.ndarray, n: int) -> np.ndarray:
    """The stream predecessor of every op (-1: first on its stream)."""
    prev = np.full(n, -1, dtype=np.int64)
    if len(ops):
        o = ops[np.lexsort((ks[ops], dev_stream[ops]))]
        same = dev_stream[o][1:] == dev_stream[o][:-1]
        prev[o[1:][same]] = o[:-1][same]
    return prev


def _known_cross_stream(raw: RawTrace, launch: np.ndarray, dev_stream: np.ndarray, is_sync_ev: np.ndarray,
                        has_l: np.ndarray) -> dict[int, list[int]]:
    """Cross-stream edges named by ``cuda_sync`` args: waiting op -> [op it waits for]."""
    n = len(launch)
    known: dict[int, list[int]] = {}
    if not (n and len(raw.k_wait_stream) == n and (raw.k_wait_corr >= 0).any()):
        return known
    corr_ts = dict(zip(raw.l_corr.tolist(), raw.l_ts.tolist()))
    for i in np.flatnonzero(is_sync_ev & (raw.k_wait_corr >= 0) & (raw.k_wait_stream >= 0)):
        rec_ts = corr_ts.get(int(raw.k_wait_corr[i]))
        wait_launch = launch[i]
        if rec_ts is None or wait_launch < 0:
            continue
        key_src = int(raw.k_device[i]) * (1 << 32) + int(raw.k_wait_stream[i])
        src_c = np.flatnonzero((dev_stream == key_src) & has_l & ~is_sync_ev)
        src_c = src_c[raw.l_ts[launch[src_c]] < rec_ts]
        dst_c = np.flatnonzero((dev_stream == dev_stream[i]) & has_l & ~is_sync_ev)
        dst_c = dst_c[raw.l_ts[launch[dst_c]] > raw.l_ts[wait_launch]]
        if len(src_c) and len(dst_c):
            s_op = src_c[np.argmax(raw.l_ts[launch[src_c]])]
            d_op = dst_c[np.argmin(raw.l_ts[launch[dst_c]])]
            known.setdefault(int(d_op), []).append(int(s_op))
    return known


@dataclass
class _Gpu:
    """Per-rank GPU-side facts shared by the builders (seconds)."""

    ks: np.ndarray
    ke: np.ndarray
    launch: np.ndarray               # GPU row -> call index or -1
    call_node: np.ndarray            # call index -> local node or -1
    l_s: np.ndarray                  # call starts
    dev_stream: np.ndarray
    is_sync_ev: np.ndarray
    prev: np.ndarray
    ops: np.ndarray
    lat0: float
    by_end: tuple[np.ndarray, ...] = ()     # (non-marker ops sorted by end, their ends)


def _gpu_edges(raw: RawTrace, gp: _Gpu, known_x: dict, ed: Edges, release: np.ndarray, tol_s: float) -> dict:
    """Stream, launch and cross-stream edges of the device ops; binding gaps fitted."""
    ks, ke, launch, prev, n = gp.ks, gp.ke, gp.launch, gp.prev, len(gp.ks)
    has_l = launch >= 0
    ls_of = np.full(n, np.nan)
    ls_of[has_l] = gp.l_s[launch[has_l]]
    has_p = prev >= 0
    t_stream = np.where(has_p, ke[np.maximum(prev, 0)], -np.inf)
    w0_all = np.where(has_l & (ks >= ls_of), np.minimum(gp.lat0, ks - np.nan_to_num(ls_of)), 0.0)
    t_launch = np.where(has_l, np.nan_to_num(ls_of) + w0_all, -np.inf)
    is_op = np.zeros(n, dtype=bool)
    is_op[gp.ops] = True
    special = np.zeros(n, dtype=bool)
    if known_x:
        special[list(known_x)] = True
    special |= is_op & (ks - np.maximum(t_stream, t_launch) > tol_s)   # a cross-stream look (or a root)
    simple = is_op & ~special
    bind_stream = simple & has_p & (t_stream >= t_launch)
    rows = np.flatnonzero(simple & has_p)
    ws = np.where(bind_stream[rows], ks[rows] - t_stream[rows], -np.maximum(0.0, t_stream[rows] - ks[rows]))
    ed.add(prev[rows], rows, ws, True, E_STREAM, w_nom=0.0)
    rows = np.flatnonzero(simple & has_l)
    w0 = w0_all[rows]
    wl = np.where(~bind_stream[rows], w0 + ks[rows] - t_launch[rows], w0 - np.maximum(0.0, t_launch[rows] - ks[rows]))
    ed.add(gp.call_node[launch[rows]], rows, wl, False, E_LAUNCH, w_nom=w0)
    counts = _special_gpu_edges(raw, gp, np.flatnonzero(special), known_x, w0_all, ed, release, tol_s)
    # sync events: placed at their measured offset after their launch (markers)
    sev = np.flatnonzero(gp.is_sync_ev)
    with_l = sev[launch[sev] >= 0]
    ed.add(gp.call_node[launch[with_l]], with_l, ks[with_l] - gp.l_s[launch[with_l]], False, E_LAUNCH)
    no_l = sev[launch[sev] < 0]
    release[no_l] = ks[no_l]
    return counts


def _special_gpu_edges(raw: RawTrace, gp: _Gpu, special: np.ndarray, known_x: dict[int, list[int]],
                       w0_all: np.ndarray, ed: Edges, release: np.ndarray, tol_s: float) -> dict[str, int]:
    """Ops that started later than stream order and launch allow: known or inferred cross-stream
    dependencies, or roots (kept at their measured start)."""
    ks, ke, launch, prev = gp.ks, gp.ke, gp.launch, gp.prev
    by_dev: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for d in np.unique(raw.k_device[gp.ops]) if len(gp.ops) else []:
        rows = gp.ops[raw.k_device[gp.ops] == d]
        rows = rows[np.argsort(ke[rows], kind="stable")]
        by_dev[int(d)] = (rows, ke[rows])
    n_inferred = n_anchor = 0
    src: list[int] = []
    dst: list[int] = []
    w: list[float] = []
    wn: list[float] = []
    fe: list[bool] = []
    ek: list[int] = []
    for k in special.tolist():
        s = ks[k]
        cands: list[tuple[float, int, float, bool, int]] = []   # (T, src, nominal w, from_end, kind)
        p = prev[k]
        if p >= 0:
            cands.append((ke[p], int(p), 0.0, True, E_STREAM))
        li = launch[k]
        if li >= 0:
            w0k = float(w0_all[k])
            cands.append((gp.l_s[li] + w0k, int(gp.call_node[li]), w0k, False, E_LAUNCH))
        for s_op in known_x.get(k, ()):
            cands.append((ke[s_op], s_op, 0.0, True, E_XSTREAM))
        tmax = max((c[0] for c in cands), default=-np.inf)
        if s - tmax > tol_s:
            rws, ends = by_dev[int(raw.k_device[k])]
            j = int(np.searchsorted(ends, s + 1e-9, side="right")) - 1
            while j >= 0 and ends[j] > tmax:
                r = int(rws[j])
                if gp.dev_stream[r] != gp.dev_stream[k] and ks[r] < s:
                    cands.append((ends[j], r, 0.0, True, E_XSTREAM))
                    n_inferred += 1
                    break
                j -= 1
        if not cands:
            release[k] = s
            n_anchor += 1
            continue
        b = max(range(len(cands)), key=lambda i: cands[i][0])
        for i, (t, s_node, w_n, f, kind) in enumerate(cands):
            # binding: exactly the measured start; others: never later than it (clock jitter)
            src.append(s_node); dst.append(k); fe.append(f); ek.append(kind); wn.append(w_n)
            w.append(w_n + (s - t) if i == b else w_n - max(0.0, t - s))
    for kind in (E_STREAM, E_LAUNCH, E_XSTREAM):
        m = [i for i, x in enumerate(ek) if x == kind]
        ed.add([src[i] for i in m], [dst[i] for i in m], [w[i] for i in m], [fe[i] for i in m], kind,
               w_nom=[wn[i] for i in m])
    return {"cross_stream_inferred_from_timing": n_inferred, "anchored_ops": n_anchor}


def _blocking_candidates(raw: RawTrace, l_d: np.ndarray, lname: list[str], owns_op: np.ndarray,
                         queue_min_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Calls that may block on the GPU: (memcpy owning its copy, *Synchronize, long calls, median
    duration of each call's name)."""
    m = len(l_d)
    uniq = sorted(set(lname))
    is_sync = {nm: any(x in nm for x in _SYNC_NAMES) for nm in uniq}
    is_copy = {nm: "Memcpy" in nm for nm in uniq}
    sync_name = np.fromiter((is_sync[x] for x in lname), dtype=bool, count=m)
    memcpy = np.fromiter((is_copy[x] for x in lname), dtype=bool, count=m) & owns_op
    med_of = np.full(m, np.inf)
    if len(raw.l_nid) == m and m:
        u, inv = np.unique(raw.l_nid, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        cuts = np.flatnonzero(np.diff(inv[order])) + 1
        meds = np.array([np.median(l_d[g]) for g in np.split(order, cuts)])
        med_of = meds[inv.reshape(-1)]
    long_ = l_d > np.maximum(queue_min_s, 10 * med_of)
    return memcpy, sync_name, long_, med_of


def _block_targets(j: int, kind: str, is_long: bool, gp: _Gpu, l_d: np.ndarray, t_launch: np.ndarray,
                   own_op: dict[int, int], med: float,
                   lname: str, queue_tol_s: float) -> tuple[list[int], float, bool]:
    """(target ops, own cost, is a launch-queue wait) of a call that may have blocked: a memcpy
    that returned after its own copy, a sync call, else a long call that waited for the queue."""
    ke = gp.ke
    s_j, end_j = gp.l_s[j], gp.l_s[j] + l_d[j]
    own_cost = min(float(l_d[j]), 10e-6)
    if kind == "memcpy":
        op = own_op[j]
        if s_j < ke[op] <= end_j + 1e-9:
            return [op], own_cost, False
    elif kind == "sync":
        before = np.flatnonzero((t_launch < s_j) & (ke <= end_j + 1e-6) & ~gp.is_sync_ev)
        if not len(before):
            return [], own_cost, False
        best = int(before[np.argmax(ke[before])])
        if ke[best] <= s_j:
            return [], own_cost, False
        targets = [best]
        if lname in _DEVICE_SYNC:   # every stream's last op launched before the call
            bs = gp.dev_stream[before]
            for key in np.unique(bs):
                rows = before[bs == key]
                last = int(rows[np.argmax(t_launch[rows])])
                if last != best:
                    targets.append(last)
        return targets, own_cost, False
    if not is_long:
        return [], own_cost, False
    # a long call that returned just after an op (launched before it) ended waited for the queue
    by_end, end_sorted = gp.by_end
    p = int(np.searchsorted(end_sorted, end_j + 1e-9, side="right")) - 1
    while p >= 0 and end_sorted[p] > s_j:
        op = int(by_end[p])
        if t_launch[op] < s_j:
            if end_j - end_sorted[p] <= queue_tol_s:
                return [op], min(float(l_d[j]), med), True
            break
        p -= 1
    return [], own_cost, False


def build_rank_graph(raw: RawTrace, rt: RankTrace, origin_us: float, *, tol_s: float = 20e-6,
                     queue_min_s: float = 50e-6, queue_tol_s: float = 10e-6, keep_calls: bool = True) -> RankGraph:
    """The dependency graph of one rank (see the module docstring); times in seconds.

    ``raw`` must come from ``load_trace(..., keep_runtime=True)``; ``rt`` from
    ``build_rank(raw, origin_us)`` without rounding. ``tol_s``: how much later than every
    known constraint an op may start before a cross-stream dependency is inferred;
    ``queue_min_s`` / ``queue_tol_s``: a runtime call longer than this and 10x its name's median
    that returned within ``queue_tol_s`` after an op ended waited for the launch queue.
    ``keep_calls``: keep every runtime call's columns (:class:`Calls`, for writing replayed
    traces); without, ``calls`` is None.
    """
    tl = rt.timeline
    n, m = len(tl), len(raw.l_ts)
    l_s = (raw.l_ts - origin_us) * 1e-6
    l_d = raw.l_dur * 1e-6 if len(raw.l_dur) == m else np.zeros(m)
    lname = [raw.names[i] for i in raw.l_nid] if len(raw.l_nid) == m else ["?"] * m
    gp = _gpu_facts(raw, tl.start_s, tl.end_s, l_s, n)
    owns = np.zeros(m, dtype=bool)
    owns[gp.launch[gp.launch >= 0]] = True
    memcpy, sync_name, long_, med_of = _blocking_candidates(raw, l_d, lname, owns, queue_min_s)
    cand = memcpy | sync_name | long_
    order = np.lexsort((l_s, raw.l_tid)) if m else np.empty(0, dtype=np.int64)
    first = np.zeros(m, dtype=bool)
    if m:
        tids = raw.l_tid[order]
        first[order[np.r_[True, tids[1:] != tids[:-1]]]] = True
    kept = owns | cand | first
    kept_idx = np.flatnonzero(kept)
    gp.call_node = np.full(m, -1, dtype=np.int64)
    gp.call_node[kept_idx] = n + np.arange(len(kept_idx))
    n_cpu = len(kept_idx)
    kind = [np.full(n, GPU, np.int8), np.full(n_cpu, CPU, np.int8)]
    dur = [tl.end_s - tl.start_s, l_d[kept_idx].copy()]
    start = [tl.start_s.copy(), l_s[kept_idx]]
    release = np.full(n + n_cpu, -np.inf)
    ed = Edges()
    known_x = _known_cross_stream(raw, gp.launch, gp.dev_stream, gp.is_sync_ev, gp.launch >= 0)
    counts = _gpu_edges(raw, gp, known_x, ed, release, tol_s)
    waits = _wait_nodes(gp, l_d, lname, cand, memcpy, sync_name, long_, med_of, dur[1], n, n_cpu, ed, queue_tol_s)
    exit_of = np.arange(n, n + n_cpu, dtype=np.int64)
    for j, wn in waits["exit"].items():
        exit_of[gp.call_node[j] - n] = wn
    n_wait = len(waits["start"])
    kind.append(np.full(n_wait, WAIT, np.int8))
    dur.append(np.zeros(n_wait))
    start.append(np.asarray(waits["start"], dtype=np.float64))
    release = np.concatenate([release, np.full(n_wait, -np.inf)])
    anchor = _cpu_chain(raw, gp, l_s, l_d, order, kept, exit_of, n, ed, release)
    src, dst, w, w_nom, fe, ek = ed.arrays()
    launch_of = np.full(n, -1, dtype=np.int64)
    launch_of[gp.launch >= 0] = gp.call_node[gp.launch[gp.launch >= 0]]
    g = RankGraph(rank=rt.rank, rt=rt, n_gpu=n, n_cpu=n_cpu, kind=np.concatenate(kind), dur=np.concatenate(dur),
                  start=np.concatenate(start), release=release, src=src, dst=dst, w=w, w_nom=w_nom, from_end=fe,
                  ekind=ek, launch_of=launch_of, exit_of=exit_of,
                  calls=Calls(start=l_s, end=l_s + l_d, tid=raw.l_tid, corr=raw.l_corr, names=lname,
                              node=gp.call_node, anchor=anchor, thread_labels=list(raw.threads)) if keep_calls else None,
                  device=DeviceCols(cat=raw.k_cat, device=raw.k_device, stream=raw.k_stream, corr=raw.k_corr))
    g.notes.append(f"median launch latency {gp.lat0 * 1e6:.1f} us")
    g.inferred = {
        "launch": "correlation id (Kineto's ac2g flow id)",
        "stream_order": "device + stream id",
        "cross_stream_from_args": sum(len(v) for v in known_x.values()),
        "cross_stream_inferred_from_timing": counts["cross_stream_inferred_from_timing"],
        "host_sync_blocking_calls": waits["blocking"],
        "launch_queue_waits": waits["queue"],
        "anchored_ops": counts["anchored_ops"],
        "launch_latency_us": gp.lat0 * 1e6,
        "runtime_calls": m,
        "runtime_calls_in_graph": n_cpu,
    }
    return g


def _gpu_facts(raw: RawTrace, ks: np.ndarray, ke: np.ndarray, l_s: np.ndarray, n: int) -> _Gpu:
    """Launch join, stream order and the median launch latency of ops launched onto an idle stream."""
    launch = _launch_rows(raw, n)
    dev_stream = raw.k_device * (1 << 32) + raw.k_stream if n else np.empty(0, dtype=np.int64)
    is_sync_ev = raw.k_cat == _SYNC_CAT if n else np.zeros(0, dtype=bool)
    ops = np.flatnonzero(~is_sync_ev)
    prev = _stream_prev(ks, dev_stream, ops, n)
    has_l = launch >= 0
    ls_of = np.full(n, np.nan)
    ls_of[has_l] = l_s[launch[has_l]]
    lat_all = ks - ls_of
    idle = has_l & ((prev < 0) | (ke[np.maximum(prev, 0)] <= ls_of))
    cand = lat_all[idle & (lat_all >= 0)]
    gp = _Gpu(ks=ks, ke=ke, launch=launch, call_node=np.empty(0, np.int64), l_s=l_s, dev_stream=dev_stream,
              is_sync_ev=is_sync_ev, prev=prev, ops=ops, lat0=float(np.median(cand)) if len(cand) else 0.0)
    by_end = ops[np.argsort(ke[ops], kind="stable")]
    gp.by_end = (by_end, ke[by_end])
    return gp


class _Waits(TypedDict):
    """What :func:`_wait_nodes` adds: the wait node each blocking call exits through (by call
    index), each wait node's start (s), blocking calls and launch-queue waits counted."""

    exit: dict[int, int]
    start: list[float]
    blocking: int
    queue: int


def _wait_nodes(gp: _Gpu, l_d: np.ndarray, lname: list[str], cand: np.ndarray, memcpy: np.ndarray,
                sync_name: np.ndarray, long_: np.ndarray, med_of: np.ndarray, cpu_dur: np.ndarray, n: int, n_cpu: int,
                ed: Edges, queue_tol_s: float) -> _Waits:
    """A wait node per call that blocked on the GPU, with its host-sync edges."""
    t_launch = np.full(len(gp.ks), np.inf)
    has_l = gp.launch >= 0
    t_launch[has_l] = gp.l_s[gp.launch[has_l]]
    own_op = {int(gp.launch[k]): int(k) for k in np.flatnonzero(has_l)}
    out: _Waits = {"exit": {}, "start": [], "blocking": 0, "queue": 0}
    for j in np.flatnonzero(cand).tolist():
        kind = "memcpy" if memcpy[j] else "sync" if sync_name[j] else "long"
        targets, own_cost, queue = _block_targets(j, kind, bool(long_[j]), gp, l_d, t_launch, own_op, float(med_of[j]),
                                                  lname[j], queue_tol_s)
        if not targets:
            continue
        out["blocking"] += 1
        out["queue"] += int(queue)
        node = int(gp.call_node[j])
        end_j = gp.l_s[j] + l_d[j]
        cpu_dur[node - n] = own_cost
        wn = n + n_cpu + len(out["start"])
        out["start"].append(end_j)
        ed.add(node, wn, 0.0, True, E_SYNC)
        best = targets[0]
        ed.add(targets, wn, [end_j - gp.ke[best] if t == best else 0.0 for t in targets], True, E_SYNC)
        out["exit"][j] = wn
    out["blocking"] -= out["queue"]
    return out


def _cpu_chain(raw: RawTrace, gp: _Gpu, l_s: np.ndarray, l_d: np.ndarray, order: np.ndarray, kept: np.ndarray,
               exit_of: np.ndarray, n: int, ed: Edges, release: np.ndarray) -> np.ndarray:
    """CPU-order edges between consecutive kept calls of each thread (the folded calls' time and
    gaps in the weight); returns each call's anchor (the kept call it follows, itself if kept)."""
    m = len(l_s)
    anchor = np.arange(m, dtype=np.int64)
    if not m:
        return anchor
    ko = order[kept[order]]
    tid = raw.l_tid[ko]
    same = np.r_[False, tid[1:] == tid[:-1]]
    nodes = gp.call_node[ko]
    heads = nodes[~same]
    release[heads] = l_s[ko[~same]]
    cur, prv = ko[1:][same[1:]], ko[:-1][same[1:]]
    ed.add(exit_of[gp.call_node[prv] - n], gp.call_node[cur], l_s[cur] - (l_s[prv] + l_d[prv]), True, E_CPU)
    pos = np.where(kept[order], np.arange(m), 0)
    anchor[order] = order[np.maximum.accumulate(pos)]
    return anchor
